// The non-quantized ops against direct formulas, and the row invariance the speculative path
// relies on (a multi-row call equals one-row calls bit for bit).
#include "kernels/ops.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <thread>
#include <vector>

namespace dspark::kernels {
namespace {

std::vector<float> random_vector(int64_t n, uint32_t seed, float scale = 1.0f, float mean = 0.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(mean, scale);
  std::vector<float> v(n);
  for (float& x : v) x = normal(rng);
  return v;
}

float max_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
  float m = 0.0f;
  for (size_t i = 0; i < a.size(); ++i) m = std::max(m, std::fabs(a[i] - b[i]));
  return m;
}

struct SsmCase {
  SsmDims dims;
  int64_t rows;
  std::vector<float> state, x, B, C, dt, A, D;

  SsmCase(SsmDims d, int64_t r, uint32_t seed) : dims(d), rows(r) {
    state = random_vector(d.heads * d.head_dim * d.state_size, seed, 0.5f);
    x = random_vector(r * d.heads * d.head_dim, seed + 1);
    B = random_vector(r * d.groups * d.state_size, seed + 2);
    C = random_vector(r * d.groups * d.state_size, seed + 3);
    dt = random_vector(r * d.heads, seed + 4, 0.5f);
    for (float& v : dt) v = softplus(v - 1.0f);
    A = random_vector(d.heads, seed + 5, 0.5f, 0.5f);
    for (float& v : A) v = -std::exp(v);
    D = random_vector(d.heads, seed + 6);
  }
};

TEST(Ssd, ChunkedEqualsSequentialOnExistingState) {
  for (SsmDims dims : {SsmDims{4, 8, 2, 16}, SsmDims{6, 4, 3, 8}, SsmDims{2, 16, 1, 32}}) {
    for (int64_t chunk : {1, 5, 8, 64}) {
      SsmCase c(dims, 37, 11);
      std::vector<float> seq_state = c.state, chunk_state = c.state;
      std::vector<float> seq_y(c.x.size()), chunk_y(c.x.size());
      ssd_sequential(dims, seq_state.data(), c.x.data(), c.B.data(), c.C.data(), c.dt.data(),
                     c.A.data(), c.D.data(), c.rows, seq_y.data());
      ssd_chunked(dims, chunk_state.data(), c.x.data(), c.B.data(), c.C.data(), c.dt.data(),
                  c.A.data(), c.D.data(), c.rows, chunk, chunk_y.data());
      EXPECT_LT(max_abs_diff(seq_y, chunk_y), 2e-4f) << "chunk " << chunk;
      EXPECT_LT(max_abs_diff(seq_state, chunk_state), 2e-4f) << "chunk " << chunk;
    }
  }
}

TEST(Ssd, SequentialMatchesTheRecurrenceWrittenOut) {
  const SsmDims dims{2, 3, 1, 4};
  SsmCase c(dims, 5, 3);
  std::vector<double> S(c.state.begin(), c.state.end());
  std::vector<float> y(c.x.size());
  std::vector<float> state = c.state;
  ssd_sequential(dims, state.data(), c.x.data(), c.B.data(), c.C.data(), c.dt.data(), c.A.data(),
                 c.D.data(), c.rows, y.data());
  for (int64_t t = 0; t < c.rows; ++t) {
    for (int64_t h = 0; h < 2; ++h) {
      const double dt = c.dt[t * 2 + h];
      for (int64_t p = 0; p < 3; ++p) {
        double out = 0.0;
        for (int64_t n = 0; n < 4; ++n) {
          double& s = S[(h * 3 + p) * 4 + n];
          s = std::exp(dt * c.A[h]) * s + dt * c.x[(t * 2 + h) * 3 + p] * c.B[t * 4 + n];
          out += s * c.C[t * 4 + n];
        }
        out += c.D[h] * c.x[(t * 2 + h) * 3 + p];
        EXPECT_NEAR(y[(t * 2 + h) * 3 + p], out, 1e-4);
      }
    }
  }
}

TEST(Ssd, SequentialIsRowInvariantAndStateOnlyAgrees) {
  const SsmDims dims{4, 8, 2, 16};
  SsmCase c(dims, 9, 21);
  std::vector<float> all_state = c.state, one_state = c.state, bare_state = c.state;
  std::vector<float> all_y(c.x.size()), one_y(c.x.size());
  ssd_sequential(dims, all_state.data(), c.x.data(), c.B.data(), c.C.data(), c.dt.data(),
                 c.A.data(), c.D.data(), c.rows, all_y.data());
  for (int64_t t = 0; t < c.rows; ++t) {
    ssd_sequential(dims, one_state.data(), c.x.data() + t * 32, c.B.data() + t * 32,
                   c.C.data() + t * 32, c.dt.data() + t * 4, c.A.data(), c.D.data(), 1,
                   one_y.data() + t * 32);
  }
  ssd_sequential(dims, bare_state.data(), c.x.data(), c.B.data(), c.C.data(), c.dt.data(),
                 c.A.data(), nullptr, c.rows, nullptr);
  EXPECT_EQ(all_y, one_y);
  EXPECT_EQ(all_state, one_state);
  EXPECT_EQ(all_state, bare_state);
}

TEST(Conv, MatchesFormulaAndCarriesTheWindow) {
  const int64_t channels = 5, kernel = 4, rows = 6;
  std::vector<float> window = random_vector((kernel - 1) * channels, 1);
  const std::vector<float> input = random_vector(rows * channels, 2);
  const std::vector<float> weight = random_vector(channels * kernel, 3);
  const std::vector<float> bias = random_vector(channels, 4);
  std::vector<float> padded = window;
  padded.insert(padded.end(), input.begin(), input.end());

  std::vector<float> all_window = window, out(rows * channels);
  causal_conv1d(all_window.data(), input.data(), rows, channels, kernel, weight.data(), bias.data(),
                out.data());
  for (int64_t t = 0; t < rows; ++t) {
    for (int64_t c = 0; c < channels; ++c) {
      double expected = bias[c];
      for (int64_t k = 0; k < kernel; ++k) {
        expected += weight[c * kernel + k] * padded[(t + k) * channels + c];
      }
      EXPECT_NEAR(out[t * channels + c], expected, 1e-5);
    }
  }
  EXPECT_EQ(all_window, std::vector<float>(padded.end() - (kernel - 1) * channels, padded.end()));

  std::vector<float> step_window = window, step_out(rows * channels);
  for (int64_t t = 0; t < rows; ++t) {
    causal_conv1d(step_window.data(), input.data() + t * channels, 1, channels, kernel,
                  weight.data(), bias.data(), step_out.data() + t * channels);
  }
  EXPECT_EQ(out, step_out);
  EXPECT_EQ(all_window, step_window);

  std::vector<float> advanced = window;
  conv_window_advance(advanced.data(), input.data(), 2, channels, kernel);
  EXPECT_EQ(advanced, std::vector<float>(padded.begin() + 2 * channels,
                                         padded.begin() + (2 + kernel - 1) * channels));
}

// Heads per kv head 1, 2, 4, 8 and 16 (the tiled kernels and the generic one), over two key
// blocks with a partial last tile.
class Attention : public ::testing::TestWithParam<std::pair<int64_t, int64_t>> {};

TEST_P(Attention, MatchesNaiveSoftmaxAndIsRowInvariant) {
  const auto [q_heads, kv_heads] = GetParam();
  const int64_t dim = 8, past = 299, rows = 4;
  const int64_t total = past + rows;
  const std::vector<float> q = random_vector(rows * q_heads * dim, 7);
  const std::vector<float> keys = random_vector(total * kv_heads * dim, 8);
  const std::vector<float> values = random_vector(total * kv_heads * dim, 9);
  const float scale = 0.3f;
  std::vector<float> out(rows * q_heads * dim);
  causal_attention(q.data(), rows, q_heads, kv_heads, dim, keys.data(), values.data(), past, scale,
                   out.data());
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t h = 0; h < q_heads; ++h) {
      const int64_t kv = h / (q_heads / kv_heads);
      std::vector<double> s(past + r + 1);
      double peak = -1e30, sum = 0.0;
      for (int64_t j = 0; j <= past + r; ++j) {
        double dot = 0.0;
        for (int64_t d = 0; d < dim; ++d) {
          dot += q[(r * q_heads + h) * dim + d] * keys[(j * kv_heads + kv) * dim + d];
        }
        s[j] = dot * scale;
        peak = std::max(peak, s[j]);
      }
      for (double& v : s) sum += (v = std::exp(v - peak));
      for (int64_t d = 0; d < dim; ++d) {
        double expected = 0.0;
        for (int64_t j = 0; j <= past + r; ++j) {
          expected += s[j] / sum * values[(j * kv_heads + kv) * dim + d];
        }
        ASSERT_NEAR(out[(r * q_heads + h) * dim + d], expected, 1e-5);
      }
    }
  }
  for (int64_t r = 0; r < rows; ++r) {
    std::vector<float> one(q_heads * dim);
    causal_attention(q.data() + r * q_heads * dim, 1, q_heads, kv_heads, dim, keys.data(),
                     values.data(), past + r, scale, one.data());
    EXPECT_TRUE(std::equal(one.begin(), one.end(), out.begin() + r * q_heads * dim));
  }
}

