#include "speculative/decode_report.h"

#include <fmt/format.h>

namespace dspark {
namespace {

double end_to_end_tokens_per_second(const GenerationStats& generation) {
  const double seconds = generation.prefill_seconds + generation.decode_seconds;
  return seconds > 0 ? generation.generated_tokens / seconds : 0.0;
}

}  // namespace

double tokens_per_round(const DecodeStats& decode, const GenerationStats& generation) {
  if (decode.mode == DecodeMode::baseline) return generation.generated_tokens > 1 ? 1.0 : 0.0;
  return decode.speculative.tokens_per_round(generation.generated_tokens);
}

std::vector<double> slot_acceptance(const SpeculativeStats& stats) {
  std::vector<double> shares;
  for (size_t i = 0; i < stats.position_verified.size(); ++i) {
    const int64_t verified = stats.position_verified[i];
    shares.push_back(verified > 0 ? double(stats.position_accepted[i]) / verified : 0.0);
  }
  return shares;
}

std::string format_decode_stats(const DecodeStats& decode, const GenerationStats& generation) {
  std::string text = fmt::format("Prompt: {} tokens", generation.prompt_tokens);
  if (generation.cached_prompt_tokens > 0)
    text += fmt::format(" ({} cached)", generation.cached_prompt_tokens);
  text += fmt::format(", {:.1f} tokens-per-sec\n", generation.prefill_tokens_per_second());
  text += fmt::format("Generation: {} tokens, {:.1f} tokens-per-sec ({:.1f} end to end)\n",
                      generation.generated_tokens, generation.decode_tokens_per_second(),
                      end_to_end_tokens_per_second(generation));
  if (decode.mode != DecodeMode::baseline) {
    const SpeculativeStats& spec = decode.speculative;
    text += fmt::format(
        "Speculative: {}, cap {}, {} rounds + {} plain steps, {:.2f} tokens/round, {:.0f}% of "
        "drafts accepted",
        decode_mode_name(decode.mode), decode.cap, spec.rounds, spec.plain_steps,
        tokens_per_round(decode, generation), 100.0 * spec.acceptance_rate());
    // The confidence schedule's share: drafts made and then not verified.
    if (spec.unverified > 0) text += fmt::format(", {} drafts not verified", spec.unverified);
    text += "\n";
    const std::vector<double> shares = slot_acceptance(spec);
    if (!shares.empty()) {
      text += "Acceptance by slot:";
      // Long lookup drafts reach 32 slots; the first ones carry the story.
      constexpr size_t kSlotsShown = 12;
      for (size_t i = 0; i < std::min(shares.size(), kSlotsShown); ++i)
        text += fmt::format(" {:.2f}", shares[i]);
      if (shares.size() > kSlotsShown) text += " ...";
      text += "\n";
    }
  }
  text += fmt::format("Peak memory: {:.3f} GB", generation.peak_rss_bytes / 1e9);
  return text;
}

nlohmann::json decode_stats_json(const DecodeStats& decode, const GenerationStats& generation) {
  nlohmann::json out;
  out["mode"] = decode_mode_name(decode.mode);
  out["prompt_tokens"] = generation.prompt_tokens;
  out["cached_prompt_tokens"] = generation.cached_prompt_tokens;
  out["generated_tokens"] = generation.generated_tokens;
  out["prefill_seconds"] = generation.prefill_seconds;
  out["decode_seconds"] = generation.decode_seconds;
  out["prefill_tok_s"] = generation.prefill_tokens_per_second();
  out["decode_tok_s"] = generation.decode_tokens_per_second();
  out["tok_s"] = end_to_end_tokens_per_second(generation);
  out["accept"] = tokens_per_round(decode, generation);
  out["peak_rss_bytes"] = generation.peak_rss_bytes;
  if (decode.mode != DecodeMode::baseline) {
    const SpeculativeStats& spec = decode.speculative;
    out["cap"] = decode.cap;
    out["rounds"] = spec.rounds;
    out["plain_steps"] = spec.plain_steps;
    out["target_forwards"] = spec.target_forwards;
    out["lookup_rounds"] = spec.lookup_rounds;
    out["drafted"] = spec.drafted;
    out["accepted"] = spec.accepted;
    out["unverified"] = spec.unverified;
    out["acceptance_rate"] = spec.acceptance_rate();
    out["slot_acceptance"] = slot_acceptance(spec);
    out["drafter_seconds"] = spec.drafter_seconds;
    out["verify_seconds"] = spec.verify_seconds;
  }
  return out;
}

}  // namespace dspark
