// nemotron_h: a stack of pre-norm residual layers, each one of Mamba-2 mixer (M), attention (*),
// MoE (E) or dense MLP (-), as laid out by hybrid_override_pattern. The math follows
// docs/model-math.md §3–§5; section numbers below refer to it. Loads MLX checkpoints (experts
// stacked as switch_mlp.fc1/fc2, conv weight [C, K, 1], optionally quantized) and Hugging Face ones
// (per-expert experts.{e}.up_proj/down_proj, conv weight [C, 1, K]).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <variant>

#include "base/error.h"
#include "kernels/ops.h"
#include "model/architectures.h"
#include "model/loader.h"
#include "model/qwen3_block.h"

namespace dspark {
namespace {

// Routed-expert rows (tokens × top_k) gathered per batch, bounding MoE scratch memory in prefill.
constexpr int64_t kMaxExpertRowsPerBatch = 4096;

struct NemotronConfig {
  int64_t hidden = 0;
  int64_t vocab = 0;
  std::string pattern;
  float eps = 1e-5f;
  int64_t max_context = 0;
  bool tied = false;
  // Mamba-2 (§3)
  int64_t mamba_heads = 0;
  int64_t mamba_head_dim = 0;
  int64_t ssm_state = 0;
  int64_t n_groups = 0;
  int64_t conv_kernel = 0;
  bool conv_bias = true;
  float dt_min = 0.0f;
  float dt_max = std::numeric_limits<float>::infinity();
  // Attention (§4)
  int64_t heads = 0;
  int64_t kv_heads = 0;
  int64_t head_dim = 0;
  // MoE (§5)
  int64_t experts = 0;
  int64_t top_k = 0;
  int64_t n_group = 1;
  int64_t topk_group = 1;
  bool norm_topk_prob = true;
  float routed_scaling = 1.0f;
  int64_t moe_intermediate = 0;
  bool shared_expert = false;
  int64_t shared_intermediate = 0;
  int64_t latent = 0;  // moe_latent_size; 0 = experts work in the hidden size
  // Dense MLP (§5.3)
  int64_t mlp_intermediate = 0;

