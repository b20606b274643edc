#pragma once
// The figures of one generation, as text (generate's footer) and as JSON (the server's
// per-response stats, benchmark records): speed, tokens per round, per-slot acceptance, the cap,
// peak memory. One formatter, so every entry point reports the same numbers the same way.
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "engine/generator.h"
#include "speculative/decode.h"

namespace dspark {

// Committed tokens per target forward after prefill (1.0 for plain decoding).
double tokens_per_round(const DecodeStats& decode, const GenerationStats& generation);
// Per draft slot: the share of rounds verifying the slot that accepted it (and so every slot
// before it).
std::vector<double> slot_acceptance(const SpeculativeStats& stats);

// Lines without a trailing newline:
//   Prompt: 27 tokens, 310.2 tokens-per-sec
//   Generation: 200 tokens, 41.3 tokens-per-sec (44.0 end to end)
//   Speculative: lookup, cap 6, 61 rounds + 20 plain steps, 2.46 tokens/round, 58% of drafts
//   accepted Acceptance by slot: 0.80 0.66 0.52 ... Peak memory: 0.412 GB
std::string format_decode_stats(const DecodeStats& decode, const GenerationStats& generation);

nlohmann::json decode_stats_json(const DecodeStats& decode, const GenerationStats& generation);

}  // namespace dspark
