// The int8 numerics of the quantized products (quant.h, order in quant_impl.h): the scalar
// reference against a double-precision evaluation of the formula, every SIMD ISA against the scalar
// reference bit for bit, each row of a batch against its m = 1 value, thread-count and expert-mix
// independence, the accuracy against the fp32 numerics, and the process-wide numerics switch.
// Every call names its numerics: none of these tests depends on the default.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include "base/error.h"
#include "base/thread_pool.h"
#include "kernels/quant.h"
#include "test_matrices.h"

namespace dspark::kernels {
namespace {

using testing::make_quant_matrix;
using testing::random_activations;
using testing::supported_isas;
using testing::TestActivations;

constexpr double kUnitRoundoff = 1.0 / (1 << 24);
constexpr int64_t kBlock = 32;

void int8_product(Isa isa, const float* x, int64_t m, const QuantMatrix& w, float* y,
                  int64_t expert = 0) {
  qmatmul_numerics(Numerics::int8, isa, x, m, w, y, expert);
}

// Bit-exact comparison; on a mismatch, the first differing (activation row, output row).
std::string compare(const float* got, const float* want, int64_t m, int64_t rows) {
  for (int64_t k = 0; k < m * rows; ++k) {
    if (std::memcmp(&got[k], &want[k], sizeof(float)) != 0) {
      std::ostringstream message;
      message << "activation row " << k / rows << ", output row " << k % rows << ": " << got[k]
              << " vs " << want[k];
      return message.str();
    }
  }
  return "";
}

// Random rows, with special rows when the batch has them: row 1 all +0, row 2 all -0 (zero
// blocks), row 3 with one zero block and ties: a block whose largest magnitude is 127 has d = 1,
// so ±k.5 must round half to even.
TestActivations batch_activations(int64_t m, int64_t cols, uint32_t seed) {
  TestActivations x = random_activations(m * cols, seed);
  if (m > 1) std::fill_n(x.data() + cols, cols, 0.0f);
  if (m > 2) std::fill_n(x.data() + 2 * cols, cols, -0.0f);
  if (m > 3) {
    float* row = x.data() + 3 * cols;
    std::fill_n(row, kBlock, 0.0f);
    if (cols >= 2 * kBlock) {
      const float ties[] = {127.0f, 2.5f, -3.5f, 0.5f, -0.5f, 1.5f, -126.5f, 4.5f};
      for (int64_t k = 0; k < kBlock; ++k) row[kBlock + k] = ties[k % 8];
    }
  }
  return x;
}

// The formula of quant.h evaluated independently: x8 and d_b as specified (fp32 steps), then the
// sum in double, with its magnitude Σ|s_g·d_b·isum_b| + Σ|b_g|·Σ|x| for error bounds.
struct FormulaValue {
  double value = 0.0;
  double magnitude = 0.0;
};

FormulaValue formula(const float* x, const testing::TestQuantMatrix& matrix, int64_t expert,
                     int64_t row) {
  const QuantMatrix& w = matrix.w;
  const int64_t cols = w.cols, group = w.format.group_size;
  std::vector<int> x8(cols);
  std::vector<float> d(cols / kBlock);
  for (int64_t b = 0; b < cols / kBlock; ++b) {
    float amax = 0.0f;
    for (int64_t k = b * kBlock; k < (b + 1) * kBlock; ++k) amax = std::max(amax, std::abs(x[k]));
    d[b] = amax / 127.0f;
    for (int64_t k = b * kBlock; k < (b + 1) * kBlock; ++k) {
      x8[k] = d[b] == 0.0f
                  ? 0
                  : static_cast<int>(std::nearbyint(std::clamp(x[k] / d[b], -127.0f, 127.0f)));
    }
  }
  const int64_t stored = expert * w.rows + row;
  FormulaValue result;
  for (int64_t g = 0; g < cols / group; ++g) {
    const double scale = matrix.scales[stored * (cols / group) + g];
    const double bias = matrix.biases[stored * (cols / group) + g];
    // Σx of the quantized row: the product is then exactly W·x̂, x̂ = d_b·x8 (quant.h).
    double xsum = 0.0, xabs = 0.0;
    for (int64_t k = g * group; k < (g + 1) * group; ++k) {
      xsum += static_cast<double>(d[k / kBlock]) * x8[k];
      xabs += std::abs(static_cast<double>(d[k / kBlock]) * x8[k]);
    }
    for (int64_t b = g * group / kBlock; b < (g + 1) * group / kBlock; ++b) {
      int64_t isum = 0;
      for (int64_t k = b * kBlock; k < (b + 1) * kBlock; ++k) {
        isum += static_cast<int64_t>(matrix.codes[stored * cols + k]) * x8[k];
      }
      result.value += scale * d[b] * static_cast<double>(isum);
      result.magnitude += std::abs(scale * d[b] * static_cast<double>(isum));
    }
    result.value += bias * xsum;
    result.magnitude += std::abs(bias) * xabs;
  }
  return result;
}

using Int8Params = std::tuple<int, int, DType>;

class QuantInt8Test : public ::testing::TestWithParam<Int8Params> {
 protected:
  int bits() const { return std::get<0>(GetParam()); }
  int group() const { return std::get<1>(GetParam()); }
  DType scale_dtype() const { return std::get<2>(GetParam()); }
};

// Every fp32 rounding of the canonical order (the block chain, the group chain, the fp32 group
// sums of x, the final add) is within (cols + 8)·u of the magnitude; a wrong code, scale, block
// scale or rounding of x8 (a tie rounded away from even) misses by far more.
TEST_P(QuantInt8Test, ScalarReferenceMatchesFormulaInDouble) {
  const int64_t rows = 11, cols = 3 * group(), experts = 2, m = 5;
  const auto matrix = make_quant_matrix(bits(), group(), scale_dtype(), experts, rows, cols, 7);
  const auto x = batch_activations(m, cols, 8);
  std::vector<float> y(m * rows);
  int8_product(Isa::scalar, x.data(), m, matrix.w, y.data(), 1);
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t r = 0; r < rows; ++r) {
      const FormulaValue expected = formula(x.data() + i * cols, matrix, 1, r);
      EXPECT_NEAR(y[i * rows + r], expected.value, (cols + 8) * kUnitRoundoff * expected.magnitude)
          << "row " << r << " activation " << i;
    }
  }
}