  int64_t d_inner() const { return mamba_heads * mamba_head_dim; }
  int64_t conv_dim() const { return d_inner() + 2 * n_groups * ssm_state; }
  bool has(char kind) const { return pattern.find(kind) != std::string::npos; }
};

char block_char(const std::string& name, const std::string& source) {
  if (name == "mamba" || name == "linear_attention" || name == "conv") return 'M';
  if (name == "attention" || name == "full_attention") return '*';
  if (name == "moe") return 'E';
  if (name == "mlp") return '-';
  fail("{}: unknown layer type '{}' in layers_block_type", source, name);
}

std::string read_pattern(const ConfigReader& config) {
  std::string pattern;
  bool from_pattern = false;
  if (config.has("hybrid_override_pattern")) {
    const nlohmann::json& value = config.raw("hybrid_override_pattern");
    if (value.is_string()) {
      pattern = value.get<std::string>();
    } else if (value.is_array()) {
      for (const auto& item : value) {
        if (!item.is_string() || item.get<std::string>().size() != 1) {
          fail("{}: hybrid_override_pattern entries must be single characters", config.source());
        }
        pattern += item.get<std::string>();
      }
    } else {
      fail("{}: hybrid_override_pattern must be a string", config.source());
    }
    from_pattern = true;
  }
  for (const char* key : {"layers_block_type", "layer_types"}) {
    if (!config.has(key)) continue;
    const nlohmann::json& value = config.raw(key);
    if (!value.is_array()) fail("{}: {} must be a list", config.source(), key);
    std::string listed;
    for (const auto& item : value) {
      if (!item.is_string()) fail("{}: {} entries must be strings", config.source(), key);
      listed += block_char(item.get<std::string>(), config.source());
    }
    if (from_pattern && listed != pattern) {
      fail("{}: {} ({}) disagrees with hybrid_override_pattern ({})", config.source(), key, listed,
           pattern);
    }
    pattern = listed;
    from_pattern = true;
  }
  if (!from_pattern) {
    fail("{}: nemotron_h needs hybrid_override_pattern or layers_block_type", config.source());
  }
  for (size_t i = 0; i < pattern.size(); ++i) {
    if (std::string_view("M*E-").find(pattern[i]) == std::string_view::npos) {
      fail("{}: hybrid_override_pattern has '{}' at layer {}; expected M, *, E or -",
           config.source(), pattern[i], i);
    }
  }
  if (pattern.empty()) fail("{}: the layer pattern is empty", config.source());
  if (static_cast<int64_t>(pattern.size()) > kMaxConfigLayers) {
    fail("{}: the layer pattern has {} layers; at most {} are supported", config.source(),
         pattern.size(), kMaxConfigLayers);
  }
  if (config.has("num_hidden_layers") &&
      config.integer("num_hidden_layers") != static_cast<int64_t>(pattern.size())) {
    fail("{}: the layer pattern '{}' has {} layers but num_hidden_layers is {}", config.source(),
         pattern, pattern.size(), config.integer("num_hidden_layers"));
  }
  return pattern;
}

NemotronConfig read_config(const Checkpoint& checkpoint) {
  const ConfigReader config(checkpoint.config(), checkpoint.path() + "/config.json");
  NemotronConfig c;
  c.pattern = read_pattern(config);
  c.hidden = config.integer_in("hidden_size", 1, kMaxConfigHidden);
  c.vocab = config.integer_in("vocab_size", 1, kMaxConfigVocab);
  c.eps = static_cast<float>(config.number_above("layer_norm_epsilon", 1e-5, 0.0, 1.0));
  c.max_context = config.integer_in("max_position_embeddings", 0, 0, kMaxConfigContext);
  c.tied = config.flag("tie_word_embeddings", false);
  if (c.has('M')) {
    c.mamba_heads = config.integer_in("mamba_num_heads", 1, kMaxConfigHeads);
    c.mamba_head_dim = config.integer_in("mamba_head_dim", 1, kMaxConfigHeadDim);
    c.ssm_state = config.integer_in("ssm_state_size", 1, kMaxConfigSsmState);
    c.n_groups = config.integer_in("n_groups", 1, c.mamba_heads);
    c.conv_kernel = config.integer_in("conv_kernel", 1, kMaxConfigConvKernel);
    c.conv_bias = config.flag("use_conv_bias", true);
    if (c.mamba_heads % c.n_groups != 0 || c.d_inner() % c.n_groups != 0) {
      fail("{}: mamba_num_heads {} is not a multiple of n_groups {}", config.source(),
           c.mamba_heads, c.n_groups);
    }
    if (config.has("time_step_limit")) {
      const nlohmann::json& limit = config.raw("time_step_limit");
      if (!limit.is_array() || limit.size() != 2 || !limit[0].is_number()) {
        fail("{}: time_step_limit must be [min, max]", config.source());
      }
      c.dt_min = limit[0].get<float>();
      c.dt_max = limit[1].is_number() ? limit[1].get<float>() : c.dt_max;
      if (!std::isfinite(c.dt_min) || std::isnan(c.dt_max) || c.dt_min > c.dt_max) {
        fail("{}: time_step_limit {} must be [min, max] with finite min <= max", config.source(),
             limit.dump());
      }
    }
  }
  if (c.has('*')) {
    c.heads = config.integer_in("num_attention_heads", 1, kMaxConfigHeads);
    c.kv_heads = config.integer_in("num_key_value_heads", c.heads, 1, c.heads);
    if (!config.has("head_dim") && c.hidden % c.heads != 0) {
      fail(
          "{}: hidden_size {} is not a multiple of num_attention_heads {} (and there is no "
          "head_dim)",
          config.source(), c.hidden, c.heads);
    }
    c.head_dim = config.integer_in("head_dim", c.hidden / c.heads, 1, kMaxConfigHeadDim);
    if (c.heads % c.kv_heads != 0) {
      fail("{}: num_attention_heads {} is not a multiple of num_key_value_heads {}",
           config.source(), c.heads, c.kv_heads);
    }
  }
  if (c.has('E')) {
    c.experts = config.integer_in("n_routed_experts", 1, kMaxConfigExperts);
    c.top_k = config.integer("num_experts_per_tok");
    c.n_group = config.integer_in("n_group", 1, 1, c.experts);
    c.topk_group = config.integer_in("topk_group", 1, 1, c.n_group);
    if (c.experts % c.n_group != 0) {
      fail("{}: n_routed_experts {} is not a multiple of n_group {}", config.source(), c.experts,
           c.n_group);
    }
    c.norm_topk_prob = config.flag("norm_topk_prob", true);
    c.routed_scaling =
        static_cast<float>(config.number_above("routed_scaling_factor", 1.0, 0.0, 1e6));
    c.moe_intermediate = config.integer_in("moe_intermediate_size", 1, kMaxConfigIntermediate);
    c.shared_expert = config.has("n_shared_experts");
    if (c.shared_expert) {
      c.shared_intermediate =
          config.integer_in("moe_shared_expert_intermediate_size", 1, kMaxConfigIntermediate);
    }
    c.latent = config.integer_in("moe_latent_size", 0, 0, kMaxConfigHidden);
    if (c.top_k < 1 || c.top_k > c.experts) {
      fail("{}: num_experts_per_tok {} must be in [1, n_routed_experts = {}]", config.source(),
           c.top_k, c.experts);
    }
  }
  if (c.has('-')) {
    c.mlp_intermediate = config.integer_in("intermediate_size", 1, kMaxConfigIntermediate);
  }
  return c;
}

// Routed experts: MLX stacks them into one [experts, out, in] tensor; Hugging Face files keep one
// tensor per expert, bound in place.
struct ExpertBank {
  LinearWeights stacked;
  std::vector<LinearWeights> each;

