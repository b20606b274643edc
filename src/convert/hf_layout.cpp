#include "convert/hf_layout.h"

#include <map>

#include "base/error.h"

namespace dspark {
namespace {

// Reads config.json keys the way mlx-lm's ModelArgs do: a null value counts as absent.
class ConfigReader {
 public:
  ConfigReader(const nlohmann::json& config, const std::string& path)
      : config_(config), path_(path) {}

  const std::string& path() const { return path_; }

  bool has(const std::string& key) const {
    return config_.contains(key) && !config_[key].is_null();
  }
  const nlohmann::json& value(const std::string& key) const { return config_[key]; }

  int64_t integer(const std::string& key) const {
    if (!has(key)) fail("{}: missing '{}'", path_, key);
    return positive(key, config_[key]);
  }
  int64_t integer(const std::string& key, int64_t fallback) const {
    return has(key) ? positive(key, config_[key]) : fallback;
  }
  bool flag(const std::string& key) const {
    if (!has(key)) fail("{}: missing '{}'", path_, key);
    if (!config_[key].is_boolean()) fail("{}: '{}' is not true or false", path_, key);
    return config_[key].get<bool>();
  }
  bool flag(const std::string& key, bool fallback) const { return has(key) ? flag(key) : fallback; }

 private:
  int64_t positive(const std::string& key, const nlohmann::json& value) const {
    if (!value.is_number_integer() || value.get<int64_t>() <= 0) {
      fail("{}: '{}' must be a positive integer, not {}", path_, key, value.dump());
    }
    return value.get<int64_t>();
  }

  const nlohmann::json& config_;
  std::string path_;
};

class LayoutBuilder {
 public:
  explicit LayoutBuilder(HfLayout& layout) : layout_(layout) {}

  // A Linear (or Embedding, which has no bias) at `module` with a [rows, cols] weight.
  void linear(const std::string& module, int64_t rows, int64_t cols, bool bias) {
    add({module + ".weight", {rows, cols}, {}, true});
    if (bias) add({module + ".bias", {rows}, {}, false});
  }
  void vector(const std::string& name, int64_t size, bool counted = true, bool castable = true) {
    HfParameter parameter{name, {size}, {}, false};
    parameter.counted = counted;
    parameter.castable = castable;
    add(std::move(parameter));
  }
  void add(HfParameter parameter) {
    if (parameter.sources.empty()) parameter.sources.push_back({parameter.name});
    layout_.parameters.push_back(std::move(parameter));
  }

