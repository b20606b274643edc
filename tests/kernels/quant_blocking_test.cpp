// The activation-row blocking of the quantized products (quant_tiles.h): for every batch size
// m = 1 .. 33 (every block size and every remainder after blocks of up to 8 rows) and output row
// counts that leave tails after every row tile, each SIMD ISA equals the scalar reference bit for
// bit, and every row of a batch equals the same row computed alone (m = 1), which lossless
// speculative decoding relies on.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include "base/thread_pool.h"
#include "kernels/quant.h"
#include "test_matrices.h"

namespace dspark::kernels {
namespace {

using testing::make_quant_matrix;
using testing::random_activations;
using testing::supported_isas;
using testing::TestActivations;

constexpr int64_t kMaxBatch = 33;

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

// Random rows, with row 1 all +0 and row 2 all -0 (sign-of-zero corner cases of the partial
// sums) when the batch has them.
TestActivations batch_activations(int64_t m, int64_t cols, uint32_t seed) {
  TestActivations x = random_activations(m * cols, seed);
  if (m > 1) std::fill_n(x.data() + cols, cols, 0.0f);
  if (m > 2) std::fill_n(x.data() + 2 * cols, cols, -0.0f);
  return x;
}

// Checks qmatmul of every batch size up to kMaxBatch on every ISA against the scalar reference,
// and each row against its m = 1 result.
void check_batches(const QuantMatrix& w, int64_t expert, uint32_t seed) {
  const int64_t rows = w.rows, cols = w.cols;
  const TestActivations x = batch_activations(kMaxBatch, cols, seed);
  // Each row alone, on the scalar reference.
  std::vector<float> alone(kMaxBatch * rows);
  for (int64_t i = 0; i < kMaxBatch; ++i) {
    qmatmul_numerics(Numerics::fp32, Isa::scalar, x.data() + i * cols, 1, w,
                     alone.data() + i * rows, expert);
  }
  for (Isa isa : supported_isas()) {
    for (int64_t m = 1; m <= kMaxBatch; ++m) {
      std::vector<float> y(m * rows, -1.0f);
      qmatmul_numerics(Numerics::fp32, isa, x.data(), m, w, y.data(), expert);
      const std::string difference = compare(y.data(), alone.data(), m, rows);
      ASSERT_EQ(difference, "") << isa_name(isa) << " m=" << m;
    }
  }
}

using BlockingParams = std::tuple<int, int>;

class QuantBlockingTest : public ::testing::TestWithParam<BlockingParams> {};

TEST_P(QuantBlockingTest, EveryBatchSizeEqualsRowsAloneOnEveryIsa) {
  const auto [bits, group] = GetParam();
  const DType dtype = bits % 2 == 0 ? DType::BF16 : DType::F16;
  // 13 output rows: tails after tiles of 8, 4, 3 and 2 rows; 2 experts, the second used.
  const auto matrix = make_quant_matrix(bits, group, dtype, 2, 13, 3 * group, 41);
  check_batches(matrix.w, 1, 42);
}

INSTANTIATE_TEST_SUITE_P(AllFormats, QuantBlockingTest,
                         ::testing::Combine(::testing::Values(2, 3, 4, 5, 6, 8),
                                            ::testing::Values(32, 64, 128)),
                         [](const ::testing::TestParamInfo<BlockingParams>& info) {
                           std::ostringstream name;
                           name << "b" << std::get<0>(info.param) << "_g"
                                << std::get<1>(info.param);
                           return name.str();
                         });

// Odd shapes: one output row, a row count below every tile, and 65 groups per row (the scales
// and biases are converted 64 groups at a time), with F32 scales.
TEST(QuantBlocking, OddShapesEqualRowsAlone) {
  struct Shape {
    int bits;
    int64_t rows;
    int64_t groups;
  };
  const Shape shapes[] = {{4, 1, 1}, {4, 7, 65}, {8, 2, 65}, {6, 5, 2}, {3, 23, 1}};
  for (const Shape& shape : shapes) {
    std::ostringstream trace;
    trace << "bits " << shape.bits << " rows " << shape.rows << " groups " << shape.groups;
    SCOPED_TRACE(trace.str());
    const auto matrix =
        make_quant_matrix(shape.bits, 32, DType::F32, 1, shape.rows, 32 * shape.groups, 43);
    check_batches(matrix.w, 0, 44);
  }
}

// A verify-sized batch through a gathered product whose rows use different experts, at 1, 2 and
// 3 threads: every row equals its expert's m = 1 product.
TEST(QuantBlocking, GatheredBatchesEqualRowsAloneAtAnyThreadCount) {
  const int64_t rows = 45, cols = 4 * 32, experts = 3, m = 19;
  const auto matrix = make_quant_matrix(4, 32, DType::BF16, experts, rows, cols, 45);
  const TestActivations x = batch_activations(m, cols, 46);
  std::vector<int32_t> ids(m);
  for (int64_t i = 0; i < m; ++i) ids[i] = static_cast<int32_t>(i * 7 % experts);
  std::vector<float> alone(m * rows);
  for (int64_t i = 0; i < m; ++i) {
    qmatmul_numerics(Numerics::fp32, Isa::scalar, x.data() + i * cols, 1, matrix.w,
                     alone.data() + i * rows, ids[i]);
  }
  for (int threads : {1, 2, 3}) {
    set_default_threads(threads);
    for (Isa isa : supported_isas()) {
      std::vector<float> gathered(m * rows, -1.0f);
      gather_qmatmul_numerics(Numerics::fp32, isa, x.data(), m, ids.data(), matrix.w,
                              gathered.data());
      EXPECT_EQ(compare(gathered.data(), alone.data(), m, rows), "")
          << isa_name(isa) << " threads " << threads;
      // Expert 0 for every row: the plain product of a batch of 19 rows.
      std::vector<float> plain(m * rows, -1.0f), plain_alone(m * rows);
      qmatmul_numerics(Numerics::fp32, isa, x.data(), m, matrix.w, plain.data());
      for (int64_t i = 0; i < m; ++i) {
        qmatmul_numerics(Numerics::fp32, Isa::scalar, x.data() + i * cols, 1, matrix.w,
                         plain_alone.data() + i * rows);
      }
      EXPECT_EQ(compare(plain.data(), plain_alone.data(), m, rows), "")
          << isa_name(isa) << " threads " << threads;
    }
  }
  set_default_threads(2);
}

}  // namespace
}  // namespace dspark::kernels
