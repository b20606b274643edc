// Mamba-2 pieces: the causal depthwise convolution with carried window and the SSD scan, in its
// sequential form (decode, verification, rollback rebuild) and its chunked form (long prefill).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "base/error.h"
#include "base/thread_pool.h"
#include "kernels/cpu/ops_common.h"
#include "kernels/ops.h"

namespace dspark::kernels {
namespace {

void check_dims(const SsmDims& dims) {
  if (dims.heads <= 0 || dims.groups <= 0 || dims.heads % dims.groups != 0 || dims.head_dim <= 0 ||
      dims.state_size <= 0) {
    fail("ssd: {} heads cannot share {} groups (head_dim {}, state_size {})", dims.heads,
         dims.groups, dims.head_dim, dims.state_size);
  }
}

// One token of one head: S ← exp(dt·A)·S + (dt·x) ⊗ B, then y = S·C + D·x. Every path through
// the sequential scan (decode, verify, rebuild) goes through exactly this arithmetic. The output
// dot product is accumulated in the same pass as the update, lane n % 8, as cpu::dot_lanes does.
inline void ssd_token_head(float* state, const float* x, const float* B, const float* C, float dt,
                           float A, float D, int64_t head_dim, int64_t state_size, float* y) {
  const float decay = std::exp(dt * A);
  for (int64_t p = 0; p < head_dim; ++p) {
    const float xdt = dt * x[p];
    float* row = state + p * state_size;
    if (y == nullptr) {
      for (int64_t n = 0; n < state_size; ++n) row[n] = decay * row[n] + xdt * B[n];
      continue;
    }
    float lanes[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    int64_t n = 0;
    for (; n + 8 <= state_size; n += 8) {
      for (int l = 0; l < 8; ++l) {
        row[n + l] = decay * row[n + l] + xdt * B[n + l];
        lanes[l] += row[n + l] * C[n + l];
      }
    }
    for (; n < state_size; ++n) {
      row[n] = decay * row[n] + xdt * B[n];
      lanes[n % 8] += row[n] * C[n];
    }
    y[p] = cpu::sum_lanes(lanes) + D * x[p];
  }
}

}  // namespace

void conv_window_advance(float* window, const float* input, int64_t rows, int64_t channels,
                         int64_t kernel) {
  const int64_t keep = kernel - 1;
  if (keep <= 0 || rows <= 0) return;
  if (rows >= keep) {
    std::memcpy(window, input + (rows - keep) * channels, keep * channels * sizeof(float));
    return;
  }
  std::memmove(window, window + rows * channels, (keep - rows) * channels * sizeof(float));
  std::memcpy(window + (keep - rows) * channels, input, rows * channels * sizeof(float));
}

void causal_conv1d(float* window, const float* input, int64_t rows, int64_t channels,
                   int64_t kernel, const float* weight, const float* bias, float* out) {
  const int64_t keep = kernel - 1;
  // padded row i (0 <= i < keep + rows) is window row i, then input row i - keep.
  auto padded = [&](int64_t i) {
    return i < keep ? window + i * channels : input + (i - keep) * channels;
  };
  default_pool().parallel_for(channels, 64, [&](int64_t begin, int64_t end, int) {
    for (int64_t t = 0; t < rows; ++t) {
      float* o = out + t * channels;
      for (int64_t c = begin; c < end; ++c) o[c] = bias ? bias[c] : 0.0f;
      for (int64_t k = 0; k < kernel; ++k) {
        const float* source = padded(t + k);
        for (int64_t c = begin; c < end; ++c) o[c] += weight[c * kernel + k] * source[c];
      }
    }
  });
  conv_window_advance(window, input, rows, channels, kernel);
}

void ssd_sequential(const SsmDims& dims, float* state, const float* x, const float* B,
                    const float* C, const float* dt, const float* A, const float* D, int64_t rows,
                    float* y) {
  check_dims(dims);
  const int64_t H = dims.heads, P = dims.head_dim, G = dims.groups, N = dims.state_size;
  const int64_t heads_per_group = H / G;
  default_pool().parallel_for(H, 1, [&](int64_t begin, int64_t end, int) {
    for (int64_t h = begin; h < end; ++h) {
      const int64_t g = h / heads_per_group;
      for (int64_t t = 0; t < rows; ++t) {
        ssd_token_head(state + h * P * N, x + (t * H + h) * P, B + (t * G + g) * N,
                       C + (t * G + g) * N, dt[t * H + h], A[h], D ? D[h] : 0.0f, P, N,
                       y ? y + (t * H + h) * P : nullptr);
      }
    }
  });
}

void ssd_chunked(const SsmDims& dims, float* state, const float* x, const float* B, const float* C,
                 const float* dt, const float* A, const float* D, int64_t rows, int64_t chunk,
                 float* y) {
  check_dims(dims);
  if (chunk <= 0) fail("ssd_chunked: chunk length {} must be positive", chunk);
  const int64_t H = dims.heads, P = dims.head_dim, G = dims.groups, N = dims.state_size;
  const int64_t heads_per_group = H / G;
  std::vector<float> cb(G * chunk * chunk);  // [G, i, j] = C[i]·B[j], j <= i
  ThreadPool& pool = default_pool();
  for (int64_t c0 = 0; c0 < rows; c0 += chunk) {
    const int64_t Q = std::min(chunk, rows - c0);
    pool.parallel_for(G * Q, 1, [&](int64_t begin, int64_t end, int) {
      for (int64_t item = begin; item < end; ++item) {
        const int64_t g = item / Q, i = item % Q;
        const float* ci = C + ((c0 + i) * G + g) * N;
        for (int64_t j = 0; j <= i; ++j) {
          cb[(g * chunk + i) * chunk + j] = cpu::dot_lanes(ci, B + ((c0 + j) * G + g) * N, N);
        }
      }
    });
    pool.parallel_for(H, 1, [&](int64_t begin, int64_t end, int) {
      std::vector<float> log_decay(Q), cumulative(Q), weight(Q), carried(P);
      for (int64_t h = begin; h < end; ++h) {
        const int64_t g = h / heads_per_group;
        float* S = state + h * P * N;
        float running = 0.0f;
        for (int64_t t = 0; t < Q; ++t) {
          log_decay[t] = dt[(c0 + t) * H + h] * A[h];
          running += log_decay[t];
          cumulative[t] = running;
        }
        for (int64_t i = 0; i < Q && y != nullptr; ++i) {
          const float* ci = C + ((c0 + i) * G + g) * N;
          // weight[j] = (C_i·B_j) · exp(Σ_{k=j+1..i} a_k) · dt_j, the segment sum built from
          // non-positive terms so that no large exponents cancel.
          float segment = 0.0f;
          for (int64_t j = i; j >= 0; --j) {
            weight[j] = cb[(g * chunk + i) * chunk + j] * std::exp(segment) * dt[(c0 + j) * H + h];
            segment += log_decay[j];
          }
          const float carry = std::exp(cumulative[i]);
          for (int64_t p = 0; p < P; ++p) carried[p] = cpu::dot_lanes(S + p * N, ci, N);
          float* yi = y + ((c0 + i) * H + h) * P;
          const float* xi = x + ((c0 + i) * H + h) * P;
          for (int64_t p = 0; p < P; ++p) yi[p] = carry * carried[p] + D[h] * xi[p];
          for (int64_t j = 0; j <= i; ++j) {
            cpu::axpy(weight[j], x + ((c0 + j) * H + h) * P, yi, P);
          }
        }
        // S_end = exp(cum[Q-1])·S0 + Σ_j exp(Σ_{k=j+1..Q-1} a_k)·dt_j·x_j ⊗ B_j.
        const float total = std::exp(cumulative[Q - 1]);
        for (int64_t i = 0; i < P * N; ++i) S[i] *= total;
        float segment = 0.0f;
        for (int64_t j = Q - 1; j >= 0; --j) {
          const float scale = std::exp(segment) * dt[(c0 + j) * H + h];
          const float* xj = x + ((c0 + j) * H + h) * P;
          const float* bj = B + ((c0 + j) * G + g) * N;
          for (int64_t p = 0; p < P; ++p) cpu::axpy(scale * xj[p], bj, S + p * N, N);
          segment += log_decay[j];
        }
      }
    });
  }
}

}  // namespace dspark::kernels
