// Degenerate config.json values are refused by field name before any allocation: a zero head
// count used to divide by zero (SIGFPE), huge counts ran out of memory (std::bad_alloc), negative
// sizes threw std::length_error.
#include <gtest/gtest.h>

#include <chrono>
#include <functional>

#include "base/error.h"
#include "model/model.h"
#include "tiny_checkpoint.h"

namespace dspark {
namespace {

using testing::TinyCheckpoint;

// The error (message) of loading the tiny model of `fill` after `damage`; also checks that
// refusing took no time (no allocation of the damaged sizes happened first).
std::string load_error(const std::function<void(TinyCheckpoint&)>& fill,
                       const std::function<void(nlohmann::json&)>& damage) {
  TinyCheckpoint ck(3);
  fill(ck);
  damage(ck.config);
  const std::string dir = ck.write();
  const auto start = std::chrono::steady_clock::now();
  std::string message = "(no error)";
  try {
    load_model(dir);
  } catch (const Error& e) {
    message = e.what();
  }
  // Refused before allocating what the absurd sizes ask for (which would take minutes, or fail):
  // the bound is loose enough for a sanitizer build on a busy machine.
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(20));
  // Drop the temporary directory prefix: the rest names the file and the field.
  const size_t config = message.find("config.json: ");
  return config == std::string::npos ? message : message.substr(config);
}

void llama(TinyCheckpoint& ck) {
  testing::fill_llama(ck);
}
void nemotron(TinyCheckpoint& ck) {
  testing::fill_nemotron(ck, "M*E-");
}

TEST(DenseConfig, DegenerateSizesNameTheField) {
  auto error = [](const std::function<void(nlohmann::json&)>& damage) {
    return load_error(llama, damage);
  };
  EXPECT_EQ(error([](nlohmann::json& c) { c["num_attention_heads"] = 0; }),
            "config.json: field 'num_attention_heads' is 0; it must be in [1, 1024]");
  EXPECT_EQ(error([](nlohmann::json& c) { c["num_hidden_layers"] = 1000000000; }),
            "config.json: field 'num_hidden_layers' is 1000000000; it must be in [1, 1024]");
  EXPECT_EQ(error([](nlohmann::json& c) { c["hidden_size"] = -64; }),
            "config.json: field 'hidden_size' is -64; it must be in [1, 65536]");
  EXPECT_EQ(error([](nlohmann::json& c) { c["intermediate_size"] = -1; }),
            "config.json: field 'intermediate_size' is -1; it must be in [1, 1048576]");
  EXPECT_EQ(error([](nlohmann::json& c) { c["vocab_size"] = int64_t{1} << 40; }),
            "config.json: field 'vocab_size' is 1099511627776; it must be in [1, 16777216]");
  EXPECT_EQ(error([](nlohmann::json& c) { c["num_key_value_heads"] = 0; }),
            "config.json: field 'num_key_value_heads' is 0; it must be in [1, 4]");
  EXPECT_EQ(error([](nlohmann::json& c) { c["num_key_value_heads"] = 3; }),
            "config.json: num_attention_heads 4 is not a multiple of num_key_value_heads 3");
  EXPECT_EQ(error([](nlohmann::json& c) { c["num_attention_heads"] = 3; }),
            "config.json: hidden_size 64 is not a multiple of num_attention_heads 3 (and there is "
            "no head_dim)");
  EXPECT_EQ(error([](nlohmann::json& c) { c["head_dim"] = 100000; }),
            "config.json: field 'head_dim' is 100000; it must be in [2, 4096]");
  EXPECT_EQ(error([](nlohmann::json& c) { c["max_position_embeddings"] = -5; }),
            "config.json: field 'max_position_embeddings' is -5; it must be in [0, 1073741824]");
  EXPECT_EQ(error([](nlohmann::json& c) { c["rms_norm_eps"] = 0.0; }),
            "config.json: field 'rms_norm_eps' is 0; it must be in (0, 1]");
  EXPECT_EQ(error([](nlohmann::json& c) { c["rope_theta"] = -1.0; }),
            "config.json: field 'rope_theta' is -1; it must be in (1, 1000000000000]");
  EXPECT_EQ(error([](nlohmann::json& c) { c["num_hidden_layers"] = 18446744073709551615ull; }),
            "config.json: field 'num_hidden_layers' is 18446744073709551615, too large");
  EXPECT_EQ(error([](nlohmann::json& c) { c["num_hidden_layers"] = 2.5; }),
            "config.json: field 'num_hidden_layers' must be an integer");
  EXPECT_EQ(error([](nlohmann::json& c) {
              c["rope_scaling"] = {{"type", "linear"}, {"factor", 0.0}};
            }),
            "config.json: rope_scaling.factor is 0; it must be positive");
  EXPECT_EQ(error([](nlohmann::json& c) {
              c["rope_scaling"] = {{"type", "llama3"},
                                   {"factor", 8.0},
                                   {"low_freq_factor", 2.0},
                                   {"high_freq_factor", 2.0}};
            }),
            "config.json: rope_scaling low_freq_factor and high_freq_factor must differ");
}

TEST(DenseConfig, VocabDisagreeingWithTheEmbeddingIsRefusedByTensorName) {
  const std::string message = load_error(llama, [](nlohmann::json& c) { c["vocab_size"] = 1000; });
  EXPECT_NE(message.find("tensor 'model.embed_tokens.weight' has shape [96, 64], expected "
                         "[1000, 64]"),
            std::string::npos)
      << message;
}

TEST(NemotronConfig, DegenerateSizesNameTheField) {
  auto error = [](const std::function<void(nlohmann::json&)>& damage) {
    return load_error(nemotron, damage);
  };
  EXPECT_EQ(error([](nlohmann::json& c) { c["num_attention_heads"] = 0; }),
            "config.json: field 'num_attention_heads' is 0; it must be in [1, 1024]");
  EXPECT_EQ(error([](nlohmann::json& c) { c["mamba_num_heads"] = 0; }),
            "config.json: field 'mamba_num_heads' is 0; it must be in [1, 1024]");
  EXPECT_EQ(error([](nlohmann::json& c) { c["n_groups"] = 0; }),
            "config.json: field 'n_groups' is 0; it must be in [1, 4]");
  EXPECT_EQ(error([](nlohmann::json& c) { c["n_groups"] = 3; }),
            "config.json: mamba_num_heads 4 is not a multiple of n_groups 3");
  EXPECT_EQ(error([](nlohmann::json& c) { c["ssm_state_size"] = -16; }),
            "config.json: field 'ssm_state_size' is -16; it must be in [1, 4096]");
  EXPECT_EQ(error([](nlohmann::json& c) { c["conv_kernel"] = 0; }),
            "config.json: field 'conv_kernel' is 0; it must be in [1, 64]");
  EXPECT_EQ(error([](nlohmann::json& c) { c["n_routed_experts"] = 1000000; }),
            "config.json: field 'n_routed_experts' is 1000000; it must be in [1, 4096]");
  EXPECT_EQ(error([](nlohmann::json& c) { c["num_experts_per_tok"] = 9; }),
            "config.json: num_experts_per_tok 9 must be in [1, n_routed_experts = 8]");
  EXPECT_EQ(error([](nlohmann::json& c) { c["n_group"] = 3; }),
            "config.json: n_routed_experts 8 is not a multiple of n_group 3");
  EXPECT_EQ(error([](nlohmann::json& c) { c["topk_group"] = 2; }),
            "config.json: field 'topk_group' is 2; it must be in [1, 1]");
  EXPECT_EQ(error([](nlohmann::json& c) { c["moe_intermediate_size"] = 0; }),
            "config.json: field 'moe_intermediate_size' is 0; it must be in [1, 1048576]");
  EXPECT_EQ(error([](nlohmann::json& c) { c["moe_latent_size"] = -1; }),
            "config.json: field 'moe_latent_size' is -1; it must be in [0, 65536]");
  EXPECT_EQ(error([](nlohmann::json& c) { c["hidden_size"] = 0; }),
            "config.json: field 'hidden_size' is 0; it must be in [1, 65536]");
  EXPECT_EQ(error([](nlohmann::json& c) { c["layer_norm_epsilon"] = -1.0; }),
            "config.json: field 'layer_norm_epsilon' is -1; it must be in (0, 1]");
  EXPECT_EQ(error([](nlohmann::json& c) {
              c["time_step_limit"] = {1.0, 0.5};
            }),
            "config.json: time_step_limit [1.0,0.5] must be [min, max] with finite min <= max");
  EXPECT_EQ(error([](nlohmann::json& c) {
              c["hybrid_override_pattern"] = std::string(5000, 'M');
              c["num_hidden_layers"] = 5000;
            }),
            "config.json: the layer pattern has 5000 layers; at most 1024 are supported");
}

}  // namespace
}  // namespace dspark