TEST_P(QuantInt8Test, EverySimdIsaEqualsScalarBitForBit) {
  // 37 output rows: not a multiple of the 8-row tile; 3 experts, the last one used.
  const int64_t rows = 37, cols = 5 * group(), experts = 3;
  const auto matrix = make_quant_matrix(bits(), group(), scale_dtype(), experts, rows, cols, 11);
  for (int64_t m : {1, 2, 3, 4, 5, 8, 9, 17}) {
    const auto x = batch_activations(m, cols, static_cast<uint32_t>(100 + m));
    std::vector<float> reference(m * rows);
    int8_product(Isa::scalar, x.data(), m, matrix.w, reference.data(), 2);
    for (Isa isa : supported_isas()) {
      std::vector<float> y(m * rows, -1.0f);
      int8_product(isa, x.data(), m, matrix.w, y.data(), 2);
      EXPECT_EQ(compare(y.data(), reference.data(), m, rows), "") << isa_name(isa) << " m=" << m;
    }
  }
}

TEST_P(QuantInt8Test, GatheredProductEqualsPerExpertProducts) {
  const int64_t rows = 21, cols = 3 * group(), experts = 5, m = 7;
  const auto matrix = make_quant_matrix(bits(), group(), scale_dtype(), experts, rows, cols, 17);
  const auto x = batch_activations(m, cols, 18);
  const std::vector<int32_t> ids = {4, 0, 4, 2, 0, 4, 1};
  for (Isa isa : supported_isas()) {
    std::vector<float> gathered(m * rows, -1.0f);
    gather_qmatmul_numerics(Numerics::int8, isa, x.data(), m, ids.data(), matrix.w,
                            gathered.data());
    for (int64_t r = 0; r < m; ++r) {
      std::vector<float> single(rows);
      int8_product(Isa::scalar, x.data() + r * cols, 1, matrix.w, single.data(), ids[r]);
      EXPECT_EQ(compare(gathered.data() + r * rows, single.data(), 1, rows), "")
          << isa_name(isa) << " row " << r;
    }
  }
}

// Dequantization (embedding lookups) and int8 products of `tiled` (w with tile values or codes)
// against w's.
void check_tiled_products(const QuantMatrix& w, const QuantMatrix& tiled, int64_t rows,
                          int64_t cols, int64_t experts) {
  std::vector<float> from_tiles(rows * cols), from_originals(rows * cols);
  dequantize_rows(tiled, 2, 0, rows, from_tiles.data());
  dequantize_rows(w, 2, 0, rows, from_originals.data());
  EXPECT_EQ(compare(from_tiles.data(), from_originals.data(), rows, cols), "");
  dequantize_rows_mlx(tiled, 1, 3, rows, from_tiles.data());
  dequantize_rows_mlx(w, 1, 3, rows, from_originals.data());
  EXPECT_EQ(compare(from_tiles.data(), from_originals.data(), rows - 3, cols), "");
  // Every row count with a kernel function of its own (1-2, 3, 4, 8), the passes in between,
  // and the interleaved buffer past 8.
  for (int64_t m : {1, 2, 3, 4, 5, 6, 7, 8, 17}) {
    const auto x = batch_activations(m, cols, static_cast<uint32_t>(200 + m));
    std::vector<float> reference(m * rows);
    int8_product(Isa::scalar, x.data(), m, w, reference.data(), 2);
    std::vector<int32_t> ids(m);
    for (int64_t i = 0; i < m; ++i) ids[i] = static_cast<int32_t>((i * 2 + 1) % experts);
    for (Isa isa : supported_isas()) {
      std::vector<float> y(m * rows, -1.0f);
      int8_product(isa, x.data(), m, tiled, y.data(), 2);
      EXPECT_EQ(compare(y.data(), reference.data(), m, rows), "") << isa_name(isa) << " m=" << m;
      std::vector<float> gathered(m * rows, -1.0f), plain(m * rows, -1.0f);
      gather_qmatmul_numerics(Numerics::int8, isa, x.data(), m, ids.data(), tiled, gathered.data());
      gather_qmatmul_numerics(Numerics::int8, isa, x.data(), m, ids.data(), w, plain.data());
      EXPECT_EQ(compare(gathered.data(), plain.data(), m, rows), "")
          << isa_name(isa) << " gathered m=" << m;
    }
  }
}

