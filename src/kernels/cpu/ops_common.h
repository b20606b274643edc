#pragma once
// Internal to the kernels module: helpers shared by the ops_*.cpp files. The reductions use a
// fixed lane structure so that their result never depends on where a row sits in a batch.
#include <cstdint>

namespace dspark::kernels::cpu {

// The sum of 8 partial sums, combined pairwise.
inline float sum_lanes(const float* lanes) {
  return ((lanes[0] + lanes[4]) + (lanes[2] + lanes[6])) +
         ((lanes[1] + lanes[5]) + (lanes[3] + lanes[7]));
}

// Σ a[i]·b[i] with 8 partial sums (lane i % 8), combined pairwise; the loop vectorizes.
inline float dot_lanes(const float* a, const float* b, int64_t n) {
  float lanes[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    for (int l = 0; l < 8; ++l) lanes[l] += a[i + l] * b[i + l];
  }
  for (; i < n; ++i) lanes[i % 8] += a[i] * b[i];
  return sum_lanes(lanes);
}

// Σ a[i]² with the same lane structure.
inline float sum_squares_lanes(const float* a, int64_t n) {
  return dot_lanes(a, a, n);
}

// y[i] += s · x[i].
inline void axpy(float s, const float* x, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] += s * x[i];
}

}  // namespace dspark::kernels::cpu
