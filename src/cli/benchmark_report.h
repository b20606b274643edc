#pragma once
// The results of `dspark benchmark` and their three renderings: the console rows, the JSON record
// and the SVG chart (per suite, decode tok/s per prompt: dashed for plain decoding, solid for each
// speculative arm), each stating the roofline measured in the same run.
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "speculative/calibration.h"
#include "speculative/decode.h"

namespace dspark::cli {

// One generation.
struct TrialRun {
  double tok_s = 0.0;         // end to end: generated tokens over prefill + decode time
  double decode_tok_s = 0.0;  // tokens after the first over decode time
  double accept = 0.0;        // committed tokens per target forward after prefill
  int64_t generated = 0;
  int64_t peak_rss_bytes = 0;  // peak RSS during this generation alone
  // Same tokens as plain decoding of the same prompt; sampled speculative arms are not compared
  // (they keep the distribution, not the tokens: BenchmarkReport::compares_tokens).
  bool matches_plain = true;
  double speedup = 1.0;  // tok_s over plain decoding's tok_s in the same trial
};

struct PromptResult {
  std::string suite;
  std::string id;
  std::vector<TrialRun> trials;
  // Medians over the trials.
  double tok_s() const;
  double decode_tok_s() const;
  double accept() const;
  double speedup() const;
  int64_t peak_rss_bytes() const;  // the largest
  bool matches_plain() const;      // in every trial
};

struct ArmResult {
  std::string label;  // "baseline", "lookup", "dspark cap=2", "dspark cap=auto"
  DecodeMode mode = DecodeMode::baseline;
  std::string cap_choice;  // "", a number, "auto", "derived" or "derived-all", maybe + "+lookup"
  int cap = 0;             // the cap the arm started with
  std::vector<PromptResult> prompts;
  SpeculativeStats totals;  // summed over every generation of the arm

  // Means over the prompts of `suite` ("" = every suite: the mean of the suite means).
  double tok_s(const std::string& suite = "") const;
  double decode_tok_s(const std::string& suite = "") const;
  double accept(const std::string& suite = "") const;
  double speedup(const std::string& suite = "") const;
  int64_t peak_rss_bytes() const;
  std::vector<double> slot_acceptance() const;
};

// One arm at one load (--concurrency): `sequences` generations at once, each on its own prompt,
// stepped together, one batched target forward a step (decode_together, speculative/verify.h).
struct LoadRun {
  std::string arm;
  DecodeMode mode = DecodeMode::baseline;  // the arm's
  int sequences = 0;                       // generations at once (the closed loop's clients)
  int generations = 0;  // generations run per trial: every prompt, and at least `sequences`
  int64_t generated_tokens = 0;  // what they generated (the last trial)
  std::vector<double> tok_s;     // aggregate generated tokens over wall time, per trial
  std::vector<double> speedup;   // over the baseline arm at the same load, per trial
  // The same while every generation decodes (StepCounters::full_seconds): the steady rate of
  // `sequences` concurrent generations, per trial (0 when no step had them all decoding).
  std::vector<double> full_tok_s;
  std::vector<double> full_speedup;
  // The step-cost curve SPS(B): mean time of one batched step, and what the steps carried.
  double step_ms = 0.0;
  double sequences_per_step = 0.0;
  double rows_per_step = 0.0;
  int derived_cap = -1;  // the derived cap at this load (arms with the derived cap), else -1
  double drafts_per_round = 0.0;
  bool matches_plain = true;  // every generation equals plain decoding of its prompt alone

  double median_tok_s() const;
  double median_speedup() const;
  double median_full_tok_s() const;
  double median_full_speedup() const;
};

struct Roofline {
  int64_t bytes_per_token = 0;     // weights one decode step streams
  double bandwidth_1t_gbs = 0.0;   // measured read bandwidth, one thread
  double bandwidth_all_gbs = 0.0;  // measured read bandwidth, all threads
  double ceiling_tok_s() const;
};

struct BenchmarkReport {
  std::string version;
  std::string device;  // CPU model, ISA, threads
  std::string os;
  std::string target;
  std::string drafter;
  int drafter_bits = 0;  // the drafter's quantisation at load (0 = as stored)
  int threads = 0;
  int trials = 0;
  int64_t max_new_tokens = 0;
  float temperature = 0.0f;  // 0 = greedy
  uint64_t seed = 0;
  std::vector<std::string> suites;
  Roofline roofline;
  Calibration calibration;  // the target alone (no drafter costs)
  int calibration_max_cap = 0;
  int derived_cap = 0;  // from the calibration with the acceptance prior
  struct DrafterCalibration {
    std::string mode;
    Calibration calibration;
    int derived_cap = 0;
  };
  std::vector<DrafterCalibration> drafter_calibrations;      // per model-drafter mode
  std::vector<std::pair<std::string, std::string>> skipped;  // mode, why
  std::vector<ArmResult> arms;                               // arms[0] is plain decoding
  std::vector<LoadRun> loads;  // --concurrency, level by level, arms in order

  // "greedy", or "temperature 0.7, seed 3".
  std::string decoding() const;
  // Whether an arm's tokens must equal plain decoding's: greedy ones, and plain decoding's own
  // (seeded) under load.
  bool compares_tokens(DecodeMode arm_mode) const {
    return temperature <= 0.0f || arm_mode == DecodeMode::baseline;
  }
  // The costs that price `mode`'s rounds: its drafter's calibration, else the target's.
  const Calibration& calibration_for(DecodeMode mode) const;
};

// "  lookup                 41.2 tok/s e2e · 43.0 decode   accept 2.31 (1.21x)" and a line of
// per-suite figures.
std::string format_arm(const BenchmarkReport& report, const ArmResult& arm);
nlohmann::json report_json(const BenchmarkReport& report);
std::string report_svg(const BenchmarkReport& report);
// "  4 sequences  baseline  158.2 tok/s (1.00x) · step 22.4 ms, 3.9 sequences, 3.9 rows"
std::string format_load(const LoadRun& load);
// Aggregate tok/s against the load, one line per arm (log2 axis of sequences).
std::string concurrency_svg(const BenchmarkReport& report);

}  // namespace dspark::cli
