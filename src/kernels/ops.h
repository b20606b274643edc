#pragma once
// Non-quantized CPU operations of the model forward: normalisation, activations, rotary
// embeddings, attention over a KV cache, the causal depthwise convolution and the Mamba-2 SSD
// scan, and MoE routing. Everything is fp32. Math follows docs/model-math.md §3–§5 and
// §12.3.
//
// Row invariance: every operation computes each token row with the same arithmetic whatever the
// number of rows in the call and the thread count, so a multi-token run gives bit-identical rows
// to one-token-at-a-time processing. The one deliberate exception is ssd_chunked (a different
// summation order of the same recurrence, the form GPU kernels use); the CPU model scans token by
// token, which measures faster here.
// Attention gives the same bits on every ISA (scalar, AVX2, AVX-512; kernels/cpu/attention_impl.h
// fixes its order).
#include <cstdint>
#include <optional>
#include <string_view>

#include "kernels/quant.h"

namespace dspark::kernels {

// out[r] = x[r] / sqrt(mean(x[r]²) + eps) ⊙ weight, over `rows` rows of `dim` values; weight may
// be null (no scaling). out may alias x.
void rms_norm(const float* x, int64_t rows, int64_t dim, const float* weight, float eps,
              float* out);

// In place: x ← x · sigmoid(x), sigmoid from kernels/cpu/exp_block.h's exp (the same bits on
// every ISA, within a few ulp of libm's).
void silu(float* x, int64_t n);
// out[i] = silu(gate[i]) · up[i], or silu(gate[i]) when up is null, with `isa`'s kernel (the same
// bits on every ISA); out may alias gate or up. silu, swiglu_columns and gated_rms_norm run it
// with best_isa().
void silu_product_isa(Isa isa, const float* gate, const float* up, float* out, int64_t n);
// A sampling distribution's unnormalised weights with `isa`'s kernel (the same bits on every ISA):
// out[i] = exp((x[i] - peak) · scale) with kernels/cpu/exp_block.h's exp, and 0 where x[i] is NaN.
// For weights in (0, 1], peak is finite and no x[i] exceeds it, and scale is finite and positive.
// softmax_weights runs it with best_isa().
void softmax_weights_isa(Isa isa, const float* x, int64_t n, float peak, float scale, float* out);
void softmax_weights(const float* x, int64_t n, float peak, float scale, float* out);
// In place: x ← max(x, 0)².
void relu_squared(float* x, int64_t n);
// log(1 + exp(x)) without overflow.
float softplus(float x);

// The element-wise steps of the model files, each with one fixed arithmetic per element, so a
// backend reproduces them bit for bit (these definitions are the scalar reference).
// In place: x ← x + y (a residual add).
void add_in_place(float* x, const float* y, int64_t n);
// In place: x ← x · s.
void scale_in_place(float* x, int64_t n, float s);
// In place: gate ← silu(gate) · up (the middle of a SwiGLU MLP), over columns [begin, end) of
// `rows` rows of `stride` values: one thread's share of the rows a product has just computed
// (qmatmul_shared's rows_done).
void swiglu_columns(float* gate, const float* up, int64_t rows, int64_t stride, int64_t begin,
                    int64_t end);
// In place: x ← x · sigmoid(gate) (a gated attention output).
void sigmoid_gate(float* x, const float* gate, int64_t n);
// Mamba-2 step sizes (docs/model-math.md §3.4): dt[t, h] = clamp(softplus(raw[t · raw_stride + h]
// + bias[h]), dt_min, dt_max) for `rows` rows of `heads` values.
void mamba_step_sizes(const float* raw, int64_t raw_stride, int64_t rows, int64_t heads,
                      const float* bias, float dt_min, float dt_max, float* dt);
// Mamba-2's gated RMSNorm, gate before the norm (§3.5): out = silu(z) · y, normalised over each
// of `groups` groups of dim / groups values, times weight [dim]. z has row stride z_stride; y and
// out are [rows, dim]; out may alias y.
void gated_rms_norm(const float* z, int64_t z_stride, const float* y, int64_t rows, int64_t dim,
                    int64_t groups, const float* weight, float eps, float* out);
// The MoE combine (§5): out[t] = Σ_k weights[t·top_k + k] · expert_out[t·top_k + k], summed in
// ascending k from zero. expert_out: [rows · top_k, dim]; out: [rows, dim].
void moe_combine(const float* expert_out, const float* weights, int64_t rows, int64_t top_k,
                 int64_t dim, float* out);

// Rotary position embedding over `rows` rows of `heads` heads of `head_dim` values. Row r sits at
// position first_position + r; pair i (i < rotary_dim/2) turns by angle
// (position · position_scale) · inv_freq[i], computed in fp32. Non-traditional ("rotate half")
// pairs (x_i, x_{i + rotary_dim/2}); traditional pairs (x_2i, x_2i+1).
struct RopeSpec {
  const float* inv_freq = nullptr;  // rotary_dim / 2 values
  int64_t rotary_dim = 0;
  bool traditional = false;
  float position_scale = 1.0f;
};
void rope(float* x, int64_t rows, int64_t heads, int64_t head_dim, int64_t first_position,
          const RopeSpec& spec);

// Causal grouped-query attention. q: [rows, q_heads, head_dim]; keys, values: token-major
// [positions, kv_heads, head_dim] holding at least past + rows positions. Query row r sits at
// position past + r and attends keys [0, past + r]; q head h reads kv head h / (q_heads /
// kv_heads). Scores are scaled, softmaxed and accumulated in fp32. out: [rows, q_heads,
// head_dim]. Each output row depends only on its own query and keys: not on `rows`, the thread
// count or the ISA.
void causal_attention(const float* q, int64_t rows, int64_t q_heads, int64_t kv_heads,
                      int64_t head_dim, const float* keys, const float* values, int64_t past,
                      float scale, float* out);
// The same with the kernels of one ISA; refuses one this CPU lacks.
void causal_attention_isa(Isa isa, const float* q, int64_t rows, int64_t q_heads, int64_t kv_heads,
                          int64_t head_dim, const float* keys, const float* values, int64_t past,
                          float scale, float* out);

// The element type of a model state's KV cache. f16 halves what attention reads per token and
// what the cache holds; attention widens its values to fp32 exactly, so rows stay bit-identical
// whatever the batch, the thread count and the ISA.
enum class KvType { f32, f16 };
const char* kv_type_name(KvType type);
// "f16" or "f32"; anything else throws dspark::Error naming `what` (e.g. "--kv-cache").
KvType parse_kv_type(std::string_view name, const char* what);
int64_t kv_type_bytes(KvType type);
// The KV cache type of new model states: f16 under int8 numerics (the precision class of MLX's
// bf16 cache and llama.cpp's f16 one), f32 under fp32 numerics (the oracle path), unless
// DSPARK_KV_CACHE=f16|f32 (read at first use; a bad value throws) or set_kv_cache_type says
// otherwise.
KvType kv_cache_type();
// A type, or nullopt: follow the numerics again.
void set_kv_cache_type(std::optional<KvType> type);
// Writes n values into a cache of `type`: as they are, or rounded to the nearest f16 with values
// past ±65504 saturating there (an infinite key would turn every score into NaN).
void store_kv(KvType type, const float* src, int64_t n, void* dst);

// One sequence of a batched attention: its query rows, its own cache (of kv_type) and its output,
// laid out as in causal_attention.
struct AttentionSequence {
  const float* q = nullptr;
  int64_t rows = 0;
  const void* keys = nullptr;
  const void* values = nullptr;
  int64_t past = 0;
  float* out = nullptr;
  KvType kv_type = KvType::f32;
};
// causal_attention of several sequences sharing the head shape, their work spread over the pool
// together (a step of single-row sequences leaves too little work in any one of them to share).
// Each sequence's output equals its own causal_attention bit for bit.
void causal_attention_batch(const AttentionSequence* sequences, int64_t count, int64_t q_heads,
                            int64_t kv_heads, int64_t head_dim, float scale);
void causal_attention_batch_isa(Isa isa, const AttentionSequence* sequences, int64_t count,
                                int64_t q_heads, int64_t kv_heads, int64_t head_dim, float scale);

// Attention of a drafter's block (a DSpark / DFlash backbone layer): block row i of `rows` sits at
// position past + i and sees the context's keys 0 .. past - 1 and the block's own keys (all of
// them, or rows 0 .. i when `causal`), only those within `window` positions of it (window > 0),
// plus an optional per-head sink: a logit in the softmax normaliser that adds no value. Only the
// rows in `queries` ask: q, out: [queries.count, q_heads, head_dim], block rows queries.first ...
// The context's and the block's keys and values are token-major [kv_heads, head_dim] in separate
// buffers, the block's for all `rows` rows. Each key run goes through causal_attention's block
// kernel in its fixed order, so a row's result is the same whatever the thread count, the ISA and
// the other rows that ask.
struct BlockAttentionSpec {
  int64_t q_heads = 0, kv_heads = 0, head_dim = 0;
  bool causal = false;
  int64_t window = 0;  // 0 = none
  float scale = 1.0f;
  const float* sinks = nullptr;  // [q_heads] or null
};
struct BlockQueries {
  int64_t first = 0;
  int64_t count = 0;
};
void block_attention(const BlockAttentionSpec& spec, const float* q, BlockQueries queries,
                     const float* context_keys, const float* context_values, int64_t past,
                     const float* block_keys, const float* block_values, int64_t rows, float* out);
void block_attention_isa(Isa isa, const BlockAttentionSpec& spec, const float* q,
                         BlockQueries queries, const float* context_keys,
                         const float* context_values, int64_t past, const float* block_keys,
                         const float* block_values, int64_t rows, float* out);

// Causal depthwise convolution with carried state (docs/model-math.md §3.3). window: [kernel - 1,
// channels], the raw inputs of the previous kernel - 1 tokens, oldest first. input: [rows,
// channels]. weight: [channels, kernel] (weight[c, kernel - 1] multiplies the current token);
// bias: [channels] or null. out[t, c] = bias[c] + Σ_k weight[c, k] · padded[t + k, c] with
// padded = concat(window, input); no activation. The window is advanced past the input.
void causal_conv1d(float* window, const float* input, int64_t rows, int64_t channels,
                   int64_t kernel, const float* weight, const float* bias, float* out);
// Only the window update of causal_conv1d: window ← last kernel - 1 rows of concat(window, input).
void conv_window_advance(float* window, const float* input, int64_t rows, int64_t channels,
                         int64_t kernel);

// Mamba-2 selective state space scan (docs/model-math.md §3.4) for one sequence.
//   state: [heads, head_dim, state_size] fp32, updated in place
//   x: [rows, heads, head_dim]; B, C: [rows, groups, state_size]; head h uses group
//   h / (heads / groups); dt: [rows, heads] after softplus (and clamp); A: [heads] = -exp(A_log);
//   D: [heads]; y: [rows, heads, head_dim]. With y null only the state is updated (D may be
//   null then).
// Per token: S ← exp(dt·A)·S + (dt·x) ⊗ B;  y = S·C + D·x.
struct SsmDims {
  int64_t heads = 0;
  int64_t head_dim = 0;
  int64_t groups = 0;
  int64_t state_size = 0;
};
// The recurrence one token at a time. The arithmetic of each (token, head) is fixed, so running
// rows one call at a time or all in one call gives bit-identical states and outputs.
void ssd_sequential(const SsmDims& dims, float* state, const float* x, const float* B,
                    const float* C, const float* dt, const float* A, const float* D, int64_t rows,
                    float* y);
// The chunked ("SSD") form of the same recurrence on top of the existing state: intra-chunk
// terms as a masked decay matrix, the carried state through exp(cumulative log-decay), and one
// state update per chunk of `chunk` tokens. Equal to ssd_sequential up to rounding.
void ssd_chunked(const SsmDims& dims, float* state, const float* x, const float* B, const float* C,
                 const float* dt, const float* A, const float* D, int64_t rows, int64_t chunk,
                 float* y);

// MoE router (docs/model-math.md §5.1, mlx-lm's group_expert_select). For each row: scores =
// sigmoid(logits); selection uses scores + correction_bias (null = none), group-limited when
// n_group > 1 (groups outside the best topk_group, ranked by the sum of their two best selection
// scores, are set to 0); ties go to the lower expert id. Weights are the unbiased scores of the
// chosen experts, divided by their sum + 1e-20 when norm_topk_prob and top_k > 1, times
// routed_scaling_factor. ids and weights: [rows, top_k], experts in descending selection score.
struct RouterSpec {
  int64_t experts = 0;
  int64_t top_k = 1;
  int64_t n_group = 1;
  int64_t topk_group = 1;
  bool norm_topk_prob = true;
  float routed_scaling_factor = 1.0f;
  const float* correction_bias = nullptr;
};
void moe_route(const float* logits, int64_t rows, const RouterSpec& spec, int32_t* ids,
               float* weights);

}  // namespace dspark::kernels
