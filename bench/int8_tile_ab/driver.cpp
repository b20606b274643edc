// Paired A/B of two versions of the AVX2 int8 tiles in one process (scripts/int8_tile_ab.sh).
// On a shared VM whole-process timings of the same binary move by a fifth between runs, which
// hides a 10 % kernel change; here the two versions take turns call by call on the same matrices
// and activations, so both see the same machine, and the outputs are compared bit for bit.
//
// Matrices: the default model's (SmolLM2-135M) 4-bit group-32 gate and down projections and an
// eighth of its 8-bit tied head, bf16 scales, tile values packed as the loader packs them, enough
// copies (>= 64 MiB, or the working set asked for) that the weights come from memory, and 4-bit
// tile codes (a version of the tiles that predates them ignores them). One thread. A working set
// of 1 MiB keeps two copies of each matrix in L2 and L3: the kernels' compute cost alone, which
// a machine with more memory bandwidth per core than this one's would see.
//
//   int8_tile_ab [rounds] [working set MiB]
//       min and median microseconds per product of each side, B / A
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

#include "kernels/cpu/quant_impl.h"
#include "kernels/quant.h"

namespace dspark::kernels::cpu {
void variant_a(const Int8Task& task, int64_t row_begin, int64_t row_end);
void variant_b(const Int8Task& task, int64_t row_begin, int64_t row_end);
}  // namespace dspark::kernels::cpu

namespace {

using namespace dspark::kernels;
using namespace dspark::kernels::cpu;

double now_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

struct Shape {
  const char* name;
  int bits;
  int64_t rows, cols;
};

struct MatrixCopy {
  std::vector<uint8_t> packed, scales, biases, tile_values, tile_codes;
  QuantMatrix w;
};

std::vector<MatrixCopy> random_copies(const Shape& shape, int64_t working_set,
                                      std::mt19937& random) {
  constexpr int64_t kGroup = 32;
  const int64_t packed_bytes = shape.rows * shape.cols * shape.bits / 8;
  const int64_t groups = shape.rows * shape.cols / kGroup;
  std::vector<MatrixCopy> copies(std::max<int64_t>(2, working_set / packed_bytes));
  for (MatrixCopy& copy : copies) {
    copy.packed.resize(packed_bytes);
    for (uint8_t& byte : copy.packed) byte = static_cast<uint8_t>(random());
    copy.scales.resize(groups * 2);
    copy.biases.resize(groups * 2);
    for (int64_t g = 0; g < groups; ++g) {
      // bf16 scales near 1/128 and biases near -1/16, as a 4- or 8-bit layer's are.
      const uint16_t scale = 0x3c00 + (random() & 0xff), bias = 0xbd80 + (random() & 0xff);
      std::memcpy(&copy.scales[2 * g], &scale, 2);
      std::memcpy(&copy.biases[2 * g], &bias, 2);
    }
    QuantMatrix& w = copy.w;
    w.packed = copy.packed.data();
    w.scales = copy.scales.data();
    w.biases = copy.biases.data();
    w.scale_dtype = dspark::DType::BF16;
    w.rows = shape.rows;
    w.cols = shape.cols;
    w.format = {shape.bits, static_cast<int>(kGroup)};
    copy.tile_values.resize(tile_values_bytes(w));
    pack_tile_values(w, copy.tile_values.data());
    w.tile_values = copy.tile_values.data();
    // Tile codes where the loader packs them for this process (8 bits only on AVX-512 VNNI CPUs).
    if (products_read_tile_codes(shape.bits)) copy.tile_codes.resize(tile_codes_bytes(w));
    if (!copy.tile_codes.empty()) {
      pack_tile_codes(w, copy.tile_codes.data());
      w.tile_codes = copy.tile_codes.data();
    }
  }
  return copies;
}

// m activation rows quantized as the AVX2 table quantizes them, with their group sums.
struct Activations {
  std::vector<int8_t> x8;
  std::vector<float> block_scales, xsums;
  std::vector<const int8_t*> x8_rows;
  std::vector<const float*> scale_rows, xsum_rows;
  std::vector<SpreadVector> spread;
  std::vector<const uint8_t*> spread_rows;  // as quant.cpp makes them: where spread_pays

