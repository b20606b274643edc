#pragma once
// The pre-norm attention + SwiGLU block of llama, qwen2 and qwen3 (docs/model-math.md §12), one
// implementation for its three users:
//   - the dense models run whole blocks over their KV cache (rotary positions per sequence);
//   - nemotron_h's attention layers run the attention half alone (no positions, §4);
//   - the DSpark / DFlash backbone runs whole blocks over [context ; draft block]
//     (docs/speculative.md §11.3), with a gated query and sinks where the head has them.
// What differs between them is only how queries meet keys, so the caller supplies that step.
#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "kernels/ops.h"
#include "model/model.h"
#include "model/weights.h"

namespace dspark {

// A layer's scratch buffer, grown to at least n floats (kept between calls: thread_local buffers).
inline float* grow(std::vector<float>& buffer, int64_t n) {
  if (static_cast<int64_t>(buffer.size()) < n) buffer.resize(n);
  return buffer.data();
}

struct AttentionWeights {
  const LinearWeights* q_proj = nullptr;  // with a gated query: per head [q | gate]
  const LinearWeights* k_proj = nullptr;
  const LinearWeights* v_proj = nullptr;
  const LinearWeights* o_proj = nullptr;
  const float* q_norm = nullptr;  // per-head RMSNorm weights [head_dim] (qwen3), or null
  const float* k_norm = nullptr;
};

struct AttentionShape {
  int64_t heads = 0;
  int64_t kv_heads = 0;
  int64_t head_dim = 0;
  float eps = 1e-6f;       // of the per-head norms
  bool gated_q = false;    // o ← o · sigmoid(gate) before o_proj
  float magnitude = 1.0f;  // a factor on q and k after their norms (yarn's mscale)
};

// Given q [rows, heads, head_dim] and k, v [rows, kv_heads, head_dim] after the projections and
// per-head norms, fills o [rows, heads, head_dim]: rotary embedding, any cache and the attention
// itself. It may change q and k in place. Under qwen3_block_rows, q and o hold the kept rows only.
using Attend = std::function<void(float* q, float* k, const float* v, int64_t rows, float* o)>;

// out [rows, hidden] = o_proj(attend(q, k, v)) for the normed input xn [rows, hidden].
void attention_mixer(const AttentionWeights& weights, const AttentionShape& shape, const float* xn,
                     int64_t rows, const Attend& attend, float* out);

struct SwigluWeights {
  const LinearWeights* gate_proj = nullptr;
  const LinearWeights* up_proj = nullptr;
  const LinearWeights* down_proj = nullptr;
};

// out [rows, hidden] = down_proj(silu(gate_proj(x)) · up_proj(x)).
void swiglu_mlp(const SwigluWeights& weights, const float* x, int64_t rows, float* out);

struct Qwen3BlockWeights {
  const float* input_norm = nullptr;
  const float* post_attention_norm = nullptr;
  AttentionWeights attention;
  SwigluWeights mlp;
};

// hidden ← hidden + attention(rms(hidden)); hidden ← hidden + mlp(rms(hidden)), over `rows` rows
// of hidden_size values; eps is the block norms' epsilon.
void qwen3_block(const Qwen3BlockWeights& weights, const AttentionShape& shape, int64_t hidden_size,
                 float eps, float* hidden, int64_t rows, const Attend& attend);

// qwen3_block's result for the rows `kept` (indices into hidden's `rows` rows) alone, written one
// after another to kept_hidden [kept.size(), hidden_size]: every row's keys and values reach
// attend, but the queries, o_proj and the MLP run for the kept rows only. Each kept row equals its
// row of qwen3_block bit for bit (every op works row by row), for a fraction of the work where a
// drafter's last layer needs only the drafting rows of its block.
void qwen3_block_rows(const Qwen3BlockWeights& weights, const AttentionShape& shape,
                      int64_t hidden_size, float eps, const float* hidden, int64_t rows,
                      std::span<const int64_t> kept, const Attend& attend, float* kept_hidden);

// The Attend of a model's own KV cache: per sequence span, the rotary embedding at the sequence's
// positions (rope null: none), the new keys and values appended to cache slot `layer`, and causal
// attention over the whole cache.
Attend cached_attention(const AttentionShape& shape, int64_t layer,
                        const std::vector<RowSpan>& spans, const kernels::RopeSpec* rope);

}  // namespace dspark
