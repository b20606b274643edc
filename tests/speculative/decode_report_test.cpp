// The figures generate prints and the server returns, from known statistics.
#include "speculative/decode_report.h"

#include <gtest/gtest.h>

namespace dspark {
namespace {

GenerationStats generation() {
  GenerationStats stats;
  stats.prompt_tokens = 20;
  stats.generated_tokens = 41;
  stats.prefill_seconds = 0.5;
  stats.decode_seconds = 2.0;
  stats.peak_rss_bytes = 1'500'000'000;
  return stats;
}

DecodeStats lookup_stats() {
  DecodeStats decode;
  decode.mode = DecodeMode::lookup;
  decode.cap = 6;
  SpeculativeStats& spec = decode.speculative;
  spec.rounds = 10;
  spec.plain_steps = 6;
  spec.drafted = 30;
  spec.accepted = 15;
  spec.position_verified = {10, 10, 10};
  spec.position_accepted = {8, 5, 2};
  return decode;
}

TEST(DecodeReport, PlainDecodingFooter) {
  DecodeStats plain;
  EXPECT_EQ(format_decode_stats(plain, generation()),
            "Prompt: 20 tokens, 40.0 tokens-per-sec\n"
            "Generation: 41 tokens, 20.0 tokens-per-sec (16.4 end to end)\n"
            "Peak memory: 1.500 GB");
  const nlohmann::json json = decode_stats_json(plain, generation());
  EXPECT_EQ(json["mode"], "baseline");
  EXPECT_DOUBLE_EQ(json["accept"].get<double>(), 1.0);
  EXPECT_DOUBLE_EQ(json["tok_s"].get<double>(), 41 / 2.5);
  EXPECT_FALSE(json.contains("slot_acceptance"));
}

TEST(DecodeReport, SpeculativeFooterAndJson) {
  // 40 tokens after the first over 16 target forwards = 2.5 tokens per round.
  EXPECT_EQ(
      format_decode_stats(lookup_stats(), generation()),
      "Prompt: 20 tokens, 40.0 tokens-per-sec\n"
      "Generation: 41 tokens, 20.0 tokens-per-sec (16.4 end to end)\n"
      "Speculative: lookup, cap 6, 10 rounds + 6 plain steps, 2.50 tokens/round, 50% of drafts "
      "accepted\n"
      "Acceptance by slot: 0.80 0.50 0.20\n"
      "Peak memory: 1.500 GB");
  const nlohmann::json json = decode_stats_json(lookup_stats(), generation());
  EXPECT_EQ(json["mode"], "lookup");
  EXPECT_EQ(json["cap"], 6);
  EXPECT_DOUBLE_EQ(json["accept"].get<double>(), 2.5);
  EXPECT_EQ(json["slot_acceptance"].get<std::vector<double>>(),
            (std::vector<double>{0.8, 0.5, 0.2}));
  EXPECT_DOUBLE_EQ(json["acceptance_rate"].get<double>(), 0.5);
  EXPECT_EQ(json["unverified"], 0);
}

// Drafts the confidence schedule made and then did not verify are counted in the footer and the
// JSON.
TEST(DecodeReport, CountsTheDraftsNotVerified) {
  DecodeStats stats = lookup_stats();
  stats.speculative.unverified = 7;
  const std::string footer = format_decode_stats(stats, generation());
  EXPECT_NE(footer.find("50% of drafts accepted, 7 drafts not verified\n"), std::string::npos)
      << footer;
  EXPECT_EQ(decode_stats_json(stats, generation())["unverified"], 7);
}

}  // namespace
}  // namespace dspark
