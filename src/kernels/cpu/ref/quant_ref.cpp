// Scalar reference kernels: the canonical order of quant_impl.h written as plainly as possible.
// They are the oracle for the SIMD kernels and the fallback for CPUs without AVX2.
#include <cmath>
#include <cstring>

#include "kernels/cpu/quant_impl.h"
#include "tensor/dtype.h"

namespace dspark::kernels::cpu {
namespace {

// Element `index` of a row stored as a little-endian bit stream of `bits`-bit values.
uint32_t unpack_element(const uint8_t* row, int64_t row_bytes, int bits, int64_t index) {
  const int64_t first_bit = index * bits;
  uint32_t value = 0;
  for (int bit = 0; bit < bits; ++bit) {
    const int64_t stream_bit = first_bit + bit;
    const int64_t byte = stream_bit / 8;
    if (byte >= row_bytes) break;
    value |= static_cast<uint32_t>((row[byte] >> (stream_bit % 8)) & 1u) << bit;
  }
  return value;
}

float load_as_float(const uint8_t* base, DType dtype, int64_t index) {
  switch (dtype) {
    case DType::F32: {
      float value;
      std::memcpy(&value, base + index * 4, 4);
      return value;
    }
    case DType::BF16:
    case DType::F16: {
      uint16_t bits;
      std::memcpy(&bits, base + index * 2, 2);
      return dtype == DType::BF16 ? dspark::bf16_to_f32(bits) : dspark::f16_to_f32(bits);
    }
    default:
      return 0.0f;  // Formats are validated before kernels run.
  }
}

float tree16(const float* lanes) {
  float r8[8], r4[4], r2[2];
  for (int l = 0; l < 8; ++l) r8[l] = lanes[l] + lanes[l + 8];
  for (int l = 0; l < 4; ++l) r4[l] = r8[l] + r8[l + 4];
  for (int l = 0; l < 2; ++l) r2[l] = r4[l] + r4[l + 2];
  return r2[0] + r2[1];
}

void quant_rows(const QuantTask& task, int64_t row_begin, int64_t row_end) {
  const QuantMatrix& w = *task.w;
  const int bits = w.format.bits;
  const int64_t group = w.format.group_size;
  const int64_t groups = w.groups_per_row();
  const int64_t row_bytes = w.words_per_row() * 4;
  const int64_t scale_size = static_cast<int64_t>(dtype_size(w.scale_dtype));
  for (int64_t row = row_begin; row < row_end; ++row) {
    const int64_t stored_row = task.expert * w.rows + row;
    const uint8_t* packed = w.packed + stored_row * row_bytes;
    const uint8_t* scales = w.scales + stored_row * groups * scale_size;
    const uint8_t* biases = w.biases + stored_row * groups * scale_size;
    for (int64_t i = 0; i < task.m; ++i) {
      const float* x = task.x[i];
      float acc[16] = {};
      float bias_lanes[16] = {};
      for (int64_t g = 0; g < groups; ++g) {
        float partial[16] = {};
        for (int64_t slot = 0; slot < group; ++slot) {
          const int64_t element = g * group + slot_element(bits, slot);
          const auto q = static_cast<float>(unpack_element(packed, row_bytes, bits, element));
          partial[slot % 16] = std::fma(x[element], q, partial[slot % 16]);
        }
        const float scale = load_as_float(scales, w.scale_dtype, g);
        const float bias = load_as_float(biases, w.scale_dtype, g);
        for (int l = 0; l < 16; ++l) acc[l] = std::fma(scale, partial[l], acc[l]);
        bias_lanes[g % 16] = std::fma(bias, task.xsums[i][g], bias_lanes[g % 16]);
      }
      float total[16];
      for (int l = 0; l < 16; ++l) total[l] = acc[l] + bias_lanes[l];
      task.y[i][row] = tree16(total);
    }
  }
}

// The int8 order of quant_impl.h, activations in element order.
void int8_rows(const Int8Task& task, int64_t row_begin, int64_t row_end) {
  const QuantMatrix& w = *task.w;
  const int bits = w.format.bits;
  const int64_t group = w.format.group_size;
  const int64_t groups = w.groups_per_row();
  const int64_t row_bytes = w.words_per_row() * 4;
  const int64_t scale_size = static_cast<int64_t>(dtype_size(w.scale_dtype));
  for (int64_t row = row_begin; row < row_end; ++row) {
    const int64_t stored_row = task.expert * w.rows + row;
    const uint8_t* packed = w.packed + stored_row * row_bytes;
    const uint8_t* scales = w.scales + stored_row * groups * scale_size;
    const uint8_t* biases = w.biases + stored_row * groups * scale_size;
    for (int64_t i = 0; i < task.m; ++i) {
      const int8_t* x8 = task.x8[i];
      float acc = 0.0f, bias = 0.0f;
      for (int64_t g = 0; g < groups; ++g) {
        float t = 0.0f;
        for (int64_t first = g * group; first < (g + 1) * group; first += kInt8Block) {
          int32_t isum = 0;
          for (int64_t k = first; k < first + kInt8Block; ++k) {
            isum += static_cast<int32_t>(unpack_element(packed, row_bytes, bits, k)) * x8[k];
          }
          const float d = task.block_scales[i][first / kInt8Block];
          t = first == g * group ? d * static_cast<float>(isum)
                                 : std::fma(d, static_cast<float>(isum), t);
        }
        acc = std::fma(load_as_float(scales, w.scale_dtype, g), t, acc);
        bias = std::fma(load_as_float(biases, w.scale_dtype, g), task.xsums[i][g], bias);
      }
      task.y[i][row] = acc + bias;
    }
  }
}

void quantize_activations(const float* x, int64_t cols, int /*bits*/, int8_t* x8,
                          float* block_scales) {
  for (int64_t first = 0; first < cols; first += kInt8Block) {
    float amax = 0.0f;
    for (int64_t k = first; k < first + kInt8Block; ++k) {
      const float magnitude = std::fabs(x[k]);
      amax = magnitude > amax ? magnitude : amax;
    }
    const float d = amax / 127.0f;
    block_scales[first / kInt8Block] = d;
    for (int64_t k = first; k < first + kInt8Block; ++k) {
      if (d == 0.0f) {
        x8[k] = 0;
        continue;
      }
      float c = x[k] / d;
      c = c < 127.0f ? c : 127.0f;
      c = c > -127.0f ? c : -127.0f;
      x8[k] = static_cast<int8_t>(std::nearbyint(c));
    }
  }
}

void dense_rows(const DenseTask& task, int64_t row_begin, int64_t row_end) {
  const DenseMatrix& w = *task.w;
  for (int64_t row = row_begin; row < row_end; ++row) {
    const int64_t first = (task.expert * w.rows + row) * w.cols;
    for (int64_t i = 0; i < task.m; ++i) {
      const float* x = task.x[i];
      float acc[16] = {};
      for (int64_t k = 0; k < w.cols; ++k) {
        acc[k % 16] = std::fma(x[k], load_as_float(w.data, w.dtype, first + k), acc[k % 16]);
      }
      task.y[i][row] = tree16(acc);
    }
  }
}

void bf16_to_f32_ref(const uint8_t* src, int64_t n, float* dst) {
  for (int64_t k = 0; k < n; ++k) dst[k] = load_as_float(src, DType::BF16, k);
}

void f16_to_f32_ref(const uint8_t* src, int64_t n, float* dst) {
  for (int64_t k = 0; k < n; ++k) dst[k] = load_as_float(src, DType::F16, k);
}

void f32_to_bf16_ref(const float* src, int64_t n, uint8_t* dst) {
  for (int64_t k = 0; k < n; ++k) {
    const uint16_t bits = dspark::f32_to_bf16(src[k]);
    std::memcpy(dst + 2 * k, &bits, 2);
  }
}

void f32_to_f16_ref(const float* src, int64_t n, uint8_t* dst) {
  for (int64_t k = 0; k < n; ++k) {
    // The operand order of the SIMD min/max: a NaN passes through both.
    const float above = -kF16Max > src[k] ? -kF16Max : src[k];
    const float clamped = kF16Max < above ? kF16Max : above;
    const uint16_t bits = dspark::f32_to_f16(clamped);
    std::memcpy(dst + 2 * k, &bits, 2);
  }
}

uint64_t read_sweep_ref(const uint8_t* data, int64_t bytes) {
  uint64_t sum = 0;
  for (int64_t offset = 0; offset < bytes; offset += 8) {
    uint64_t word;
    std::memcpy(&word, data + offset, 8);
    sum += word;
  }
  return sum;
}

}  // namespace

const KernelTable kRefKernels = {
    quant_rows,     int8_rows,       quantize_activations, dense_rows,     bf16_to_f32_ref,
    f16_to_f32_ref, f32_to_bf16_ref, f32_to_f16_ref,       read_sweep_ref, nullptr,
    false};

}  // namespace dspark::kernels::cpu
