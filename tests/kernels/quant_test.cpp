// Quantized and dense products: the scalar reference against exact (double) arithmetic, every SIMD
// ISA against the scalar reference bit for bit (quant_impl.h fixes one summation order for all),
// and the determinism promises of quant.h (independence from m, expert mix and thread count).
#include "kernels/quant.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <string>
#include <tuple>
#include <vector>

#include "base/error.h"
#include "base/thread_pool.h"
#include "test_matrices.h"

namespace dspark::kernels {
namespace {

using testing::make_dense_matrix;
using testing::make_quant_matrix;
using testing::random_activations;
using testing::supported_isas;

constexpr double kUnitRoundoff = 1.0 / (1 << 24);

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// Index and values of the first difference, for failure messages.
std::string first_difference(const std::vector<float>& a, const std::vector<float>& b) {
  for (size_t k = 0; k < a.size(); ++k) {
    if (std::memcmp(&a[k], &b[k], sizeof(float)) != 0) {
      return "index " + std::to_string(k) + ": " + std::to_string(a[k]) + " vs " +
             std::to_string(b[k]);
    }
  }
  return "none";
}

using QuantParams = std::tuple<int, int, DType>;

class QuantProductTest : public ::testing::TestWithParam<QuantParams> {
 protected:
  int bits() const { return std::get<0>(GetParam()); }
  int group() const { return std::get<1>(GetParam()); }
  DType scale_dtype() const { return std::get<2>(GetParam()); }
};

// The reference against double-precision Σ x·(s·q + b). Any fp32 order of the terms is within
// n·u·(Σ|s·x·q| + Σ|b·x|) of the exact value with n the longest chain of roundings (< cols + 8 for
// the canonical order); a wrong element, code or group would miss by O(1) relative.
TEST_P(QuantProductTest, ScalarReferenceMatchesExactArithmetic) {
  const int64_t rows = 11, cols = 3 * group(), experts = 2, m = 3;
  const auto matrix = make_quant_matrix(bits(), group(), scale_dtype(), experts, rows, cols, 7);
  const auto x = random_activations(m * cols, 8);
  std::vector<float> y(m * rows);
  qmatmul_numerics(Numerics::fp32, Isa::scalar, x.data(), m, matrix.w, y.data(), 1);
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t r = 0; r < rows; ++r) {
      double exact = 0.0, magnitude = 0.0;
      for (int64_t c = 0; c < cols; ++c) {
        const int64_t g = (rows + r) * (cols / group()) + c / group();
        const double xv = x[i * cols + c];
        const double code = matrix.codes[(rows + r) * cols + c];
        exact += xv * (matrix.scales[g] * code + matrix.biases[g]);
        magnitude += std::abs(xv * matrix.scales[g] * code) + std::abs(xv * matrix.biases[g]);
      }
      const double bound = (cols + 8) * kUnitRoundoff * magnitude;
      EXPECT_NEAR(y[i * rows + r], exact, bound) << "row " << r << " activation " << i;
    }
  }
}

TEST_P(QuantProductTest, EverySimdIsaEqualsScalarBitForBit) {
  // 37 output rows: not a multiple of any row tile; 3 experts, the last one used.
  const int64_t rows = 37, cols = 5 * group(), experts = 3;
  const auto matrix = make_quant_matrix(bits(), group(), scale_dtype(), experts, rows, cols, 11);
  for (int64_t m : {1, 2, 3, 5, 9}) {
    const auto x = random_activations(m * cols, static_cast<uint32_t>(100 + m));
    std::vector<float> reference(m * rows);
    qmatmul_numerics(Numerics::fp32, Isa::scalar, x.data(), m, matrix.w, reference.data(), 2);
    for (Isa isa : supported_isas()) {
      std::vector<float> y(m * rows, -1.0f);
      qmatmul_numerics(Numerics::fp32, isa, x.data(), m, matrix.w, y.data(), 2);
      EXPECT_TRUE(same_bits(y, reference)) << isa_name(isa) << " m=" << m << " first difference at "
                                           << first_difference(y, reference);
    }
  }
}