  Activations(int64_t m, const Shape& shape, std::mt19937& random) {
    const int64_t blocks = shape.cols / kInt8Block;
    x8.resize(m * shape.cols);
    block_scales.resize(m * blocks);
    xsums.resize(m * blocks);
    std::vector<float> x(shape.cols);
    std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
    for (int64_t i = 0; i < m; ++i) {
      for (float& value : x) value = uniform(random);
      int8_t* row = x8.data() + i * shape.cols;
      float* scales = block_scales.data() + i * blocks;
      quantize_activations_avx2(x.data(), shape.cols, shape.bits, row, scales);
      for (int64_t b = 0; b < blocks; ++b) {
        int sum = 0;
        for (int64_t k = 0; k < kInt8Block; ++k) sum += row[b * kInt8Block + k];
        xsums[i * blocks + b] = scales[b] * static_cast<float>(sum);
      }
      x8_rows.push_back(row);
      scale_rows.push_back(scales);
      xsum_rows.push_back(xsums.data() + i * blocks);
    }
    if (spread_pays(m, shape.cols) && shape.bits == 4) {
      spread.resize(m * shape.cols / 4);
      for (int64_t i = 0; i < m; ++i) {
        spread_activations_avx2(x8_rows[i], shape.cols, spread.data() + i * shape.cols / 4);
        spread_rows.push_back(spread[i * shape.cols / 4].bytes);
      }
    }
  }

  Int8Task task(const QuantMatrix& w, float* const* y) const {
    Int8Task t;
    t.w = &w;
    t.m = static_cast<int64_t>(x8_rows.size());
    t.x8 = x8_rows.data();
    t.block_scales = scale_rows.data();
    t.xsums = xsum_rows.data();
    t.y = y;
    t.spread = spread_rows.empty() ? nullptr : spread_rows.data();
    return t;
  }
};

}  // namespace

int main(int argc, char** argv) {
  const int rounds = argc > 1 ? std::max(1, std::atoi(argv[1])) : 20;
  const int64_t working_set =
      (argc > 2 ? std::max(1, std::atoi(argv[2])) : 64) * (int64_t{1} << 20);
  const Shape shapes[] = {{"gate 1536x576 b4", 4, 1536, 576},
                          {"down 576x1536 b4", 4, 576, 1536},
                          {"head/8 6144x576 b8", 8, 6144, 576}};
  std::mt19937 random(1);
  bool identical = true;
  std::printf("%-20s %3s  %9s %9s  %9s %9s  %8s %8s\n", "matrix", "m", "A min us", "A med",
              "B min us", "B med", "B/A min", "B/A med");
  for (const Shape& shape : shapes) {
    const std::vector<MatrixCopy> copies = random_copies(shape, working_set, random);
    for (int64_t m : {1, 2, 3, 4, 5, 6, 7, 8, 16}) {
      const Activations activations(m, shape, random);
      std::vector<float> y_a(m * shape.rows), y_b(m * shape.rows);
      std::vector<float*> rows_a(m), rows_b(m);
      for (int64_t i = 0; i < m; ++i) {
        rows_a[i] = y_a.data() + i * shape.rows;
        rows_b[i] = y_b.data() + i * shape.rows;
      }
      std::vector<double> seconds[2];
      size_t next_copy = 0;
      for (int round = 0; round < rounds; ++round) {
        for (int turn = 0; turn < 2; ++turn) {
          const int side = (turn + round) % 2;  // A first in even rounds, B first in odd ones
          const Int8Task task = activations.task(copies[next_copy++ % copies.size()].w,
                                                 side == 0 ? rows_a.data() : rows_b.data());
          const double start = now_seconds();
          (side == 0 ? variant_a : variant_b)(task, 0, shape.rows);
          seconds[side].push_back(now_seconds() - start);
        }
      }
      variant_a(activations.task(copies[0].w, rows_a.data()), 0, shape.rows);
      variant_b(activations.task(copies[0].w, rows_b.data()), 0, shape.rows);
      const bool same = std::memcmp(y_a.data(), y_b.data(), y_a.size() * sizeof(float)) == 0;
      identical &= same;
      for (auto& side : seconds) std::sort(side.begin(), side.end());
      const double a_min = seconds[0].front(), a_med = seconds[0][seconds[0].size() / 2];
      const double b_min = seconds[1].front(), b_med = seconds[1][seconds[1].size() / 2];
      std::printf("%-20s %3lld  %9.1f %9.1f  %9.1f %9.1f  %8.3f %8.3f%s\n", shape.name,
                  static_cast<long long>(m), a_min * 1e6, a_med * 1e6, b_min * 1e6, b_med * 1e6,
                  b_min / a_min, b_med / a_med, same ? "" : "  OUTPUTS DIFFER");
    }
  }
  return identical ? 0 : 1;
}
