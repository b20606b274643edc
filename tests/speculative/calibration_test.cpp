// Calibration on a tiny hybrid (Mamba + attention + MoE) model: every cost is measured, the
// recurrent state survives the roll-backs between iterations, results are cached per key and read
// back unchanged, a cache the machine no longer matches is measured again, and a damaged cache
// entry is refused by name.
#include "speculative/calibration.h"

#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <fstream>

#include "base/error.h"
#include "forward_fingerprint.h"
#include "spec_models.h"
#include "speculative/lookup.h"

namespace dspark {
namespace {

class Calibrate : public ::testing::Test {
 protected:
  void SetUp() override {
    testing::fill_nemotron(checkpoint_, "M*EM-");
    checkpoint_.config["max_position_embeddings"] = 2048;
    model_ = load_model(checkpoint_.write());
    cache_ = (std::filesystem::temp_directory_path() /
              ("dspark_calibration_" + std::to_string(getpid()) + ".json"))
                 .string();
    std::filesystem::remove(cache_);
    options_.cache_path = cache_;
    options_.target_name = "tiny";
    options_.context = 128;
    options_.deep_context = 1024;
    options_.warmups = 1;
    options_.iterations = 3;
  }
  void TearDown() override { std::filesystem::remove(cache_); }

  testing::TinyCheckpoint checkpoint_{11};
  std::unique_ptr<Model> model_;
  std::string cache_;
  CalibrationOptions options_;
};

TEST_F(Calibrate, MeasuresEveryCostAndCachesIt) {
  const DrafterFactory lookup = [] { return std::make_unique<LookupDrafter>(); };
  options_.mode = "dspark";
  options_.drafter_name = "lookup-as-drafter";
  const Calibration first = calibrate(*model_, lookup, options_);
  EXPECT_FALSE(first.from_cache);
  ASSERT_EQ(first.curves.verify_ms.size(), 8u);
  for (double ms : first.curves.verify_ms) EXPECT_GT(ms, 0.0);
  ASSERT_EQ(first.curves.drafter_ms.size(), 7u);
  for (double ms : first.curves.drafter_ms) EXPECT_GT(ms, 0.0);
  EXPECT_GE(first.curves.overhead_ms, 0.0);
  EXPECT_EQ(first.curves.slope_widths, (std::vector<int>{1, 4, 8}));
  EXPECT_EQ(first.curves.reference_context, 128);
  EXPECT_NE(first.key.find("lookup-as-drafter"), std::string::npos);

  Calibration cached = first;
  Calibration second = calibrate(*model_, lookup, options_);
  for (int remeasured = 0; second.stale && remeasured < 4; ++remeasured) {
    // The cached entry was timed in a slow spell (a neighbouring test on the same cores): the
    // stale check measured again and replaced it, and that entry is what the next call reads.
    EXPECT_FALSE(second.from_cache);
    cached = second;
    second = calibrate(*model_, lookup, options_);
  }
  EXPECT_TRUE(second.from_cache);
  EXPECT_EQ(second.key, first.key);
  EXPECT_EQ(second.curves.verify_ms, cached.curves.verify_ms);
  EXPECT_EQ(second.curves.drafter_ms, cached.curves.drafter_ms);
  EXPECT_EQ(second.curves.slope_ms_per_token, cached.curves.slope_ms_per_token);
  EXPECT_EQ(second.curves.drafter_slope_ms_per_token, cached.curves.drafter_slope_ms_per_token);

  // Another mode is another key: measured again, and both stay in the file.
  CalibrationOptions lookup_mode = options_;
  lookup_mode.mode = "lookup";
  lookup_mode.drafter_name.clear();
  const Calibration other = calibrate(*model_, DrafterFactory{}, lookup_mode);
  EXPECT_FALSE(other.from_cache);
  EXPECT_TRUE(other.curves.drafter_ms.empty());
  std::ifstream in(cache_);
  const nlohmann::json cache = nlohmann::json::parse(in);
  EXPECT_TRUE(cache.contains(first.key));
  EXPECT_TRUE(cache.contains(other.key));
}

// A drafter whose every draft costs 20 us per context row it holds, as a block attending over its
// context does, so that the depth slope calibration should find is known. At 5 us a row the
// difference between the depths (4.5 ms) was near a scheduler slice, and one run of the suite on
// two busy cores failed it.
class DepthCostDrafter : public Drafter {
 public:
  std::string name() const override { return "depth-cost"; }
  void on_target_rows(const int32_t* /*tokens*/, int64_t n, const float* /*taps*/) override {
    rows_ += n;
  }
  int64_t context_rows() const override { return rows_; }
  Draft propose(const DraftRequest& request) override {
    const auto until = std::chrono::steady_clock::now() + std::chrono::microseconds(20 * rows_);
    while (std::chrono::steady_clock::now() < until) {
    }
    Draft draft;
    draft.tokens.assign(request.cap, request.committed.back());
    return draft;
  }

