#include "formats/quant_config.h"

#include <gtest/gtest.h>

#include "base/error.h"

namespace dspark {
namespace {

std::string error_of(const nlohmann::json& config) {
  try {
    QuantConfig::from_config(config, "config.json");
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(QuantConfig, GlobalAndOverrides) {
  auto config = nlohmann::json::parse(R"({"quantization": {"group_size": 64, "bits": 4,
      "model.layers.0.mlp.down_proj": {"group_size": 32, "bits": 8},
      "lm_head": {"bits": 6, "group_size": 64, "mode": "affine"},
      "model.layers.1.self_attn.v_proj": false}})");
  QuantConfig quant = QuantConfig::from_config(config, "config.json");
  EXPECT_TRUE(quant.present());
  EXPECT_EQ(quant.settings_for("model.layers.0.mlp.up_proj").bits, 4);
  EXPECT_EQ(quant.settings_for("model.layers.0.mlp.down_proj").bits, 8);
  EXPECT_EQ(quant.settings_for("model.layers.0.mlp.down_proj").group_size, 32);
  EXPECT_EQ(quant.settings_for("lm_head").bits, 6);
  EXPECT_TRUE(quant.excluded("model.layers.1.self_attn.v_proj"));
  EXPECT_THROW(quant.settings_for("model.layers.1.self_attn.v_proj"), Error);
}

TEST(QuantConfig, QuantizationConfigCopyAndMissingMode) {
  auto config = nlohmann::json::parse(R"({"quantization_config": {"group_size": 128, "bits": 8}})");
  QuantConfig quant = QuantConfig::from_config(config, "config.json");
  EXPECT_EQ(quant.settings_for("x").group_size, 128);
  EXPECT_EQ(quant.settings_for("x").mode, "affine");
  EXPECT_FALSE(QuantConfig::from_config(nlohmann::json::object(), "c").present());
}

TEST(QuantConfig, RefusesWhatMlxDoesNotSupport) {
  EXPECT_NE(error_of(nlohmann::json::parse(R"({"quantization": {"group_size": 64, "bits": 7}})"))
                .find("7 bits is not an MLX affine width"),
            std::string::npos);
  EXPECT_NE(error_of(nlohmann::json::parse(R"({"quantization": {"group_size": 48, "bits": 4}})"))
                .find("group size 48 is not supported"),
            std::string::npos);
  EXPECT_NE(error_of(nlohmann::json::parse(
                         R"({"quantization": {"group_size": 32, "bits": 4, "mode": "mxfp4"}})"))
                .find("mode 'mxfp4' is not supported"),
            std::string::npos);
  EXPECT_NE(error_of(nlohmann::json::parse(
                         R"({"quantization": {"group_size": 64, "bits": 4, "m.a": {"bits": 1}}})"))
                .find("override 'm.a'"),
            std::string::npos);
}

}  // namespace
}  // namespace dspark
