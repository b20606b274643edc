// The MLX parameter layout derived from Hugging Face configs, checked against the real Nemotron 3
// Nano config and the sizes in docs/model-math.md (§1.3, §7).
#include "convert/hf_layout.h"

#include <gtest/gtest.h>

#include <map>

#include "base/error.h"
#include "formats/checkpoint.h"

namespace dspark {
namespace {

const std::string kNanoConfig =
    std::string(DSPARK_PUBLIC_FIXTURES) + "/nemotron-3-nano/config.from-jax-test-literal.json";

std::map<std::string, const HfParameter*> by_name(const HfLayout& layout) {
  std::map<std::string, const HfParameter*> result;
  for (const auto& parameter : layout.parameters) result[parameter.name] = &parameter;
  return result;
}

TEST(HfLayout, NemotronNanoMatchesTheSpec) {
  const HfLayout layout = hf_layout(read_json_file(kNanoConfig), kNanoConfig);
  const auto parameters = by_name(layout);
  const auto shape = [&](const std::string& name) { return parameters.at(name)->shape; };
  EXPECT_EQ(shape("backbone.layers.0.mixer.in_proj.weight"), (std::vector<int64_t>{10304, 2688}));
  EXPECT_EQ(shape("backbone.layers.0.mixer.conv1d.weight"), (std::vector<int64_t>{6144, 4, 1}));
  EXPECT_EQ(shape("backbone.layers.0.mixer.out_proj.weight"), (std::vector<int64_t>{2688, 4096}));
  EXPECT_EQ(shape("backbone.layers.5.mixer.k_proj.weight"), (std::vector<int64_t>{256, 2688}));
  EXPECT_EQ(shape("backbone.layers.1.mixer.switch_mlp.fc1.weight"),
            (std::vector<int64_t>{128, 1856, 2688}));
  EXPECT_EQ(shape("backbone.layers.1.mixer.switch_mlp.fc2.weight"),
            (std::vector<int64_t>{128, 2688, 1856}));
  EXPECT_EQ(shape("backbone.layers.1.mixer.shared_experts.down_proj.weight"),
            (std::vector<int64_t>{2688, 3712}));

  const HfParameter& fc2 = *parameters.at("backbone.layers.1.mixer.switch_mlp.fc2.weight");
  ASSERT_EQ(fc2.sources.size(), 2u);
  ASSERT_EQ(fc2.sources[0].size(), 128u);
  EXPECT_EQ(fc2.sources[0][127], "backbone.layers.1.mixer.experts.127.down_proj.weight");
  EXPECT_TRUE(fc2.quantizable);
  EXPECT_FALSE(parameters.at("backbone.layers.1.mixer.gate.weight")->quantizable);
  EXPECT_TRUE(parameters.at("backbone.layers.1.mixer.gate.weight")->castable);
  EXPECT_FALSE(parameters.at("backbone.layers.1.mixer.gate.e_score_correction_bias")->castable);
  EXPECT_FALSE(parameters.at("backbone.layers.0.mixer.A_log")->castable);
  EXPECT_FALSE(parameters.at("backbone.layers.0.mixer.conv1d.weight")->quantizable);
  EXPECT_TRUE(parameters.at("backbone.embeddings.weight")->quantizable);
  EXPECT_TRUE(parameters.at("lm_head.weight")->quantizable);

  // §7.3: 729 tensors once every quantizable weight becomes weight + scales + biases.
  int64_t tensors = 0;
  int64_t counted = 0;
  for (const auto& parameter : layout.parameters) {
    tensors += parameter.quantizable ? 3 : 1;
    if (!parameter.counted) continue;
    int64_t numel = 1;
    for (int64_t dim : parameter.shape) numel *= dim;
    counted += numel;
  }
  EXPECT_EQ(tensors, 729);
  // §1.3 "total ≈ 31.58e9", less the 23 × 3 × 64 mixer-held dt_bias / A_log / D values that
  // mlx-lm's total_parameters leaves out.
  EXPECT_EQ(counted, 31577935872);

  EXPECT_TRUE(layout.dropped("mtp.layers.0.eh_proj.weight"));
  EXPECT_FALSE(layout.dropped("backbone.layers.0.norm.weight"));
}

nlohmann::json llama_config() {
  return {{"model_type", "llama"},    {"hidden_size", 64},      {"vocab_size", 100},
          {"intermediate_size", 128}, {"num_hidden_layers", 2}, {"num_attention_heads", 4},
          {"rms_norm_eps", 1e-5}};
}

TEST(HfLayout, LlamaDefaultsFollowMlxLm) {
  // mlx-lm's llama ties the embeddings unless the config says otherwise, and defaults the
  // key/value heads to the query heads.
  const HfLayout tied = hf_layout(llama_config(), "config.json");
  const auto parameters = by_name(tied);
  EXPECT_EQ(parameters.count("lm_head.weight"), 0u);
  EXPECT_TRUE(tied.dropped("lm_head.weight"));
  EXPECT_TRUE(tied.dropped("model.layers.1.self_attn.rotary_emb.inv_freq"));
  EXPECT_EQ(parameters.at("model.layers.1.self_attn.k_proj.weight")->shape,
            (std::vector<int64_t>{64, 64}));

  auto config = llama_config();
  config["tie_word_embeddings"] = false;
  config["attention_bias"] = true;
  config["num_key_value_heads"] = 2;
  const HfLayout untied = hf_layout(config, "config.json");
  const auto untied_parameters = by_name(untied);
  EXPECT_EQ(untied_parameters.count("lm_head.weight"), 1u);
  EXPECT_FALSE(untied.dropped("lm_head.weight"));
  EXPECT_EQ(untied_parameters.at("model.layers.0.self_attn.k_proj.bias")->shape,
            (std::vector<int64_t>{32}));
  EXPECT_FALSE(untied_parameters.at("model.layers.0.self_attn.o_proj.bias")->quantizable);
}

TEST(HfLayout, Qwen2HasQkvBiasesOnly) {
  auto config = llama_config();
  config["model_type"] = "qwen2";
  config["num_key_value_heads"] = 4;
  const auto parameters = by_name(hf_layout(config, "config.json"));
  EXPECT_EQ(parameters.count("model.layers.0.self_attn.v_proj.bias"), 1u);
  EXPECT_EQ(parameters.count("model.layers.0.self_attn.o_proj.bias"), 0u);
}

void expect_refusal(const nlohmann::json& config, const std::string& fragment) {
  try {
    hf_layout(config, "some/config.json");
    ADD_FAILURE() << "accepted a config that should fail with: " << fragment;
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(fragment), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("some/config.json"), std::string::npos) << e.what();
  }
}

TEST(HfLayout, Refusals) {
  auto config = llama_config();
  config["model_type"] = "gpt2";
  expect_refusal(config, "model_type 'gpt2'");

  config = llama_config();
  config["model_type"] = "qwen3";
  config["head_dim"] = 16;
  config["num_key_value_heads"] = 2;
  expect_refusal(config, "'tie_word_embeddings'");  // required by mlx-lm's qwen3

  config = llama_config();
  config["hidden_size"] = -3;
  expect_refusal(config, "'hidden_size' must be a positive integer");

  auto nemotron = read_json_file(kNanoConfig);
  nemotron["layers_block_type"] = {"mamba", "moe"};
  expect_refusal(nemotron, "disagrees");
  nemotron = read_json_file(kNanoConfig);
  nemotron["hybrid_override_pattern"] = "MEX";
  expect_refusal(nemotron, "layer kind 'X'");
}

}  // namespace
}  // namespace dspark