// A matrix with tile values and, at 4 and 8 bits, tile codes (quant.h) gives every ISA's int8
// products, and dequantization, the bits it gives without them: 37 rows (a partial last tile), 3
// experts, dense and gathered, every batch size kind; codes with and without values.
TEST_P(QuantInt8Test, TileValuesAndCodesChangeNoBit) {
  const int64_t rows = 37, cols = 5 * group(), experts = 3;
  const auto matrix = make_quant_matrix(bits(), group(), scale_dtype(), experts, rows, cols, 23);
  std::vector<uint8_t> values(static_cast<size_t>(tile_values_bytes(matrix.w)));
  pack_tile_values(matrix.w, values.data());
  std::vector<uint8_t> codes(static_cast<size_t>(tile_codes_bytes(matrix.w)));
  ASSERT_EQ(codes.empty(), bits() != 4 && bits() != 8);
  if (!codes.empty()) pack_tile_codes(matrix.w, codes.data());
  std::vector<QuantMatrix> variants(1, matrix.w);
  variants[0].tile_values = values.data();
  if (!codes.empty()) {
    variants.push_back(variants[0]);
    variants.back().tile_codes = codes.data();
    variants.push_back(matrix.w);
    variants.back().tile_codes = codes.data();
  }
  for (size_t v = 0; v < variants.size(); ++v) {
    SCOPED_TRACE("variant " + std::to_string(v));
    check_tiled_products(matrix.w, variants[v], rows, cols, experts);
  }
}

// The largest codes against activations of one sign at the largest magnitude: the sums that
// bound the SIMD kernels' 16-bit partial sums (two products of 15·127 per word, 16 per block).
// Every ISA, with and without tile codes, matches the formula in double and the scalar reference
// bit for bit; a saturated or wrapped partial sum misses both by far.
TEST_P(QuantInt8Test, LargestCodesAndActivationsDoNotSaturate) {
  const int64_t rows = 16, cols = 4 * group(), most_rows = 17;
  auto matrix = make_quant_matrix(bits(), group(), scale_dtype(), 1, rows, cols, 29);
  uint8_t* packed = matrix.storage.data() + (matrix.w.packed - matrix.storage.data());
  std::fill_n(packed, rows * cols * bits() / 8, uint8_t{0xFF});
  std::fill(matrix.codes.begin(), matrix.codes.end(), (1u << bits()) - 1);
  // Row i: every input (i + 1) · ±1, so that every x8 is ±127; signs alternate by row.
  std::vector<float> x(most_rows * cols);
  for (int64_t i = 0; i < most_rows; ++i) {
    std::fill_n(x.data() + i * cols, cols, static_cast<float>((i + 1) * (i % 2 == 0 ? 1 : -1)));
  }
  std::vector<uint8_t> values(static_cast<size_t>(tile_values_bytes(matrix.w)));
  pack_tile_values(matrix.w, values.data());
  std::vector<uint8_t> codes(static_cast<size_t>(tile_codes_bytes(matrix.w)));
  std::vector<QuantMatrix> variants(1, matrix.w);
  if (!codes.empty()) {
    pack_tile_codes(matrix.w, codes.data());
    variants.push_back(matrix.w);
    variants.back().tile_values = values.data();
    variants.back().tile_codes = codes.data();
  }
  for (int64_t m : {1, 2, 3, 4, 8, 17}) {
    std::vector<float> reference(m * rows);
    int8_product(Isa::scalar, x.data(), m, matrix.w, reference.data());
    for (int64_t i = 0; i < m; ++i) {
      for (int64_t r = 0; r < rows; ++r) {
        const FormulaValue expected = formula(x.data() + i * cols, matrix, 0, r);
        ASSERT_NEAR(reference[i * rows + r], expected.value,
                    (cols + 8) * kUnitRoundoff * expected.magnitude)
            << "m=" << m << " row " << r << " activation " << i;
      }
    }
    for (size_t v = 0; v < variants.size(); ++v) {
      for (Isa isa : supported_isas()) {
        std::vector<float> y(m * rows, -1.0f);
        int8_product(isa, x.data(), m, variants[v], y.data());
        EXPECT_EQ(compare(y.data(), reference.data(), m, rows), "")
            << isa_name(isa) << " variant " << v << " m=" << m;
      }
    }
  }
}

