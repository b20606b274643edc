#pragma once
// Random quantized and dense matrices for the kernel tests, stored at odd byte offsets (kernels
// must cope with unaligned tensors). Quantized matrices are built from known integer codes packed
// here with a plain bit writer, independently of the kernels' unpacking.
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "base/system_info.h"
#include "kernels/quant.h"
#include "tensor/dtype.h"

namespace dspark::kernels::testing {

inline float round_to(DType dtype, float value) {
  if (dtype == DType::BF16) return dspark::bf16_to_f32(dspark::f32_to_bf16(value));
  if (dtype == DType::F16) return dspark::f16_to_f32(dspark::f32_to_f16(value));
  return value;
}

inline void store_as(DType dtype, float value, uint8_t* dst) {
  if (dtype == DType::F32) {
    std::memcpy(dst, &value, 4);
    return;
  }
  const uint16_t bits =
      dtype == DType::BF16 ? dspark::f32_to_bf16(value) : dspark::f32_to_f16(value);
  std::memcpy(dst, &bits, 2);
}

struct TestQuantMatrix {
  std::vector<uint8_t> storage;
  QuantMatrix w;
  std::vector<uint32_t> codes;  // [experts, rows, cols]
  std::vector<float> scales;    // [experts, rows, groups], exact values stored
  std::vector<float> biases;

  float weight(int64_t expert, int64_t row, int64_t col) const {
    const int64_t stored = expert * w.rows + row;
    const int64_t g = stored * w.groups_per_row() + col / w.format.group_size;
    return scales[g] * static_cast<float>(codes[stored * w.cols + col]) + biases[g];
  }
};

inline TestQuantMatrix make_quant_matrix(int bits, int group, DType scale_dtype, int64_t experts,
                                         int64_t rows, int64_t cols, uint32_t seed) {
  TestQuantMatrix m;
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> scale_dist(-0.05f, 0.05f);
  std::uniform_real_distribution<float> bias_dist(-1.0f, 1.0f);
  const int64_t total_rows = experts * rows;
  const int64_t groups = cols / group;
  const int64_t packed_bytes = total_rows * cols * bits / 8;
  const int64_t scale_bytes = total_rows * groups * static_cast<int64_t>(dtype_size(scale_dtype));
  // Odd offsets: packed at +1, scales at +3 past it, biases at +5 past those.
  const int64_t packed_at = 1, scales_at = packed_at + packed_bytes + 3;
  const int64_t biases_at = scales_at + scale_bytes + 5;
  m.storage.assign(biases_at + scale_bytes + 1, 0);
  m.codes.resize(total_rows * cols);
  const uint32_t max_code = (1u << bits) - 1;
  for (auto& code : m.codes) code = rng() & max_code;
  uint8_t* packed = m.storage.data() + packed_at;
  for (int64_t r = 0; r < total_rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) {
      const uint32_t code = m.codes[r * cols + c];
      for (int bit = 0; bit < bits; ++bit) {
        const int64_t stream_bit = r * cols * bits + c * bits + bit;
        if ((code >> bit) & 1u)
          packed[stream_bit / 8] |= static_cast<uint8_t>(1u << (stream_bit % 8));
      }
    }
  }
  const int64_t size = static_cast<int64_t>(dtype_size(scale_dtype));
  for (int64_t g = 0; g < total_rows * groups; ++g) {
    m.scales.push_back(round_to(scale_dtype, scale_dist(rng)));
    m.biases.push_back(round_to(scale_dtype, bias_dist(rng)));
    store_as(scale_dtype, m.scales.back(), m.storage.data() + scales_at + g * size);
    store_as(scale_dtype, m.biases.back(), m.storage.data() + biases_at + g * size);
  }
  m.w.packed = packed;
  m.w.scales = m.storage.data() + scales_at;
  m.w.biases = m.storage.data() + biases_at;
  m.w.scale_dtype = scale_dtype;
  m.w.experts = experts;
  m.w.rows = rows;
  m.w.cols = cols;
  m.w.format = {bits, group};
  return m;
}

struct TestDenseMatrix {
  std::vector<uint8_t> storage;
  DenseMatrix w;
  std::vector<float> values;  // exact stored values
};

inline TestDenseMatrix make_dense_matrix(DType dtype, int64_t experts, int64_t rows, int64_t cols,
                                         uint32_t seed) {
  TestDenseMatrix m;
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  const int64_t count = experts * rows * cols;
  const int64_t size = static_cast<int64_t>(dtype_size(dtype));
  m.storage.assign(count * size + 2, 0);
  for (int64_t k = 0; k < count; ++k) {
    m.values.push_back(round_to(dtype, dist(rng)));
    store_as(dtype, m.values.back(), m.storage.data() + 1 + k * size);
  }
  m.w.data = m.storage.data() + 1;
  m.w.dtype = dtype;
  m.w.experts = experts;
  m.w.rows = rows;
  m.w.cols = cols;
  return m;
}

// Activations that start one float into their buffer, so that they are not 16-byte aligned.
struct TestActivations {
  std::vector<float> buffer;
  float* data() { return buffer.data() + 1; }
  const float* data() const { return buffer.data() + 1; }
  float operator[](int64_t k) const { return buffer[k + 1]; }
};

inline TestActivations random_activations(int64_t count, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  TestActivations x;
  x.buffer.resize(count + 1);
  for (int64_t k = 0; k < count; ++k) x.buffer[k + 1] = dist(rng);
  return x;
}

// The ISAs this CPU runs (whatever DSPARK_ISA says): every one is checked against the scalar one.
inline std::vector<Isa> supported_isas() {
  const CpuFeatures& cpu = cpu_features();
  std::vector<Isa> isas = {Isa::scalar};
  if (cpu.avx2 && cpu.fma && cpu.f16c) {
    isas.push_back(Isa::avx2);
    if (cpu.avxvnni) isas.push_back(Isa::avxvnni);
  }
  if (cpu.avx512f && cpu.avx512bw && cpu.avx512vl && cpu.avx512dq && cpu.fma && cpu.f16c) {
    isas.push_back(Isa::avx512);
    if (cpu.avx512vnni) isas.push_back(Isa::avx512vnni);
  }
  return isas;
}

}  // namespace dspark::kernels::testing
