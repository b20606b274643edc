// Row-wise and element-wise ops: RMSNorm, activations, rotary embeddings, MoE routing.
#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "base/error.h"
#include "kernels/cpu/elementwise_impl.h"
#include "kernels/cpu/ops_common.h"
#include "kernels/ops.h"

namespace dspark::kernels {

void rms_norm(const float* x, int64_t rows, int64_t dim, const float* weight, float eps,
              float* out) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * dim;
    float* yr = out + r * dim;
    const float mean_square = cpu::sum_squares_lanes(xr, dim) / static_cast<float>(dim);
    const float inv = 1.0f / std::sqrt(mean_square + eps);
    if (weight != nullptr) {
      for (int64_t i = 0; i < dim; ++i) yr[i] = (xr[i] * inv) * weight[i];
    } else {
      for (int64_t i = 0; i < dim; ++i) yr[i] = xr[i] * inv;
    }
  }
}

namespace {

// The kernel of an element-wise op for `isa`: one per vector width.
template <typename Kernel>
Kernel elementwise_kernel(Isa isa, const char* op, Kernel scalar, Kernel avx2, Kernel avx512) {
  if (!isa_supported(isa)) fail("{}: this CPU does not support the {} kernels", op, isa_name(isa));
  switch (isa) {
    case Isa::avx512vnni:
    case Isa::avx512:
      return avx512;
    case Isa::avxvnni:
    case Isa::avx2:
      return avx2;
    case Isa::scalar:
      break;
  }
  return scalar;
}

using SiluProduct = void (*)(const float*, const float*, float*, int64_t);

SiluProduct silu_product_kernel(Isa isa) {
  return elementwise_kernel<SiluProduct>(isa, "silu", cpu::silu_product_ref, cpu::silu_product_avx2,
                                         cpu::silu_product_avx512);
}

// The kernel of best_isa(), resolved once: the element-wise steps run hundreds of times a token.
SiluProduct silu_product_best() {
  static const SiluProduct kernel = silu_product_kernel(best_isa());
  return kernel;
}

using SoftmaxWeights = void (*)(const float*, int64_t, float, float, float*);

SoftmaxWeights softmax_weights_kernel(Isa isa) {
  return elementwise_kernel<SoftmaxWeights>(isa, "softmax weights", cpu::softmax_weights_ref,
                                            cpu::softmax_weights_avx2, cpu::softmax_weights_avx512);
}

}  // namespace

void softmax_weights_isa(Isa isa, const float* x, int64_t n, float peak, float scale, float* out) {
  softmax_weights_kernel(isa)(x, n, peak, scale, out);
}

void softmax_weights(const float* x, int64_t n, float peak, float scale, float* out) {
  static const SoftmaxWeights kernel = softmax_weights_kernel(best_isa());
  kernel(x, n, peak, scale, out);
}

void silu_product_isa(Isa isa, const float* gate, const float* up, float* out, int64_t n) {
  silu_product_kernel(isa)(gate, up, out, n);
}

void silu(float* x, int64_t n) {
  silu_product_best()(x, nullptr, x, n);
}

void relu_squared(float* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const float r = x[i] > 0.0f ? x[i] : 0.0f;
    x[i] = r * r;
  }
}

float softplus(float x) {
  return std::max(x, 0.0f) + std::log1p(std::exp(-std::fabs(x)));
}

void add_in_place(float* x, const float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) x[i] += y[i];
}

void scale_in_place(float* x, int64_t n, float s) {
  for (int64_t i = 0; i < n; ++i) x[i] *= s;
}

void swiglu_columns(float* gate, const float* up, int64_t rows, int64_t stride, int64_t begin,
                    int64_t end) {
  const SiluProduct kernel = silu_product_best();
  for (int64_t r = 0; r < rows; ++r) {
    kernel(gate + r * stride + begin, up + r * stride + begin, gate + r * stride + begin,
           end - begin);
  }
}