// Against the fp32 numerics: x8·d_b differs from x by at most d_b / 2 per element, and the bias
// term uses the fp32 group sums, so |y_int8 - y_fp32| <= Σ_k |s_g·q_k|·d_b / 2 plus the fp32
// roundings of both paths ((cols + 8)·u of each magnitude). Typical errors are far smaller: the
// root-mean-square difference stays under 1% of the root-mean-square output.
TEST_P(QuantInt8Test, CloseToFp32Numerics) {
  const int64_t rows = 16, cols = 4 * group(), m = 4;
  const auto matrix = make_quant_matrix(bits(), group(), scale_dtype(), 1, rows, cols, 19);
  const auto x = random_activations(m * cols, 20);
  std::vector<float> y8(m * rows), y32(m * rows);
  int8_product(best_isa(), x.data(), m, matrix.w, y8.data());
  qmatmul_numerics(Numerics::fp32, best_isa(), x.data(), m, matrix.w, y32.data());
  double error_squares = 0.0, output_squares = 0.0;
  for (int64_t i = 0; i < m; ++i) {
    const float* row = x.data() + i * cols;
    for (int64_t r = 0; r < rows; ++r) {
      double rounding = 0.0, magnitude = 0.0;
      for (int64_t b = 0; b < cols / kBlock; ++b) {
        float amax = 0.0f;
        for (int64_t k = b * kBlock; k < (b + 1) * kBlock; ++k) {
          amax = std::max(amax, std::abs(row[k]));
        }
        for (int64_t k = b * kBlock; k < (b + 1) * kBlock; ++k) {
          const int64_t g = r * (cols / group()) + k / group();
          // The product is W·x̂: each input's rounding (at most d_b/2) meets the whole weight.
          const double code_part = std::abs(matrix.scales[g] * matrix.codes[r * cols + k]);
          const double weight =
              std::abs(matrix.scales[g] * matrix.codes[r * cols + k] + matrix.biases[g]);
          rounding += weight * (amax / 127.0) / 2;
          magnitude += (code_part + std::abs(matrix.biases[g])) * (std::abs(row[k]) + amax / 127.0);
        }
      }
      const double difference = y8[i * rows + r] - y32[i * rows + r];
      EXPECT_LE(std::abs(difference), rounding + 2 * (cols + 8) * kUnitRoundoff * magnitude)
          << "row " << r << " activation " << i;
      error_squares += difference * difference;
      output_squares += static_cast<double>(y32[i * rows + r]) * y32[i * rows + r];
    }
  }
  EXPECT_LT(std::sqrt(error_squares / output_squares), 0.01);
}

INSTANTIATE_TEST_SUITE_P(AllFormats, QuantInt8Test,
                         ::testing::Combine(::testing::Values(2, 3, 4, 5, 6, 8),
                                            ::testing::Values(32, 64, 128),
                                            ::testing::Values(DType::BF16, DType::F16, DType::F32)),
                         [](const ::testing::TestParamInfo<Int8Params>& info) {
                           std::ostringstream name;
                           name << "b" << std::get<0>(info.param) << "_g" << std::get<1>(info.param)
                                << "_" << dtype_name(std::get<2>(info.param));
                           return name.str();
                         });

// Every batch size m = 1 .. 66 (past the kernels' 64-row activation blocks) on every ISA: each row
// equals the same row computed alone on the scalar reference.
void check_batches(const QuantMatrix& w, int64_t expert, uint32_t seed) {
  constexpr int64_t kMaxBatch = 66;
  const int64_t rows = w.rows, cols = w.cols;
  const TestActivations x = batch_activations(kMaxBatch, cols, seed);
  std::vector<float> alone(kMaxBatch * rows);
  for (int64_t i = 0; i < kMaxBatch; ++i) {
    int8_product(Isa::scalar, x.data() + i * cols, 1, w, alone.data() + i * rows, expert);
  }
  for (Isa isa : supported_isas()) {
    for (int64_t m = 1; m <= kMaxBatch; ++m) {
      std::vector<float> y(m * rows, -1.0f);
      int8_product(isa, x.data(), m, w, y.data(), expert);
      ASSERT_EQ(compare(y.data(), alone.data(), m, rows), "") << isa_name(isa) << " m=" << m;
    }
  }
}

using BlockingParams = std::tuple<int, int>;

class QuantInt8BlockingTest : public ::testing::TestWithParam<BlockingParams> {};