TEST_P(QuantProductTest, RowResultDoesNotDependOnBatch) {
  const int64_t rows = 29, cols = 4 * group(), m = 9;
  const auto matrix = make_quant_matrix(bits(), group(), scale_dtype(), 1, rows, cols, 13);
  const auto x = random_activations(m * cols, 14);
  for (Isa isa : supported_isas()) {
    std::vector<float> batch(m * rows);
    qmatmul_numerics(Numerics::fp32, isa, x.data(), m, matrix.w, batch.data());
    for (int64_t i = 0; i < m; ++i) {
      std::vector<float> alone(rows);
      qmatmul_numerics(Numerics::fp32, isa, x.data() + i * cols, 1, matrix.w, alone.data());
      const std::vector<float> from_batch(batch.begin() + i * rows, batch.begin() + (i + 1) * rows);
      EXPECT_TRUE(same_bits(alone, from_batch)) << isa_name(isa) << " activation row " << i;
    }
  }
}

TEST_P(QuantProductTest, GatheredProductEqualsPerExpertProducts) {
  const int64_t rows = 21, cols = 3 * group(), experts = 5, m = 7;
  const auto matrix = make_quant_matrix(bits(), group(), scale_dtype(), experts, rows, cols, 17);
  const auto x = random_activations(m * cols, 18);
  const std::vector<int32_t> ids = {4, 0, 4, 2, 0, 4, 1};
  for (Isa isa : supported_isas()) {
    std::vector<float> gathered(m * rows, -1.0f);
    gather_qmatmul_numerics(Numerics::fp32, isa, x.data(), m, ids.data(), matrix.w,
                            gathered.data());
    for (int64_t r = 0; r < m; ++r) {
      std::vector<float> single(rows);
      qmatmul_numerics(Numerics::fp32, Isa::scalar, x.data() + r * cols, 1, matrix.w, single.data(),
                       ids[r]);
      const std::vector<float> got(gathered.begin() + r * rows, gathered.begin() + (r + 1) * rows);
      EXPECT_TRUE(same_bits(got, single)) << isa_name(isa) << " row " << r;
    }
  }
}