INSTANTIATE_TEST_SUITE_P(Groups, Attention,
                         ::testing::Values(std::pair<int64_t, int64_t>{3, 3},
                                           std::pair<int64_t, int64_t>{4, 2},
                                           std::pair<int64_t, int64_t>{8, 2},
                                           std::pair<int64_t, int64_t>{16, 2},
                                           std::pair<int64_t, int64_t>{32, 2}));

TEST(Rope, RotatesHalvesAndPairsByPositionAngle) {
  const int64_t dim = 8, heads = 2, rows = 3, first = 7;
  const std::vector<float> inv_freq = {1.0f, 0.1f, 0.01f, 0.001f};
  const std::vector<float> x = random_vector(rows * heads * dim, 5);
  for (bool traditional : {false, true}) {
    std::vector<float> y = x;
    rope(y.data(), rows, heads, dim, first, {inv_freq.data(), dim, traditional, 0.5f});
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t h = 0; h < heads; ++h) {
        const float* in = x.data() + (r * heads + h) * dim;
        const float* out = y.data() + (r * heads + h) * dim;
        for (int64_t i = 0; i < dim / 2; ++i) {
          const double angle = (first + r) * 0.5 * inv_freq[i];
          const int64_t a = traditional ? 2 * i : i, b = traditional ? 2 * i + 1 : i + dim / 2;
          EXPECT_NEAR(out[a], in[a] * std::cos(angle) - in[b] * std::sin(angle), 1e-5);
          EXPECT_NEAR(out[b], in[a] * std::sin(angle) + in[b] * std::cos(angle), 1e-5);
        }
      }
    }
  }
}