void sigmoid_gate(float* x, const float* gate, int64_t n) {
  for (int64_t i = 0; i < n; ++i) x[i] *= 1.0f / (1.0f + std::exp(-gate[i]));
}

void mamba_step_sizes(const float* raw, int64_t raw_stride, int64_t rows, int64_t heads,
                      const float* bias, float dt_min, float dt_max, float* dt) {
  for (int64_t t = 0; t < rows; ++t) {
    for (int64_t h = 0; h < heads; ++h) {
      dt[t * heads + h] = std::clamp(softplus(raw[t * raw_stride + h] + bias[h]), dt_min, dt_max);
    }
  }
}

void gated_rms_norm(const float* z, int64_t z_stride, const float* y, int64_t rows, int64_t dim,
                    int64_t groups, const float* weight, float eps, float* out) {
  if (groups < 1 || dim % groups != 0) {
    fail("gated_rms_norm: {} values do not split into {} groups", dim, groups);
  }
  const int64_t group_size = dim / groups;
  for (int64_t t = 0; t < rows; ++t) {
    float* row = out + t * dim;
    silu_product_best()(z + t * z_stride, y + t * dim, row, dim);
    for (int64_t g = 0; g < groups; ++g) {
      rms_norm(row + g * group_size, 1, group_size, weight + g * group_size, eps,
               row + g * group_size);
    }
  }
}

void moe_combine(const float* expert_out, const float* weights, int64_t rows, int64_t top_k,
                 int64_t dim, float* out) {
  for (int64_t t = 0; t < rows; ++t) {
    float* y = out + t * dim;
    std::fill(y, y + dim, 0.0f);
    for (int64_t k = 0; k < top_k; ++k) {
      const float weight = weights[t * top_k + k];
      const float* v = expert_out + (t * top_k + k) * dim;
      for (int64_t i = 0; i < dim; ++i) y[i] += weight * v[i];
    }
  }
}

namespace {

// The cosines and sines of consecutive positions for one RopeSpec. A forward rotates q and k of
// every layer at the same positions, so each thread keeps the last table it computed and reuses it
// while the frequencies (compared by value: a spec's array may be freed and its address reused),
// scale and positions match. The values are the ones computed per call, so the results do not
// change.
struct RopeTable {
  std::vector<float> inv_freq;
  float position_scale = 0.0f;
  int64_t first_position = -1;
  int64_t rows = 0;
  std::vector<float> cosines, sines;  // rows x half

  bool holds(const RopeSpec& spec, int64_t half, int64_t first, int64_t count) const {
    return first_position == first && rows >= count && position_scale == spec.position_scale &&
           static_cast<int64_t>(inv_freq.size()) == half &&
           std::equal(inv_freq.begin(), inv_freq.end(), spec.inv_freq);
  }

  void compute(const RopeSpec& spec, int64_t half, int64_t first, int64_t count) {
    inv_freq.assign(spec.inv_freq, spec.inv_freq + half);
    position_scale = spec.position_scale;
    first_position = first;
    rows = count;
    cosines.resize(static_cast<size_t>(count * half));
    sines.resize(cosines.size());
    for (int64_t r = 0; r < count; ++r) {
      const float position = static_cast<float>(first + r) * spec.position_scale;
      for (int64_t i = 0; i < half; ++i) {
        const float angle = position * spec.inv_freq[i];
        cosines[r * half + i] = std::cos(angle);
        sines[r * half + i] = std::sin(angle);
      }
    }
  }
};

}  // namespace

