#pragma once
// How one generation decodes: plain, lookup drafts, or a model drafter (DSpark / DFlash), with a
// fixed or automatic draft cap. Everything that generates (generate, serve, benchmark) goes
// through run_generation, so every entry point gets the same modes and the same statistics.
#include <memory>
#include <optional>
#include <string>

#include "engine/generator.h"
#include "speculative/drafter.h"
#include "speculative/verify.h"

namespace dspark {

enum class DecodeMode { baseline, lookup, dspark, dflash };
const char* decode_mode_name(DecodeMode mode);
// Parses baseline|lookup|dspark|dflash; throws naming the value otherwise ("auto" is resolved by
// resolve_decode_mode, not here).
DecodeMode parse_decode_mode(const std::string& text);

struct DecodeOptions {
  DecodeMode mode = DecodeMode::baseline;
  // Drafts per round; nullopt = derived (the cap policy chooses, see cap_policy_factory).
  std::optional<int> max_draft;
  bool auto_cap = false;  // --max-draft auto: the per-round controller
  // Derived caps: verify only the drafts a confidence head's survival estimates pay for
  // (DerivedCap); --confidence-schedule off verifies every draft of the cap.
  bool confidence_schedule = true;
  bool lookup_drafts = false;  // hybrid lookup pre-step inside dspark / dflash modes
  int lookup_long_draft = 32;  // long-draft ceiling of lookup drafts
};

// The most drafts a standalone lookup round may verify: its long-draft ceiling or --max-draft.
int lookup_cap_ceiling(const DecodeOptions& options);

struct DecodeStats {
  DecodeMode mode = DecodeMode::baseline;
  int cap = 0;  // the fixed or derived cap (the controller's starting cap for auto)
  SpeculativeStats speculative;
};

// A model drafter for the dspark / dflash modes: built per generation (its context is per
// sequence) by the drafter module. Null when the mode needs none.
using DrafterFactory = std::function<std::unique_ptr<Drafter>()>;
// A cap policy per generation; when unset a FixedCap of max_draft (or 2) is used (lookup: of
// lookup_cap_ceiling).
using CapPolicyFactory = std::function<std::unique_ptr<CapPolicy>(const DecodeOptions&)>;

struct DecodeSetup {
  DecodeOptions options;
  DrafterFactory drafter;       // required for dspark / dflash
  CapPolicyFactory cap_policy;  // optional
  // The --lookup-drafts pre-step's policy (optional; without one its long-draft ceiling holds).
  CapPolicyFactory lookup_cap_policy;
};

// One generation set up as `setup` says (its drafter, cap policies and lookup pre-step, owned
// here), as a SequenceDecoder of one pool sequence: run_generation runs it alone, decode_together
// with others. The model, pool and config must outlive it, and the sequence must stay open; the
// callback is copied.
class Decoding {
 public:
  Decoding(const Model& model, const std::vector<int32_t>& prompt, StatePool& pool,
           SequenceId sequence, const GenerationConfig& config, const DecodeSetup& setup,
           const TokenCallback& on_token);
  ~Decoding();
  Decoding(const Decoding&) = delete;
  Decoding& operator=(const Decoding&) = delete;

  SequenceDecoder& decoder() { return *decoder_; }
  // The statistics so far (complete once the decoder has finished).
  DecodeStats stats() const;

 private:
  DecodeMode mode_;
  int cap_ = 0;
  std::unique_ptr<Drafter> drafter_;
  std::unique_ptr<CapPolicy> caps_;
  std::unique_ptr<Drafter> lookup_;
  std::unique_ptr<CapPolicy> lookup_caps_;
  SpeculativeOptions options_;
  std::unique_ptr<SequenceDecoder> decoder_;
};

GenerationResult run_generation(const Model& model, const std::vector<int32_t>& prompt,
                                StatePool& pool, SequenceId sequence,
                                const GenerationConfig& config, const DecodeSetup& setup,
                                const TokenCallback& on_token, DecodeStats* stats = nullptr);

}  // namespace dspark