 private:
  int64_t rows_ = 0;
};

TEST_F(Calibrate, TimesDraftingAgainAtTheDeepContext) {
  const DrafterFactory drafter = [] { return std::make_unique<DepthCostDrafter>(); };
  options_.mode = "dspark";
  options_.drafter_name = "depth-cost";
  // Medians of 7 and 5: a spin preempted on an oversubscribed machine ends slices late, and one
  // such shallow median among 3 samples once left the slope at a sixth of its value.
  options_.iterations = 7;
  options_.deep_iterations = 5;
  const Calibration calibration = calibrate(*model_, drafter, options_);
  // 20 us a row: its context grown from 128 rows to the deep 1,024, a draft costs at least 17.9 ms
  // more (a spin ends at its deadline or later; on cores shared with other tests, up to a few
  // scheduler slices later, so the upper bound only rules out a wrong scale).
  EXPECT_GT(calibration.curves.drafter_slope_ms_per_token, 0.014);
  EXPECT_LT(calibration.curves.drafter_slope_ms_per_token, 0.4);
  EXPECT_GT(calibration.curves.drafter(7, 1024) - calibration.curves.drafter(7, 128), 12.0);
}

// A drafter quantised at another width drafts at another cost: --drafter-bits keys its own curves.
TEST_F(Calibrate, TheDrafterQuantisationIsPartOfTheKey) {
  CalibrationOptions four_bits = options_;
  four_bits.mode = "dspark";
  four_bits.drafter_name = "head";
  four_bits.drafter_bits = 4;
  CalibrationOptions eight_bits = four_bits, as_stored = four_bits;
  eight_bits.drafter_bits = 8;
  as_stored.drafter_bits = 0;
  const std::string key = calibration_key(*model_, four_bits);
  EXPECT_NE(key.find("|head@q4|"), std::string::npos) << key;
  EXPECT_NE(calibration_key(*model_, eight_bits), key);
  EXPECT_NE(calibration_key(*model_, as_stored).find("|head@stored|"), std::string::npos);
  // Without a drafter the bits mean nothing.
  CalibrationOptions lookup = four_bits;
  lookup.drafter_name.clear();
  EXPECT_NE(calibration_key(*model_, lookup).find("|-|"), std::string::npos);
}

// A head reshaped in place drafts at its own cost: the key follows its config and weight files,
// not only its directory's name.
TEST(DrafterCalibrationName, FollowsTheConfigAndTheWeightFiles) {
  namespace fs = std::filesystem;
  const fs::path root =
      fs::temp_directory_path() / ("dspark_drafter_name_" + std::to_string(getpid()));
  const fs::path head = root / "a" / "head", twin = root / "b" / "head";
  for (const fs::path& directory : {head, twin}) {
    fs::create_directories(directory);
    std::ofstream(directory / "config.json") << R"({"num_hidden_layers": 1})";
    std::ofstream(directory / "model.safetensors") << std::string(64, 'x');
  }
  const std::string name = drafter_calibration_name(head.string());
  EXPECT_EQ(name.substr(0, 5), "head#") << name;
  EXPECT_EQ(drafter_calibration_name(twin.string()), name);
  EXPECT_EQ(drafter_calibration_name(head.string() + "/"), name);

  std::ofstream(twin / "config.json") << R"({"num_hidden_layers": 2})";
  EXPECT_NE(drafter_calibration_name(twin.string()), name);
  std::ofstream(twin / "config.json") << R"({"num_hidden_layers": 1})";
  std::ofstream(twin / "model.safetensors") << std::string(96, 'x');
  EXPECT_NE(drafter_calibration_name(twin.string()), name);
  fs::remove_all(root);
}

// A cache written while the machine was loaded (here: every verify 1,000 times slower than this
// model runs) no longer matches a width-1 forward timed now, so it is measured again and replaced.
TEST_F(Calibrate, AStaleCacheIsMeasuredAgain) {
  const Calibration first = calibrate(*model_, DrafterFactory{}, options_);
  nlohmann::json cache;
  {
    std::ifstream in(cache_);
    cache = nlohmann::json::parse(in);
  }
  for (auto& [width, ms] : cache[first.key]["verify"].items()) ms = ms.get<double>() * 1000.0;
  {
    std::ofstream out(cache_);
    out << cache.dump();
  }
  const Calibration again = calibrate(*model_, DrafterFactory{}, options_);
  EXPECT_FALSE(again.from_cache);
  ASSERT_TRUE(again.stale.has_value());
  EXPECT_DOUBLE_EQ(again.stale->cached_ms, cache[first.key]["verify"]["1"].get<double>());
  EXPECT_LT(again.stale->now_ms, again.stale->cached_ms / 10.0);
  EXPECT_LT(again.curves.verify(1), again.stale->cached_ms / 10.0);

  // The re-measured curves replaced the stale ones in the file. (Read from the file: a third
  // calibrate() may find the machine faster again than in the minute `again` measured, on a busy
  // machine, and re-measure.)
  std::ifstream in(cache_);
  const nlohmann::json replaced = nlohmann::json::parse(in);
  EXPECT_EQ(cost_curves_from_json(replaced[first.key], cache_).verify_ms, again.curves.verify_ms);
}

TEST_F(Calibrate, CapPolicyUsesTheMeasuredCurvesOrFallsBackToTwo) {
  const CalibratedCaps caps = calibrated_cap_policy(*model_, DrafterFactory{}, options_, 7, true);
  EXPECT_EQ(caps.error, "");
  // The curves the policy measured, read from the cache file it wrote: a second calibrate() can
  // find them stale on a loaded machine (an ASan build on a busy VM did) and measure others.
  CalibrationOptions sized = options_;
  sized.max_width = 8;
  std::ifstream in(cache_);
  const nlohmann::json cache = nlohmann::json::parse(in);
  const std::string key = calibration_key(*model_, sized);
  ASSERT_TRUE(cache.contains(key));
  // A build with other kernels or flags keys its own costs.
  EXPECT_NE(key.find(std::string("|fw ") + kForwardFingerprint + "|"), std::string::npos) << key;
  EXPECT_EQ(caps.derived_cap, derive_cap(cost_curves_from_json(cache[key], cache_), 7));
  EXPECT_EQ(caps.policy(DecodeOptions{})->cap_for_round(), caps.derived_cap);

  CalibrationOptions too_long = options_;
  too_long.context = 4096;  // beyond the model's 2048 positions
  const CalibratedCaps fallback =
      calibrated_cap_policy(*model_, DrafterFactory{}, too_long, 7, true);
  EXPECT_NE(fallback.error.find("context"), std::string::npos);
  EXPECT_EQ(fallback.derived_cap, 2);
  DecodeOptions automatic;
  automatic.auto_cap = true;
  EXPECT_EQ(fallback.policy(DecodeOptions{})->cap_for_round(), 2);
  EXPECT_EQ(fallback.policy(automatic)->cap_for_round(), 2);
}

TEST(CostCurvesJson, RoundTripsAndRefusesDamage) {
  CostCurves curves;
  curves.verify_ms = {10, 11.5, 13};
  curves.drafter_ms = {1, 2};
  curves.overhead_ms = 0.25;
  curves.slope_widths = {1, 3};
  curves.slope_ms_per_token = {0.001, 0.003};
  curves.drafter_slope_ms_per_token = 0.0005;
  const CostCurves back = cost_curves_from_json(cost_curves_json(curves), "test");
  EXPECT_EQ(back.verify_ms, curves.verify_ms);
  EXPECT_EQ(back.drafter_ms, curves.drafter_ms);
  EXPECT_EQ(back.overhead_ms, curves.overhead_ms);
  EXPECT_EQ(back.slope_widths, curves.slope_widths);
  EXPECT_EQ(back.slope_ms_per_token, curves.slope_ms_per_token);
  EXPECT_EQ(back.drafter_slope_ms_per_token, curves.drafter_slope_ms_per_token);

  nlohmann::json wrong_slope = cost_curves_json(curves);
  wrong_slope["drafter_depth"] = "steep";
  EXPECT_THROW(cost_curves_from_json(wrong_slope, "x"), Error);
  nlohmann::json damaged = cost_curves_json(curves);
  damaged["verify"]["7"] = 3.0;
  try {
    cost_curves_from_json(damaged, "cache.json [key]");
    FAIL() << "a verify width past the series was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("cache.json [key]"), std::string::npos);
    EXPECT_NE(std::string(e.what()).find("verify"), std::string::npos);
  }
  EXPECT_THROW(cost_curves_from_json(nlohmann::json::object(), "x"), Error);
}

}  // namespace
}  // namespace dspark