TEST_P(QuantInt8BlockingTest, EveryBatchSizeEqualsRowsAloneOnEveryIsa) {
  const auto [bits, group] = GetParam();
  const DType dtype = bits % 2 == 0 ? DType::BF16 : DType::F16;
  // 21 output rows: full tiles (two of 8 rows, one of 16) and a tail of 5; 2 experts, the second
  // used.
  const auto matrix = make_quant_matrix(bits, group, dtype, 2, 21, 3 * group, 41);
  check_batches(matrix.w, 1, 42);
}

INSTANTIATE_TEST_SUITE_P(AllFormats, QuantInt8BlockingTest,
                         ::testing::Combine(::testing::Values(2, 3, 4, 5, 6, 8),
                                            ::testing::Values(32, 64, 128)),
                         [](const ::testing::TestParamInfo<BlockingParams>& info) {
                           std::ostringstream name;
                           name << "b" << std::get<0>(info.param) << "_g"
                                << std::get<1>(info.param);
                           return name.str();
                         });

// Odd shapes with F32 scales: one output row, rows below and just past a tile, a single group
// per row of each size, and rows spanning several 256-column chunks with a partial last chunk.
TEST(QuantInt8, OddShapesEqualRowsAlone) {
  struct Shape {
    int bits;
    int group;
    int64_t rows;
    int64_t groups;
  };
  const Shape shapes[] = {{4, 32, 1, 1},  {4, 64, 7, 1},  {8, 128, 9, 1},  {2, 32, 23, 1},
                          {6, 32, 5, 2},  {3, 64, 17, 5}, {5, 128, 3, 3},  {4, 32, 8, 19},
                          {8, 32, 15, 9}, {2, 64, 12, 7}, {6, 128, 10, 3}, {3, 32, 2, 33}};
  for (const Shape& shape : shapes) {
    std::ostringstream trace;
    trace << "bits " << shape.bits << " group " << shape.group << " rows " << shape.rows
          << " groups " << shape.groups;
    SCOPED_TRACE(trace.str());
    const auto matrix = make_quant_matrix(shape.bits, shape.group, DType::F32, 1, shape.rows,
                                          shape.group * shape.groups, 43);
    check_batches(matrix.w, 0, 44);
  }
}

// Plain and gathered products at 1 .. 8 threads, at decode, verify and prefill-like batch sizes,
// on every ISA: bit-identical to the scalar reference with one row at a time.
TEST(QuantInt8, ResultDoesNotDependOnThreadCount) {
  const int64_t rows = 203, cols = 576, experts = 4;
  const auto matrix = make_quant_matrix(4, 32, DType::BF16, experts, rows, cols, 29);
  for (int64_t m : {1, 16, 70}) {
    const auto x = batch_activations(m, cols, 30);
    std::vector<int32_t> ids(m);
    for (int64_t i = 0; i < m; ++i) ids[i] = static_cast<int32_t>((i * 5 + 3) % experts);
    std::vector<float> plain_alone(m * rows), gathered_alone(m * rows);
    for (int64_t i = 0; i < m; ++i) {
      int8_product(Isa::scalar, x.data() + i * cols, 1, matrix.w, plain_alone.data() + i * rows, 2);
      int8_product(Isa::scalar, x.data() + i * cols, 1, matrix.w, gathered_alone.data() + i * rows,
                   ids[i]);
    }
    for (int threads = 1; threads <= 8; ++threads) {
      set_default_threads(threads);
      for (Isa isa : supported_isas()) {
        std::vector<float> plain(m * rows, -1.0f), gathered(m * rows, -1.0f);
        int8_product(isa, x.data(), m, matrix.w, plain.data(), 2);
        gather_qmatmul_numerics(Numerics::int8, isa, x.data(), m, ids.data(), matrix.w,
                                gathered.data());
        EXPECT_EQ(compare(plain.data(), plain_alone.data(), m, rows), "")
            << isa_name(isa) << " m=" << m << " threads " << threads;
        EXPECT_EQ(compare(gathered.data(), gathered_alone.data(), m, rows), "")
            << "gathered " << isa_name(isa) << " m=" << m << " threads " << threads;
      }
    }
  }
  set_default_threads(2);
}

