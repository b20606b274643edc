#include "kernels/quant.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <limits>
#include <mutex>
#include <optional>
#include <string_view>
#include <unordered_map>
#include <vector>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "base/error.h"
#include "base/system_info.h"
#include "base/thread_pool.h"
#include "kernels/cpu/quant_impl.h"

namespace dspark::kernels {
namespace {

bool is_scale_dtype(DType dtype) {
  return dtype == DType::BF16 || dtype == DType::F16 || dtype == DType::F32;
}

void check_matrix(const QuantMatrix& w, const char* what) {
  check_quant_format(w.format, what);
  if (!is_scale_dtype(w.scale_dtype)) {
    fail("{}: scales and biases must be BF16, F16 or F32, not {}", what, dtype_name(w.scale_dtype));
  }
  if (w.rows <= 0 || w.cols <= 0 || w.experts <= 0) {
    fail("{}: bad quantized matrix shape [{}, {}, {}]", what, w.experts, w.rows, w.cols);
  }
  if (w.cols % w.format.group_size != 0) {
    fail("{}: {} input columns are not a multiple of the group size {}", what, w.cols,
         w.format.group_size);
  }
  if (w.packed == nullptr || w.scales == nullptr || w.biases == nullptr) {
    fail("{}: quantized matrix without packed weights, scales or biases", what);
  }
}

void check_matrix(const DenseMatrix& w, const char* what) {
  if (!is_scale_dtype(w.dtype)) {
    fail("{}: dense weights must be F32, F16 or BF16, not {}", what, dtype_name(w.dtype));
  }
  if (w.rows <= 0 || w.cols <= 0 || w.experts <= 0 || w.data == nullptr) {
    fail("{}: bad dense matrix [{}, {}, {}]", what, w.experts, w.rows, w.cols);
  }
}

void check_expert(int64_t expert, int64_t experts, const char* what) {
  if (expert < 0 || expert >= experts) {
    fail("{}: expert {} out of range [0, {})", what, expert, experts);
  }
}

void check_isa(Isa isa) {
  if (!isa_supported(isa)) fail("this CPU does not support the {} kernels", isa_name(isa));
}

Isa detect_best_isa() {
  if (const char* requested = std::getenv("DSPARK_ISA"); requested != nullptr && *requested) {
    const std::string_view name(requested);
    for (Isa isa : {Isa::scalar, Isa::avx2, Isa::avxvnni, Isa::avx512, Isa::avx512vnni}) {
      if (name == isa_name(isa)) {
        check_isa(isa);
        return isa;
      }
    }
    fail("DSPARK_ISA={} is not one of scalar, avx2, avxvnni, avx512, avx512vnni", name);
  }
  if (isa_supported(Isa::avx512vnni)) return Isa::avx512vnni;
  if (isa_supported(Isa::avx512)) return Isa::avx512;
  if (isa_supported(Isa::avxvnni)) return Isa::avxvnni;
  if (isa_supported(Isa::avx2)) return Isa::avx2;
  return Isa::scalar;
}

// Rows per parallel chunk: a multiple of 16, and enough work per chunk that claiming it pays
// (about 32768 weight-activation products). A verify batch of m rows does m times the work per
// weight row, so its chunks hold fewer rows and the threads stay balanced on small matrices.
int64_t row_grain(int64_t cols, int64_t m = 1) {
  const int64_t work_per_row = cols * std::clamp<int64_t>(m, 1, 16);
  const int64_t min_rows = (32768 + work_per_row - 1) / work_per_row;
  return std::max<int64_t>(16, (min_rows + 15) / 16 * 16);
}

// Activation rows in the form the quantized kernels read: slot order and per-group sums.
struct PreparedActivations {
  std::vector<float> slots;
  std::vector<float> sums;
  std::vector<const float*> x_rows;
  std::vector<const float*> slot_rows;
  std::vector<const float*> sum_rows;
};

void prepare_activations(const float* x, int64_t m, const QuantMatrix& w,
                         PreparedActivations& out) {
  const int64_t cols = w.cols;
  const int64_t group = w.format.group_size;
  const int64_t groups = w.groups_per_row();
  const int bits = w.format.bits;
  const bool permuted = cpu::slots_permuted(bits);
  const int64_t padded_groups = (groups + 15) / 16 * 16;
  out.sums.assign(m * padded_groups, 0.0f);
  out.x_rows.resize(m);
  out.slot_rows.resize(m);
  out.sum_rows.resize(m);
  if (permuted) out.slots.resize(m * cols);
  for (int64_t i = 0; i < m; ++i) {
    const float* row = x + i * cols;
    float* sums = out.sums.data() + i * padded_groups;
    for (int64_t g = 0; g < groups; ++g) {
      float sum = 0.0f;
      for (int64_t k = g * group; k < (g + 1) * group; ++k) sum += row[k];
      sums[g] = sum;
    }
    out.x_rows[i] = row;
    out.sum_rows[i] = sums;
    if (permuted) {
      float* slots = out.slots.data() + i * cols;
      for (int64_t base = 0; base < cols; base += group) {
        for (int64_t j = 0; j < group; ++j)
          slots[base + j] = row[base + cpu::slot_element(bits, j)];
      }
      out.slot_rows[i] = slots;
    } else {
      out.slot_rows[i] = row;
    }
  }
}

// Activation rows quantized for the int8 kernels, once per call for all rows.
struct Int8Activations {
  std::vector<int8_t> x8;
  std::vector<float> block_scales;
  std::vector<float> sums;
  std::vector<const int8_t*> x8_rows;
  std::vector<const float*> scale_rows;
  std::vector<const float*> sum_rows;
  std::vector<cpu::SpreadVector> spread;
  std::vector<const uint8_t*> spread_rows;  // empty when the rows are not spread
};

// Whether the activations of a product whose tasks have at most `task_rows` rows each, m in all,
// are spread for `table`'s kernel (quant_impl.h). The bound on m keeps a gathered product's
// spread rows in L2.
bool spreads_activations(const cpu::KernelTable& table, const QuantMatrix& w, int64_t m,
                         int64_t task_rows) {
  constexpr int64_t kMaxSpreadRows = 16;
  const bool spread_codes =
      w.format.bits == 4 || (w.format.bits == 8 && table.spreads_byte_tile_codes);
  return table.spread_activations != nullptr && spread_codes && w.tile_codes != nullptr &&
         cpu::spread_pays(task_rows, w.cols) && m <= kMaxSpreadRows;
}

void prepare_int8_activations(const cpu::KernelTable& table, const float* x, int64_t m,
                              const QuantMatrix& w, bool spread, Int8Activations& out) {
  const int64_t cols = w.cols;
  const int64_t group = w.format.group_size;
  const int64_t groups = w.groups_per_row();
  const int64_t blocks = cols / cpu::kInt8Block;
  // The buffers only grow: callers keep one per thread, and every value read is written here.
  const auto grow = [](auto& buffer, int64_t size) {
    if (static_cast<int64_t>(buffer.size()) < size) buffer.resize(static_cast<size_t>(size));
  };
  grow(out.x8, m * cols);
  grow(out.block_scales, m * blocks);
  grow(out.sums, m * groups);
  grow(out.x8_rows, m);
  grow(out.scale_rows, m);
  grow(out.sum_rows, m);
  const int64_t blocks_per_group = group / cpu::kInt8Block;
  for (int64_t i = 0; i < m; ++i) {
    const float* row = x + i * cols;
    int8_t* x8 = out.x8.data() + i * cols;
    float* scales = out.block_scales.data() + i * blocks;
    table.quantize_activations(row, cols, w.format.bits, x8, scales);
    // Σx of the quantized row (quant_impl.h): each block's integer sum (exact, so the table's
    // element order does not matter) times its scale, chained over the group's blocks.
    float* sums = out.sums.data() + i * groups;
    for (int64_t g = 0; g < groups; ++g) {
      float sum = 0.0f;
      for (int64_t j = 0; j < blocks_per_group; ++j) {
        const int64_t b = g * blocks_per_group + j;
        int32_t block_sum = 0;
        for (int64_t k = b * cpu::kInt8Block; k < (b + 1) * cpu::kInt8Block; ++k)
          block_sum += x8[k];
        const float term = static_cast<float>(block_sum);
        sum = j == 0 ? scales[b] * term : std::fma(scales[b], term, sum);
      }
      sums[g] = sum;
    }
    out.x8_rows[i] = x8;
    out.scale_rows[i] = scales;
    out.sum_rows[i] = sums;
  }
  out.spread_rows.clear();
  if (!spread) return;
  const int64_t vectors = cols * cpu::kSpreadBytesPerInput / 32;
  grow(out.spread, m * vectors);
  for (int64_t i = 0; i < m; ++i) {
    cpu::SpreadVector* row = out.spread.data() + i * vectors;
    table.spread_activations(out.x8_rows[i], cols, row);
    out.spread_rows.push_back(row->bytes);
  }
}

// The prepared rows' spread, or null when they are not spread.
const uint8_t* const* spread_rows_or_null(const Int8Activations& prepared) {
  return prepared.spread_rows.empty() ? nullptr : prepared.spread_rows.data();
}

Numerics numerics_from_environment() {
  const char* requested = std::getenv("DSPARK_NUMERICS");
  if (requested == nullptr || *requested == '\0') return Numerics::int8;
  return parse_numerics(requested, "DSPARK_NUMERICS");
}

// -1 until first use; then the Numerics value.
std::atomic<int> current_numerics{-1};

// Rows of x sharing an expert, in first-seen order of experts and increasing row order.
struct ExpertSegment {
  int64_t expert;
  std::vector<int64_t> rows;
};

std::vector<ExpertSegment> segments_by_expert(const int32_t* expert_ids, int64_t m, int64_t experts,
                                              const char* what) {
  std::vector<ExpertSegment> segments;
  for (int64_t r = 0; r < m; ++r) {
    const int64_t expert = expert_ids[r];
    check_expert(expert, experts, what);
    auto found = std::find_if(segments.begin(), segments.end(),
                              [&](const ExpertSegment& s) { return s.expert == expert; });
    if (found == segments.end()) {
      segments.push_back({expert, {r}});
    } else {
      found->rows.push_back(r);
    }
  }
  return segments;
}

// One unit of gathered work: rows [row_begin, row_end) of one segment's expert.
struct GatherItem {
  int64_t segment;
  int64_t row_begin;
  int64_t row_end;
};

std::vector<GatherItem> gather_items(const std::vector<ExpertSegment>& segments, int64_t rows,
                                     int64_t grain) {
  std::vector<GatherItem> items;
  for (int64_t s = 0; s < static_cast<int64_t>(segments.size()); ++s) {
    for (int64_t begin = 0; begin < rows; begin += grain) {
      items.push_back({s, begin, std::min(rows, begin + grain)});
    }
  }
  return items;
}

float read_scale(const void* base, DType dtype, int64_t index) {
  const auto* bytes = static_cast<const uint8_t*>(base);
  if (dtype == DType::F32) {
    float value;
    std::memcpy(&value, bytes + index * 4, 4);
    return value;
  }
  uint16_t bits;
  std::memcpy(&bits, bytes + index * 2, 2);
  return dtype == DType::BF16 ? dspark::bf16_to_f32(bits) : dspark::f16_to_f32(bits);
}

void write_scale(void* base, DType dtype, int64_t index, float value) {
  auto* bytes = static_cast<uint8_t*>(base);
  if (dtype == DType::F32) {
    std::memcpy(bytes + index * 4, &value, 4);
    return;
  }
  const uint16_t bits = dtype == DType::BF16 ? dspark::f32_to_bf16(value) : f32_to_f16(value);
  std::memcpy(bytes + index * 2, &bits, 2);
}

float round_to_dtype(DType dtype, float value) {
  if (dtype == DType::BF16) return dspark::round_to_bf16(value);
  if (dtype == DType::F16) return dspark::f16_to_f32(f32_to_f16(value));
  return value;
}

// w = s·q + b per element; `in_scale_dtype` rounds the product and the sum to the scale dtype
// (mx.dequantize's arithmetic in the model dtype).
void dequantize(const QuantMatrix& w, int64_t expert, int64_t row_begin, int64_t row_end,
                float* out, bool in_scale_dtype) {
  check_matrix(w, "dequantize");
  check_expert(expert, w.experts, "dequantize");
  if (row_begin < 0 || row_end > w.rows || row_begin > row_end) {
    fail("dequantize: rows [{}, {}) outside [0, {})", row_begin, row_end, w.rows);
  }
  const int bits = w.format.bits;
  const uint32_t mask = (1u << bits) - 1;
  const int64_t row_bytes = w.words_per_row() * 4;
  const int64_t groups = w.groups_per_row();
  const DType rounding = in_scale_dtype ? w.scale_dtype : DType::F32;
  const int64_t tiles = cpu::tiles_per_expert(w.rows);
  for (int64_t row = row_begin; row < row_end; ++row) {
    const int64_t stored = expert * w.rows + row;
    const uint8_t* packed = w.packed + stored * row_bytes;
    float* dst = out + (row - row_begin) * w.cols;
    // Read from the tile values when the matrix has them: its loader released the originals (an
    // embedding lookup would fault their pages back in).
    const uint8_t* scales = w.scales;
    const uint8_t* biases = w.biases;
    int64_t first = stored * groups, stride = 1;
    if (w.tile_values != nullptr) {
      const cpu::TileValueSlots slots =
          cpu::tile_value_slots(w.scale_dtype, static_cast<int>(row % cpu::kTileValueRows));
      const int64_t tile = expert * tiles + row / cpu::kTileValueRows;
      scales = w.tile_values + slots.scale * dtype_size(w.scale_dtype);
      biases = w.tile_values + slots.bias * dtype_size(w.scale_dtype);
      stride = 2 * cpu::kTileValueRows;
      first = tile * groups * stride;
    }
    // Likewise the tile codes (4 and 8 bits): row r's byte j of a block is byte j % 4 of dword r
    // of vector j / 4.
    const uint8_t* tile_codes = nullptr;
    const int64_t tile_block_bytes = cpu::tile_code_block_bytes(bits);
    if (w.tile_codes != nullptr) {
      const int64_t tile = expert * tiles + row / cpu::kTileValueRows;
      tile_codes = w.tile_codes + tile * (w.cols / cpu::kInt8Block) * tile_block_bytes +
                   row % cpu::kTileValueRows * 4;
    }
    for (int64_t k = 0; k < w.cols; ++k) {
      uint32_t window = 0;
      const int64_t first_bit = k * bits;
      if (tile_codes != nullptr) {
        const int64_t byte = k % cpu::kInt8Block * bits / 8;
        window = tile_codes[k / cpu::kInt8Block * tile_block_bytes + byte / 4 * 32 + byte % 4];
      } else {
        const int64_t byte = first_bit / 8;
        window = packed[byte];
        if (byte + 1 < row_bytes) window |= static_cast<uint32_t>(packed[byte + 1]) << 8;
      }
      const auto q = static_cast<float>((window >> (first_bit % 8)) & mask);
      const int64_t g = first + k / w.format.group_size * stride;
      const float product = round_to_dtype(rounding, read_scale(scales, w.scale_dtype, g) * q);
      dst[k] = round_to_dtype(rounding, product + read_scale(biases, w.scale_dtype, g));
    }
  }
}

// Quantizes one row the way MLX's CPU quantizer does: all arithmetic in fp32, q rounded half to
// even, the edge value (the larger-magnitude extreme) kept exact.
void quantize_row(const float* weights, int64_t cols, QuantFormat format, DType scale_dtype,
                  uint8_t* packed, void* scales, void* biases, int64_t group_index) {
  const int bits = format.bits;
  const float max_q = static_cast<float>((1 << bits) - 1);
  const int64_t row_bytes = cols * bits / 8;
  std::memset(packed, 0, row_bytes);
  for (int64_t g = 0; g < cols / format.group_size; ++g) {
    const float* group = weights + g * format.group_size;
    float w_min = std::numeric_limits<float>::infinity();
    float w_max = -w_min;
    for (int64_t k = 0; k < format.group_size; ++k) {
      w_max = std::max(w_max, group[k]);
      w_min = std::min(w_min, group[k]);
    }
    const bool min_is_edge = std::abs(w_min) > std::abs(w_max);
    float scale = std::max((w_max - w_min) / max_q, 1e-7f);
    scale = min_is_edge ? scale : -scale;
    const float edge = min_is_edge ? w_min : w_max;
    const float q0 = std::rint(edge / scale);
    float bias = 0.0f;
    if (q0 != 0.0f) {
      scale = edge / q0;
      bias = edge;
    }
    for (int64_t k = 0; k < format.group_size; ++k) {
      float q = std::rint((group[k] - bias) / scale);
      q = std::min(std::max(q, 0.0f), max_q);
      const uint32_t value = static_cast<uint32_t>(q);
      const int64_t first_bit = (g * format.group_size + k) * bits;
      const uint32_t shifted = value << (first_bit % 8);
      packed[first_bit / 8] |= static_cast<uint8_t>(shifted);
      if ((first_bit % 8) + bits > 8)
        packed[first_bit / 8 + 1] |= static_cast<uint8_t>(shifted >> 8);
    }
    write_scale(scales, scale_dtype, group_index + g, scale);
    write_scale(biases, scale_dtype, group_index + g, bias);
  }
}

template <typename Convert>
void convert_in_parallel(int64_t n, Convert convert) {
  constexpr int64_t kChunk = 1 << 16;
  if (n <= 4 * kChunk) {
    convert(0, n);
    return;
  }
  default_pool().parallel_for(n, kChunk,
                              [&](int64_t begin, int64_t end, int) { convert(begin, end); });
}

}  // namespace

bool isa_supported(Isa isa) {
  const CpuFeatures& cpu = cpu_features();
  switch (isa) {
    case Isa::scalar:
      return true;
    case Isa::avx2:
      return cpu.avx2 && cpu.fma && cpu.f16c;
    case Isa::avxvnni:
      return isa_supported(Isa::avx2) && cpu.avxvnni;
    case Isa::avx512:
      return cpu.avx512f && cpu.avx512bw && cpu.avx512vl && cpu.avx512dq && cpu.fma && cpu.f16c;
    case Isa::avx512vnni:
      return isa_supported(Isa::avx512) && cpu.avx512vnni;
  }
  return false;
}

namespace cpu {
const KernelTable& kernel_table(Isa isa) {
  switch (isa) {
    case Isa::avx512vnni:
      return kAvx512VnniKernels;
    case Isa::avx512:
      return kAvx512Kernels;
    case Isa::avxvnni:
      return kAvxVnniKernels;
    case Isa::avx2:
      return kAvx2Kernels;
    case Isa::scalar:
      break;
  }
  return kRefKernels;
}
}  // namespace cpu

void check_quant_format(const QuantFormat& format, const char* what) {
  const int bits = format.bits;
  if (bits != 2 && bits != 3 && bits != 4 && bits != 5 && bits != 6 && bits != 8) {
    fail("{}: {} bits is not an MLX affine quantization (bits must be 2, 3, 4, 5, 6 or 8)", what,
         bits);
  }
  const int group = format.group_size;
  if (group != 32 && group != 64 && group != 128) {
    fail("{}: group size {} is not supported (must be 32, 64 or 128)", what, group);
  }
}

int64_t QuantMatrix::bytes_per_expert() const {
  const int64_t scale_bytes = static_cast<int64_t>(dtype_size(scale_dtype));
  return rows * (words_per_row() * 4 + 2 * groups_per_row() * scale_bytes);
}

int64_t tile_values_bytes(const QuantMatrix& w) {
  return w.experts * cpu::tiles_per_expert(w.rows) * w.groups_per_row() *
         cpu::tile_value_group_bytes(w.scale_dtype);
}

namespace {

// Tiles [first, end) of pack_tile_values with scale values of type T (its size is the scale
// dtype's): copies of a known size compile to plain moves.
template <typename T>
void pack_tiles(const QuantMatrix& w, uint8_t* out, int64_t first, int64_t end) {
  const int64_t groups = w.groups_per_row();
  const int64_t tiles = cpu::tiles_per_expert(w.rows);
  for (int64_t tile = first; tile < end; ++tile) {
    const int64_t expert = tile / tiles;
    const int64_t first_row = tile % tiles * cpu::kTileValueRows;
    T* values = reinterpret_cast<T*>(out) + tile * groups * 2 * cpu::kTileValueRows;
    for (int r = 0; r < cpu::kTileValueRows; ++r) {
      const cpu::TileValueSlots slots = cpu::tile_value_slots(w.scale_dtype, r);
      if (first_row + r >= w.rows) {
        for (int64_t g = 0; g < groups; ++g) {
          values[g * 2 * cpu::kTileValueRows + slots.scale] = T{};
          values[g * 2 * cpu::kTileValueRows + slots.bias] = T{};
        }
        continue;
      }
      const int64_t source = (expert * w.rows + first_row + r) * groups * sizeof(T);
      for (int64_t g = 0; g < groups; ++g) {
        std::memcpy(&values[g * 2 * cpu::kTileValueRows + slots.scale],
                    w.scales + source + g * sizeof(T), sizeof(T));
        std::memcpy(&values[g * 2 * cpu::kTileValueRows + slots.bias],
                    w.biases + source + g * sizeof(T), sizeof(T));
      }
    }
  }
}

}  // namespace

namespace {

// Calls pack(first, end) for w's tiles (every expert's, in stored order) a slice at a time, and
// after each slice rows_packed (when given) with the stored rows packed so far: a loader's
// originals and packed copy are both resident for one slice only.
template <typename Pack>
void pack_in_slices(const QuantMatrix& w, const RowsPacked& rows_packed, const Pack& pack) {
  constexpr int64_t kSliceTiles = 256;
  const int64_t tiles = cpu::tiles_per_expert(w.rows);
  for (int64_t first = 0; first < w.experts * tiles; first += kSliceTiles) {
    const int64_t end = std::min(w.experts * tiles, first + kSliceTiles);
    pack(first, end);
    if (rows_packed) {
      const int64_t last = end - 1;
      rows_packed(last / tiles * w.rows +
                  std::min(w.rows, (last % tiles + 1) * cpu::kTileValueRows));
    }
  }
}

}  // namespace

void pack_tile_values(const QuantMatrix& w, uint8_t* out, const RowsPacked& rows_packed) {
  pack_in_slices(w, rows_packed, [&](int64_t first, int64_t end) {
    if (w.scale_dtype == DType::F32) {
      pack_tiles<uint32_t>(w, out, first, end);
    } else {
      pack_tiles<uint16_t>(w, out, first, end);
    }
  });
}

int64_t tile_codes_bytes(const QuantMatrix& w) {
  if (!cpu::has_tile_codes(w.format.bits)) return 0;
  return w.experts * cpu::tiles_per_expert(w.rows) * (w.cols / cpu::kInt8Block) *
         cpu::tile_code_block_bytes(w.format.bits);
}

void pack_tile_codes(const QuantMatrix& w, uint8_t* out, const RowsPacked& rows_packed) {
  const int bits = w.format.bits;
  if (!cpu::has_tile_codes(bits)) fail("pack_tile_codes: {}-bit codes have no tile layout", bits);
  const int64_t block_bytes = cpu::kInt8Block * bits / 8;  // one row's 32 codes
  const int64_t tile_block_bytes = cpu::tile_code_block_bytes(bits);
  const int64_t tiles = cpu::tiles_per_expert(w.rows);
  const int64_t blocks = w.cols / cpu::kInt8Block;
  const int64_t row_bytes = w.cols * bits / 8;
  pack_in_slices(w, rows_packed, [&](int64_t first, int64_t end) {
    for (int64_t tile = first; tile < end; ++tile) {
      const int64_t expert = tile / tiles;
      const int64_t first_row = tile % tiles * cpu::kTileValueRows;
      uint8_t* tile_out = out + tile * blocks * tile_block_bytes;
      for (int r = 0; r < cpu::kTileValueRows; ++r) {
        const bool inside = first_row + r < w.rows;
        const uint8_t* row = w.packed + (expert * w.rows + first_row + r) * row_bytes;
        for (int64_t b = 0; b < blocks; ++b) {
          for (int64_t s = 0; s < cpu::tile_code_vectors(bits); ++s) {
            uint8_t* dword = tile_out + b * tile_block_bytes + s * 32 + r * 4;
            if (inside) {
              std::memcpy(dword, row + b * block_bytes + s * 4, 4);
            } else {
              std::memset(dword, 0, 4);
            }
          }
        }
      }
    }
  });
}

bool products_read_tile_values() {
  if (numerics() != Numerics::int8) return false;
  return best_isa() != Isa::scalar;
}

bool products_read_tile_codes(int bits) {
  if (!products_read_tile_values()) return false;
  const Isa isa = best_isa();
  return cpu::has_tile_codes(bits) &&
         (bits == 4 || isa == Isa::avx512vnni || cpu::kernel_table(isa).spreads_byte_tile_codes);
}

const char* isa_name(Isa isa) {
  switch (isa) {
    case Isa::scalar:
      return "scalar";
    case Isa::avx2:
      return "avx2";
    case Isa::avxvnni:
      return "avxvnni";
    case Isa::avx512:
      return "avx512";
    case Isa::avx512vnni:
      return "avx512vnni";
  }
  return "?";
}

Isa best_isa() {
  static const Isa isa = detect_best_isa();
  return isa;
}

void quantize(const float* weights, int64_t rows, int64_t cols, QuantFormat format,
              DType scale_dtype, uint32_t* packed, void* scales, void* biases) {
  check_quant_format(format, "quantize");
  if (!is_scale_dtype(scale_dtype)) {
    fail("quantize: scales must be BF16, F16 or F32, not {}", dtype_name(scale_dtype));
  }
  if (cols % format.group_size != 0) {
    fail("quantize: {} columns are not a multiple of the group size {}", cols, format.group_size);
  }
  const int64_t row_bytes = cols * format.bits / 8;
  const int64_t groups = cols / format.group_size;
  auto* packed_bytes = reinterpret_cast<uint8_t*>(packed);
  default_pool().parallel_for(rows, row_grain(cols), [&](int64_t begin, int64_t end, int) {
    for (int64_t r = begin; r < end; ++r) {
      quantize_row(weights + r * cols, cols, format, scale_dtype, packed_bytes + r * row_bytes,
                   scales, biases, r * groups);
    }
  });
}

void dequantize_rows(const QuantMatrix& w, int64_t expert, int64_t row_begin, int64_t row_end,
                     float* out) {
  dequantize(w, expert, row_begin, row_end, out, false);
}

void dequantize_rows_mlx(const QuantMatrix& w, int64_t expert, int64_t row_begin, int64_t row_end,
                         float* out) {
  dequantize(w, expert, row_begin, row_end, out, true);
}

const char* numerics_name(Numerics numerics) {
  switch (numerics) {
    case Numerics::int8:
      return "int8";
    case Numerics::fp32:
      return "fp32";
  }
  return "?";
}

Numerics parse_numerics(std::string_view name, const char* what) {
  for (Numerics numerics : {Numerics::int8, Numerics::fp32}) {
    if (name == numerics_name(numerics)) return numerics;
  }
  fail("{}: numerics '{}' is not one of int8, fp32", what, name);
}

Numerics numerics() {
  int value = current_numerics.load(std::memory_order_relaxed);
  if (value < 0) {
    int unset = -1;
    current_numerics.compare_exchange_strong(unset, static_cast<int>(numerics_from_environment()));
    value = current_numerics.load(std::memory_order_relaxed);
  }
  return static_cast<Numerics>(value);
}

void set_numerics(Numerics numerics) {
  current_numerics.store(static_cast<int>(numerics), std::memory_order_relaxed);
}

namespace {

// The kernels qmatmul may choose between: the best ISA and, on AVX-512 CPUs, its 256-bit sibling.
// Every kernel gives the same bits, so the choice is one of speed alone, and the faster one depends
// on the CPU and the shape: on Zen 4, which runs 512-bit operations as two 256-bit halves, the
// AVX2 kernels stream one or two activation rows through most matrices 1.3-1.9x faster than the
// AVX-512 VNNI ones, which win at 8 rows (quant_bench, one thread; docs/benchmarks, session 16).
// DSPARK_ISA pins one ISA.
std::vector<Isa> product_candidates() {
  const Isa best = best_isa();
  const char* forced = std::getenv("DSPARK_ISA");
  if (forced != nullptr && *forced) return {best};
  if (best == Isa::avx512vnni) {
    return {best, isa_supported(Isa::avxvnni) ? Isa::avxvnni : Isa::avx2};
  }
  if (best == Isa::avx512) return {best, Isa::avx2};
  return {best};
}

// Products of one shape, bit width, group, scale type and numerics, with a number of activation
// rows in one bucket (1, 2, 3-4, 5-8, 9-16), run the same kernels. More rows (prefill) take the
// best ISA without a measurement: the wide kernels win from 8 rows on, and timing a prefill
// chunk six times would hold up a first answer.
constexpr int64_t kPlannedRows = 16;
struct PlanKey {
  int64_t rows, cols;
  int bits, group;
  DType scale_dtype;
  Numerics numerics;
  int rows_bucket;
  bool gathered;  // gather_qmatmul, bucketed by the most rows of one expert
  bool operator==(const PlanKey&) const = default;
};

struct PlanKeyHash {
  size_t operator()(const PlanKey& k) const {
    size_t h = std::hash<int64_t>()(k.rows) * 31 + std::hash<int64_t>()(k.cols);
    for (int part : {k.bits, k.group, static_cast<int>(k.scale_dtype), static_cast<int>(k.numerics),
                     k.rows_bucket, static_cast<int>(k.gathered)}) {
      h = h * 31 + std::hash<int>()(part);
    }
    return h;
  }
};

int rows_bucket(int64_t m) {
  int bucket = 0;
  for (int64_t limit = 1; m > limit; limit *= 2) ++bucket;
  return bucket;
}

// How much faster than the best ISA's kernel another must run to be chosen. Three timed runs on a
// VM shared with other guests vary by more than the kernels near parity differ: on an Emerald
// Rapids Xeon the plan kept 256-bit kernels that ran no faster there, and verify forwards with
// DSPARK_ISA=avx512vnni pinned took 0.83-1.06x the default's time (verify_bench, 4 rounds) before
// this margin. Where the 256-bit kernels win they win by more (1.3-1.9x on Zen 4, above).
constexpr double kPlanMargin = 0.1;

// The kernel chosen for each key, measured on the first product with that key.
class KernelPlan {
 public:
  std::optional<Isa> find(const PlanKey& key) {
    std::lock_guard lock(mutex_);
    const auto found = chosen_.find(key);
    if (found == chosen_.end()) return std::nullopt;
    return found->second;
  }