  void load(WeightLoader& loader, const std::string& stacked_path, const std::string& each_prefix,
            const std::string& each_name, int64_t experts, int64_t out, int64_t in) {
    if (loader.has(stacked_path + ".weight")) {
      stacked = loader.linear(stacked_path, out, in, experts);
      return;
    }
    for (int64_t e = 0; e < experts; ++e) {
      each.push_back(loader.linear(each_prefix + std::to_string(e) + "." + each_name, out, in));
    }
  }

  // y[r] = x[r] · W[ids[r]]ᵀ.
  void apply(const float* x, int64_t m, const int32_t* ids, float* y) const {
    if (each.empty()) {
      stacked.apply_gathered(x, m, ids, y);
      return;
    }
    const int64_t in = each[0].cols(), out = each[0].rows();
    std::vector<int64_t> order(m);
    for (int64_t r = 0; r < m; ++r) order[r] = r;
    std::stable_sort(order.begin(), order.end(),
                     [&](int64_t a, int64_t b) { return ids[a] < ids[b]; });
    std::vector<float> rows_in, rows_out;
    for (int64_t begin = 0; begin < m;) {
      int64_t end = begin;
      while (end < m && ids[order[end]] == ids[order[begin]]) ++end;
      const int64_t count = end - begin;
      rows_in.resize(count * in);
      rows_out.resize(count * out);
      for (int64_t i = 0; i < count; ++i) {
        std::memcpy(rows_in.data() + i * in, x + order[begin + i] * in, in * sizeof(float));
      }
      each[ids[order[begin]]].apply(rows_in.data(), count, rows_out.data());
      for (int64_t i = 0; i < count; ++i) {
        std::memcpy(y + order[begin + i] * out, rows_out.data() + i * out, out * sizeof(float));
      }
      begin = end;
    }
  }

  int64_t bytes_per_expert() const {
    return each.empty() ? linear_bytes(stacked) : linear_bytes(each[0]);
  }
};

struct MambaMixer {
  int64_t index = 0;  // among the Mamba layers: the state / record slot
  LinearWeights in_proj;
  LinearWeights out_proj;
  std::vector<float> conv_weight;  // [conv_dim, kernel]
  std::vector<float> conv_bias;    // [conv_dim] or empty
  std::vector<float> dt_bias;      // [heads]
  std::vector<float> A;            // [heads] = -exp(A_log)
  std::vector<float> D;            // [heads]
  std::vector<float> norm_weight;  // [d_inner]
};

struct AttentionMixer {
  int64_t index = 0;  // among the attention layers: the KV cache slot
  LinearWeights q_proj, k_proj, v_proj, o_proj;
};

struct MoeMixer {
  LinearWeights gate;
  std::vector<float> correction_bias;  // [experts] or empty
  ExpertBank up, down;
  LinearWeights shared_up, shared_down;
  LinearWeights latent_in, latent_out;  // only with moe_latent_size
};

struct MlpMixer {
  LinearWeights up_proj, down_proj;
};

struct Layer {
  char kind = 'M';
  std::vector<float> norm;
  std::variant<MambaMixer, AttentionMixer, MoeMixer, MlpMixer> mixer;
};

class NemotronH final : public Model {
 public:
  explicit NemotronH(std::unique_ptr<Checkpoint> checkpoint);