void rope(float* x, int64_t rows, int64_t heads, int64_t head_dim, int64_t first_position,
          const RopeSpec& spec) {
  const int64_t half = spec.rotary_dim / 2;
  if (spec.rotary_dim > head_dim || spec.rotary_dim % 2 != 0) {
    fail("rope: rotary_dim {} must be even and at most head_dim {}", spec.rotary_dim, head_dim);
  }
  thread_local RopeTable table;
  if (!table.holds(spec, half, first_position, rows)) {
    table.compute(spec, half, first_position, rows);
  }
  for (int64_t r = 0; r < rows; ++r) {
    const float* cosines = table.cosines.data() + r * half;
    const float* sines = table.sines.data() + r * half;
    for (int64_t h = 0; h < heads; ++h) {
      float* v = x + (r * heads + h) * head_dim;
      for (int64_t i = 0; i < half; ++i) {
        float* first = spec.traditional ? v + 2 * i : v + i;
        float* second = spec.traditional ? v + 2 * i + 1 : v + i + half;
        const float a = *first;
        const float b = *second;
        *first = a * cosines[i] - b * sines[i];
        *second = a * sines[i] + b * cosines[i];
      }
    }
  }
}

void moe_route(const float* logits, int64_t rows, const RouterSpec& spec, int32_t* ids,
               float* weights) {
  const int64_t experts = spec.experts;
  if (spec.top_k < 1 || spec.top_k > experts) {
    fail("moe_route: top_k {} must be in [1, {}]", spec.top_k, experts);
  }
  if (spec.n_group < 1 || experts % spec.n_group != 0 || spec.topk_group < 1 ||
      spec.topk_group > spec.n_group) {
    fail("moe_route: {} experts cannot form {} groups keeping {}", experts, spec.n_group,
         spec.topk_group);
  }
  std::vector<float> scores(experts), selection(experts);
  std::vector<int32_t> order(experts);
  const int64_t group_size = experts / spec.n_group;
  std::vector<float> group_scores(spec.n_group);
  std::vector<int64_t> group_order(spec.n_group);
  // Descending value, ties to the lower index: a total order, so the choice is deterministic.
  auto by_value = [](const std::vector<float>& v) {
    return [&v](int64_t a, int64_t b) { return v[a] > v[b] || (v[a] == v[b] && a < b); };
  };
  for (int64_t r = 0; r < rows; ++r) {
    const float* row = logits + r * experts;
    for (int64_t e = 0; e < experts; ++e) {
      scores[e] = 1.0f / (1.0f + std::exp(-row[e]));
      selection[e] = scores[e] + (spec.correction_bias ? spec.correction_bias[e] : 0.0f);
    }
    if (spec.n_group > 1) {
      for (int64_t g = 0; g < spec.n_group; ++g) {
        const float* s = selection.data() + g * group_size;
        float best = -INFINITY, second = -INFINITY;
        for (int64_t i = 0; i < group_size; ++i) {
          if (s[i] > best) {
            second = best;
            best = s[i];
          } else if (s[i] > second) {
            second = s[i];
          }
        }
        group_scores[g] = group_size > 1 ? best + second : best;
      }
      std::iota(group_order.begin(), group_order.end(), 0);
      std::sort(group_order.begin(), group_order.end(), by_value(group_scores));
      for (int64_t i = spec.topk_group; i < spec.n_group; ++i) {
        std::fill_n(selection.begin() + group_order[i] * group_size, group_size, 0.0f);
      }
    }
    std::iota(order.begin(), order.end(), 0);
    std::partial_sort(order.begin(), order.begin() + spec.top_k, order.end(), by_value(selection));
    int32_t* row_ids = ids + r * spec.top_k;
    float* row_weights = weights + r * spec.top_k;
    float sum = 0.0f;
    for (int64_t k = 0; k < spec.top_k; ++k) {
      row_ids[k] = order[k];
      row_weights[k] = scores[order[k]];
      sum += row_weights[k];
    }
    const bool normalise = spec.norm_topk_prob && spec.top_k > 1;
    for (int64_t k = 0; k < spec.top_k; ++k) {
      if (normalise) row_weights[k] = row_weights[k] / (sum + 1e-20f);
      row_weights[k] *= spec.routed_scaling_factor;
    }
  }
}

}  // namespace dspark::kernels