  // Runs the product with each candidate in turn, three times over, and keeps the first candidate
  // (the best ISA) unless another's fastest run beat its fastest by kPlanMargin. `run(isa)` writes
  // the same output whichever runs. `evict()` runs before each: it flushes the weights from the
  // caches, so that every run streams them from memory as a decode step does (a model's matrices
  // together outgrow the caches; one alone may not, and timed hot it would favour the kernel with
  // the faster arithmetic over the faster stream).
  template <typename Run, typename Evict>
  void measure(const PlanKey& key, const std::vector<Isa>& candidates, const Run& run,
               const Evict& evict) {
    constexpr int kRounds = 3;
    std::vector<double> fastest(candidates.size(), std::numeric_limits<double>::infinity());
    for (int round = 0; round < kRounds; ++round) {
      for (size_t c = 0; c < candidates.size(); ++c) {
        evict();
        const auto start = std::chrono::steady_clock::now();
        run(candidates[c]);
        const std::chrono::duration<double> took = std::chrono::steady_clock::now() - start;
        fastest[c] = std::min(fastest[c], took.count());
      }
    }
    size_t best = 0;
    for (size_t c = 1; c < candidates.size(); ++c) {
      if (fastest[c] * (1.0 + kPlanMargin) < fastest[best]) best = c;
    }
    std::lock_guard lock(mutex_);
    chosen_.emplace(key, candidates[best]);
  }