// rope keeps each thread's last table of cosines and sines: whatever the thread rotated before
// (other frequencies in the same array, another scale, fewer or more rows at the same positions), a
// call gives the bits a thread with no table gives.
TEST(Rope, ReusedTablesGiveTheBitsOfAFreshThread) {
  const int64_t dim = 8, heads = 3, first = 40;
  std::vector<float> inv_freq = {1.0f, 0.1f, 0.01f, 0.001f};
  const std::vector<float> x = random_vector(5 * heads * dim, 6);
  const auto rotated = [&](int64_t rows, float scale) {
    std::vector<float> y(x.begin(), x.begin() + rows * heads * dim);
    rope(y.data(), rows, heads, dim, first, {inv_freq.data(), dim, false, scale});
    return y;
  };
  const auto on_fresh_thread = [&](int64_t rows, float scale) {
    std::vector<float> y;
    std::thread([&] { y = rotated(rows, scale); }).join();
    return y;
  };
  EXPECT_EQ(rotated(3, 1.0f), on_fresh_thread(3, 1.0f));
  EXPECT_EQ(rotated(2, 1.0f), on_fresh_thread(2, 1.0f));
  EXPECT_EQ(rotated(5, 1.0f), on_fresh_thread(5, 1.0f));
  EXPECT_EQ(rotated(5, 0.5f), on_fresh_thread(5, 0.5f));
  inv_freq[2] = 0.02f;
  EXPECT_EQ(rotated(5, 0.5f), on_fresh_thread(5, 0.5f));
}

