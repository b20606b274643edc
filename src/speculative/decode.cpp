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

GenerationResult run_generation(const Model& model, const std::vector<int32_t>& prompt,
                                ModelState& state, const GenerationConfig& config,
                                const DecodeSetup& setup, const TokenCallback& on_token,
                                DecodeStats* stats) {
  const DecodeOptions& options = setup.options;
  DecodeStats local;
  DecodeStats& out = stats != nullptr ? *stats : local;
  out = DecodeStats{};
  out.mode = options.mode;
  if (options.mode == DecodeMode::baseline) {
    return Generator(model, setup.batcher).generate(prompt, state, config, on_token);
  }
  if (options.mode == DecodeMode::lookup) {
    const int max_draft = options.max_draft.value_or(kLookupMaxDraft);
    LookupDrafter lookup(LookupParams{3, 4, max_draft, lookup_cap_ceiling(options)});
    FixedCap ceiling(lookup_cap_ceiling(options));
    std::unique_ptr<CapPolicy> load_caps;
    if (setup.cap_policy) load_caps = setup.cap_policy(options);
    out.cap = max_draft;
    SpeculativeOptions speculative;
    speculative.batcher = setup.batcher;
    SpeculativeGenerator generator(model, lookup, load_caps ? *load_caps : ceiling, speculative);
    GenerationResult result = generator.generate(prompt, state, config, on_token);
    out.speculative = generator.stats();
    return result;
  }
  if (!setup.drafter) fail("{} mode needs a drafter", decode_mode_name(options.mode));
  std::unique_ptr<Drafter> drafter = setup.drafter();
  std::unique_ptr<CapPolicy> caps;
  if (setup.cap_policy) caps = setup.cap_policy(options);
  if (!caps) caps = std::make_unique<FixedCap>(options.max_draft.value_or(kFallbackCap));
  out.cap = caps->current_cap();
  std::unique_ptr<LookupDrafter> lookup;
  std::unique_ptr<CapPolicy> lookup_caps;
  SpeculativeOptions speculative;
  speculative.batcher = setup.batcher;
  if (options.lookup_drafts) {
    lookup = std::make_unique<LookupDrafter>(LookupParams{4, 5, 6, options.lookup_long_draft});
    speculative.lookup = lookup.get();
    speculative.lookup_cap = options.lookup_long_draft;
    if (setup.lookup_cap_policy) lookup_caps = setup.lookup_cap_policy(options);
    speculative.lookup_caps = lookup_caps.get();
  }
  SpeculativeGenerator generator(model, *drafter, *caps, speculative);
  GenerationResult result = generator.generate(prompt, state, config, on_token);
  out.speculative = generator.stats();
  return result;
}

}  // namespace dspark
