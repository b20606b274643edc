// Dense decoder-only transformers: llama (SmolLM2, Llama 3), qwen2 and qwen3 (q/k RMSNorm per
// head). docs/model-math.md §12: pre-norm attention with rotary embeddings (rotate-half,
// fp32 angles, rope_scaling none / linear / llama3 / yarn), SwiGLU MLP, tied or untied output.
#include <cmath>
#include <numbers>

#include "base/error.h"
#include "kernels/ops.h"
#include "model/architectures.h"
#include "model/loader.h"
#include "model/qwen3_block.h"

namespace dspark {
namespace {

struct DenseConfig {
  std::string model_type;
  int64_t hidden = 0;
  int64_t layers = 0;
  int64_t intermediate = 0;
  int64_t heads = 0;
  int64_t kv_heads = 0;
  int64_t head_dim = 0;
  int64_t vocab = 0;
  int64_t max_context = 0;
  float eps = 1e-5f;
  bool qk_norm = false;
  // Rotary embedding, resolved from rope_theta and rope_scaling.
  std::vector<float> inv_freq;  // head_dim / 2
  bool rope_traditional = false;
  float position_scale = 1.0f;
  float rope_magnitude = 1.0f;  // yarn's mscale on the rotated q and k
};

// Frequencies θ^(-2i/d), then the rope_scaling variant (mlx-lm rope_utils.py semantics).
void resolve_rope(const ConfigReader& config, const nlohmann::json* scaling, double theta,
                  DenseConfig& c) {
  const int64_t d = c.head_dim;
  std::vector<double> wavelength_over_2pi(d / 2);  // "freqs" in mlx-lm: θ^(2i/d)
  for (int64_t i = 0; i < d / 2; ++i) {
    wavelength_over_2pi[i] = std::pow(theta, static_cast<double>(2 * i) / static_cast<double>(d));
  }
  std::string type = "default";
  auto field = [&](const char* key, double fallback) {
    if (scaling == nullptr || !scaling->contains(key) || (*scaling)[key].is_null()) {
      return fallback;
    }
    if (!(*scaling)[key].is_number() || !std::isfinite((*scaling)[key].get<double>())) {
      fail("{}: rope_scaling.{} must be a finite number", config.source(), key);
    }
    return (*scaling)[key].get<double>();
  };
  if (scaling != nullptr) {
    for (const char* key : {"type", "rope_type"}) {
      if (scaling->contains(key) && (*scaling)[key].is_string()) {
        type = (*scaling)[key].get<std::string>();
        break;
      }
    }
  }
  for (const char* key : {"factor", "original_max_position_embeddings", "low_freq_factor",
                          "high_freq_factor", "beta_fast", "beta_slow"}) {
    if (field(key, 1.0) <= 0.0) {
      fail("{}: rope_scaling.{} is {}; it must be positive", config.source(), key, field(key, 1.0));
    }
  }
  if (type == "llama3" && field("low_freq_factor", 1.0) == field("high_freq_factor", 4.0)) {
    fail("{}: rope_scaling low_freq_factor and high_freq_factor must differ", config.source());
  }
  if (type == "linear") {
    c.position_scale = static_cast<float>(1.0 / field("factor", 1.0));
  } else if (type == "llama3") {
    const double factor = field("factor", 1.0);
    const double low = field("low_freq_factor", 1.0);
    const double high = field("high_freq_factor", 4.0);
    const double original = field("original_max_position_embeddings", 8192.0);
    const double low_wavelength = original / low;
    const double high_wavelength = original / high;
    for (double& f : wavelength_over_2pi) {
      const double wavelength = 2.0 * std::numbers::pi * f;
      if (wavelength > low_wavelength) {
        f *= factor;
      } else if (wavelength > high_wavelength) {
        const double smooth = (original / wavelength - low) / (high - low);
        f = f / ((1.0 - smooth) / factor + smooth);
      }
    }
  } else if (type == "yarn") {
    const double factor = field("factor", 1.0);
    const double original = field("original_max_position_embeddings", 4096.0);
    const double beta_fast = field("beta_fast", 32.0);
    const double beta_slow = field("beta_slow", 1.0);
    const double mscale = field("mscale", 1.0);
    const double mscale_all_dim = field("mscale_all_dim", 0.0);
    auto correction_dim = [&](double rotations) {
      return (static_cast<double>(d) * std::log(original / (rotations * 2.0 * std::numbers::pi))) /
             (2.0 * std::log(theta));
    };
    const double low = std::max(std::floor(correction_dim(beta_fast)), 0.0);
    double high = std::min(std::ceil(correction_dim(beta_slow)), static_cast<double>(d - 1));
    if (low == high) high += 0.001;
    auto get_mscale = [&](double m) {
      return factor <= 1.0 ? 1.0 : 0.1 * m * std::log(factor) + 1.0;
    };
    c.rope_magnitude = static_cast<float>(get_mscale(mscale) / get_mscale(mscale_all_dim));
    for (int64_t i = 0; i < d / 2; ++i) {
      const double ramp = std::clamp((static_cast<double>(i) - low) / (high - low), 0.0, 1.0);
      const double mask = 1.0 - ramp;
      const double extra = wavelength_over_2pi[i];
      const double inter = factor * extra;
      wavelength_over_2pi[i] = (inter * extra) / (inter * mask + extra * (1.0 - mask));
    }
  } else if (type != "default") {
    fail("{}: unsupported rope_scaling type '{}' (supported: linear, llama3, yarn)",
         config.source(), type);
  }
  c.inv_freq.resize(d / 2);
  for (int64_t i = 0; i < d / 2; ++i)
    c.inv_freq[i] = static_cast<float>(1.0 / wavelength_over_2pi[i]);
}

DenseConfig read_config(const Checkpoint& checkpoint) {
  const ConfigReader config(checkpoint.config(), checkpoint.path() + "/config.json");
  DenseConfig c;
  c.model_type = config.string("model_type", "");
  c.hidden = config.integer_in("hidden_size", 1, kMaxConfigHidden);
  c.layers = config.integer_in("num_hidden_layers", 1, kMaxConfigLayers);
  c.intermediate = config.integer_in("intermediate_size", 1, kMaxConfigIntermediate);
  c.heads = config.integer_in("num_attention_heads", 1, kMaxConfigHeads);
  c.kv_heads = config.integer_in("num_key_value_heads", c.heads, 1, c.heads);
  if (!config.has("head_dim") && c.hidden % c.heads != 0) {
    fail(
        "{}: hidden_size {} is not a multiple of num_attention_heads {} (and there is no head_dim)",
        config.source(), c.hidden, c.heads);
  }
  c.head_dim = config.integer_in("head_dim", c.hidden / c.heads, 2, kMaxConfigHeadDim);
  c.vocab = config.integer_in("vocab_size", 1, kMaxConfigVocab);
  c.max_context = config.integer_in("max_position_embeddings", 0, 0, kMaxConfigContext);
  c.eps = static_cast<float>(config.number_above("rms_norm_eps", 1e-5, 0.0, 1.0));
  c.qk_norm = c.model_type == "qwen3";
  c.rope_traditional = config.flag("rope_traditional", false);
  if (c.heads % c.kv_heads != 0) {
    fail("{}: num_attention_heads {} is not a multiple of num_key_value_heads {}", config.source(),
         c.heads, c.kv_heads);
  }
  if (c.heads * c.head_dim > kMaxConfigHidden * 4) {
    fail("{}: num_attention_heads {} x head_dim {} is too wide (at most {})", config.source(),
         c.heads, c.head_dim, kMaxConfigHidden * 4);
  }
  if (c.head_dim % 2 != 0)
    fail("{}: head_dim {} must be even for RoPE", config.source(), c.head_dim);
  if (config.has("layer_types")) {
    for (const auto& type : config.raw("layer_types")) {
      if (!type.is_string() || type.get<std::string>() != "full_attention") {
        fail("{}: layer_types entry {} is not supported (only full_attention)", config.source(),
             type.dump());
      }
    }
  }
  const nlohmann::json* scaling = nullptr;
  double theta =
      config.number_above("rope_theta", c.model_type == "qwen2" ? 1000000.0 : 10000.0, 1.0, 1e12);
  if (config.has("rope_scaling")) {
    scaling = &config.raw("rope_scaling");
  } else if (config.has("rope_parameters")) {
    scaling = &config.raw("rope_parameters");
    if (!config.has("rope_theta") && scaling->is_object() && scaling->contains("rope_theta")) {
      const nlohmann::json& value = (*scaling)["rope_theta"];
      if (!value.is_number() || !(value.get<double>() > 1.0 && value.get<double>() <= 1e12)) {
        fail("{}: rope_parameters.rope_theta is {}; it must be a number in (1, 1e12]",
             config.source(), value.dump());
      }
      theta = value.get<double>();
    }
  }
  if (scaling != nullptr && !scaling->is_object()) {
    fail("{}: rope_scaling must be an object", config.source());
  }
  resolve_rope(config, scaling, theta, c);
  return c;
}

struct DenseLayer {
  std::vector<float> input_norm, post_attention_norm;
  LinearWeights q_proj, k_proj, v_proj, o_proj;
  std::vector<float> q_norm, k_norm;  // qwen3 only
  LinearWeights gate_proj, up_proj, down_proj;
};

class DenseTransformer final : public Model {
 public:
  explicit DenseTransformer(std::unique_ptr<Checkpoint> checkpoint);

