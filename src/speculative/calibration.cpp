#include "speculative/calibration.h"

#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <numeric>
#include <random>

#include "base/error.h"
#include "base/file_io.h"
#include "base/system_info.h"
#include "base/thread_pool.h"
#include "forward_fingerprint.h"
#include "kernels/ops.h"
#include "kernels/quant.h"

namespace dspark {
namespace {

// 2: verify rows are distinct tokens. 3: the drafter's depth slope (drafter_depth).
constexpr int kSchemaVersion = 3;
// The synthetic prompt: one token id repeated (§16.1).
constexpr int32_t kSyntheticToken = 7;
// Verify rows step through the vocabulary by this prime: a MoE verify streams the union of the
// experts its rows route to (docs/performance.md §4), and rows of one repeated token would all
// route alike and understate it.
constexpr int64_t kVerifyRowStride = 7919;

double median_ms(std::vector<double> seconds) {
  std::sort(seconds.begin(), seconds.end());
  const size_t n = seconds.size();
  const double middle = n % 2 == 1 ? seconds[n / 2] : 0.5 * (seconds[n / 2 - 1] + seconds[n / 2]);
  return middle * 1000.0;
}

struct Repeats {
  int warmups = 0;
  int iterations = 0;
};

// The median milliseconds of each of `items` (each runs once and returns its seconds). The items
// take turns, once each per round, so that a slow spell of the machine (a neighbour on a shared
// VM) lands on all of them alike instead of bending the curves, whose shape (what a wider verify
// or a longer draft costs over a narrower one) is what the derived cap reads.
std::vector<double> interleaved_ms(Repeats repeats,
                                   const std::vector<std::function<double()>>& items) {
  std::vector<std::vector<double>> seconds(items.size());
  for (int round = 0; round < repeats.warmups + repeats.iterations; ++round) {
    for (size_t i = 0; i < items.size(); ++i) {
      const double elapsed = items[i]();
      if (round >= repeats.warmups) seconds[i].push_back(elapsed);
    }
  }
  std::vector<double> ms;
  for (std::vector<double>& times : seconds) ms.push_back(median_ms(std::move(times)));
  return ms;
}

// The seconds `body` takes.
template <typename Body>
double seconds_of(Body body) {
  const double start = now_seconds();
  body();
  return now_seconds() - start;
}

struct Measurer {
  const Model& target;
  const CalibrationOptions& options;
  std::vector<int> taps;
  ModelState state;
  ForwardOutput output;
  std::vector<int32_t> rows;
  std::vector<int64_t> logit_rows;

  // One tapped verify forward of `width` rows, timed, and rolled back afterwards (recording on,
  // as the verify loop has it). Width 1 cannot be rolled back on recurrent models, so it simply
  // advances the state.
  double verify_once(int width) {
    const int64_t length = state.length();
    rows.resize(width);
    for (int i = 0; i < width; ++i) {
      rows[i] =
          static_cast<int32_t>((kSyntheticToken + kVerifyRowStride * i) % target.vocab_size());
    }
    logit_rows.resize(width);
    std::iota(logit_rows.begin(), logit_rows.end(), 0);
    state.set_recording(width > 1);
    const double elapsed =
        seconds_of([&] { target.forward(rows.data(), width, state, logit_rows, taps, output); });
    if (width > 1) state.trim(length);
    return elapsed;
  }

  // Items for interleaved_ms: a verify forward at each of `widths` (width 1 last: it advances
  // the state).
  std::vector<std::function<double()>> verify_items(const std::vector<int>& widths) {
    std::vector<std::function<double()>> items;
    for (int width : widths) items.push_back([this, width] { return verify_once(width); });
    return items;
  }