TEST(Norm, RmsNormWithAndWithoutWeight) {
  const std::vector<float> x = {1.0f, -2.0f, 3.0f, -4.0f, 0.5f, 0.5f, 0.5f, 0.5f};
  const std::vector<float> w = {1.0f, 2.0f, 0.5f, -1.0f};
  std::vector<float> y(8), z(8);
  rms_norm(x.data(), 2, 4, w.data(), 1e-5f, y.data());
  rms_norm(x.data(), 2, 4, nullptr, 1e-5f, z.data());
  const float inv0 = 1.0f / std::sqrt(7.5f + 1e-5f), inv1 = 1.0f / std::sqrt(0.25f + 1e-5f);
  for (int i = 0; i < 4; ++i) {
    EXPECT_NEAR(y[i], x[i] * inv0 * w[i], 1e-6);
    EXPECT_NEAR(z[4 + i], x[4 + i] * inv1, 1e-6);
  }
}

double silu_double(double x) {
  return x / (1.0 + std::exp(-x));
}

TEST(Elementwise, ResidualAddScaleSwigluAndSigmoidGateFollowTheirFormulas) {
  const std::vector<float> a = random_vector(101, 21, 3.0f), b = random_vector(101, 22, 3.0f);
  std::vector<float> sum = a, scaled = a, gate = a, gated = a;
  add_in_place(sum.data(), b.data(), 101);
  scale_in_place(scaled.data(), 101, 0.75f);
  swiglu_columns(gate.data(), b.data(), 1, 101, 0, 101);
  sigmoid_gate(gated.data(), b.data(), 101);
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(sum[i], a[i] + b[i]);
    EXPECT_EQ(scaled[i], a[i] * 0.75f);
    const double swiglu_ref = silu_double(a[i]) * b[i];
    EXPECT_NEAR(gate[i], swiglu_ref, 1e-5 * (1.0 + std::fabs(swiglu_ref))) << i;
    const double gated_ref = a[i] / (1.0 + std::exp(-static_cast<double>(b[i])));
    EXPECT_NEAR(gated[i], gated_ref, 1e-5 * (1.0 + std::fabs(gated_ref))) << i;
  }
  // swiglu is silu, then the product: the model files relied on that composition before.
  std::vector<float> composed = a;
  silu(composed.data(), 101);
  for (size_t i = 0; i < a.size(); ++i) EXPECT_EQ(gate[i], composed[i] * b[i]);
  // Columns [20, 40) of 2 rows of 50 values (a thread's share): the rest is left as it was.
  std::vector<float> share = a;
  swiglu_columns(share.data(), b.data(), 2, 50, 20, 40);
  for (size_t i = 0; i < 100; ++i) {
    const bool inside = i % 50 >= 20 && i % 50 < 40;
    EXPECT_EQ(share[i], inside ? gate[i] : a[i]) << i;
  }
}

// Units in the last place between two floats of one sign.
int64_t ulps_apart(float a, float b) {
  return std::abs(static_cast<int64_t>(std::bit_cast<int32_t>(a)) -
                  static_cast<int64_t>(std::bit_cast<int32_t>(b)));
}

