#pragma once
// The decoding flags `generate` and `serve` share (docs/speculative.md §15, docs/server-api.md
// §6.1, §6.2): --mode, --max-draft, --drafter, --drafter-bits, --confidence-threshold,
// --lookup-drafts / --no-lookup-drafts, declared once so that both commands take the same names and
// defaults, and resolved once per loaded model into the DecodeSetup every generation uses.
#include <CLI/CLI.hpp>
#include <string>

#include "engine/model_bundle.h"
#include "engine/sampler.h"
#include "speculative/decode.h"

namespace dspark::cli {

struct DecodeFlags {
  std::string mode = "auto";
  std::string max_draft;  // "" = derived, a number, or "auto" (the per-round controller)
  std::string drafter;
  int drafter_bits = 4;
  float confidence_threshold = 0.0f;
  std::string confidence_schedule = "on";
  // --lookup-drafts / --no-lookup-drafts; neither: on for a dense target, off for a MoE one.
  bool lookup_drafts = false;
  bool no_lookup_drafts = false;
  // Let message and tool text yield control tokens (the old behaviour; a prompt-injection risk:
  // a user typing the template's end-of-turn markup can forge turns).
  bool special_tokens_in_content = false;
};

// --numerics int8|fp32 and --kv-cache f16|f32: set the process-wide numerics of quantized
// products and the KV cache type of new model states when parsed.
void add_numerics_flags(CLI::App& command);
// The decoding flags above, --numerics and --kv-cache among them.
void add_decode_flags(CLI::App& command, DecodeFlags& flags);

// A number in [min, max]: unlike CLI::Range it refuses nan and inf (every comparison with NaN
// is false, so a range check alone lets it through).
CLI::Validator finite_range(double min, double max);

// A --drafter-bits width: 0 (as stored) or an MLX affine width (2, 3, 4, 5, 6, 8; 1 is taken as
// 2, as the reference clamps it).
CLI::Validator drafter_bits();

// A --threads count: 0 (all CPUs) up to 4x the CPUs this process may use.
CLI::Validator thread_count();

// The cap options of --max-draft; throws for a value that is neither a count nor "auto" (so a
// command can refuse it before loading anything).
DecodeOptions cap_options(const DecodeFlags& flags);

// Resolves the mode and drafter for `bundle`, loaded from --model `model` (as given) and
// --models-dir `models_dir_flag`, loads the drafter and its calibrated cap policy.
// `explanation` receives the one-line "mode ...: reason".
DecodeSetup resolve_decode_flags(const DecodeFlags& flags, const std::string& model,
                                 const std::string& models_dir_flag, const ModelBundle& bundle,
                                 std::string& explanation);

}  // namespace dspark::cli