 private:
  HfLayout& layout_;
};

std::string nemotron_pattern(const ConfigReader& config) {
  static const std::map<std::string, char> kBlockTypes = {{"full_attention", '*'},
                                                          {"attention", '*'},
                                                          {"linear_attention", 'M'},
                                                          {"mamba", 'M'},
                                                          {"conv", 'M'},
                                                          {"moe", 'E'},
                                                          {"mlp", '-'}};
  std::string from_list;
  for (const char* key : {"layers_block_type", "layer_types"}) {
    if (!config.has(key)) continue;
    if (!config.value(key).is_array()) fail("{}: '{}' is not a list", config.path(), key);
    for (const auto& entry : config.value(key)) {
      auto found =
          entry.is_string() ? kBlockTypes.find(entry.get<std::string>()) : kBlockTypes.end();
      if (found == kBlockTypes.end()) {
        fail(
            "{}: '{}' holds {}, not one of attention, full_attention, mamba, linear_attention, "
            "conv, moe, mlp",
            config.path(), key, entry.dump());
      }
      from_list.push_back(found->second);
    }
    break;
  }
  std::string pattern;
  if (config.has("hybrid_override_pattern")) {
    const auto& value = config.value("hybrid_override_pattern");
    if (value.is_string()) {
      pattern = value.get<std::string>();
    } else if (value.is_array()) {
      for (const auto& entry : value) {
        if (!entry.is_string() || entry.get<std::string>().size() != 1) {
          fail("{}: hybrid_override_pattern entry {} is not one character", config.path(),
               entry.dump());
        }
        pattern += entry.get<std::string>();
      }
    } else {
      fail("{}: hybrid_override_pattern is neither a string nor a list", config.path());
    }
    if (!from_list.empty() && from_list != pattern) {
      fail("{}: hybrid_override_pattern '{}' disagrees with the layer type list ('{}')",
           config.path(), pattern, from_list);
    }
  } else {
    pattern = from_list;
  }
  if (pattern.empty()) {
    fail("{}: no hybrid_override_pattern or layers_block_type describes the layers", config.path());
  }
  for (char kind : pattern) {
    if (kind != 'M' && kind != '*' && kind != 'E' && kind != '-') {
      fail("{}: layer kind '{}' in '{}' is not M, *, E or -", config.path(), kind, pattern);
    }
  }
  return pattern;
}

void nemotron_h_layout(const ConfigReader& config, HfLayout& layout) {
  LayoutBuilder build(layout);
  const int64_t hidden = config.integer("hidden_size");
  const int64_t vocab = config.integer("vocab_size");
  const std::string pattern = nemotron_pattern(config);

  HfParameter embeddings{"backbone.embeddings.weight", {vocab, hidden}, {}, true};
  // Older Nemotron-H checkpoints spell it "embedding"; mlx-lm only knows "embeddings".
  embeddings.sources = {{"backbone.embeddings.weight"}, {"backbone.embedding.weight"}};
  build.add(std::move(embeddings));

  for (size_t index = 0; index < pattern.size(); ++index) {
    const std::string layer = "backbone.layers." + std::to_string(index);
    const std::string mixer = layer + ".mixer";
    build.vector(layer + ".norm.weight", hidden);
    switch (pattern[index]) {
      case 'M': {
        const int64_t heads = config.integer("mamba_num_heads");
        const int64_t inner = heads * config.integer("mamba_head_dim");
        const int64_t conv_dim =
            inner + 2 * config.integer("n_groups") * config.integer("ssm_state_size");
        const bool projection_bias = config.flag("mamba_proj_bias");
        HfParameter conv{
            mixer + ".conv1d.weight", {conv_dim, config.integer("conv_kernel"), 1}, {}, false};
        conv.conv_weight = true;
        build.add(std::move(conv));
        if (config.flag("use_conv_bias")) build.vector(mixer + ".conv1d.bias", conv_dim);
        build.linear(mixer + ".in_proj", inner + conv_dim + heads, hidden, projection_bias);
        // The mixer itself holds these three; it has submodules, so mlx-lm does not count them.
        build.vector(mixer + ".dt_bias", heads, false);
        build.vector(mixer + ".A_log", heads, false, false);
        build.vector(mixer + ".D", heads, false);
        build.vector(mixer + ".norm.weight", inner);
        build.linear(mixer + ".out_proj", hidden, inner, projection_bias);
        break;
      }
      case '*': {
        const int64_t heads = config.integer("num_attention_heads");
        const int64_t kv_heads = config.integer("num_key_value_heads");
        const int64_t head_dim = config.integer("head_dim", hidden / heads);
        const bool bias = config.flag("attention_bias");
        build.linear(mixer + ".q_proj", heads * head_dim, hidden, bias);
        build.linear(mixer + ".k_proj", kv_heads * head_dim, hidden, bias);
        build.linear(mixer + ".v_proj", kv_heads * head_dim, hidden, bias);
        build.linear(mixer + ".o_proj", hidden, heads * head_dim, bias);
        break;
      }
      case '-': {
        const int64_t width = config.integer("intermediate_size");
        const bool bias = config.flag("mlp_bias");
        build.linear(mixer + ".up_proj", width, hidden, bias);
        build.linear(mixer + ".down_proj", hidden, width, bias);
        break;
      }
      case 'E': {
        const int64_t experts = config.integer("n_routed_experts");
        const int64_t width = config.integer("moe_intermediate_size");
        const bool latent = config.has("moe_latent_size");
        const int64_t expert_dim = latent ? config.integer("moe_latent_size") : hidden;
        const bool bias = config.flag("mlp_bias");
        for (const auto& [hf, mlx, rows, cols] :
             {std::tuple{"up_proj", "fc1", width, expert_dim},
              std::tuple{"down_proj", "fc2", expert_dim, width}}) {
          HfParameter stack{
              mixer + ".switch_mlp." + mlx + ".weight", {experts, rows, cols}, {}, true};
          std::vector<std::string> per_expert;
          for (int64_t e = 0; e < experts; ++e) {
            per_expert.push_back(mixer + ".experts." + std::to_string(e) + "." + hf + ".weight");
          }
          stack.sources = {per_expert, {stack.name}};
          build.add(std::move(stack));
        }
        // The router is a custom module, not a Linear: never quantized.
        build.add({mixer + ".gate.weight", {experts, hidden}, {}, false});
        build.vector(mixer + ".gate.e_score_correction_bias", experts, true, false);
        if (config.has("n_shared_experts")) {
          const int64_t shared = config.integer("moe_shared_expert_intermediate_size");
          build.linear(mixer + ".shared_experts.up_proj", shared, hidden, bias);
          build.linear(mixer + ".shared_experts.down_proj", hidden, shared, bias);
        }
        if (latent) {
          build.linear(mixer + ".fc1_latent_proj", expert_dim, hidden, bias);
          build.linear(mixer + ".fc2_latent_proj", hidden, expert_dim, bias);
        }
        break;
      }
    }
  }
  build.vector("backbone.norm_f.weight", hidden);
  HfParameter lm_head{"lm_head.weight", {vocab, hidden}, {}, true};
  // mlx-lm's nemotron_h always has an lm_head; a tied checkpoint may omit it (the runtime then
  // uses the embedding table).
  lm_head.optional = config.flag("tie_word_embeddings", false);
  build.add(std::move(lm_head));
  layout.dropped_prefixes = {"mtp."};
}

// llama, qwen2 and qwen3 share one decoder layout; they differ in biases, head_dim, q/k norms and
// which config keys are required.
void dense_layout(const ConfigReader& config, const std::string& type, HfLayout& layout) {
  LayoutBuilder build(layout);
  const int64_t hidden = config.integer("hidden_size");
  const int64_t vocab = config.integer("vocab_size");
  const int64_t width = config.integer("intermediate_size");
  const int64_t heads = config.integer("num_attention_heads");
  const bool qwen3 = type == "qwen3";
  const bool qwen2 = type == "qwen2";
  const int64_t kv_heads = (qwen3 || qwen2) ? config.integer("num_key_value_heads")
                                            : config.integer("num_key_value_heads", heads);
  int64_t head_dim = hidden / heads;
  if (qwen3) head_dim = config.integer("head_dim");
  if (type == "llama") head_dim = config.integer("head_dim", hidden / heads);
  int64_t layers = 0;
  if (type == "llama" && config.has("layer_types")) {
    if (!config.value("layer_types").is_array()) {
      fail("{}: 'layer_types' is not a list", config.path());
    }
    layers = static_cast<int64_t>(config.value("layer_types").size());
  } else {
    layers = config.integer("num_hidden_layers");
  }
  // mlx-lm defaults tie_word_embeddings to true for llama and qwen2 and requires it for qwen3.
  const bool tied =
      qwen3 ? config.flag("tie_word_embeddings") : config.flag("tie_word_embeddings", true);
  const bool attention_bias = type == "llama" && config.flag("attention_bias", false);
  const bool mlp_bias = type == "llama" && config.flag("mlp_bias", false);

  build.linear("model.embed_tokens", vocab, hidden, false);
  for (int64_t index = 0; index < layers; ++index) {
    const std::string layer = "model.layers." + std::to_string(index);
    const std::string attention = layer + ".self_attn";
    build.linear(attention + ".q_proj", heads * head_dim, hidden, attention_bias || qwen2);
    build.linear(attention + ".k_proj", kv_heads * head_dim, hidden, attention_bias || qwen2);
    build.linear(attention + ".v_proj", kv_heads * head_dim, hidden, attention_bias || qwen2);
    build.linear(attention + ".o_proj", hidden, heads * head_dim, attention_bias);
    if (qwen3) {
      build.vector(attention + ".q_norm.weight", head_dim);
      build.vector(attention + ".k_norm.weight", head_dim);
    }
    build.linear(layer + ".mlp.gate_proj", width, hidden, mlp_bias);
    build.linear(layer + ".mlp.down_proj", hidden, width, mlp_bias);
    build.linear(layer + ".mlp.up_proj", width, hidden, mlp_bias);
    build.vector(layer + ".input_layernorm.weight", hidden);
    build.vector(layer + ".post_attention_layernorm.weight", hidden);
  }
  build.vector("model.norm.weight", hidden);
  if (tied) {
    layout.dropped_names.push_back("lm_head.weight");
  } else {
    build.linear("lm_head", vocab, hidden, false);
  }
  // Precomputed RoPE frequencies of old checkpoints (mlx-lm drops them for llama and qwen2).
  layout.dropped_substrings.push_back("self_attn.rotary_emb.inv_freq");
}

}  // namespace

bool HfLayout::dropped(const std::string& hf_name) const {
  for (const auto& prefix : dropped_prefixes) {
    if (hf_name.starts_with(prefix)) return true;
  }
  for (const auto& part : dropped_substrings) {
    if (hf_name.find(part) != std::string::npos) return true;
  }
  for (const auto& name : dropped_names) {
    if (hf_name == name) return true;
  }
  return false;
}

HfLayout hf_layout(const nlohmann::json& config, const std::string& config_path) {
  if (!config.is_object() || !config.contains("model_type") || !config["model_type"].is_string()) {
    fail("{}: no model_type", config_path);
  }
  HfLayout layout;
  layout.architecture = config["model_type"].get<std::string>();
  const ConfigReader reader(config, config_path);
  if (layout.architecture == "nemotron_h") {
    nemotron_h_layout(reader, layout);
  } else if (layout.architecture == "llama" || layout.architecture == "qwen2" ||
             layout.architecture == "qwen3") {
    dense_layout(reader, layout.architecture, layout);
  } else {
    fail("{}: model_type '{}' cannot be converted (supported: nemotron_h, llama, qwen2, qwen3)",
         config_path, layout.architecture);
  }
  return layout;
}

}  // namespace dspark