TEST(Elementwise, SiluGivesTheSameBitsOnEveryIsaWithinUlpsOfExactSilu) {
  // Normal values at three scales, a sweep over the exp floor and the sign change, and the special
  // values; 1,037 in all, so every kernel's tail runs too.
  std::vector<float> gate = random_vector(300, 31, 1.0f);
  for (float x : random_vector(300, 32, 12.0f)) gate.push_back(x);
  for (float x : random_vector(300, 33, 60.0f)) gate.push_back(x);
  for (int i = -60; i <= 60; ++i) gate.push_back(static_cast<float>(i) * 1.5f);
  const float infinity = std::numeric_limits<float>::infinity();
  for (float x : {0.0f, -0.0f, 1e-30f, -1e-30f, 86.9f, -86.9f, 87.0f, -87.0f, 87.1f, -87.1f, 88.8f,
                  -88.8f, 200.0f, -200.0f, infinity, std::numeric_limits<float>::max(),
                  -std::numeric_limits<float>::max(), std::numeric_limits<float>::denorm_min()}) {
    gate.push_back(x);
  }
  const std::vector<float> up = random_vector(gate.size(), 34, 2.0f);
  const int64_t n = static_cast<int64_t>(gate.size());
  std::vector<float> reference(n), reference_product(n);
  silu_product_isa(Isa::scalar, gate.data(), nullptr, reference.data(), n);
  silu_product_isa(Isa::scalar, gate.data(), up.data(), reference_product.data(), n);
  for (Isa isa : {Isa::avx2, Isa::avx512}) {
    if (!isa_supported(isa)) continue;
    std::vector<float> out(n), product(n), in_place = gate;
    silu_product_isa(isa, gate.data(), nullptr, out.data(), n);
    silu_product_isa(isa, gate.data(), up.data(), product.data(), n);
    silu_product_isa(isa, in_place.data(), nullptr, in_place.data(), n);
    EXPECT_EQ(std::memcmp(out.data(), reference.data(), n * sizeof(float)), 0) << isa_name(isa);
    EXPECT_EQ(std::memcmp(product.data(), reference_product.data(), n * sizeof(float)), 0)
        << isa_name(isa);
    EXPECT_EQ(std::memcmp(in_place.data(), reference.data(), n * sizeof(float)), 0)
        << isa_name(isa);
  }
  for (int64_t i = 0; i < n; ++i) {
    const float x = gate[i];
    EXPECT_EQ(reference_product[i], reference[i] * up[i]) << x;
    if (std::isinf(x)) {
      EXPECT_EQ(reference[i], infinity) << "silu(+inf) = +inf";
      continue;
    }
    const float exact = static_cast<float>(silu_double(x));
    if (x < -87.0f) {
      // exp(-|x|) is flushed to 0 below the floor: silu is -0 there, against an exact value
      // under 87 · e^-87 ≈ 1.4e-36.
      EXPECT_EQ(reference[i], 0.0f) << x;
      EXPECT_LT(std::fabs(exact), 2e-36f) << x;
    } else if (std::fabs(exact) < std::numeric_limits<float>::min()) {
      EXPECT_LE(std::fabs(reference[i] - exact), std::numeric_limits<float>::min()) << x;
    } else {
      EXPECT_LE(ulps_apart(reference[i], exact), 4) << x << ": " << reference[i] << " vs " << exact;
    }
  }
  // NaN stays NaN.
  const float nan = std::numeric_limits<float>::quiet_NaN();
  for (Isa isa : {Isa::scalar, Isa::avx2, Isa::avx512}) {
    if (!isa_supported(isa)) continue;
    std::vector<float> nans(17, nan), out(17);
    silu_product_isa(isa, nans.data(), nullptr, out.data(), 17);
    for (float v : out) EXPECT_TRUE(std::isnan(v)) << isa_name(isa);
  }
}

