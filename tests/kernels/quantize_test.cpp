// quantize(): MLX's quantizer. Bit-exactness against mlx.core.quantize is the oracle test's job
// (tests/oracle/test_quant_mlx.py); here, the properties that must hold on any input.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "kernels/quant.h"
#include "test_matrices.h"

namespace dspark::kernels {
namespace {

struct Quantized {
  std::vector<uint32_t> packed;
  std::vector<uint8_t> scales, biases;
  QuantMatrix w;
};

Quantized quantize_matrix(const std::vector<float>& weights, int64_t rows, int64_t cols,
                          QuantFormat format, DType dtype) {
  Quantized q;
  const int64_t groups = cols / format.group_size;
  q.packed.resize(rows * cols * format.bits / 32);
  q.scales.resize(rows * groups * dtype_size(dtype));
  q.biases.resize(q.scales.size());
  quantize(weights.data(), rows, cols, format, dtype, q.packed.data(), q.scales.data(),
           q.biases.data());
  q.w.packed = reinterpret_cast<const uint8_t*>(q.packed.data());
  q.w.scales = q.scales.data();
  q.w.biases = q.biases.data();
  q.w.scale_dtype = dtype;
  q.w.rows = rows;
  q.w.cols = cols;
  q.w.format = format;
  return q;
}

float stored_scale(const Quantized& q, int64_t index) {
  if (q.w.scale_dtype == DType::F32) return reinterpret_cast<const float*>(q.scales.data())[index];
  uint16_t bits;
  std::memcpy(&bits, q.scales.data() + 2 * index, 2);
  return q.w.scale_dtype == DType::BF16 ? dspark::bf16_to_f32(bits) : dspark::f16_to_f32(bits);
}

class QuantizeTest : public ::testing::TestWithParam<std::tuple<int, int>> {};

// The range of a group divided by the number of steps: the step before MLX re-derives the scale
// from the edge (scale = edge / round(edge / step)), which can shrink it slightly so that values
// at the far end clip, off by up to one such step.
float nominal_step(const std::vector<float>& weights, int64_t first, int64_t count, int bits) {
  float lo = weights[first], hi = weights[first];
  for (int64_t k = first; k < first + count; ++k) {
    lo = std::min(lo, weights[k]);
    hi = std::max(hi, weights[k]);
  }
  return (hi - lo) / static_cast<float>((1 << bits) - 1);
}

// With fp32 scales every weight that the codes can reach comes back within half a step, the rest
// (clipped at the far end) within one nominal step, and the larger-magnitude extreme of every group
// comes back exactly.
TEST_P(QuantizeTest, RoundTripWithinHalfStepAndEdgeExact) {
  const auto [bits, group] = GetParam();
  const int64_t rows = 6, cols = 4 * group;
  std::mt19937 rng(bits * 100 + group);
  std::normal_distribution<float> normal(0.0f, 0.1f);
  std::vector<float> weights(rows * cols);
  for (auto& w : weights) w = normal(rng);
  for (int64_t k = 0; k < group; ++k) weights[k] = 0.375f;  // a constant group
  const Quantized q = quantize_matrix(weights, rows, cols, {bits, group}, DType::F32);
  std::vector<float> back(rows * cols);
  dequantize_rows(q.w, 0, 0, rows, back.data());
  const float max_q = static_cast<float>((1 << bits) - 1);
  for (int64_t g = 0; g < rows * cols / group; ++g) {
    const float scale = stored_scale(q, g);
    float bias;
    std::memcpy(&bias, q.biases.data() + 4 * g, 4);
    const float reach_lo = std::min(bias, bias + max_q * scale);
    const float reach_hi = std::max(bias, bias + max_q * scale);
    const float step = nominal_step(weights, g * group, group, bits);
    int64_t edge = g * group;
    for (int64_t k = g * group; k < (g + 1) * group; ++k) {
      if (std::abs(weights[k]) > std::abs(weights[edge])) edge = k;
      const float error = std::abs(back[k] - weights[k]);
      if (weights[k] >= reach_lo && weights[k] <= reach_hi) {
        EXPECT_LE(error, 0.5f * std::abs(scale) * (1 + 1e-5f) + 1e-7f) << "element " << k;
      } else {
        EXPECT_LE(error, step * (1 + 1e-5f) + 1e-7f) << "clipped element " << k;
      }
    }
    EXPECT_EQ(back[edge], weights[edge]) << "edge of group " << g;
  }
  for (int64_t k = 0; k < group; ++k) EXPECT_EQ(back[k], 0.375f);
}

// 16-bit scales add at most q·|s − s16| to that error.
TEST_P(QuantizeTest, RoundTripWith16BitScales) {
  const auto [bits, group] = GetParam();
  const int64_t rows = 3, cols = 2 * group;
  std::mt19937 rng(bits + group);
  std::uniform_real_distribution<float> uniform(-2.0f, 1.0f);
  for (DType dtype : {DType::BF16, DType::F16}) {
    std::vector<float> weights(rows * cols);
    for (auto& w : weights) w = testing::round_to(dtype, uniform(rng));
    const Quantized q = quantize_matrix(weights, rows, cols, {bits, group}, dtype);
    std::vector<float> back(rows * cols);
    dequantize_rows(q.w, 0, 0, rows, back.data());
    const float relative_step_error = dtype == DType::BF16 ? 1.0f / 256 : 1.0f / 2048;
    const float max_q = static_cast<float>((1 << bits) - 1);
    for (int64_t k = 0; k < rows * cols; ++k) {
      const float scale = std::abs(stored_scale(q, k / group));
      const float step = nominal_step(weights, k / group * group, group, bits);
      EXPECT_LE(std::abs(back[k] - weights[k]),
                step * 1.001f + max_q * scale * relative_step_error + 1e-6f)
          << dtype_name(dtype) << " element " << k;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(AllFormats, QuantizeTest,
                         ::testing::Combine(::testing::Values(2, 3, 4, 5, 6, 8),
                                            ::testing::Values(32, 64, 128)));

TEST(Quantize, CodesFillTheRangeAndPackAsBitStream) {
  // Integers spanning 0..max_q: the positive extreme max_q is the edge, so scale = -1 and
  // bias = max_q exactly, and value v gets code max_q − v, packed LSB first as one bit stream.
  for (int bits : {2, 3, 4, 5, 6, 8}) {
    const int64_t cols = 128;
    const int max_q = (1 << bits) - 1;
    std::vector<float> values(cols);
    for (int64_t k = 0; k < cols; ++k) values[k] = static_cast<float>((k * 37) % (max_q + 1));
    values[0] = 0.0f;
    values[1] = static_cast<float>(max_q);
    const Quantized q = quantize_matrix(values, 1, cols, {bits, 128}, DType::F32);
    EXPECT_EQ(stored_scale(q, 0), -1.0f);
    float bias;
    std::memcpy(&bias, q.biases.data(), 4);
    EXPECT_EQ(bias, static_cast<float>(max_q));
    const auto* bytes = reinterpret_cast<const uint8_t*>(q.packed.data());
    for (int64_t k = 0; k < cols; ++k) {
      uint32_t code = 0;
      for (int bit = 0; bit < bits; ++bit) {
        const int64_t stream_bit = k * bits + bit;
        code |= static_cast<uint32_t>((bytes[stream_bit / 8] >> (stream_bit % 8)) & 1) << bit;
      }
      EXPECT_EQ(code, static_cast<uint32_t>(max_q - values[k])) << bits << " bits, k " << k;
    }
  }
}

}  // namespace
}  // namespace dspark::kernels