  StateLayout state_layout() const override;
  int64_t layer_decode_weight_bytes(int64_t layer) const override;
  int64_t routed_expert_bytes(int64_t layer) const override;

 protected:
  void run_layer(int64_t layer, float* hidden, int64_t n,
                 const std::vector<RowSpan>& spans) const override;

 private:
  void load();
  void mamba(const MambaMixer& m, const float* xn, int64_t n, const std::vector<RowSpan>& spans,
             float* out) const;
  void attention(const AttentionMixer& a, const float* xn, int64_t n,
                 const std::vector<RowSpan>& spans, float* out) const;
  void moe(int64_t layer, const MoeMixer& e, const float* xn, int64_t n, float* out) const;
  void relu2_mlp(const LinearWeights& up, const LinearWeights& down, const float* x, int64_t n,
                 float* out) const;

  NemotronConfig c_;
  std::vector<Layer> layers_;
  int64_t mamba_layers_ = 0;
  int64_t attention_layers_ = 0;
};

NemotronH::NemotronH(std::unique_ptr<Checkpoint> checkpoint) : Model(std::move(checkpoint)) {
  c_ = read_config(*checkpoint_);
  config_.architecture = "nemotron_h";
  config_.vocab_size = c_.vocab;
  config_.num_layers = static_cast<int64_t>(c_.pattern.size());
  config_.hidden_size = c_.hidden;
  config_.max_context = c_.max_context;
  config_.layer_kinds = c_.pattern;
  norm_eps_ = c_.eps;
  load();
}

void NemotronH::load() {
  WeightLoader w(*checkpoint_);
  const int64_t H = c_.hidden;
  std::string embedding_path;
  for (const char* candidate : {"backbone.embeddings", "backbone.embedding"}) {
    if (w.has(std::string(candidate) + ".weight")) embedding_path = candidate;
  }
  if (embedding_path.empty()) {
    fail("{}: missing tensor 'backbone.embeddings.weight'", checkpoint_->path());
  }
  // mlx-lm's nemotron_h always has its own lm_head, whatever tie_word_embeddings says; the
  // embedding table serves as the head only when a tied checkpoint carries none.
  tied_ = c_.tied && !w.has("lm_head.weight");
  embedding_ = w.embedding(embedding_path, c_.vocab, H, tied_);
  final_norm_ = w.floats("backbone.norm_f.weight", {H});
  if (!tied_) lm_head_ = w.linear("lm_head", c_.vocab, H);

  for (size_t l = 0; l < c_.pattern.size(); ++l) {
    const std::string p = "backbone.layers." + std::to_string(l);
    const std::string mx = p + ".mixer";
    Layer layer;
    layer.kind = c_.pattern[l];
    layer.norm = w.floats(p + ".norm.weight", {H});
    switch (layer.kind) {
      case 'M': {
        MambaMixer m;
        m.index = mamba_layers_++;
        const int64_t heads = c_.mamba_heads, di = c_.d_inner(), cd = c_.conv_dim();
        m.in_proj = w.linear(mx + ".in_proj", di + cd + heads, H);
        m.out_proj = w.linear(mx + ".out_proj", H, di);
        const std::string conv_name = mx + ".conv1d.weight";
        const TensorView& conv = w.tensor(conv_name);
        const std::vector<int64_t> mlx_shape{cd, c_.conv_kernel, 1};
        const std::vector<int64_t> hf_shape{cd, 1, c_.conv_kernel};
        if (conv.shape != mlx_shape && conv.shape != hf_shape) {
          fail("{}: tensor '{}' has shape {}, expected {} (MLX) or {} (Hugging Face)",
               checkpoint_->path(), conv_name, shape_string(conv.shape), shape_string(mlx_shape),
               shape_string(hf_shape));
        }
        // Both layouts hold weight[c, k] at flat index c·K + k.
        m.conv_weight = w.floats(conv_name, conv.shape);
        if (c_.conv_bias) m.conv_bias = w.floats(mx + ".conv1d.bias", {cd});
        m.dt_bias = w.floats(mx + ".dt_bias", {heads});
        m.A = w.floats(mx + ".A_log", {heads});
        for (float& a : m.A) a = -std::exp(a);
        m.D = w.floats(mx + ".D", {heads});
        m.norm_weight = w.floats(mx + ".norm.weight", {di});
        layer.mixer = std::move(m);
        break;
      }
      case '*': {
        AttentionMixer a;
        a.index = attention_layers_++;
        a.q_proj = w.linear(mx + ".q_proj", c_.heads * c_.head_dim, H);
        a.k_proj = w.linear(mx + ".k_proj", c_.kv_heads * c_.head_dim, H);
        a.v_proj = w.linear(mx + ".v_proj", c_.kv_heads * c_.head_dim, H);
        a.o_proj = w.linear(mx + ".o_proj", H, c_.heads * c_.head_dim);
        layer.mixer = std::move(a);
        break;
      }
      case 'E': {
        MoeMixer e;
        e.gate = w.linear(mx + ".gate", c_.experts, H);
        if (w.has(mx + ".gate.e_score_correction_bias")) {
          e.correction_bias = w.floats(mx + ".gate.e_score_correction_bias", {c_.experts});
        }
        const int64_t expert_in = c_.latent > 0 ? c_.latent : H;
        e.up.load(w, mx + ".switch_mlp.fc1", mx + ".experts.", "up_proj", c_.experts,
                  c_.moe_intermediate, expert_in);
        e.down.load(w, mx + ".switch_mlp.fc2", mx + ".experts.", "down_proj", c_.experts, expert_in,
                    c_.moe_intermediate);
        if (c_.shared_expert) {
          e.shared_up = w.linear(mx + ".shared_experts.up_proj", c_.shared_intermediate, H);
          e.shared_down = w.linear(mx + ".shared_experts.down_proj", H, c_.shared_intermediate);
        }
        if (c_.latent > 0) {
          e.latent_in = w.linear(mx + ".fc1_latent_proj", c_.latent, H);
          e.latent_out = w.linear(mx + ".fc2_latent_proj", H, c_.latent);
        }
        layer.mixer = std::move(e);
        break;
      }
      case '-': {
        MlpMixer d;
        d.up_proj = w.linear(mx + ".up_proj", c_.mlp_intermediate, H);
        d.down_proj = w.linear(mx + ".down_proj", H, c_.mlp_intermediate);
        layer.mixer = std::move(d);
        break;
      }
    }
    layers_.push_back(std::move(layer));
  }
  // mlx-lm drops the multi-token-prediction head (mtp.*).
  w.check_all_used([](const std::string& name) { return name.rfind("mtp.", 0) == 0; });
}

StateLayout NemotronH::state_layout() const {
  StateLayout layout;
  layout.attention_layers = attention_layers_;
  layout.kv_heads = c_.kv_heads;
  layout.head_dim = c_.head_dim;
  layout.mamba_layers = mamba_layers_;
  layout.conv_channels = c_.conv_dim();
  layout.conv_kernel = c_.conv_kernel;
  layout.ssm = {c_.mamba_heads, c_.mamba_head_dim, c_.n_groups, c_.ssm_state};
  layout.max_context = c_.max_context;
  layout.kv_type = kernels::kv_cache_type();
  return layout;
}

void NemotronH::run_layer(int64_t index, float* hidden, int64_t n,
                          const std::vector<RowSpan>& spans) const {
  const Layer& layer = layers_[index];
  const int64_t H = c_.hidden;
  thread_local std::vector<float> normed_buffer, mixed_buffer;
  float* xn = grow(normed_buffer, n * H);
  float* mixed = grow(mixed_buffer, n * H);
  kernels::rms_norm(hidden, n, H, layer.norm.data(), c_.eps, xn);
  switch (layer.kind) {
    case 'M':
      mamba(std::get<MambaMixer>(layer.mixer), xn, n, spans, mixed);
      break;
    case '*':
      attention(std::get<AttentionMixer>(layer.mixer), xn, n, spans, mixed);
      break;
    case 'E':
      moe(index, std::get<MoeMixer>(layer.mixer), xn, n, mixed);
      break;
    case '-': {
      const MlpMixer& d = std::get<MlpMixer>(layer.mixer);
      relu2_mlp(d.up_proj, d.down_proj, xn, n, mixed);
      break;
    }
  }
  kernels::add_in_place(hidden, mixed, n * H);
}

// §3.2–§3.5.
void NemotronH::mamba(const MambaMixer& m, const float* xn, int64_t n,
                      const std::vector<RowSpan>& spans, float* out) const {
  const int64_t heads = c_.mamba_heads, P = c_.mamba_head_dim, G = c_.n_groups, N = c_.ssm_state;
  const int64_t di = c_.d_inner(), cd = c_.conv_dim(), width = di + cd + heads;
  thread_local std::vector<float> proj_b, xbc_b, conv_b, x_b, B_b, C_b, dt_b, y_b;
  float* proj = grow(proj_b, n * width);
  float* xbc = grow(xbc_b, n * cd);
  float* conv = grow(conv_b, n * cd);
  float* x = grow(x_b, n * di);
  float* B = grow(B_b, n * G * N);
  float* C = grow(C_b, n * G * N);
  float* dt = grow(dt_b, n * heads);
  float* y = grow(y_b, n * di);

  m.in_proj.apply(xn, n, proj);  // [z | xBC | dt]
  for (int64_t t = 0; t < n; ++t) {
    std::memcpy(xbc + t * cd, proj + t * width + di, cd * sizeof(float));
  }
  for (const RowSpan& span : spans) {
    kernels::causal_conv1d(span.state->conv(m.index), xbc + span.first * cd, span.rows, cd,
                           c_.conv_kernel, m.conv_weight.data(),
                           m.conv_bias.empty() ? nullptr : m.conv_bias.data(),
                           conv + span.first * cd);
  }
  kernels::silu(conv, n * cd);
  for (int64_t t = 0; t < n; ++t) {
    const float* u = conv + t * cd;
    std::memcpy(x + t * di, u, di * sizeof(float));
    std::memcpy(B + t * G * N, u + di, G * N * sizeof(float));
    std::memcpy(C + t * G * N, u + di + G * N, G * N * sizeof(float));
  }
  kernels::mamba_step_sizes(proj + di + cd, width, n, heads, m.dt_bias.data(), c_.dt_min, c_.dt_max,
                            dt);
  for (const RowSpan& span : spans) {
    ModelState& state = *span.state;
    const int64_t t0 = span.first;
    if (state.recording_forward()) {
      state.append_record(
          m.index,
          {m.A.data(), xbc + t0 * cd, x + t0 * di, B + t0 * G * N, C + t0 * G * N, dt + t0 * heads},
          span.rows);
    }
    // The scan runs token by token for every run length: on the CPU it beats the chunked SSD
    // form (bench/decode_bench BM_SsdStep), and it makes a multi-token run (prefill chunk, verify
    // block, rollback rebuild) bit-identical to one-token decoding.
    kernels::ssd_sequential({heads, P, G, N}, state.ssm(m.index), x + t0 * di, B + t0 * G * N,
                            C + t0 * G * N, dt + t0 * heads, m.A.data(), m.D.data(), span.rows,
                            y + t0 * di);
  }
  // z is the first d_inner values of each projected row.
  kernels::gated_rms_norm(proj, width, y, n, di, G, m.norm_weight.data(), c_.eps, y);
  m.out_proj.apply(y, n, out);
}

// §4: GQA without positional encoding.
void NemotronH::attention(const AttentionMixer& a, const float* xn, int64_t n,
                          const std::vector<RowSpan>& spans, float* out) const {
  const AttentionShape shape{c_.heads, c_.kv_heads, c_.head_dim, c_.eps};
  attention_mixer({&a.q_proj, &a.k_proj, &a.v_proj, &a.o_proj}, shape, xn, n,
                  cached_attention(shape, a.index, spans, nullptr), out);
}

void NemotronH::relu2_mlp(const LinearWeights& up, const LinearWeights& down, const float* x,
                          int64_t n, float* out) const {
  std::vector<float> mid(n * up.rows());
  up.apply(x, n, mid.data());
  kernels::relu_squared(mid.data(), n * up.rows());
  down.apply(mid.data(), n, out);
}

// §5.
void NemotronH::moe(int64_t layer, const MoeMixer& e, const float* xn, int64_t n,
                    float* out) const {
  const int64_t H = c_.hidden, K = c_.top_k, I = c_.moe_intermediate;
  const int64_t expert_in = c_.latent > 0 ? c_.latent : H;
  std::vector<float> router_logits(n * c_.experts), weights(n * K);
  std::vector<int32_t> ids(n * K);
  e.gate.apply(xn, n, router_logits.data());
  kernels::RouterSpec spec;
  spec.experts = c_.experts;
  spec.top_k = K;
  spec.n_group = c_.n_group;
  spec.topk_group = c_.topk_group;
  spec.norm_topk_prob = c_.norm_topk_prob;
  spec.routed_scaling_factor = c_.routed_scaling;
  spec.correction_bias = e.correction_bias.empty() ? nullptr : e.correction_bias.data();
  kernels::moe_route(router_logits.data(), n, spec, ids.data(), weights.data());
  if (routing_counts_) routing_counts_->record(layer, c_.experts, ids.data(), n, K);

  std::vector<float> latent;
  const float* expert_input = xn;
  if (c_.latent > 0) {
    latent.resize(n * c_.latent);
    e.latent_in.apply(xn, n, latent.data());
    expert_input = latent.data();
  }
  std::vector<float> routed(n * expert_in);
  const int64_t batch = std::max<int64_t>(1, kMaxExpertRowsPerBatch / K);
  std::vector<float> repeated, mid, expert_out;
  for (int64_t first = 0; first < n; first += batch) {
    const int64_t rows = std::min(batch, n - first);
    repeated.resize(rows * K * expert_in);
    mid.resize(rows * K * I);
    expert_out.resize(rows * K * expert_in);
    for (int64_t t = 0; t < rows; ++t) {
      for (int64_t k = 0; k < K; ++k) {
        std::memcpy(repeated.data() + (t * K + k) * expert_in,
                    expert_input + (first + t) * expert_in, expert_in * sizeof(float));
      }
    }
    const int32_t* batch_ids = ids.data() + first * K;
    e.up.apply(repeated.data(), rows * K, batch_ids, mid.data());
    kernels::relu_squared(mid.data(), rows * K * I);
    e.down.apply(mid.data(), rows * K, batch_ids, expert_out.data());
    kernels::moe_combine(expert_out.data(), weights.data() + first * K, rows, K, expert_in,
                         routed.data() + first * expert_in);
  }
  if (c_.latent > 0) {
    e.latent_out.apply(routed.data(), n, out);
  } else {
    std::memcpy(out, routed.data(), n * H * sizeof(float));
  }
  if (c_.shared_expert) {
    std::vector<float> shared(n * H);
    relu2_mlp(e.shared_up, e.shared_down, xn, n, shared.data());
    kernels::add_in_place(out, shared.data(), n * H);
  }
}

int64_t NemotronH::layer_decode_weight_bytes(int64_t index) const {
  const Layer& layer = layers_[index];
  int64_t bytes = static_cast<int64_t>(layer.norm.size() * sizeof(float));
  if (const auto* m = std::get_if<MambaMixer>(&layer.mixer)) {
    bytes += linear_bytes(m->in_proj) + linear_bytes(m->out_proj);
    bytes += static_cast<int64_t>(
        (m->conv_weight.size() + m->conv_bias.size() + m->norm_weight.size() + 3 * m->A.size()) *
        sizeof(float));
  } else if (const auto* a = std::get_if<AttentionMixer>(&layer.mixer)) {
    bytes += linear_bytes(a->q_proj) + linear_bytes(a->k_proj) + linear_bytes(a->v_proj) +
             linear_bytes(a->o_proj);
  } else if (const auto* e = std::get_if<MoeMixer>(&layer.mixer)) {
    bytes += linear_bytes(e->gate) + linear_bytes(e->shared_up) + linear_bytes(e->shared_down) +
             linear_bytes(e->latent_in) + linear_bytes(e->latent_out);
    bytes += c_.top_k * routed_expert_bytes(index);
  } else if (const auto* d = std::get_if<MlpMixer>(&layer.mixer)) {
    bytes += linear_bytes(d->up_proj) + linear_bytes(d->down_proj);
  }
  return bytes;
}

int64_t NemotronH::routed_expert_bytes(int64_t index) const {
  const auto* e = std::get_if<MoeMixer>(&layers_[index].mixer);
  return e == nullptr ? 0 : e->up.bytes_per_expert() + e->down.bytes_per_expert();
}

}  // namespace

std::unique_ptr<Model> make_nemotron_h(std::unique_ptr<Checkpoint> checkpoint) {
  return std::make_unique<NemotronH>(std::move(checkpoint));
}

}  // namespace dspark