TEST(Elementwise, SoftmaxWeightsGiveTheSameBitsOnEveryIsaWithinUlpsOfExp) {
  // Logits below a peak of 3 at two scales and a sweep over exp's floor, then the special values
  // (the peak itself, -0, -infinity and NaN); 1,000 in all, so every kernel's tail runs too.
  const float peak = 3.0f, scale = 1.0f / 0.7f;
  std::vector<float> logits;
  for (float x : random_vector(400, 41, 2.0f)) logits.push_back(std::min(x, peak));
  for (float x : random_vector(400, 42, 20.0f)) logits.push_back(std::min(x, peak));
  for (int i = 0; i < 190; ++i) logits.push_back(peak - 58.0f - 0.02f * static_cast<float>(i));
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float infinity = std::numeric_limits<float>::infinity();
  for (float x : {peak, -0.0f, -infinity, nan, peak - 1e-6f, -nan, nan, -infinity, 0.0f, peak}) {
    logits.push_back(x);
  }
  const int64_t n = static_cast<int64_t>(logits.size());
  std::vector<float> reference(n);
  softmax_weights_isa(Isa::scalar, logits.data(), n, peak, scale, reference.data());
  for (Isa isa : {Isa::avx2, Isa::avx512}) {
    if (!isa_supported(isa)) continue;
    std::vector<float> out(n);
    softmax_weights_isa(isa, logits.data(), n, peak, scale, out.data());
    EXPECT_EQ(std::memcmp(out.data(), reference.data(), n * sizeof(float)), 0) << isa_name(isa);
  }
  for (int64_t i = 0; i < n; ++i) {
    const float x = logits[i];
    const float z = (x - peak) * scale;
    if (std::isnan(x) || z < -87.0f) {
      EXPECT_EQ(reference[i], 0.0f) << x;
      continue;
    }
    const float exact = static_cast<float>(std::exp(static_cast<double>(z)));
    EXPECT_LE(ulps_apart(reference[i], exact), 2) << x << ": " << reference[i] << " vs " << exact;
    EXPECT_LE(reference[i], 1.0f) << x;
  }
  EXPECT_EQ(reference[990], 1.0f) << "the peak's weight is exactly 1";
}

TEST(Elementwise, MambaStepSizesAreClampedSoftplusOfRawPlusBias) {
  // Rows of 5 values of which the first 3 are the heads' raw step sizes.
  const int64_t rows = 7, heads = 3, stride = 5;
  const std::vector<float> raw = random_vector(rows * stride, 31, 4.0f);
  const std::vector<float> bias = {-1.0f, 0.0f, 2.0f};
  const float dt_min = 0.05f, dt_max = 3.0f;
  std::vector<float> dt(rows * heads, -1.0f);
  mamba_step_sizes(raw.data(), stride, rows, heads, bias.data(), dt_min, dt_max, dt.data());
  int clamped = 0;
  for (int64_t t = 0; t < rows; ++t) {
    for (int64_t h = 0; h < heads; ++h) {
      const double x = static_cast<double>(raw[t * stride + h]) + bias[h];
      const double softplus_ref = std::log1p(std::exp(x));
      const double expected =
          std::clamp(softplus_ref, static_cast<double>(dt_min), static_cast<double>(dt_max));
      clamped += expected != softplus_ref;
      EXPECT_NEAR(dt[t * heads + h], expected, 1e-6 * (1.0 + expected)) << t << "," << h;
    }
  }
  EXPECT_GT(clamped, 0) << "the case should reach a bound";
}

TEST(Elementwise, GatedRmsNormNormalisesEachGroupOfTheGatedValues) {
  const int64_t rows = 3, dim = 12, groups = 3, stride = 20, size = dim / groups;
  const std::vector<float> z = random_vector(rows * stride, 41, 2.0f);
  const std::vector<float> y = random_vector(rows * dim, 42, 2.0f);
  const std::vector<float> weight = random_vector(dim, 43, 1.0f, 1.0f);
  std::vector<float> out(rows * dim), in_place = y;
  gated_rms_norm(z.data(), stride, y.data(), rows, dim, groups, weight.data(), 1e-5f, out.data());
  gated_rms_norm(z.data(), stride, in_place.data(), rows, dim, groups, weight.data(), 1e-5f,
                 in_place.data());
  EXPECT_EQ(out, in_place);
  for (int64_t t = 0; t < rows; ++t) {
    for (int64_t g = 0; g < groups; ++g) {
      double gated[4], squares = 0.0;
      for (int64_t i = 0; i < size; ++i) {
        const int64_t c = g * size + i;
        gated[i] = silu_double(z[t * stride + c]) * y[t * dim + c];
        squares += gated[i] * gated[i];
      }
      const double inv = 1.0 / std::sqrt(squares / size + 1e-5);
      for (int64_t i = 0; i < size; ++i) {
        const int64_t c = g * size + i;
        EXPECT_NEAR(out[t * dim + c], gated[i] * inv * weight[c], 1e-5) << t << "," << c;
      }
    }
  }
  EXPECT_THROW(
      gated_rms_norm(z.data(), stride, y.data(), rows, dim, 5, weight.data(), 1e-5f, out.data()),
      std::exception);
}