// qmatmul_shared gives every product qmatmul's bits, in both numerics, at 1-3 threads, on its
// first call (where a kernel may still be measured) and later ones: one format (q, k and v of
// different rows), mixed formats (run apart), and equal rows with rows_done, whose ranges cover
// every output row exactly once, after both products have written it.
TEST(QuantShared, EveryProductEqualsItsOwnQmatmul) {
  const int64_t cols = 192;
  const auto q = make_quant_matrix(4, 32, DType::BF16, 1, 72, cols, 61);
  const auto k = make_quant_matrix(4, 32, DType::BF16, 1, 24, cols, 62);
  const auto v = make_quant_matrix(4, 32, DType::BF16, 1, 24, cols, 63);
  const auto k8 = make_quant_matrix(8, 64, DType::F16, 1, 24, cols, 64);
  const auto gate = make_quant_matrix(4, 32, DType::BF16, 1, 100, cols, 65);
  const auto up = make_quant_matrix(4, 32, DType::BF16, 1, 100, cols, 66);
  const Numerics saved = numerics();
  for (Numerics chosen : {Numerics::int8, Numerics::fp32}) {
    set_numerics(chosen);
    for (int threads = 1; threads <= 3; ++threads) {
      set_default_threads(threads);
      for (int64_t m : {1, 2, 5, 17}) {
        const auto x = batch_activations(m, cols, 70 + static_cast<uint32_t>(m));
        const auto want = [&](const QuantMatrix& w) {
          std::vector<float> y(m * w.rows);
          qmatmul(x.data(), m, w, y.data());
          return y;
        };
        const std::string where = std::string(numerics_name(chosen)) + " threads " +
                                  std::to_string(threads) + " m=" + std::to_string(m);
        for (const auto* second : {&k, &k8}) {
          for (int call = 0; call < 2; ++call) {
            std::vector<float> yq(m * q.w.rows, -1.0f), yk(m * second->w.rows, -1.0f),
                yv(m * v.w.rows, -1.0f);
            const SharedInputProduct products[] = {
                {&q.w, yq.data()}, {&second->w, yk.data()}, {&v.w, yv.data()}};
            qmatmul_shared(x.data(), m, products, 3);
            EXPECT_EQ(compare(yq.data(), want(q.w).data(), m, q.w.rows), "") << where;
            EXPECT_EQ(compare(yk.data(), want(second->w).data(), m, k.w.rows), "") << where;
            EXPECT_EQ(compare(yv.data(), want(v.w).data(), m, v.w.rows), "") << where;
          }
        }
        const int64_t rows = gate.w.rows;
        std::vector<float> joined = want(gate.w);
        const std::vector<float> up_alone = want(up.w);
        for (int64_t i = 0; i < m * rows; ++i) joined[i] = joined[i] - up_alone[i];
        std::vector<float> y_gate(m * rows, -1.0f), y_up(m * rows, -1.0f);
        std::vector<int> visits(rows, 0);
        const RowsDone done = [&](int64_t begin, int64_t end) {
          for (int64_t r = begin; r < end; ++r) {
            ++visits[r];
            for (int64_t i = 0; i < m; ++i) y_gate[i * rows + r] -= y_up[i * rows + r];
          }
        };
        const SharedInputProduct pair[] = {{&gate.w, y_gate.data()}, {&up.w, y_up.data()}};
        qmatmul_shared(x.data(), m, pair, 2, &done);
        EXPECT_EQ(compare(y_gate.data(), joined.data(), m, rows), "") << where;
        EXPECT_EQ(compare(y_up.data(), up_alone.data(), m, rows), "") << where;
        EXPECT_TRUE(std::all_of(visits.begin(), visits.end(), [](int n) { return n == 1; }))
            << where;
      }
    }
  }
  set_default_threads(2);
  set_numerics(saved);
}

// Products sharing their activation rows, with tile values and codes: the second product's rows
// start mid-tile in the joint loop (after 37 rows), where the kernels fall back to the originals.
TEST(QuantShared, TileValuesChangeNoBit) {
  const int64_t cols = 160;
  const auto first = make_quant_matrix(4, 32, DType::BF16, 1, 37, cols, 81);
  const auto second = make_quant_matrix(4, 32, DType::BF16, 1, 45, cols, 82);
  std::vector<uint8_t> first_values(static_cast<size_t>(tile_values_bytes(first.w)));
  std::vector<uint8_t> second_values(static_cast<size_t>(tile_values_bytes(second.w)));
  pack_tile_values(first.w, first_values.data());
  pack_tile_values(second.w, second_values.data());
  std::vector<uint8_t> first_codes(static_cast<size_t>(tile_codes_bytes(first.w)));
  std::vector<uint8_t> second_codes(static_cast<size_t>(tile_codes_bytes(second.w)));
  pack_tile_codes(first.w, first_codes.data());
  pack_tile_codes(second.w, second_codes.data());
  QuantMatrix first_tiled = first.w, second_tiled = second.w;
  first_tiled.tile_values = first_values.data();
  second_tiled.tile_values = second_values.data();
  first_tiled.tile_codes = first_codes.data();
  second_tiled.tile_codes = second_codes.data();
  const Numerics saved = numerics();
  set_numerics(Numerics::int8);
  for (int threads = 1; threads <= 3; ++threads) {
    set_default_threads(threads);
    for (int64_t m : {1, 3}) {
      const auto x = batch_activations(m, cols, 90 + static_cast<uint32_t>(m));
      std::vector<float> want_first(m * 37), want_second(m * 45);
      qmatmul(x.data(), m, first.w, want_first.data());
      qmatmul(x.data(), m, second.w, want_second.data());
      std::vector<float> y_first(m * 37, -1.0f), y_second(m * 45, -1.0f);
      const SharedInputProduct products[] = {{&first_tiled, y_first.data()},
                                             {&second_tiled, y_second.data()}};
      qmatmul_shared(x.data(), m, products, 2);
      const std::string where = "threads " + std::to_string(threads) + " m=" + std::to_string(m);
      EXPECT_EQ(compare(y_first.data(), want_first.data(), m, 37), "") << where;
      EXPECT_EQ(compare(y_second.data(), want_second.data(), m, 45), "") << where;
    }
  }
  set_default_threads(2);
  set_numerics(saved);
}

