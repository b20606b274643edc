#pragma once
// Measures the costs the draft cap is derived from (docs/speculative.md §16.1) and caches them per
// (build, machine, kernels, threads, mode, target, drafter, quantisation) in a JSON file
// (~/.cache/dspark/calibration.json): verify milliseconds per width at a 512-token synthetic
// context, drafter milliseconds per cap, the per-round overhead, and the verify slope with
// context depth. Every timing at the 512-token context is 3 warm-ups then the median of 8
// iterations (the median rather than the reference's mean: the machines we measure on are
// shared), at the deep context 1 warm-up and 3 iterations, with the state trimmed back after
// each iteration. The contexts are synthetic (the caches are grown without being computed):
// costs do not depend on what the caches hold.
#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "model/model.h"
#include "speculative/cap.h"
#include "speculative/decode.h"

namespace dspark {

struct CalibrationOptions {
  std::string cache_path;       // "" = $XDG_CACHE_HOME/dspark or ~/.cache/dspark, calibration.json
  bool use_cache = true;        // false: always measure (the result is still stored)
  std::string mode = "lookup";  // the decoding mode the costs are for (part of the key)
  std::string target_name;      // model directory basename (part of the key)
  std::string drafter_name;     // drafter_calibration_name(directory), "" for none
  int drafter_bits = 0;         // the drafter's quantisation at load (0 = as stored)
  int max_width = 8;            // verify widths 1..max_width (DSpark: block_size + 1)
  int64_t context = 512;
  // The second depth of the slope. The reference uses 16384; on the CPU a verify at that depth
  // takes seconds, and the slope is linear, so 4096 keeps calibration short. Clipped to what the
  // model's context allows.
  int64_t deep_context = 4096;
  int warmups = 3;
  int iterations = 8;
  int deep_warmups = 1;
  int deep_iterations = 3;
};

// A cached calibration that a width-1 forward timed at start-up contradicted (calibration.cpp).
struct StaleCache {
  double cached_ms = 0.0;  // the cache's width-1 verify
  double now_ms = 0.0;     // the same forward timed now
};

struct Calibration {
  CostCurves curves;
  std::string key;
  bool from_cache = false;
  double seconds = 0.0;  // spent measuring (0 when read from the cache)
  // Set when the cache held this key but was measured again because it no longer matched.
  std::optional<StaleCache> stale;
};

// The cache key: schema, the forward's build (kForwardFingerprint: a hash of the target's and the
// drafters' forward sources and build flags, so that a build with other kernels or another
// drafter backbone measures its own costs), CPU model, best
// ISA, threads, mode, target, drafter, quantisation and the target's decode bytes (which change
// with any re-quantisation).
std::string calibration_key(const Model& target, const CalibrationOptions& options);

// A drafter's name in the key: its directory's basename and a digest of what its costs depend on
// (config.json's bytes and each weight file's name and size), so that a head reshaped in place
// (other layers, draft vocabulary or block size) is measured again rather than priced by its
// predecessor's costs; a head retrained at the same shape drafts at the same cost and keeps them.
std::string drafter_calibration_name(const std::string& directory);

// Measures (or reads from the cache) the cost curves of `target` with the drafter `drafter`
// makes (null: no model drafter; drafter costs stay empty). A cached entry is first checked
// against the fastest of a few width-1 forwards timed now, and measured again when it is clearly
// slower: it was then written on a loaded machine (`Calibration::stale`).
Calibration calibrate(const Model& target, const DrafterFactory& drafter,
                      const CalibrationOptions& options);

// The verify widths a lookup calibration measures: lookup drafts are free to make, so a shared
// step may verify many rows, and measured widths price them better than the curve extended past
// width 8 (which on the default model put width 16 at 13.2 ms where it takes 15.1).
constexpr int kLookupCalibrationWidth = 16;

// The cap policy of a dspark / dflash generation (DecodeSetup::cap_policy): calibrates with the
// drafter (or reads the cache), then make_cap_policy_factory over the measured curves.
struct CalibratedCaps {
  CapPolicyFactory policy;
  // The --lookup-drafts pre-step's: LookupLoadCap over the same verify costs, drafting free.
  CapPolicyFactory lookup_policy;
  int derived_cap = 2;  // the cap without --max-draft; 0: plain decoding pays best
  std::string error;    // why calibration failed; then the caps fall back to 2 (§16.3)
};
CalibratedCaps calibrated_cap_policy(const Model& target, const DrafterFactory& drafter,
                                     const CalibrationOptions& options, int max_cap,
                                     bool allow_parking);
// Standalone lookup's: LookupLoadCap over the target's measured verify costs (its ceiling alone;
// capped under load); `policy` (and `lookup_policy`) a fixed ceiling when calibration fails.
CalibratedCaps calibrated_lookup_cap_policy(const Model& target, const CalibrationOptions& options);

nlohmann::json cost_curves_json(const CostCurves& curves);
// Throws naming `source` when a field is missing or malformed.
CostCurves cost_curves_from_json(const nlohmann::json& json, const std::string& source);

std::string default_calibration_cache_path();

}  // namespace dspark