 private:
  std::mutex mutex_;
  std::unordered_map<PlanKey, Isa, PlanKeyHash> chosen_;
};

KernelPlan& kernel_plan() {
  static KernelPlan plan;
  return plan;
}

#if defined(__x86_64__)
__attribute__((target("clflushopt"))) void flush_lines_unordered(const uint8_t* p, int64_t bytes) {
  // The intrinsic takes a mutable pointer; the flush writes nothing.
  for (int64_t offset = 0; offset < bytes; offset += 64) {
    _mm_clflushopt(const_cast<uint8_t*>(p + offset));
  }
}
#endif

// Flushes `bytes` at p from every cache level. clflush is ordered against every other flush, so
// they ran one at a time: on an Emerald Rapids Xeon the kernel plan's flushes (before each of its
// 6 timed runs per shape) were 27 % of the samples of a one-token `dspark generate` after a
// 560-token prompt. clflushopt lets them overlap (that prompt's rate 1.7x), and the fence
// completes them all before the timed run.
void flush_from_caches(const uint8_t* p, int64_t bytes) {
#if defined(__x86_64__)
  if (cpu_features().clflushopt) {
    flush_lines_unordered(p, bytes);
  } else {
    for (int64_t offset = 0; offset < bytes; offset += 64) _mm_clflush(p + offset);
  }
  _mm_mfence();
#else
  (void)p, (void)bytes;
#endif
}

// Flushes what the int8 kernels read of expert `expert` from the caches: its tile layouts where it
// has them (the loader released the originals' pages, which a flush would fault back in), else its
// packed weights, scales and biases.
void flush_expert(const QuantMatrix& w, int64_t expert) {
  if (w.tile_codes != nullptr) {
    const int64_t tile_codes = tile_codes_bytes(w) / w.experts;
    flush_from_caches(w.tile_codes + expert * tile_codes, tile_codes);
  } else {
    const int64_t packed = w.rows * w.words_per_row() * 4;
    flush_from_caches(w.packed + expert * packed, packed);
  }
  if (w.tile_values != nullptr) {
    const int64_t tile_values = tile_values_bytes(w) / w.experts;
    flush_from_caches(w.tile_values + expert * tile_values, tile_values);
  } else {
    const int64_t values =
        w.rows * w.groups_per_row() * static_cast<int64_t>(dtype_size(w.scale_dtype));
    flush_from_caches(w.scales + expert * values, values);
    flush_from_caches(w.biases + expert * values, values);
  }
}

PlanKey plan_key(const QuantMatrix& w, Numerics numerics, int64_t rows, bool gathered) {
  return {w.rows,        w.cols,   w.format.bits,     w.format.group_size,
          w.scale_dtype, numerics, rows_bucket(rows), gathered};
}

// Runs run(isa) with the planned ISA for a product of `rows` activation rows (per expert when
// gathered), measuring the candidates first when this key has none yet; `evict` flushes the
// weights the product reads.
template <typename Run, typename Evict>
void run_planned(const QuantMatrix& w, Numerics numerics, int64_t rows, bool gathered,
                 const Run& run, const Evict& evict) {
  static const std::vector<Isa> candidates = product_candidates();
  if (candidates.size() == 1 || rows <= 0 || rows > kPlannedRows) return run(candidates.front());
  const PlanKey key = plan_key(w, numerics, rows, gathered);
  KernelPlan& plan = kernel_plan();
  if (const std::optional<Isa> isa = plan.find(key)) return run(*isa);
  plan.measure(key, candidates, run, evict);
}

// The ISA run_planned would run for this product, where no measurement is needed first.
std::optional<Isa> settled_isa(const QuantMatrix& w, Numerics numerics, int64_t rows) {
  static const std::vector<Isa> candidates = product_candidates();
  if (candidates.size() == 1 || rows <= 0 || rows > kPlannedRows) return candidates.front();
  return kernel_plan().find(plan_key(w, numerics, rows, false));
}

// The most rows that share one expert id.
int64_t rows_per_expert(const int32_t* expert_ids, int64_t m) {
  std::vector<int32_t> ids(expert_ids, expert_ids + m);
  std::sort(ids.begin(), ids.end());
  int64_t most = 0;
  for (int64_t first = 0; first < m;) {
    int64_t last = first;
    while (last < m && ids[last] == ids[first]) ++last;
    most = std::max(most, last - first);
    first = last;
  }
  return most;
}

}  // namespace

Isa planned_isa(const QuantMatrix& w, int64_t m) {
  if (m > kPlannedRows) return best_isa();
  return kernel_plan().find(plan_key(w, numerics(), m, false)).value_or(best_isa());
}

void qmatmul(const float* x, int64_t m, const QuantMatrix& w, float* y, int64_t expert) {
  // Checked before a measurement flushes the expert's weights.
  check_matrix(w, "qmatmul");
  check_expert(expert, w.experts, "qmatmul");
  const Numerics current = numerics();
  run_planned(
      w, current, m, false, [&](Isa isa) { qmatmul_numerics(current, isa, x, m, w, y, expert); },
      [&] { flush_expert(w, expert); });
}

void qmatmul_isa(Isa isa, const float* x, int64_t m, const QuantMatrix& w, float* y,
                 int64_t expert) {
  qmatmul_numerics(numerics(), isa, x, m, w, y, expert);
}

void qmatmul_numerics(Numerics numerics, Isa isa, const float* x, int64_t m, const QuantMatrix& w,
                      float* y, int64_t expert) {
  check_matrix(w, "qmatmul");
  check_expert(expert, w.experts, "qmatmul");
  check_isa(isa);
  if (m <= 0) return;
  const cpu::KernelTable& table = cpu::kernel_table(isa);
  std::vector<float*> y_rows(m);
  for (int64_t i = 0; i < m; ++i) y_rows[i] = y + i * w.rows;
  const int64_t grain = row_grain(w.cols, m);
  if (numerics == Numerics::int8) {
    thread_local Int8Activations prepared;
    prepare_int8_activations(table, x, m, w, spreads_activations(table, w, m, m), prepared);
    const cpu::Int8Task task{&w,
                             expert,
                             m,
                             prepared.x8_rows.data(),
                             prepared.scale_rows.data(),
                             prepared.sum_rows.data(),
                             y_rows.data(),
                             spread_rows_or_null(prepared)};
    default_pool().parallel_for(
        w.rows, grain, [&](int64_t begin, int64_t end, int) { table.int8_rows(task, begin, end); });
    return;
  }
  PreparedActivations prepared;
  prepare_activations(x, m, w, prepared);
  const cpu::QuantTask task{&w,
                            expert,
                            m,
                            prepared.x_rows.data(),
                            prepared.slot_rows.data(),
                            prepared.sum_rows.data(),
                            y_rows.data()};
  default_pool().parallel_for(
      w.rows, grain, [&](int64_t begin, int64_t end, int) { table.quant_rows(task, begin, end); });
}

void qmatmul_shared(const float* x, int64_t m, const SharedInputProduct* products, int64_t count,
                    const RowsDone* rows_done) {
  if (count <= 0 || m <= 0) return;
  const QuantMatrix& first = *products[0].w;
  const Numerics current = numerics();
  std::vector<const cpu::KernelTable*> tables(count);
  bool together = current == Numerics::int8;
  for (int64_t k = 0; k < count; ++k) {
    const QuantMatrix& w = *products[k].w;
    check_matrix(w, "qmatmul_shared");
    together = together && w.cols == first.cols && w.format.bits == first.format.bits &&
               w.format.group_size == first.format.group_size &&
               (rows_done == nullptr || w.rows == first.rows);
    if (!together) break;
    const std::optional<Isa> isa = settled_isa(w, current, m);
    if (!isa) {
      together = false;
      break;
    }
    tables[k] = &cpu::kernel_table(*isa);
    // Every product reads the one quantization of the rows, made in its first kernel's order.
    together = tables[k]->quantize_activations == tables[0]->quantize_activations;
  }
  if (!together) {
    for (int64_t k = 0; k < count; ++k) qmatmul(x, m, *products[k].w, products[k].y);
    if (rows_done != nullptr) {
      default_pool().parallel_for(
          first.rows, row_grain(first.cols, m),
          [&](int64_t begin, int64_t end, int) { (*rows_done)(begin, end); });
    }
    return;
  }
  thread_local Int8Activations prepared;
  // Spread rows are made by the first table's function: every table that reads them shares it.
  bool spread = false;
  for (int64_t k = 0; k < count; ++k) {
    spread = spread || spreads_activations(*tables[k], *products[k].w, m, m);
  }
  spread = spread && tables[0]->spread_activations != nullptr;
  prepare_int8_activations(*tables[0], x, m, first, spread, prepared);
  std::vector<float*> y_rows(count * m);
  std::vector<cpu::Int8Task> tasks(count);
  std::vector<int64_t> row_offsets(count + 1, 0);
  for (int64_t k = 0; k < count; ++k) {
    const QuantMatrix& w = *products[k].w;
    for (int64_t i = 0; i < m; ++i) y_rows[k * m + i] = products[k].y + i * w.rows;
    tasks[k] = {&w,
                0,
                m,
                prepared.x8_rows.data(),
                prepared.scale_rows.data(),
                prepared.sum_rows.data(),
                y_rows.data() + k * m,
                tables[k]->spread_activations != nullptr ? spread_rows_or_null(prepared) : nullptr};
    row_offsets[k + 1] = row_offsets[k] + w.rows;
  }
  const int64_t grain = row_grain(first.cols, m);
  if (rows_done != nullptr) {
    default_pool().parallel_for(first.rows, grain, [&](int64_t begin, int64_t end, int) {
      for (int64_t k = 0; k < count; ++k) tables[k]->int8_rows(tasks[k], begin, end);
      (*rows_done)(begin, end);
    });
    return;
  }
  // The matrices' rows one after another, cut at the same grain as one matrix's.
  default_pool().parallel_for(row_offsets[count], grain, [&](int64_t begin, int64_t end, int) {
    for (int64_t k = 0; k < count; ++k) {
      const int64_t from = std::max(begin, row_offsets[k]), to = std::min(end, row_offsets[k + 1]);
      if (from < to) tables[k]->int8_rows(tasks[k], from - row_offsets[k], to - row_offsets[k]);
    }
  });
}

void gather_qmatmul(const float* x, int64_t m, const int32_t* expert_ids, const QuantMatrix& w,
                    float* y) {
  check_matrix(w, "gather_qmatmul");
  const Numerics current = numerics();
  run_planned(
      w, current, m > 0 ? rows_per_expert(expert_ids, m) : 0, true,
      [&](Isa isa) { gather_qmatmul_numerics(current, isa, x, m, expert_ids, w, y); },
      [&] {
        // Ids outside the tensor are skipped here; the product refuses them.
        std::vector<int32_t> experts(expert_ids, expert_ids + m);
        std::sort(experts.begin(), experts.end());
        experts.erase(std::unique(experts.begin(), experts.end()), experts.end());
        for (int32_t expert : experts) {
          if (expert >= 0 && expert < w.experts) flush_expert(w, expert);
        }
      });
}

void gather_qmatmul_isa(Isa isa, const float* x, int64_t m, const int32_t* expert_ids,
                        const QuantMatrix& w, float* y) {
  gather_qmatmul_numerics(numerics(), isa, x, m, expert_ids, w, y);
}

void gather_qmatmul_numerics(Numerics numerics, Isa isa, const float* x, int64_t m,
                             const int32_t* expert_ids, const QuantMatrix& w, float* y) {
  check_matrix(w, "gather_qmatmul");
  check_isa(isa);
  if (m <= 0) return;
  const auto segments = segments_by_expert(expert_ids, m, w.experts, "gather_qmatmul");
  const cpu::KernelTable& table = cpu::kernel_table(isa);
  const int64_t count = static_cast<int64_t>(segments.size());
  // Activations are prepared once for all rows; per segment, the kernel reads pointer arrays
  // gathered from the prepared rows.
  const bool int8 = numerics == Numerics::int8;
  PreparedActivations prepared;
  thread_local Int8Activations prepared_int8;
  if (int8) {
    int64_t most_rows = 0;
    for (const ExpertSegment& segment : segments) {
      most_rows = std::max(most_rows, static_cast<int64_t>(segment.rows.size()));
    }
    prepare_int8_activations(table, x, m, w, spreads_activations(table, w, m, most_rows),
                             prepared_int8);
  } else {
    prepare_activations(x, m, w, prepared);
  }
  std::vector<const float*> x_rows(m), slot_rows(m), sum_rows(m), scale_rows(m);
  std::vector<const int8_t*> x8_rows(m);
  const bool spread = int8 && !prepared_int8.spread_rows.empty();
  std::vector<const uint8_t*> spread_rows(spread ? m : 0);
  std::vector<float*> y_rows(m);
  std::vector<cpu::QuantTask> tasks(count);
  std::vector<cpu::Int8Task> int8_tasks(count);
  int64_t offset = 0;
  for (int64_t s = 0; s < count; ++s) {
    const auto rows = static_cast<int64_t>(segments[s].rows.size());
    for (int64_t k = 0; k < rows; ++k) {
      const int64_t r = segments[s].rows[k];
      y_rows[offset + k] = y + r * w.rows;
      if (int8) {
        x8_rows[offset + k] = prepared_int8.x8_rows[r];
        if (spread) spread_rows[offset + k] = prepared_int8.spread_rows[r];
        scale_rows[offset + k] = prepared_int8.scale_rows[r];
        sum_rows[offset + k] = prepared_int8.sum_rows[r];
      } else {
        x_rows[offset + k] = prepared.x_rows[r];
        slot_rows[offset + k] = prepared.slot_rows[r];
        sum_rows[offset + k] = prepared.sum_rows[r];
      }
    }
    tasks[s] = {&w,
                segments[s].expert,
                rows,
                x_rows.data() + offset,
                slot_rows.data() + offset,
                sum_rows.data() + offset,
                y_rows.data() + offset};
    int8_tasks[s] = {&w,
                     segments[s].expert,
                     rows,
                     x8_rows.data() + offset,
                     scale_rows.data() + offset,
                     sum_rows.data() + offset,
                     y_rows.data() + offset,
                     spread ? spread_rows.data() + offset : nullptr};
    offset += rows;
  }
  const auto items = gather_items(segments, w.rows, row_grain(w.cols, m / count));
  default_pool().parallel_for(
      static_cast<int64_t>(items.size()), 1, [&](int64_t begin, int64_t end, int) {
        for (int64_t k = begin; k < end; ++k) {
          const GatherItem& item = items[k];
          if (int8) {
            table.int8_rows(int8_tasks[item.segment], item.row_begin, item.row_end);
          } else {
            table.quant_rows(tasks[item.segment], item.row_begin, item.row_end);
          }
        }
      });
}

void matmul(const float* x, int64_t m, const DenseMatrix& w, float* y, int64_t expert) {
  matmul_isa(best_isa(), x, m, w, y, expert);
}

void matmul_isa(Isa isa, const float* x, int64_t m, const DenseMatrix& w, float* y,
                int64_t expert) {
  check_matrix(w, "matmul");
  check_expert(expert, w.experts, "matmul");
  check_isa(isa);
  if (m <= 0) return;
  std::vector<const float*> x_rows(m);
  std::vector<float*> y_rows(m);
  for (int64_t i = 0; i < m; ++i) {
    x_rows[i] = x + i * w.cols;
    y_rows[i] = y + i * w.rows;
  }
  const cpu::DenseTask task{&w, expert, m, x_rows.data(), y_rows.data()};
  const cpu::KernelTable& table = cpu::kernel_table(isa);
  default_pool().parallel_for(w.rows, row_grain(w.cols, m), [&](int64_t begin, int64_t end, int) {
    table.dense_rows(task, begin, end);
  });
}

void gather_matmul(const float* x, int64_t m, const int32_t* expert_ids, const DenseMatrix& w,
                   float* y) {
  gather_matmul_isa(best_isa(), x, m, expert_ids, w, y);
}

void gather_matmul_isa(Isa isa, const float* x, int64_t m, const int32_t* expert_ids,
                       const DenseMatrix& w, float* y) {
  check_matrix(w, "gather_matmul");
  check_isa(isa);
  if (m <= 0) return;
  const auto segments = segments_by_expert(expert_ids, m, w.experts, "gather_matmul");
  const int64_t count = static_cast<int64_t>(segments.size());
  std::vector<const float*> x_rows(m);
  std::vector<float*> y_rows(m);
  std::vector<cpu::DenseTask> tasks(count);
  int64_t offset = 0;
  for (int64_t s = 0; s < count; ++s) {
    for (int64_t k = 0; k < static_cast<int64_t>(segments[s].rows.size()); ++k) {
      const int64_t r = segments[s].rows[k];
      x_rows[offset + k] = x + r * w.cols;
      y_rows[offset + k] = y + r * w.rows;
    }
    tasks[s] = {&w, segments[s].expert, static_cast<int64_t>(segments[s].rows.size()),
                x_rows.data() + offset, y_rows.data() + offset};
    offset += static_cast<int64_t>(segments[s].rows.size());
  }
  const auto items = gather_items(segments, w.rows, row_grain(w.cols, m / count));
  const cpu::KernelTable& table = cpu::kernel_table(isa);
  default_pool().parallel_for(
      static_cast<int64_t>(items.size()), 1, [&](int64_t begin, int64_t end, int) {
        for (int64_t k = begin; k < end; ++k) {
          const GatherItem& item = items[k];
          table.dense_rows(tasks[item.segment], item.row_begin, item.row_end);
        }
      });
}

void bf16_to_f32(const void* src, int64_t n, float* dst) {
  const auto* bytes = static_cast<const uint8_t*>(src);
  const auto& table = cpu::kernel_table(best_isa());
  convert_in_parallel(n, [&](int64_t begin, int64_t end) {
    table.bf16_to_f32(bytes + 2 * begin, end - begin, dst + begin);
  });
}

void f16_to_f32(const void* src, int64_t n, float* dst) {
  const auto* bytes = static_cast<const uint8_t*>(src);
  const auto& table = cpu::kernel_table(best_isa());
  convert_in_parallel(n, [&](int64_t begin, int64_t end) {
    table.f16_to_f32(bytes + 2 * begin, end - begin, dst + begin);
  });
}

void f32_to_bf16(const float* src, int64_t n, void* dst) {
  auto* bytes = static_cast<uint8_t*>(dst);
  const auto& table = cpu::kernel_table(best_isa());
  convert_in_parallel(n, [&](int64_t begin, int64_t end) {
    table.f32_to_bf16(src + begin, end - begin, bytes + 2 * begin);
  });
}

}  // namespace dspark::kernels