TEST_P(QuantProductTest, DequantizeEqualsScaleTimesCodePlusBias) {
  const int64_t rows = 9, cols = 2 * group(), experts = 2;
  const auto matrix = make_quant_matrix(bits(), group(), scale_dtype(), experts, rows, cols, 19);
  std::vector<float> out(5 * cols);
  dequantize_rows(matrix.w, 1, 3, 8, out.data());
  for (int64_t r = 3; r < 8; ++r) {
    for (int64_t c = 0; c < cols; ++c) {
      ASSERT_EQ(out[(r - 3) * cols + c], matrix.weight(1, r, c)) << "row " << r << " col " << c;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(AllFormats, QuantProductTest,
                         ::testing::Combine(::testing::Values(2, 3, 4, 5, 6, 8),
                                            ::testing::Values(32, 64, 128),
                                            ::testing::Values(DType::BF16, DType::F16, DType::F32)),
                         [](const ::testing::TestParamInfo<QuantParams>& info) {
                           return "b" + std::to_string(std::get<0>(info.param)) + "_g" +
                                  std::to_string(std::get<1>(info.param)) + "_" +
                                  std::string(dtype_name(std::get<2>(info.param)));
                         });

TEST(QuantProduct, NemotronShapeAllIsasAgree) {
  // in_proj-like width with a row count that leaves tails for every tile size.
  const int64_t rows = 75, cols = 2688;
  for (int bits : {4, 6, 8}) {
    const auto matrix = make_quant_matrix(bits, 64, DType::BF16, 1, rows, cols, 23);
    for (int64_t m : {1, 4}) {
      const auto x = random_activations(m * cols, 24);
      std::vector<float> reference(m * rows);
      qmatmul_numerics(Numerics::fp32, Isa::scalar, x.data(), m, matrix.w, reference.data());
      for (Isa isa : supported_isas()) {
        std::vector<float> y(m * rows);
        qmatmul_numerics(Numerics::fp32, isa, x.data(), m, matrix.w, y.data());
        EXPECT_TRUE(same_bits(y, reference)) << isa_name(isa) << " bits " << bits << " m=" << m;
      }
    }
  }
}

TEST(QuantProduct, ResultDoesNotDependOnThreadCount) {
  const int64_t rows = 300, cols = 512, m = 3;
  const auto matrix = make_quant_matrix(4, 64, DType::BF16, 4, rows, cols, 29);
  const auto x = random_activations(m * cols, 30);
  const std::vector<int32_t> ids = {3, 1, 3};
  std::vector<std::vector<float>> plain, gathered;
  for (int threads : {1, 2, 3}) {
    set_default_threads(threads);
    plain.emplace_back(m * rows);
    qmatmul_numerics(Numerics::fp32, best_isa(), x.data(), m, matrix.w, plain.back().data(), 2);
    gathered.emplace_back(m * rows);
    gather_qmatmul_numerics(Numerics::fp32, best_isa(), x.data(), m, ids.data(), matrix.w,
                            gathered.back().data());
  }
  set_default_threads(2);
  EXPECT_TRUE(same_bits(plain[0], plain[1]));
  EXPECT_TRUE(same_bits(plain[0], plain[2]));
  EXPECT_TRUE(same_bits(gathered[0], gathered[1]));
  EXPECT_TRUE(same_bits(gathered[0], gathered[2]));
}

class DenseProductTest : public ::testing::TestWithParam<DType> {};

TEST_P(DenseProductTest, ScalarReferenceMatchesExactArithmetic) {
  const int64_t rows = 13, cols = 203, m = 2;
  const auto matrix = make_dense_matrix(GetParam(), 2, rows, cols, 31);
  const auto x = random_activations(m * cols, 32);
  std::vector<float> y(m * rows);
  matmul_isa(Isa::scalar, x.data(), m, matrix.w, y.data(), 1);
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t r = 0; r < rows; ++r) {
      double exact = 0.0, magnitude = 0.0;
      for (int64_t c = 0; c < cols; ++c) {
        const double term =
            static_cast<double>(x[i * cols + c]) * matrix.values[(rows + r) * cols + c];
        exact += term;
        magnitude += std::abs(term);
      }
      EXPECT_NEAR(y[i * rows + r], exact, (cols + 4) * kUnitRoundoff * magnitude);
    }
  }
}

TEST_P(DenseProductTest, EverySimdIsaEqualsScalarBitForBit) {
  const int64_t rows = 19, experts = 2;
  // Column counts below, at and around the 16-lane width, with tails.
  for (int64_t cols : {5, 16, 37, 160, 333}) {
    const auto matrix = make_dense_matrix(GetParam(), experts, rows, cols, 37);
    for (int64_t m : {1, 2, 5}) {
      const auto x = random_activations(m * cols, 38);
      std::vector<float> reference(m * rows);
      matmul_isa(Isa::scalar, x.data(), m, matrix.w, reference.data(), 1);
      for (Isa isa : supported_isas()) {
        std::vector<float> y(m * rows, -1.0f);
        matmul_isa(isa, x.data(), m, matrix.w, y.data(), 1);
        EXPECT_TRUE(same_bits(y, reference)) << isa_name(isa) << " cols " << cols << " m=" << m
                                             << ": " << first_difference(y, reference);
        std::vector<float> alone(rows);
        matmul_isa(isa, x.data() + (m - 1) * cols, 1, matrix.w, alone.data(), 1);
        const std::vector<float> last(y.end() - rows, y.end());
        EXPECT_TRUE(same_bits(alone, last)) << isa_name(isa) << " batch dependence, cols " << cols;
      }
    }
  }
}

TEST_P(DenseProductTest, GatheredProductEqualsPerExpertProducts) {
  const int64_t rows = 10, cols = 70, experts = 3, m = 4;
  const auto matrix = make_dense_matrix(GetParam(), experts, rows, cols, 41);
  const auto x = random_activations(m * cols, 42);
  const std::vector<int32_t> ids = {2, 2, 0, 1};
  for (Isa isa : supported_isas()) {
    std::vector<float> gathered(m * rows);
    gather_matmul_isa(isa, x.data(), m, ids.data(), matrix.w, gathered.data());
    for (int64_t r = 0; r < m; ++r) {
      std::vector<float> single(rows);
      matmul_isa(Isa::scalar, x.data() + r * cols, 1, matrix.w, single.data(), ids[r]);
      const std::vector<float> got(gathered.begin() + r * rows, gathered.begin() + (r + 1) * rows);
      EXPECT_TRUE(same_bits(got, single)) << isa_name(isa) << " row " << r;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(AllDtypes, DenseProductTest,
                         ::testing::Values(DType::F32, DType::F16, DType::BF16),
                         [](const ::testing::TestParamInfo<DType>& info) {
                           return std::string(dtype_name(info.param));
                         });

TEST(QuantErrors, UnsupportedFormatsAreRejectedByName) {
  for (int bits : {0, 1, 7, 9, 16}) {
    try {
      check_quant_format({bits, 64}, "layers.0.mixer.in_proj");
      ADD_FAILURE() << bits << " bits accepted";
    } catch (const Error& error) {
      EXPECT_NE(std::string(error.what()).find("layers.0.mixer.in_proj"), std::string::npos);
      EXPECT_NE(std::string(error.what()).find("bits"), std::string::npos);
    }
  }
  for (int group : {0, 16, 48, 256}) {
    EXPECT_THROW(check_quant_format({4, group}, "lm_head"), Error) << "group " << group;
  }
  for (int bits : {2, 3, 4, 5, 6, 8}) {
    for (int group : {32, 64, 128}) EXPECT_NO_THROW(check_quant_format({bits, group}, "ok"));
  }
}

TEST(QuantErrors, BadOperandsAreRejected) {
  auto matrix = make_quant_matrix(4, 64, DType::BF16, 2, 4, 128, 43);
  const auto x = random_activations(2 * 128, 44);
  std::vector<float> y(8);
  EXPECT_THROW(qmatmul(x.data(), 1, matrix.w, y.data(), 2), Error);
  const std::vector<int32_t> bad_ids = {0, 5};
  EXPECT_THROW(gather_qmatmul(x.data(), 2, bad_ids.data(), matrix.w, y.data()), Error);
  auto odd = matrix.w;
  odd.cols = 100;
  EXPECT_THROW(qmatmul(x.data(), 1, odd, y.data()), Error);
  auto wrong_dtype = matrix.w;
  wrong_dtype.scale_dtype = DType::U32;
  EXPECT_THROW(qmatmul(x.data(), 1, wrong_dtype, y.data()), Error);
  EXPECT_THROW(dequantize_rows(matrix.w, 0, 2, 5, y.data()), Error);
  std::vector<float> weights(3 * 96);
  std::vector<uint32_t> packed(3 * 96);
  std::vector<uint16_t> scales(3 * 3), biases(3 * 3);
  EXPECT_THROW(quantize(weights.data(), 3, 96, {4, 64}, DType::BF16, packed.data(), scales.data(),
                        biases.data()),
               Error);
  EXPECT_THROW(quantize(weights.data(), 3, 96, {4, 32}, DType::I32, packed.data(), scales.data(),
                        biases.data()),
               Error);
}

TEST(QuantIsa, NamesAndDetection) {
  EXPECT_STREQ(isa_name(Isa::scalar), "scalar");
  EXPECT_STREQ(isa_name(Isa::avx2), "avx2");
  EXPECT_STREQ(isa_name(Isa::avxvnni), "avxvnni");
  EXPECT_STREQ(isa_name(Isa::avx512), "avx512");
  EXPECT_STREQ(isa_name(Isa::avx512vnni), "avx512vnni");
  const auto isas = supported_isas();
  bool best_is_supported = false;
  for (Isa isa : isas) best_is_supported |= isa == best_isa();
  EXPECT_TRUE(best_is_supported);
}

// qmatmul picks its kernels by timing them on the first product of a shape and row count: the
// choice is best_isa() or, on an AVX-512 CPU without DSPARK_ISA, its 256-bit sibling; it holds for
// later products, the output is the scalar reference's bits whichever runs, and prefill-sized
// products are never timed.
TEST(QuantIsa, QmatmulKeepsAMeasuredChoiceOfKernels) {
  // A shape no other test multiplies, so that nothing is measured before this test.
  const int64_t rows = 88, cols = 608;
  const auto matrix = make_quant_matrix(4, 32, DType::BF16, 1, rows, cols, 41);
  const char* forced = std::getenv("DSPARK_ISA");
  const bool pinned = forced != nullptr && *forced;
  std::vector<Isa> allowed = {best_isa()};
  if (!pinned && best_isa() == Isa::avx512vnni)
    allowed.push_back(Isa::avxvnni), allowed.push_back(Isa::avx2);
  if (!pinned && best_isa() == Isa::avx512) allowed.push_back(Isa::avx2);
  for (int64_t m : {1, 2, 3, 8, 16}) {
    const auto x = random_activations(m * cols, 42 + static_cast<uint64_t>(m));
    std::vector<float> reference(m * rows), y(m * rows);
    qmatmul_numerics(numerics(), Isa::scalar, x.data(), m, matrix.w, reference.data());
    EXPECT_EQ(planned_isa(matrix.w, m), best_isa()) << "m=" << m << ": nothing measured yet";
    qmatmul(x.data(), m, matrix.w, y.data());
    EXPECT_TRUE(same_bits(y, reference)) << "m=" << m << " " << first_difference(y, reference);
    const Isa chosen = planned_isa(matrix.w, m);
    EXPECT_NE(std::find(allowed.begin(), allowed.end(), chosen), allowed.end())
        << "m=" << m << ": " << isa_name(chosen);
    std::fill(y.begin(), y.end(), 0.0f);
    qmatmul(x.data(), m, matrix.w, y.data());
    EXPECT_EQ(planned_isa(matrix.w, m), chosen) << "m=" << m;
    EXPECT_TRUE(same_bits(y, reference)) << "m=" << m;
  }
  EXPECT_EQ(planned_isa(matrix.w, 17), best_isa());
  // A gathered product (a decode step's 3 experts, then a verify's rows sharing them) measures its
  // own choices and gives the reference's bits too.
  const auto experts = make_quant_matrix(4, 32, DType::BF16, 5, rows, cols, 43);
  for (const std::vector<int32_t>& ids :
       {std::vector<int32_t>{4, 0, 2}, std::vector<int32_t>{4, 0, 2, 4, 4, 0, 1, 2, 4}}) {
    const auto m = static_cast<int64_t>(ids.size());
    const auto x = random_activations(m * cols, 44);
    std::vector<float> reference(m * rows), y(m * rows);
    gather_qmatmul_numerics(numerics(), Isa::scalar, x.data(), m, ids.data(), experts.w,
                            reference.data());
    for (int call = 0; call < 2; ++call) {
      gather_qmatmul(x.data(), m, ids.data(), experts.w, y.data());
      EXPECT_TRUE(same_bits(y, reference)) << "m=" << m << " call " << call;
    }
  }
}

TEST(QuantMatrixSizes, BytesPerExpert) {
  QuantMatrix w;
  w.rows = 10304;
  w.cols = 2688;
  w.format = {4, 64};
  w.scale_dtype = DType::BF16;
  // 4 bits per weight plus a bf16 scale and bias per 64 weights: 4.5 bits per weight.
  EXPECT_EQ(w.bytes_per_expert(), 10304 * 2688 * 9 / 16);
}

}  // namespace
}  // namespace dspark::kernels