// The packed layout itself, for each scale dtype: every row's scale and bias of every
// group where quant_impl.h puts it, and zeros past the last row.
TEST(TileValues, EveryValueAtItsSlot) {
  for (DType dtype : {DType::BF16, DType::F16, DType::F32}) {
    const int64_t rows = 11, cols = 96, groups = 3;
    const auto matrix = make_quant_matrix(4, 32, dtype, 2, rows, cols, 91);
    const auto size = static_cast<int64_t>(dtype_size(dtype));
    // Not zero to begin with: packing must write the padding itself.
    std::vector<uint8_t> values(static_cast<size_t>(tile_values_bytes(matrix.w)), 0xAB);
    ASSERT_EQ(static_cast<int64_t>(values.size()), 2 * 2 * groups * 16 * size);
    pack_tile_values(matrix.w, values.data());
    for (int64_t expert = 0; expert < 2; ++expert) {
      for (int64_t row = 0; row < 16; ++row) {
        for (int64_t g = 0; g < groups; ++g) {
          const int r = static_cast<int>(row % 8);
          const int scale_slot = dtype == DType::BF16 ? (r < 4 ? r : r + 4) : r;
          const int bias_slot = dtype == DType::BF16 ? scale_slot + 4 : r + 8;
          const uint8_t* group = values.data() + ((expert * 2 + row / 8) * groups + g) * 16 * size;
          std::vector<uint8_t> zero(static_cast<size_t>(size), 0);
          const uint8_t* scale = row < rows
                                     ? matrix.w.scales + ((expert * rows + row) * groups + g) * size
                                     : zero.data();
          const uint8_t* bias = row < rows
                                    ? matrix.w.biases + ((expert * rows + row) * groups + g) * size
                                    : zero.data();
          EXPECT_EQ(std::memcmp(group + scale_slot * size, scale, static_cast<size_t>(size)), 0)
              << dtype_name(dtype) << " expert " << expert << " row " << row << " group " << g;
          EXPECT_EQ(std::memcmp(group + bias_slot * size, bias, static_cast<size_t>(size)), 0)
              << dtype_name(dtype) << " expert " << expert << " row " << row << " group " << g;
        }
      }
    }
  }
}

// Packing reports its progress in stored rows, a slice of 256 tiles (2,048 rows) at a time, and
// packs the same bytes as without the report; the last report covers every expert's rows.
TEST(TileValues, PackingReportsRowsPacked) {
  const auto matrix = make_quant_matrix(4, 32, DType::BF16, 2, 2100, 32, 93);
  std::vector<uint8_t> reported(static_cast<size_t>(tile_values_bytes(matrix.w)));
  std::vector<uint8_t> quiet(reported.size());
  std::vector<int64_t> rows;
  pack_tile_values(matrix.w, reported.data(), [&](int64_t n) { rows.push_back(n); });
  pack_tile_values(matrix.w, quiet.data());
  EXPECT_EQ(rows, (std::vector<int64_t>{2048, 2100 + 1992, 4200}));
  EXPECT_EQ(reported, quiet);
}

