#include "model/qwen3_block.h"

#include <algorithm>
#include <cmath>

#include "base/error.h"
#include "model/state.h"

namespace dspark {

namespace {

// attention_mixer where the queries come from xq [queries, hidden] (rows of xn) while the keys and
// values come from every row of xn: out [queries, hidden]. xq null: every row of xn asks, its
// queries projected with the keys and values in one pass over xn.
void mix_attention(const AttentionWeights& weights, const AttentionShape& shape, const float* xn,
                   int64_t rows, const float* xq, int64_t queries, const Attend& attend,
                   float* out) {
  const int64_t hd = shape.head_dim;
  const int64_t q_width = shape.heads * hd, kv_width = shape.kv_heads * hd;
  thread_local std::vector<float> projected_b, q_b, gate_b, k_b, v_b, o_b;
  float* q = grow(q_b, queries * q_width);
  float* k = grow(k_b, rows * kv_width);
  float* v = grow(v_b, rows * kv_width);
  float* o = grow(o_b, queries * q_width);
  // Gated: per head [q | gate], split below; the gate is not normed.
  float* projected = shape.gated_q ? grow(projected_b, queries * 2 * q_width) : q;
  if (xq == nullptr) {
    const LinearWeights* const projections[] = {weights.q_proj, weights.k_proj, weights.v_proj};
    float* const outputs[] = {projected, k, v};
    apply_shared(xn, rows, projections, outputs);
  } else {
    const LinearWeights* const projections[] = {weights.k_proj, weights.v_proj};
    float* const outputs[] = {k, v};
    apply_shared(xn, rows, projections, outputs);
    weights.q_proj->apply(xq, queries, projected);
  }
  float* gate = nullptr;
  if (shape.gated_q) {
    gate = grow(gate_b, queries * q_width);
    for (int64_t r = 0; r < queries * shape.heads; ++r) {
      std::copy_n(projected + r * 2 * hd, hd, q + r * hd);
      std::copy_n(projected + r * 2 * hd + hd, hd, gate + r * hd);
    }
  }
  if (weights.q_norm != nullptr) {
    kernels::rms_norm(q, queries * shape.heads, hd, weights.q_norm, shape.eps, q);
  }
  if (weights.k_norm != nullptr) {
    kernels::rms_norm(k, rows * shape.kv_heads, hd, weights.k_norm, shape.eps, k);
  }
  if (shape.magnitude != 1.0f) {
    kernels::scale_in_place(q, queries * q_width, shape.magnitude);
    kernels::scale_in_place(k, rows * kv_width, shape.magnitude);
  }
  attend(q, k, v, rows, o);
  if (shape.gated_q) kernels::sigmoid_gate(o, gate, queries * q_width);
  weights.o_proj->apply(o, queries, out);
}

// hidden ← hidden + mlp(rms(hidden)) over `rows` rows, the second half of a block, in the scratch
// buffers normed and out of at least rows * hidden_size floats.
void mlp_half(const Qwen3BlockWeights& weights, int64_t hidden_size, float eps, float* hidden,
              int64_t rows, float* normed, float* out) {
  const int64_t n = rows * hidden_size;
  kernels::rms_norm(hidden, rows, hidden_size, weights.post_attention_norm, eps, normed);
  swiglu_mlp(weights.mlp, normed, rows, out);
  kernels::add_in_place(hidden, out, n);
}

}  // namespace

void attention_mixer(const AttentionWeights& weights, const AttentionShape& shape, const float* xn,
                     int64_t rows, const Attend& attend, float* out) {
  mix_attention(weights, shape, xn, rows, nullptr, rows, attend, out);
}

void swiglu_mlp(const SwigluWeights& weights, const float* x, int64_t rows, float* out) {
  const int64_t intermediate = weights.gate_proj->rows();
  thread_local std::vector<float> gate_b, up_b;
  float* gate = grow(gate_b, rows * intermediate);
  float* up = grow(up_b, rows * intermediate);
  const LinearWeights* const projections[] = {weights.gate_proj, weights.up_proj};
  float* const outputs[] = {gate, up};
  const kernels::RowsDone join = [&](int64_t begin, int64_t end) {
    kernels::swiglu_columns(gate, up, rows, intermediate, begin, end);
  };
  apply_shared(x, rows, projections, outputs, &join);
  weights.down_proj->apply(gate, rows, out);
}

void qwen3_block(const Qwen3BlockWeights& weights, const AttentionShape& shape, int64_t hidden_size,
                 float eps, float* hidden, int64_t rows, const Attend& attend) {
  const int64_t n = rows * hidden_size;
  thread_local std::vector<float> normed_b, out_b;
  float* normed = grow(normed_b, n);
  float* out = grow(out_b, n);
  kernels::rms_norm(hidden, rows, hidden_size, weights.input_norm, eps, normed);
  attention_mixer(weights.attention, shape, normed, rows, attend, out);
  kernels::add_in_place(hidden, out, n);
  mlp_half(weights, hidden_size, eps, hidden, rows, normed, out);
}

void qwen3_block_rows(const Qwen3BlockWeights& weights, const AttentionShape& shape,
                      int64_t hidden_size, float eps, const float* hidden, int64_t rows,
                      std::span<const int64_t> kept, const Attend& attend, float* kept_hidden) {
  const auto count = static_cast<int64_t>(kept.size());
  thread_local std::vector<float> normed_b, asking_b, out_b;
  float* normed = grow(normed_b, rows * hidden_size);
  float* asking = grow(asking_b, count * hidden_size);
  float* out = grow(out_b, count * hidden_size);
  kernels::rms_norm(hidden, rows, hidden_size, weights.input_norm, eps, normed);
  for (int64_t i = 0; i < count; ++i) {
    if (kept[i] < 0 || kept[i] >= rows) fail("qwen3_block_rows: row {} of {}", kept[i], rows);
    std::copy_n(normed + kept[i] * hidden_size, hidden_size, asking + i * hidden_size);
    std::copy_n(hidden + kept[i] * hidden_size, hidden_size, kept_hidden + i * hidden_size);
  }
  mix_attention(weights.attention, shape, normed, rows, asking, count, attend, out);
  kernels::add_in_place(kept_hidden, out, count * hidden_size);
  mlp_half(weights, hidden_size, eps, kept_hidden, count, normed, out);
}

Attend cached_attention(const AttentionShape& shape, int64_t layer,
                        const std::vector<RowSpan>& spans, const kernels::RopeSpec* rope) {
  return [&shape, layer, &spans, rope](float* q, float* k, const float* v, int64_t, float* o) {
    const int64_t hd = shape.head_dim;
    const int64_t q_width = shape.heads * hd, kv_width = shape.kv_heads * hd;
    thread_local std::vector<kernels::AttentionSequence> sequences;
    sequences.clear();
    for (const RowSpan& span : spans) {
      ModelState& state = *span.state;
      const int64_t past = state.length();
      float* span_q = q + span.first * q_width;
      float* span_k = k + span.first * kv_width;
      if (rope != nullptr) {
        kernels::rope(span_q, span.rows, shape.heads, hd, past, *rope);
        kernels::rope(span_k, span.rows, shape.kv_heads, hd, past, *rope);
      }
      const StateLayout& layout = state.layout();
      const int64_t stored = past * layout.kv_row_bytes();
      kernels::store_kv(layout.kv_type, span_k, span.rows * kv_width, state.keys(layer) + stored);
      kernels::store_kv(layout.kv_type, v + span.first * kv_width, span.rows * kv_width,
                        state.values(layer) + stored);
      sequences.push_back({span_q, span.rows, state.keys(layer), state.values(layer), past,
                           o + span.first * q_width, layout.kv_type});
    }
    // All the spans at once: a step of one-row sequences has too little work in each to share.
    kernels::causal_attention_batch(sequences.data(), static_cast<int64_t>(sequences.size()),
                                    shape.heads, shape.kv_heads, hd,
                                    1.0f / std::sqrt(static_cast<float>(hd)));
  };
}

}  // namespace dspark
