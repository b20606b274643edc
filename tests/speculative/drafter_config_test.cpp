// Drafter config.json values are range checked by field name before any tensor is bound.
#include <gtest/gtest.h>

#include <cstring>
#include <functional>

#include "../error_of.h"
#include "../model/tiny_checkpoint.h"
#include "base/error.h"
#include "formats/checkpoint.h"
#include "kernels/quant.h"
#include "speculative/drafter_loader.h"

namespace dspark {
namespace {

using nlohmann::json;

// A DeepSpec-schema DSpark drafter config that loads.
json dspark_config() {
  return {{"model_type", "qwen3"},
          {"hidden_size", 64},
          {"vocab_size", 96},
          {"num_hidden_layers", 1},
          {"intermediate_size", 128},
          {"num_attention_heads", 4},
          {"num_key_value_heads", 2},
          {"head_dim", 16},
          {"block_size", 8},
          {"mask_token_id", 95},
          {"target_layer_ids", {0, 2}},
          {"markov_rank", 16}};
}

// A z-lab DFlash drafter config that loads.
json dflash_config() {
  json c = dspark_config();
  c.erase("markov_rank");
  c["architectures"] = {"DFlashDraftModel"};
  c["dflash_config"] = {{"mask_token_id", 95}, {"target_layer_ids", {0, 2}}};
  return c;
}

using testing::error_of;

std::string dspark_error(const std::function<void(json&)>& damage) {
  json c = dspark_config();
  damage(c);
  return error_of([&] { read_dspark_config(c, "drafter/config.json"); });
}

std::string dflash_error(const std::function<void(json&)>& damage) {
  json c = dflash_config();
  damage(c);
  return error_of([&] { read_dflash_config(c, "drafter/config.json"); });
}

TEST(DrafterConfig, TheBaseConfigsLoad) {
  EXPECT_EQ(read_dspark_config(dspark_config(), "d").backbone.heads, 4);
  EXPECT_EQ(read_dflash_config(dflash_config(), "d").backbone.block_size, 8);
}

TEST(DrafterConfig, DegenerateSizesNameTheField) {
  EXPECT_EQ(dspark_error([](json& c) { c["num_attention_heads"] = 0; }),
            "drafter/config.json: field 'num_attention_heads' is 0; it must be in [1, 1024]");
  EXPECT_EQ(dspark_error([](json& c) { c["num_hidden_layers"] = 100000000; }),
            "drafter/config.json: field 'num_hidden_layers' is 100000000; it must be in [1, 1024]");
  EXPECT_EQ(dspark_error([](json& c) { c["hidden_size"] = -1; }),
            "drafter/config.json: field 'hidden_size' is -1; it must be in [1, 65536]");
  EXPECT_EQ(
      dspark_error([](json& c) { c["num_key_value_heads"] = 3; }),
      "drafter/config.json: num_attention_heads 4 is not a multiple of num_key_value_heads 3");
  EXPECT_EQ(dspark_error([](json& c) { c["block_size"] = 0; }),
            "drafter/config.json: field 'block_size' is 0; it must be in [1, 1024]");
  EXPECT_EQ(dspark_error([](json& c) { c["mask_token_id"] = 96; }),
            "drafter/config.json: field 'mask_token_id' is 96; it must be in [0, 95]");
  EXPECT_EQ(dspark_error([](json& c) { c["markov_rank"] = -2; }),
            "drafter/config.json: field 'markov_rank' is -2; it must be in [0, 16384]");
  EXPECT_EQ(dspark_error([](json& c) { c["draft_vocab_size"] = 1000; }),
            "drafter/config.json: field 'draft_vocab_size' is 1000; it must be in [1, 96]");
  EXPECT_EQ(dspark_error([](json& c) {
              c["target_layer_ids"] = {0, 5000};
            }),
            "drafter/config.json: field 'target_layer_ids' is 5000; it must be in [-1, 1024]");
  EXPECT_EQ(dspark_error([](json& c) { c["final_logit_softcapping"] = -3.0; }),
            "drafter/config.json: field 'final_logit_softcapping' is -3.0; it must be a number in "
            "[0, 1000000]");
  EXPECT_EQ(dspark_error([](json& c) { c["rms_norm_eps"] = -1.0; }),
            "drafter/config.json: field 'rms_norm_eps' is -1; it must be in (0, 1]");
}

TEST(DrafterConfig, DFlashDegenerateSizesNameTheField) {
  EXPECT_EQ(dflash_error([](json& c) { c["block_size"] = 1; }),
            "drafter/config.json: field 'block_size' is 1; it must be in [2, 1024]");
  EXPECT_EQ(dflash_error([](json& c) { c["block_size"] = "eight"; }),
            "drafter/config.json: field 'block_size' must be an integer");
  EXPECT_EQ(dflash_error([](json& c) { c["dflash_config"]["mask_token_id"] = -1; }),
            "drafter/config.json: field 'mask_token_id' is -1; it must be in [0, 95]");
  EXPECT_EQ(dflash_error([](json& c) { c["head_dim"] = 0; }),
            "drafter/config.json: field 'head_dim' is 0; it must be in [2, 4096]");
}

// A module quantized at load gets the tile layouts the target's modules get where this CPU's
// products read them (codes only for a matrix that is multiplied, not looked up, and at 8 bits only
// where the AVX-512 VNNI kernel reads them), and its products and rows stay what the plain
// quantized matrix gives.
TEST(DrafterTensors, ModulesQuantizedAtLoadGetTileLayouts) {
  testing::TinyCheckpoint tiny(7);
  tiny.linear("proj", 20, 128);
  tiny.linear("table", 24, 64);
  tiny.config = dspark_config();
  Checkpoint checkpoint(tiny.write());
  for (const int bits : {4, 8}) {
    SCOPED_TRACE(std::to_string(bits) + " bits");
    DrafterTensors tensors(checkpoint, bits);
    const auto proj = tensors.linear("proj", 20, 128);
    const auto table = tensors.linear("table", 24, 64, true, true);
    ASSERT_TRUE(proj->weights.quantized);
    ASSERT_TRUE(table->weights.quantized);
    ASSERT_EQ(proj->weights.quant.format.bits, bits);
    const bool tiles = kernels::products_read_tile_values();
    EXPECT_EQ(proj->weights.quant.tile_values != nullptr, tiles);
    EXPECT_EQ(proj->weights.quant.tile_codes != nullptr, kernels::products_read_tile_codes(bits));
    EXPECT_EQ(table->weights.quant.tile_values != nullptr, tiles);
    EXPECT_EQ(table->weights.quant.tile_codes, nullptr);

    LinearWeights plain = proj->weights;
    plain.quant.tile_values = nullptr;
    plain.quant.tile_codes = nullptr;
    for (int64_t m : {1, 3, 9}) {
      std::vector<float> x(m * 128);
      for (size_t i = 0; i < x.size(); ++i) x[i] = std::sin(0.37f * static_cast<float>(i));
      std::vector<float> with_tiles(m * 20), without(m * 20);
      proj->weights.apply(x.data(), m, with_tiles.data());
      plain.apply(x.data(), m, without.data());
      EXPECT_EQ(std::memcmp(with_tiles.data(), without.data(), without.size() * sizeof(float)), 0)
          << "m = " << m;
    }
    std::vector<float> row(128), plain_row(128);
    proj->weights.row(13, row.data());
    plain.row(13, plain_row.data());
    EXPECT_EQ(row, plain_row);
  }
}

}  // namespace
}  // namespace dspark
