#include "speculative/decode.h"

#include "base/error.h"
#include "speculative/lookup.h"

namespace dspark {
namespace {

// Standalone lookup's draft length when no --max-draft is given (docs/speculative.md §10.4).
constexpr int kLookupMaxDraft = 6;
// Without calibration, model drafters start from this cap.
constexpr int kFallbackCap = 2;

}  // namespace

const char* decode_mode_name(DecodeMode mode) {
  switch (mode) {
    case DecodeMode::baseline:
      return "baseline";
    case DecodeMode::lookup:
      return "lookup";
    case DecodeMode::dspark:
      return "dspark";
    case DecodeMode::dflash:
      return "dflash";
  }
  return "?";
}

DecodeMode parse_decode_mode(const std::string& text) {
  if (text == "baseline") return DecodeMode::baseline;
  if (text == "lookup") return DecodeMode::lookup;
  if (text == "dspark") return DecodeMode::dspark;
  if (text == "dflash") return DecodeMode::dflash;
  fail("unknown decoding mode '{}' (baseline, lookup, dspark, dflash or auto)", text);
}

int lookup_cap_ceiling(const DecodeOptions& options) {
  return std::max(options.max_draft.value_or(kLookupMaxDraft), options.lookup_long_draft);
}

Decoding::Decoding(const Model& model, const std::vector<int32_t>& prompt, StatePool& pool,
                   SequenceId sequence, const GenerationConfig& config, const DecodeSetup& setup,
                   const TokenCallback& on_token)
    : mode_(setup.options.mode) {
  const DecodeOptions& options = setup.options;
  if (mode_ == DecodeMode::baseline) {
    drafter_ = std::make_unique<NoDrafts>();
    caps_ = std::make_unique<FixedCap>(0);
  } else if (mode_ == DecodeMode::lookup) {
    const int max_draft = options.max_draft.value_or(kLookupMaxDraft);
    drafter_ =
        std::make_unique<LookupDrafter>(LookupParams{3, 4, max_draft, lookup_cap_ceiling(options)});
    if (setup.cap_policy) caps_ = setup.cap_policy(options);
    if (!caps_) caps_ = std::make_unique<FixedCap>(lookup_cap_ceiling(options));
    cap_ = max_draft;
  } else {
    if (!setup.drafter) fail("{} mode needs a drafter", decode_mode_name(mode_));
    drafter_ = setup.drafter();
    if (setup.cap_policy) caps_ = setup.cap_policy(options);
    if (!caps_) caps_ = std::make_unique<FixedCap>(options.max_draft.value_or(kFallbackCap));
    cap_ = caps_->current_cap();
    if (options.lookup_drafts) {
      lookup_ = std::make_unique<LookupDrafter>(LookupParams{4, 5, 6, options.lookup_long_draft});
      options_.lookup = lookup_.get();
      options_.lookup_cap = options.lookup_long_draft;
      if (setup.lookup_cap_policy) lookup_caps_ = setup.lookup_cap_policy(options);
      options_.lookup_caps = lookup_caps_.get();
    }
  }
  decoder_ = std::make_unique<SequenceDecoder>(model, *drafter_, *caps_, options_, prompt, pool,
                                               sequence, config, on_token);
}

Decoding::~Decoding() = default;

DecodeStats Decoding::stats() const {
  DecodeStats stats;
  stats.mode = mode_;
  stats.cap = cap_;
  if (mode_ != DecodeMode::baseline) stats.speculative = decoder_->stats();
  return stats;
}

GenerationResult run_generation(const Model& model, const std::vector<int32_t>& prompt,
                                StatePool& pool, SequenceId sequence,
                                const GenerationConfig& config, const DecodeSetup& setup,
                                const TokenCallback& on_token, DecodeStats* stats) {
  if (stats != nullptr) {
    *stats = DecodeStats{};
    stats->mode = setup.options.mode;
  }
  Decoding decoding(model, prompt, pool, sequence, config, setup, on_token);
  decoding.decoder().run_to_end();
  if (stats != nullptr) *stats = decoding.stats();
  return decoding.decoder().result();
}

}  // namespace dspark