  StateLayout state_layout() const override;
  int64_t layer_decode_weight_bytes(int64_t layer) const override;

 protected:
  void run_layer(int64_t layer, float* hidden, int64_t n,
                 const std::vector<RowSpan>& spans) const override;

 private:
  DenseConfig c_;
  std::vector<DenseLayer> layers_;
};

DenseTransformer::DenseTransformer(std::unique_ptr<Checkpoint> checkpoint)
    : Model(std::move(checkpoint)) {
  c_ = read_config(*checkpoint_);
  config_.architecture = c_.model_type;
  config_.vocab_size = c_.vocab;
  config_.num_layers = c_.layers;
  config_.hidden_size = c_.hidden;
  config_.max_context = c_.max_context;
  config_.layer_kinds = std::string(c_.layers, 'T');
  norm_eps_ = c_.eps;

  WeightLoader w(*checkpoint_);
  const int64_t H = c_.hidden, hd = c_.head_dim;
  const ConfigReader config(checkpoint_->config(), checkpoint_->path() + "/config.json");
  tied_ = config.flag("tie_word_embeddings", !w.has("lm_head.weight"));
  embedding_ = w.embedding("model.embed_tokens", c_.vocab, H, tied_);
  final_norm_ = w.floats("model.norm.weight", {H});
  if (!tied_) lm_head_ = w.linear("lm_head", c_.vocab, H);
  for (int64_t l = 0; l < c_.layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l);
    DenseLayer layer;
    layer.input_norm = w.floats(p + ".input_layernorm.weight", {H});
    layer.post_attention_norm = w.floats(p + ".post_attention_layernorm.weight", {H});
    layer.q_proj = w.linear(p + ".self_attn.q_proj", c_.heads * hd, H);
    layer.k_proj = w.linear(p + ".self_attn.k_proj", c_.kv_heads * hd, H);
    layer.v_proj = w.linear(p + ".self_attn.v_proj", c_.kv_heads * hd, H);
    layer.o_proj = w.linear(p + ".self_attn.o_proj", H, c_.heads * hd);
    if (c_.qk_norm) {
      layer.q_norm = w.floats(p + ".self_attn.q_norm.weight", {hd});
      layer.k_norm = w.floats(p + ".self_attn.k_norm.weight", {hd});
    }
    layer.gate_proj = w.linear(p + ".mlp.gate_proj", c_.intermediate, H);
    layer.up_proj = w.linear(p + ".mlp.up_proj", c_.intermediate, H);
    layer.down_proj = w.linear(p + ".mlp.down_proj", H, c_.intermediate);
    layers_.push_back(std::move(layer));
  }
  w.check_all_used([&](const std::string& name) {
    return name.find("rotary_emb.inv_freq") != std::string::npos ||
           (tied_ && name.rfind("lm_head.", 0) == 0);
  });
}

StateLayout DenseTransformer::state_layout() const {
  StateLayout layout;
  layout.attention_layers = c_.layers;
  layout.kv_heads = c_.kv_heads;
  layout.head_dim = c_.head_dim;
  layout.max_context = c_.max_context;
  layout.kv_type = kernels::kv_cache_type();
  return layout;
}

void DenseTransformer::run_layer(int64_t index, float* hidden, int64_t n,
                                 const std::vector<RowSpan>& spans) const {
  const DenseLayer& layer = layers_[index];
  const Qwen3BlockWeights weights{
      layer.input_norm.data(),
      layer.post_attention_norm.data(),
      {&layer.q_proj, &layer.k_proj, &layer.v_proj, &layer.o_proj,
       c_.qk_norm ? layer.q_norm.data() : nullptr, c_.qk_norm ? layer.k_norm.data() : nullptr},
      {&layer.gate_proj, &layer.up_proj, &layer.down_proj}};
  const AttentionShape shape{c_.heads, c_.kv_heads, c_.head_dim, c_.eps, false, c_.rope_magnitude};
  const kernels::RopeSpec rope{c_.inv_freq.data(), c_.head_dim, c_.rope_traditional,
                               c_.position_scale};
  qwen3_block(weights, shape, c_.hidden, c_.eps, hidden, n,
              cached_attention(shape, index, spans, &rope));
}

int64_t DenseTransformer::layer_decode_weight_bytes(int64_t index) const {
  const DenseLayer& layer = layers_[index];
  return linear_bytes(layer.q_proj) + linear_bytes(layer.k_proj) + linear_bytes(layer.v_proj) +
         linear_bytes(layer.o_proj) + linear_bytes(layer.gate_proj) + linear_bytes(layer.up_proj) +
         linear_bytes(layer.down_proj) +
         static_cast<int64_t>((layer.input_norm.size() + layer.post_attention_norm.size() +
                               layer.q_norm.size() + layer.k_norm.size()) *
                              sizeof(float));
}

}  // namespace

std::unique_ptr<Model> make_dense(std::unique_ptr<Checkpoint> checkpoint) {
  return std::make_unique<DenseTransformer>(std::move(checkpoint));
}

}  // namespace dspark