// The tile codes' layout: byte j of row r's block b (4 bits: codes 2j, 2j + 1; 8 bits: code j) at
// byte j % 4 of dword r of vector j / 4 of (tile, block); zeros past the last row; progress in
// stored rows as for values. Other widths have no tile codes.
TEST(TileCodes, EveryByteAtItsSlot) {
  const int64_t rows = 11, cols = 96, blocks = 3, experts = 2;
  for (const int bits : {4, 8}) {
    SCOPED_TRACE(std::to_string(bits) + " bits");
    const int64_t block_bytes = 32 * bits / 8;  // a row's bytes of one block
    const int64_t tile_block_bytes = 8 * block_bytes;
    const auto matrix = make_quant_matrix(bits, 32, DType::BF16, experts, rows, cols, 95);
    std::vector<uint8_t> codes(static_cast<size_t>(tile_codes_bytes(matrix.w)), 0xAB);
    ASSERT_EQ(static_cast<int64_t>(codes.size()), experts * 2 * blocks * tile_block_bytes);
    std::vector<int64_t> reported;
    pack_tile_codes(matrix.w, codes.data(), [&](int64_t n) { reported.push_back(n); });
    EXPECT_EQ(reported, (std::vector<int64_t>{experts * rows}));
    for (int64_t expert = 0; expert < experts; ++expert) {
      for (int64_t row = 0; row < 16; ++row) {
        for (int64_t b = 0; b < blocks; ++b) {
          for (int64_t j = 0; j < block_bytes; ++j) {
            const uint8_t* block =
                codes.data() + ((expert * 2 + row / 8) * blocks + b) * tile_block_bytes;
            const uint8_t want =
                row < rows ? matrix.w.packed[(expert * rows + row) * blocks * block_bytes +
                                             b * block_bytes + j]
                           : 0;
            EXPECT_EQ(block[j / 4 * 32 + row % 8 * 4 + j % 4], want)
                << "expert " << expert << " row " << row << " block " << b << " byte " << j;
          }
        }
      }
    }
  }
  for (const int bits : {2, 3, 5, 6}) {
    const auto other = make_quant_matrix(bits, 32, DType::BF16, 1, 8, 32, 96);
    EXPECT_EQ(tile_codes_bytes(other.w), 0) << bits << " bits";
    std::vector<uint8_t> codes(256);
    EXPECT_THROW(pack_tile_codes(other.w, codes.data()), Error) << bits << " bits";
  }
}

TEST(QuantNumerics, NamesParseAndErrors) {
  EXPECT_STREQ(numerics_name(Numerics::int8), "int8");
  EXPECT_STREQ(numerics_name(Numerics::fp32), "fp32");
  EXPECT_EQ(parse_numerics("int8", "--numerics"), Numerics::int8);
  EXPECT_EQ(parse_numerics("fp32", "--numerics"), Numerics::fp32);
  for (const char* bad : {"", "INT8", "bf16", "fp16", "int4"}) {
    try {
      parse_numerics(bad, "--numerics");
      ADD_FAILURE() << "'" << bad << "' accepted";
    } catch (const Error& error) {
      EXPECT_NE(std::string(error.what()).find("--numerics"), std::string::npos) << error.what();
      EXPECT_NE(std::string(error.what()).find("int8, fp32"), std::string::npos) << error.what();
    }
  }
}

// qmatmul, gather_qmatmul and their *_isa forms follow set_numerics.
TEST(QuantNumerics, SwitchSelectsTheProduct) {
  const int64_t rows = 24, cols = 128, m = 3;
  const auto matrix = make_quant_matrix(4, 64, DType::BF16, 2, rows, cols, 51);
  const auto x = random_activations(m * cols, 52);
  const std::vector<int32_t> ids = {1, 0, 1};
  const Numerics saved = numerics();
  for (Numerics chosen : {Numerics::int8, Numerics::fp32, Numerics::int8}) {
    set_numerics(chosen);
    EXPECT_EQ(numerics(), chosen);
    std::vector<float> want(m * rows), got(m * rows), got_isa(m * rows);
    qmatmul_numerics(chosen, best_isa(), x.data(), m, matrix.w, want.data(), 1);
    qmatmul(x.data(), m, matrix.w, got.data(), 1);
    qmatmul_isa(Isa::scalar, x.data(), m, matrix.w, got_isa.data(), 1);
    EXPECT_EQ(compare(got.data(), want.data(), m, rows), "") << numerics_name(chosen);
    EXPECT_EQ(compare(got_isa.data(), want.data(), m, rows), "") << numerics_name(chosen);
    std::vector<float> gathered_want(m * rows), gathered(m * rows), gathered_isa(m * rows);
    gather_qmatmul_numerics(chosen, best_isa(), x.data(), m, ids.data(), matrix.w,
                            gathered_want.data());
    gather_qmatmul(x.data(), m, ids.data(), matrix.w, gathered.data());
    gather_qmatmul_isa(Isa::scalar, x.data(), m, ids.data(), matrix.w, gathered_isa.data());
    EXPECT_EQ(compare(gathered.data(), gathered_want.data(), m, rows), "");
    EXPECT_EQ(compare(gathered_isa.data(), gathered_want.data(), m, rows), "");
  }
  // The two numerics really differ (the int8 rounding of x shows in the low bits).
  std::vector<float> y8(m * rows), y32(m * rows);
  qmatmul_numerics(Numerics::int8, best_isa(), x.data(), m, matrix.w, y8.data());
  qmatmul_numerics(Numerics::fp32, best_isa(), x.data(), m, matrix.w, y32.data());
  EXPECT_NE(compare(y8.data(), y32.data(), m, rows), "");
  set_numerics(saved);
}

}  // namespace
}  // namespace dspark::kernels