TEST(Elementwise, MoeCombineSumsWeightedExpertsInOrderAndIsRowInvariant) {
  const int64_t rows = 5, top_k = 6, dim = 17;
  const std::vector<float> experts = random_vector(rows * top_k * dim, 51, 3.0f);
  const std::vector<float> weights = random_vector(rows * top_k, 52, 0.3f, 0.2f);
  std::vector<float> out(rows * dim, 99.0f);
  moe_combine(experts.data(), weights.data(), rows, top_k, dim, out.data());
  for (int64_t t = 0; t < rows; ++t) {
    std::vector<float> one(dim);
    moe_combine(experts.data() + t * top_k * dim, weights.data() + t * top_k, 1, top_k, dim,
                one.data());
    for (int64_t i = 0; i < dim; ++i) {
      EXPECT_EQ(out[t * dim + i], one[i]);
      double expected = 0.0;
      for (int64_t k = 0; k < top_k; ++k) {
        expected +=
            static_cast<double>(weights[t * top_k + k]) * experts[(t * top_k + k) * dim + i];
      }
      EXPECT_NEAR(out[t * dim + i], expected, 1e-5 * (1.0 + std::fabs(expected)));
    }
  }
}

TEST(Router, SigmoidTopKWithBiasOnlyForSelection) {
  // Expert 3 wins selection only through its correction bias; weights use unbiased scores.
  const std::vector<float> logits = {2.0f, 1.0f, 0.0f, -1.0f};
  const std::vector<float> bias = {0.0f, 0.0f, 0.0f, 2.0f};
  RouterSpec spec;
  spec.experts = 4;
  spec.top_k = 2;
  spec.routed_scaling_factor = 2.5f;
  spec.correction_bias = bias.data();
  std::vector<int32_t> ids(2);
  std::vector<float> weights(2);
  moe_route(logits.data(), 1, spec, ids.data(), weights.data());
  auto sigmoid = [](float v) { return 1.0f / (1.0f + std::exp(-v)); };
  EXPECT_EQ(ids, (std::vector<int32_t>{3, 0}));
  const float sum = sigmoid(-1.0f) + sigmoid(2.0f);
  EXPECT_NEAR(weights[0], sigmoid(-1.0f) / sum * 2.5f, 1e-6);
  EXPECT_NEAR(weights[1], sigmoid(2.0f) / sum * 2.5f, 1e-6);

  spec.norm_topk_prob = false;
  moe_route(logits.data(), 1, spec, ids.data(), weights.data());
  EXPECT_NEAR(weights[1], sigmoid(2.0f) * 2.5f, 1e-6);
}

TEST(Router, GroupLimitedSelectionDropsWeakGroups) {
  // Groups {0,1}, {2,3}, {4,5}: scored by their two best; keep the best 1 group.
  const std::vector<float> logits = {3.0f, -3.0f, 1.0f, 1.0f, 0.0f, 0.5f};
  RouterSpec spec;
  spec.experts = 6;
  spec.top_k = 2;
  spec.n_group = 3;
  spec.topk_group = 1;
  std::vector<int32_t> ids(2);
  std::vector<float> weights(2);
  moe_route(logits.data(), 1, spec, ids.data(), weights.data());
  // Group {2,3} sums highest (2·sigmoid(1) > sigmoid(3) + sigmoid(-3) = 1); ties to the lower id.
  EXPECT_EQ(ids, (std::vector<int32_t>{2, 3}));
}

}  // namespace
}  // namespace dspark::kernels
