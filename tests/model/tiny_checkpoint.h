#pragma once
// Test helper: small random fp32 checkpoints written to a temporary directory, in MLX layout
// (nemotron_h with stacked experts, llama), with hooks to break them for loader error tests.
#include <unistd.h>

#include <atomic>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "formats/safetensors.h"

namespace dspark::testing {

struct TinyTensor {
  std::vector<int64_t> shape;
  std::vector<float> data;
};

class TinyCheckpoint {
 public:
  nlohmann::json config;
  std::map<std::string, TinyTensor> tensors;

  explicit TinyCheckpoint(uint32_t seed) : rng_(seed) {}
  ~TinyCheckpoint() {
    if (!dir_.empty()) std::filesystem::remove_all(dir_);
  }
  TinyCheckpoint(const TinyCheckpoint&) = delete;
  TinyCheckpoint& operator=(const TinyCheckpoint&) = delete;

  // Normal(mean, scale) values.
  void add(const std::string& name, std::vector<int64_t> shape, float scale, float mean = 0.0f) {
    int64_t count = 1;
    for (int64_t d : shape) count *= d;
    std::normal_distribution<float> normal(mean, scale);
    TinyTensor tensor{std::move(shape), std::vector<float>(count)};
    for (float& v : tensor.data) v = normal(rng_);
    tensors[name] = std::move(tensor);
  }
  // A [out, in] matrix scaled by 1/sqrt(in).
  void linear(const std::string& path, int64_t out, int64_t in) {
    add(path + ".weight", {out, in}, 1.0f / std::sqrt(static_cast<float>(in)));
  }

  // Writes config.json + model.safetensors to a fresh temporary directory and returns it.
  std::string write() {
    if (dir_.empty()) {
      static std::atomic<int> counter{0};
      dir_ = (std::filesystem::temp_directory_path() /
              ("dspark_tiny_" + std::to_string(getpid()) + "_" + std::to_string(counter++)))
                 .string();
    }
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
    std::ofstream(dir_ + "/config.json") << config.dump(2);
    std::vector<TensorToWrite> list;
    for (const auto& [name, tensor] : tensors) {
      list.push_back(
          {name, DType::F32, tensor.shape, tensor.data.data(), tensor.data.size() * sizeof(float)});
    }
    write_safetensors(dir_ + "/model.safetensors", list, {{"format", "mlx"}});
    return dir_;
  }

 private:
  std::mt19937 rng_;
  std::string dir_;
};

// A nemotron_h with every layer kind: hidden 64, 4 Mamba heads of 16 (2 groups, state 16,
// conv 4), attention 4 q / 2 kv heads of 16, 8 experts top-2 with a shared expert, MLP 96.
inline void fill_nemotron(TinyCheckpoint& ck, const std::string& pattern) {
  const int64_t H = 64, V = 96, heads = 4, P = 16, G = 2, N = 16, K = 4;
  const int64_t di = heads * P, cd = di + 2 * G * N;
  ck.config = {{"model_type", "nemotron_h"},
               {"vocab_size", V},
               {"hidden_size", H},
               {"hybrid_override_pattern", pattern},
               {"num_hidden_layers", pattern.size()},
               {"layer_norm_epsilon", 1e-5},
               {"max_position_embeddings", 512},
               {"mamba_num_heads", heads},
               {"mamba_head_dim", P},
               {"ssm_state_size", N},
               {"n_groups", G},
               {"conv_kernel", K},
               {"use_conv_bias", true},
               {"chunk_size", 8},
               {"num_attention_heads", 4},
               {"num_key_value_heads", 2},
               {"head_dim", 16},
               {"n_routed_experts", 8},
               {"num_experts_per_tok", 2},
               {"n_group", 1},
               {"topk_group", 1},
               {"norm_topk_prob", true},
               {"routed_scaling_factor", 2.5},
               {"moe_intermediate_size", 32},
               {"n_shared_experts", 1},
               {"moe_shared_expert_intermediate_size", 48},
               {"intermediate_size", 96}};
  ck.add("backbone.embeddings.weight", {V, H}, 1.0f);
  ck.add("backbone.norm_f.weight", {H}, 0.1f, 1.0f);
  ck.linear("lm_head", V, H);
  for (size_t l = 0; l < pattern.size(); ++l) {
    const std::string p = "backbone.layers." + std::to_string(l);
    const std::string m = p + ".mixer";
    ck.add(p + ".norm.weight", {H}, 0.1f, 1.0f);
    switch (pattern[l]) {
      case 'M':
        ck.linear(m + ".in_proj", di + cd + heads, H);
        ck.linear(m + ".out_proj", H, di);
        ck.add(m + ".conv1d.weight", {cd, K, 1}, 0.5f);
        ck.add(m + ".conv1d.bias", {cd}, 0.1f);
        ck.add(m + ".dt_bias", {heads}, 0.5f, -1.0f);
        ck.add(m + ".A_log", {heads}, 0.5f, 1.0f);
        ck.add(m + ".D", {heads}, 1.0f);
        ck.add(m + ".norm.weight", {di}, 0.1f, 1.0f);
        break;
      case '*':
        ck.linear(m + ".q_proj", 64, H);
        ck.linear(m + ".k_proj", 32, H);
        ck.linear(m + ".v_proj", 32, H);
        ck.linear(m + ".o_proj", H, 64);
        break;
      case 'E':
        ck.add(m + ".gate.weight", {8, H}, 0.3f);
        ck.add(m + ".gate.e_score_correction_bias", {8}, 0.1f);
        ck.add(m + ".switch_mlp.fc1.weight", {8, 32, H}, 0.125f);
        ck.add(m + ".switch_mlp.fc2.weight", {8, H, 32}, 0.18f);
        ck.linear(m + ".shared_experts.up_proj", 48, H);
        ck.linear(m + ".shared_experts.down_proj", H, 48);
        break;
      case '-':
        ck.linear(m + ".up_proj", 96, H);
        ck.linear(m + ".down_proj", H, 96);
        break;
    }
  }
}

// A llama with hidden 64, 2 layers, 4 q / 2 kv heads of 16, tied embeddings.
inline void fill_llama(TinyCheckpoint& ck) {
  const int64_t H = 64, V = 96, I = 128;
  ck.config = {{"model_type", "llama"},      {"vocab_size", V},
               {"hidden_size", H},           {"num_hidden_layers", 2},
               {"intermediate_size", I},     {"num_attention_heads", 4},
               {"num_key_value_heads", 2},   {"rms_norm_eps", 1e-5},
               {"rope_theta", 10000.0},      {"max_position_embeddings", 256},
               {"tie_word_embeddings", true}};
  ck.add("model.embed_tokens.weight", {V, H}, 1.0f);
  ck.add("model.norm.weight", {H}, 0.1f, 1.0f);
  for (int l = 0; l < 2; ++l) {
    const std::string p = "model.layers." + std::to_string(l);
    ck.add(p + ".input_layernorm.weight", {H}, 0.1f, 1.0f);
    ck.add(p + ".post_attention_layernorm.weight", {H}, 0.1f, 1.0f);
    ck.linear(p + ".self_attn.q_proj", 64, H);
    ck.linear(p + ".self_attn.k_proj", 32, H);
    ck.linear(p + ".self_attn.v_proj", 32, H);
    ck.linear(p + ".self_attn.o_proj", H, 64);
    ck.linear(p + ".mlp.gate_proj", I, H);
    ck.linear(p + ".mlp.up_proj", I, H);
    ck.linear(p + ".mlp.down_proj", H, I);
  }
}

}  // namespace dspark::testing