  // Moves the context to `tokens` positions without computing them: attention over synthetic
  // (zero) keys costs what attention over real ones costs, and recurrent layers do not depend on
  // the depth at all.
  void inflate_to(int64_t tokens) {
    state.set_recording(false);
    state.reserve(tokens + options.max_width);
    state.begin_forward(tokens - state.length());
    state.advance(tokens - state.length());
    state.end_forward();
  }
};

// A cached calibration holds only while the machine runs as it did when it was measured: one
// taken while other work loaded the cores prices drafts out for as long as it is cached. So the
// fastest of a few width-1 forwards at the reference context, timed now, checks it, and a cache
// slower than that by more than both kStaleRatio and kStaleMs is measured again. Only that
// direction counts: a forward timed now can always be slowed by a neighbour or a late thread
// wake-up, so a cache faster than now proves nothing, and the margins keep the noise of
// sub-millisecond forwards out.
constexpr double kStaleRatio = 1.5;
constexpr double kStaleMs = 1.0;
constexpr int kStaleChecks = 3;

double width1_now_ms(const Model& target, const CalibrationOptions& options) {
  Measurer m{target, options, {}, target.new_state(), {}, {}, {}};
  m.inflate_to(options.context);
  m.verify_once(1);  // warm-up
  double fastest = m.verify_once(1);
  for (int i = 1; i < kStaleChecks; ++i) fastest = std::min(fastest, m.verify_once(1));
  return fastest * 1000.0;
}

bool cache_is_stale(double cached_ms, double now_ms) {
  return cached_ms - now_ms > kStaleMs && cached_ms > kStaleRatio * now_ms;
}

int64_t deep_context(const Model& target, const CalibrationOptions& options) {
  const int64_t limit =
      target.max_context() - 2 * options.max_width - options.deep_warmups - options.deep_iterations;
  return std::min(options.deep_context, limit);
}

CostCurves measure(const Model& target, const DrafterFactory& make_drafter,
                   const CalibrationOptions& options) {
  std::unique_ptr<Drafter> drafter = make_drafter ? make_drafter() : nullptr;
  const Repeats repeats{options.warmups, options.iterations};
  Measurer m{
      target, options, drafter ? drafter->tap_layers() : std::vector<int>{}, target.new_state(), {},
      {},     {}};
  CostCurves curves;
  curves.reference_context = options.context;

  // The context is synthetic too: verify costs do not depend on what the cache holds, and the
  // drafter's context is random rows (§16.1), so no prefill is spent on it.
  const std::vector<int32_t> prompt(options.context, kSyntheticToken);
  m.inflate_to(options.context);
  std::vector<float> taps;
  if (drafter) {
    std::mt19937 engine(7);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    taps.resize(options.context * m.taps.size() * target.hidden_size());
    for (float& value : taps) value = normal(engine);
    drafter->on_target_rows(prompt.data(), options.context, taps.data());
  }

  // Taking turns (interleaved_ms): verify widths 2 .. max_width, the drafter per cap, a whole
  // round, and width 1, which like the round advances the state by a token.
  std::vector<int> widths;
  for (int width = 2; width <= options.max_width; ++width) widths.push_back(width);
  std::vector<std::function<double()>> items = m.verify_items(widths);

  // Drafter cost per cap against the 512-row context; drafting does not touch the target state.
  const int max_cap = options.max_width - 1;
  std::vector<int32_t> committed = prompt;
  committed.push_back(kSyntheticToken);
  SamplingParams greedy;
  Rng rng(0);
  if (drafter) {
    for (int cap = 1; cap <= max_cap; ++cap) {
      items.push_back([&, cap] {
        return seconds_of([&] { drafter->propose(DraftRequest{committed, cap, greedy, rng}); });
      });
    }
  }

  // A whole round at cap 2 as the loop runs it: draft, verify, pick per row, roll back to the
  // accept point (one row kept, so the context grows by one token per run), feed the drafter the
  // kept row.
  const int64_t vocab = target.vocab_size();
  items.push_back([&] {
    return seconds_of([&] {
      Draft draft;
      if (drafter) draft = drafter->propose(DraftRequest{committed, 2, greedy, rng});
      draft.tokens.resize(2, kSyntheticToken);
      const int64_t length = m.state.length();
      m.rows = {kSyntheticToken, draft.tokens[0], draft.tokens[1]};
      m.logit_rows = {0, 1, 2};
      m.state.set_recording(true);
      target.forward(m.rows.data(), 3, m.state, m.logit_rows, m.taps, m.output);
      for (int64_t row = 0; row < 3; ++row) argmax(m.output.logits.data() + row * vocab, vocab);
      m.state.trim(length + 1);
      if (drafter) drafter->on_target_rows(m.rows.data(), 1, m.output.taps.data());
      committed.push_back(kSyntheticToken);  // the next pending token
    });
  });
  items.push_back([&] { return m.verify_once(1); });

  const std::vector<double> ms = interleaved_ms(repeats, items);
  curves.verify_ms.assign(options.max_width, 0.0);
  for (size_t i = 0; i < widths.size(); ++i) curves.verify_ms[widths[i] - 1] = ms[i];
  if (drafter) {
    curves.drafter_ms.assign(ms.begin() + widths.size(), ms.begin() + widths.size() + max_cap);
  }
  const double round_ms = ms[ms.size() - 2];
  curves.verify_ms[0] = ms.back();
  curves.fit();
  curves.overhead_ms = std::max(0.0, round_ms - (curves.drafter(2) + curves.verify(3)));

  // Depth slope at the narrowest, middle and widest width.
  const int64_t deep = deep_context(target, options);
  if (deep > options.context + 64) {
    m.inflate_to(deep);
    const std::vector<int> deep_widths = {options.max_width, (1 + options.max_width) / 2, 1};
    const std::vector<double> measured = interleaved_ms(
        Repeats{options.deep_warmups, options.deep_iterations}, m.verify_items(deep_widths));
    // Ascending widths for the slope table.
    const std::vector<int> widths(deep_widths.rbegin(), deep_widths.rend());
    const std::vector<double> deep_ms(measured.rbegin(), measured.rend());
    for (size_t i = 0; i < widths.size(); ++i) {
      if (!curves.slope_widths.empty() && curves.slope_widths.back() == widths[i]) continue;
      curves.slope_widths.push_back(widths[i]);
      curves.slope_ms_per_token.push_back(
          std::max(0.0, (deep_ms[i] - curves.verify(widths[i])) / double(deep - options.context)));
    }
    // The drafter at the same depth: its context grown to the target's with the random rows it
    // was first given (a block's attention costs the same over any rows), then a draft of the
    // widest cap timed.
    if (drafter) {
      const int64_t prompt_rows = options.context;
      while (static_cast<int64_t>(committed.size()) - 1 < deep) {
        const int64_t rows =
            std::min(prompt_rows, deep - (static_cast<int64_t>(committed.size()) - 1));
        drafter->on_target_rows(prompt.data(), rows, taps.data());
        committed.insert(committed.end(), rows, kSyntheticToken);
      }
      const std::vector<double> deep_draft =
          interleaved_ms(Repeats{options.deep_warmups, options.deep_iterations}, {[&] {
                           return seconds_of([&] {
                             drafter->propose(DraftRequest{committed, max_cap, greedy, rng});
                           });
                         }});
      curves.drafter_slope_ms_per_token =
          std::max(0.0, (deep_draft[0] - curves.drafter(max_cap)) / double(deep - options.context));
    }
  }
  return curves;
}

nlohmann::json series_json(const std::vector<double>& values) {
  nlohmann::json out = nlohmann::json::object();
  for (size_t i = 0; i < values.size(); ++i) out[std::to_string(i + 1)] = values[i];
  return out;
}

std::vector<double> series_from_json(const nlohmann::json& json, const std::string& field,
                                     const std::string& source) {
  if (!json.is_object()) fail("{}: '{}' must be an object of index -> milliseconds", source, field);
  std::vector<double> values(json.size());
  for (auto& [key, value] : json.items()) {
    size_t index = 0;
    try {
      index = std::stoul(key);
    } catch (const std::exception&) {
      fail("{}: '{}' has a non-numeric key '{}'", source, field, key);
    }
    if (index < 1 || index > values.size() || !value.is_number()) {
      fail("{}: '{}' entry '{}' is out of range or not a number", source, field, key);
    }
    values[index - 1] = value.get<double>();
  }
  return values;
}

nlohmann::json read_cache(const std::string& path) {
  std::ifstream in(path);
  if (!in) return nlohmann::json::object();
  nlohmann::json cache = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  // A damaged cache is re-measured rather than fatal: it only ever holds measurements.
  return cache.is_object() ? cache : nlohmann::json::object();
}

void write_cache(const std::string& path, const nlohmann::json& cache) {
  const std::filesystem::path target(path);
  if (target.has_parent_path()) std::filesystem::create_directories(target.parent_path());
  const std::string temporary = path + ".tmp." + std::to_string(getpid());
  {
    std::ofstream out(temporary);
    if (!out) fail("cannot write the calibration cache {}", temporary);
    out << cache.dump(2) << "\n";
    if (!out) fail("cannot write the calibration cache {}", temporary);
  }
  std::filesystem::rename(temporary, target);
}

}  // namespace

std::string default_calibration_cache_path() {
  if (const char* xdg = std::getenv("XDG_CACHE_HOME"); xdg != nullptr && *xdg != '\0') {
    return std::string(xdg) + "/dspark/calibration.json";
  }
  const char* home = std::getenv("HOME");
  return std::string(home != nullptr ? home : ".") + "/.cache/dspark/calibration.json";
}

std::string drafter_calibration_name(const std::string& directory) {
  namespace fs = std::filesystem;
  // FNV-1a: the digest only has to tell drafters apart within one cache file.
  uint64_t digest = 0xcbf29ce484222325ULL;
  const auto mix = [&digest](std::string_view bytes) {
    for (const char byte : bytes) {
      digest = (digest ^ static_cast<unsigned char>(byte)) * 0x100000001b3ULL;
    }
  };
  fs::path root(directory);
  if (!root.has_filename()) root = root.parent_path();  // "head/" names "head"
  std::error_code error;
  if (fs::is_regular_file(root / "config.json", error)) {
    mix(read_file((root / "config.json").string()));
  }
  std::vector<std::string> weights;
  for (const fs::directory_entry& entry : fs::directory_iterator(root, error)) {
    const std::string name = entry.path().filename().string();
    if (name.ends_with(".safetensors")) {
      weights.push_back(fmt::format("{}:{}", name, entry.file_size(error)));
    }
  }
  std::sort(weights.begin(), weights.end());
  for (const std::string& weight : weights) mix(weight + "\n");
  return fmt::format("{}#{:016x}", root.filename().string(), digest);
}

std::string calibration_key(const Model& target, const CalibrationOptions& options) {
  const nlohmann::json& config = target.checkpoint().config();
  std::string quant = "unquantized";
  for (const char* field : {"quantization", "quantization_config"}) {
    if (config.contains(field) && config[field].is_object()) {
      quant = fmt::format("q{}g{}", config[field].value("bits", 0),
                          config[field].value("group_size", 0));
      break;
    }
  }
  return fmt::format(
      "v{}|fw {}|cpu {}|{}|{}|kv {}|t{}|{}|{}|{}|{}|b{}|ctx{}|w{}", kSchemaVersion,
      kForwardFingerprint, cpu_features().model_name, kernels::isa_name(kernels::best_isa()),
      kernels::numerics_name(kernels::numerics()), kernels::kv_type_name(kernels::kv_cache_type()),
      default_pool().num_threads(), options.mode, options.target_name,
      options.drafter_name.empty()
          ? "-"
          : fmt::format(
                "{}@{}", options.drafter_name,
                options.drafter_bits > 0 ? fmt::format("q{}", options.drafter_bits) : "stored"),
      quant, target.decode_weight_bytes(), options.context, options.max_width);
}

Calibration calibrate(const Model& target, const DrafterFactory& drafter,
                      const CalibrationOptions& options) {
  if (options.max_width < 3)
    fail("calibration needs verify widths up to at least 3, not {}", options.max_width);
  // The round and the width-1 timings each leave one token per run in the context.
  if (options.context + options.max_width + 2 * (options.warmups + options.iterations) >=
      target.max_context()) {
    fail("calibration needs a {}-token context; the model allows {}", options.context,
         target.max_context());
  }
  Calibration result;
  result.key = calibration_key(target, options);
  const std::string path =
      options.cache_path.empty() ? default_calibration_cache_path() : options.cache_path;
  if (options.use_cache) {
    const nlohmann::json cache = read_cache(path);
    if (cache.contains(result.key)) {
      CostCurves cached = cost_curves_from_json(cache[result.key], path + " [" + result.key + "]");
      const StaleCache check{cached.verify(1), width1_now_ms(target, options)};
      if (!cache_is_stale(check.cached_ms, check.now_ms)) {
        result.curves = std::move(cached);
        result.from_cache = true;
        return result;
      }
      result.stale = check;
    }
  }
  const double start = now_seconds();
  result.curves = measure(target, drafter, options);
  result.seconds = now_seconds() - start;
  nlohmann::json cache = read_cache(path);
  cache[result.key] = cost_curves_json(result.curves);
  write_cache(path, cache);
  return result;
}

CalibratedCaps calibrated_cap_policy(const Model& target, const DrafterFactory& drafter,
                                     const CalibrationOptions& options, int max_cap,
                                     bool allow_parking) {
  CalibrationOptions sized = options;
  sized.max_width = std::max(max_cap + 1, 3);
  CalibratedCaps caps;
  CostCurves curves;
  try {
    curves = calibrate(target, drafter, sized).curves;
    caps.derived_cap = derive_cap(curves, max_cap);
  } catch (const Error& e) {
    caps.error = e.what();
  }
  caps.lookup_policy = make_lookup_cap_policy_factory(curves);
  caps.policy = make_cap_policy_factory(std::move(curves), max_cap, allow_parking);
  return caps;
}

CalibratedCaps calibrated_lookup_cap_policy(const Model& target,
                                            const CalibrationOptions& options) {
  CalibratedCaps caps;
  CostCurves curves;
  try {
    curves = calibrate(target, DrafterFactory{}, options).curves;
  } catch (const Error& e) {
    caps.error = e.what();
  }
  caps.policy = make_lookup_cap_policy_factory(std::move(curves));
  caps.lookup_policy = caps.policy;
  return caps;
}

nlohmann::json cost_curves_json(const CostCurves& curves) {
  nlohmann::json out;
  out["verify"] = series_json(curves.verify_ms);
  if (!curves.drafter_ms.empty()) out["drafter"] = series_json(curves.drafter_ms);
  out["overhead"] = curves.overhead_ms;
  nlohmann::json slope = nlohmann::json::object();
  for (size_t i = 0; i < curves.slope_widths.size(); ++i) {
    slope[std::to_string(curves.slope_widths[i])] = curves.slope_ms_per_token[i];
  }
  out["verify_depth"] = {{"d0", curves.reference_context}, {"slope", slope}};
  if (!curves.drafter_ms.empty()) out["drafter_depth"] = curves.drafter_slope_ms_per_token;
  return out;
}

CostCurves cost_curves_from_json(const nlohmann::json& json, const std::string& source) {
  if (!json.is_object() || !json.contains("verify") || !json.contains("overhead") ||
      !json.contains("verify_depth")) {
    fail("{}: expected an object with 'verify', 'overhead' and 'verify_depth'", source);
  }
  CostCurves curves;
  curves.verify_ms = series_from_json(json["verify"], "verify", source);
  if (curves.verify_ms.empty()) fail("{}: 'verify' is empty", source);
  if (json.contains("drafter"))
    curves.drafter_ms = series_from_json(json["drafter"], "drafter", source);
  if (!json["overhead"].is_number()) fail("{}: 'overhead' must be a number", source);
  curves.overhead_ms = json["overhead"].get<double>();
  const nlohmann::json& depth = json["verify_depth"];
  if (!depth.is_object() || !depth.contains("d0") || !depth["d0"].is_number_integer() ||
      !depth.contains("slope") || !depth["slope"].is_object()) {
    fail("{}: 'verify_depth' must hold an integer 'd0' and a 'slope' object", source);
  }
  curves.reference_context = depth["d0"].get<int64_t>();
  std::vector<std::pair<int, double>> slopes;
  for (auto& [key, value] : depth["slope"].items()) {
    if (!value.is_number()) fail("{}: verify_depth slope '{}' is not a number", source, key);
    try {
      slopes.emplace_back(std::stoi(key), value.get<double>());
    } catch (const std::invalid_argument&) {
      fail("{}: verify_depth slope key '{}' is not a width", source, key);
    }
  }
  std::sort(slopes.begin(), slopes.end());
  for (const auto& [width, slope] : slopes) {
    curves.slope_widths.push_back(width);
    curves.slope_ms_per_token.push_back(slope);
  }
  if (json.contains("drafter_depth")) {
    if (!json["drafter_depth"].is_number()) fail("{}: 'drafter_depth' must be a number", source);
    curves.drafter_slope_ms_per_token = json["drafter_depth"].get<double>();
  }
  curves.fit();
  return curves;
}

}  // namespace dspark
