// Causal grouped-query attention over a token-major KV cache.
//
// Keys are processed in fixed blocks of kAttentionKeyBlock positions, each with its own maximum,
// exponent sum and weighted value sum (kernels/cpu/attention_impl.h), merged afterwards in block
// order ("split-K"). Blocks give a one-token decode step enough independent work for every
// thread; each block serves all query heads of its KV head, so the keys and values are read once
// per group. The blocking depends only on the key positions and each block's arithmetic is fixed,
// so a row's result is the same whatever the number of rows in the call, the thread count and
// the ISA.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <vector>

#include "base/error.h"
#include "base/thread_pool.h"
#include "kernels/cpu/attention_impl.h"
#include "kernels/cpu/ops_common.h"
#include "kernels/cpu/quant_impl.h"
#include "kernels/ops.h"

namespace dspark::kernels {
namespace {

using cpu::kAttentionKeyBlock;
using BlockKernel = void (*)(const cpu::AttentionBlock&);
using WidenKernel = void (*)(const uint16_t*, int64_t, int64_t, int64_t, float*);

// One ISA's attention kernels: the key block, and the widening of an f16 cache's rows.
struct AttentionKernels {
  BlockKernel attend_block;
  WidenKernel widen_f16;
};

AttentionKernels attention_kernels(Isa isa) {
  if (!isa_supported(isa)) {
    fail("causal_attention: this CPU does not support the {} kernels", isa_name(isa));
  }
  switch (isa) {
    case Isa::avx512vnni:
    case Isa::avx512:
      return {cpu::attend_block_avx512, cpu::widen_f16_rows_avx512};
    case Isa::avxvnni:
    case Isa::avx2:
      return {cpu::attend_block_avx2, cpu::widen_f16_rows_avx2};
    case Isa::scalar:
      break;
  }
  return {cpu::attend_block_ref, cpu::widen_f16_rows_ref};
}

// -2 until first use, -1 when the cache type follows the numerics, else a KvType.
std::atomic<int> chosen_kv_type{-2};

int kv_type_from_environment() {
  const char* requested = std::getenv("DSPARK_KV_CACHE");
  if (requested == nullptr || *requested == '\0') return -1;
  return static_cast<int>(parse_kv_type(requested, "DSPARK_KV_CACHE"));
}

}  // namespace

const char* kv_type_name(KvType type) {
  return type == KvType::f16 ? "f16" : "f32";
}

KvType parse_kv_type(std::string_view name, const char* what) {
  for (KvType type : {KvType::f16, KvType::f32}) {
    if (name == kv_type_name(type)) return type;
  }
  fail("{}: KV cache type '{}' is not one of f16, f32", what, name);
}

int64_t kv_type_bytes(KvType type) {
  return type == KvType::f16 ? 2 : 4;
}

KvType kv_cache_type() {
  int value = chosen_kv_type.load(std::memory_order_relaxed);
  if (value == -2) {
    int unread = -2;
    chosen_kv_type.compare_exchange_strong(unread, kv_type_from_environment());
    value = chosen_kv_type.load(std::memory_order_relaxed);
  }
  if (value >= 0) return static_cast<KvType>(value);
  return numerics() == Numerics::fp32 ? KvType::f32 : KvType::f16;
}

void set_kv_cache_type(std::optional<KvType> type) {
  chosen_kv_type.store(type ? static_cast<int>(*type) : -1, std::memory_order_relaxed);
}

void store_kv(KvType type, const float* src, int64_t n, void* dst) {
  if (type == KvType::f32) {
    std::copy_n(src, n, static_cast<float*>(dst));
    return;
  }
  cpu::kernel_table(best_isa()).f32_to_f16(src, n, static_cast<uint8_t*>(dst));
}

void causal_attention(const float* q, int64_t rows, int64_t q_heads, int64_t kv_heads,
                      int64_t head_dim, const float* keys, const float* values, int64_t past,
                      float scale, float* out) {
  causal_attention_isa(best_isa(), q, rows, q_heads, kv_heads, head_dim, keys, values, past, scale,
                       out);
}

void causal_attention_isa(Isa isa, const float* q, int64_t rows, int64_t q_heads, int64_t kv_heads,
                          int64_t head_dim, const float* keys, const float* values, int64_t past,
                          float scale, float* out) {
  const AttentionSequence sequence{q, rows, keys, values, past, out};
  causal_attention_batch_isa(isa, &sequence, 1, q_heads, kv_heads, head_dim, scale);
}

void causal_attention_batch(const AttentionSequence* sequences, int64_t count, int64_t q_heads,
                            int64_t kv_heads, int64_t head_dim, float scale) {
  causal_attention_batch_isa(best_isa(), sequences, count, q_heads, kv_heads, head_dim, scale);
}

namespace {

// o = the softmax-weighted values of `count` key runs from their partial results (peak, sum,
// weighted values; `stride` floats apart), merged in run order, with an optional sink: a logit
// that takes its share of the normaliser and adds no value.
void merge_partials(const float* base, int64_t count, int64_t stride, int64_t dim,
                    const float* sink, float* o) {
  float peak = sink != nullptr ? *sink : -INFINITY;
  for (int64_t r = 0; r < count; ++r) peak = std::max(peak, base[r * stride]);
  float sum = sink != nullptr ? cpu::exp_block(*sink - peak) : 0.0f;
  std::fill_n(o, dim, 0.0f);
  for (int64_t r = 0; r < count; ++r) {
    const float* p = base + r * stride;
    const float weight = cpu::exp_block(p[0] - peak);
    sum += weight * p[1];
    cpu::axpy(weight, p + 2, o, dim);
  }
  const float inv = 1.0f / sum;
  for (int64_t d = 0; d < dim; ++d) o[d] *= inv;
}

// Rows [first_row, first_row + rows) of one sequence, with where its work items and partial
// results start within its wave.
struct Segment {
  const AttentionSequence* sequence = nullptr;
  int64_t first_row = 0;
  int64_t rows = 0;
  int64_t max_blocks = 0;
  int64_t first_item = 0;     // of the wave's (kv head, block, run of rows) items
  int64_t first_partial = 0;  // of the wave's (row, kv head, block) partial results
  int64_t first_output = 0;   // of the wave's (row, q head) outputs

  int64_t row_runs() const;
};

// Index of the segment holding `index`, given each segment's first index by `first`.
template <typename First>
size_t segment_of(const std::vector<Segment>& segments, int64_t index, First first) {
  const auto after = std::upper_bound(segments.begin(), segments.end(), index,
                                      [&](int64_t i, const Segment& s) { return i < first(s); });
  return static_cast<size_t>(after - segments.begin()) - 1;
}

}  // namespace

namespace {

// One kv head's keys and values of one key block of an f16 cache, widened to fp32 (exactly) and
// packed head_dim apart. A thread keeps the last block it widened: its run of work items takes
// the rows of a verify or prefill one after another over the same block.
struct WidenedBlock {
  int64_t call = -1;
  const void* keys = nullptr;
  int64_t kv = -1, block = -1;
  std::vector<float> keys_f32, values_f32;
};

// Numbers the calls of causal_attention_batch_isa, so that a block widened in one call (one layer's
// cache) is never taken for the same position of the next.
std::atomic<int64_t> attention_calls{0};
// A sequence's rows take a key block in runs of up to kRowsPerPass: one kernel call computes every
// row of a run that reads the whole block, each key tile and value row read once for all of them.
constexpr int64_t kRowsPerPass = 8;
// Up to this many rows of a sequence read an f16 cache's key blocks as they lie (the kernel widens
// each key tile once for all of them, and each pass of heads widens the value rows it reads);
// more rows share one widened copy of each block. Measured (attention_bench
// BM_RowsAttentionFromMemory and BM_RowsAttention, 2 threads, Emerald Rapids, two rounds, the
// copy against the cache as it lies): 4 rows at 2,048 / 8,192 tokens of context 181 / 706 µs
// against 160 / 637, 8 rows level, 16 rows 522 / 2,030 against 539 / 2,108, a 256-row prefill
// chunk after 8,192 tokens 27.2 against 30.9 ms. The first row fetches ahead from an fp32 cache
// too (always read as it lies; not measured).
constexpr int64_t kRowsReadingTheCache = kRowsPerPass;

int64_t Segment::row_runs() const {
  return (rows + kRowsPerPass - 1) / kRowsPerPass;
}

}  // namespace

void causal_attention_batch_isa(Isa isa, const AttentionSequence* sequences, int64_t count,
                                int64_t q_heads, int64_t kv_heads, int64_t head_dim, float scale) {
  const AttentionKernels chosen = attention_kernels(isa);
  const BlockKernel attend_block = chosen.attend_block;
  const WidenKernel widen_f16 = chosen.widen_f16;
  const int64_t call = attention_calls.fetch_add(1, std::memory_order_relaxed);
  const int64_t group = q_heads / kv_heads;
  const int64_t partial_size = group * (2 + head_dim);
  // Rows are taken in waves so that the partial results stay within kPartialBudget floats.
  constexpr int64_t kPartialBudget = int64_t{4} << 20;
  std::vector<Segment> wave;
  std::vector<float> partials;
  int64_t wave_items = 0, wave_partials = 0, wave_outputs = 0;
  ThreadPool& pool = default_pool();
  auto run_wave = [&] {
    if (wave.empty()) return;
    partials.resize(static_cast<size_t>(wave_partials * partial_size));
    // Work item (kv head, block, run of rows), runs innermost: a thread's run of items takes the
    // rows of a verify or prefill one run after another over the same key block, which the first
    // brought into the cache (rows read the context's keys and values once per block, not once
    // each from memory), and the rows of a run that see the whole block share one kernel call.
    // Partial results stay in (row, kv head, block) order for the merge.
    pool.parallel_for(wave_items, 1, [&](int64_t first, int64_t last, int) {
      thread_local std::vector<float> scores;
      const size_t need = kRowsPerPass * group * kAttentionKeyBlock;
      if (scores.size() < need) scores.resize(need);
      size_t s = segment_of(wave, first, [](const Segment& seg) { return seg.first_item; });
      for (int64_t item = first; item < last; ++item) {
        while (s + 1 < wave.size() && item >= wave[s + 1].first_item) ++s;
        const Segment& seg = wave[s];
        const AttentionSequence& sequence = *seg.sequence;
        const int64_t local = item - seg.first_item;
        const int64_t runs = seg.row_runs();
        const int64_t run = local % runs;
        const int64_t block = (local / runs) % seg.max_blocks;
        const int64_t kv = local / (runs * seg.max_blocks);
        const int64_t run_begin = run * kRowsPerPass;
        const int64_t run_end = std::min(seg.rows, run_begin + kRowsPerPass);
        const int64_t begin = block * kAttentionKeyBlock;
        const int64_t offset = begin * kv_heads * head_dim + kv * head_dim;
        cpu::AttentionBlock task;
        if (sequence.kv_type == KvType::f32) {
          task.keys = static_cast<const float*>(sequence.keys) + offset;
          task.values = static_cast<const float*>(sequence.values) + offset;
          task.kv_stride = kv_heads * head_dim;
        } else if (seg.rows <= kRowsReadingTheCache) {
          // A decode row reads the block once: the kernel widens it as it reads, where a widened
          // copy cost a write and a read of twice the f16 bytes (7.7 % of a decode step at 400
          // tokens of context, perf, default model). A verify's rows do the same, together.
          task.keys = static_cast<const uint16_t*>(sequence.keys) + offset;
          task.values = static_cast<const uint16_t*>(sequence.values) + offset;
          task.kv_type = KvType::f16;
          task.kv_stride = kv_heads * head_dim;
        } else {
          if (begin >= sequence.past + seg.first_row + run_end) continue;  // no row sees it
          thread_local WidenedBlock widened;
          if (widened.call != call || widened.keys != sequence.keys || widened.kv != kv ||
              widened.block != block) {
            // Every key of the call is in the cache: widen as many as any row reads.
            const int64_t keys_in_block =
                std::min(sequence.past + sequence.rows - begin, kAttentionKeyBlock);
            const size_t size = kAttentionKeyBlock * head_dim;
            if (widened.keys_f32.size() < size) {
              widened.keys_f32.resize(size);
              widened.values_f32.resize(size);
            }
            // From memory, like a decode row's reads (attention_impl.h: kKvRowsAhead), so the
            // rows are widened in runs, each run fetching the next (verify_bench at 2,048 tokens
            // of context, 4 rounds: width 8 1.13x, width 4 1.04x; prefill unchanged).
            const int64_t stride = kv_heads * head_dim;
            const auto* keys = static_cast<const uint16_t*>(sequence.keys) + offset;
            const auto* values = static_cast<const uint16_t*>(sequence.values) + offset;
            for (int64_t r0 = 0; r0 < keys_in_block; r0 += cpu::kKvRowsAhead) {
              const int64_t n = std::min(cpu::kKvRowsAhead, keys_in_block - r0);
              const int64_t ahead = r0 + cpu::kKvRowsAhead;
              const int64_t ahead_end = std::min(keys_in_block, ahead + cpu::kKvRowsAhead);
              cpu::prefetch_rows(keys, ahead, ahead_end, stride, head_dim);
              cpu::prefetch_rows(values, ahead, ahead_end, stride, head_dim);
              widen_f16(keys + r0 * stride, stride, n, head_dim,
                        widened.keys_f32.data() + r0 * head_dim);
              widen_f16(values + r0 * stride, stride, n, head_dim,
                        widened.values_f32.data() + r0 * head_dim);
            }
            widened.call = call;
            widened.keys = sequence.keys;
            widened.kv = kv;
            widened.block = block;
          }
          task.keys = widened.keys_f32.data();
          task.values = widened.values_f32.data();
          task.kv_stride = head_dim;
        }
        task.group = group;
        task.head_dim = head_dim;
        task.scale = scale;
        task.scores = scores.data();
        task.q_row_stride = q_heads * head_dim;
        task.partial_row_stride = kv_heads * seg.max_blocks * partial_size;
        // Row r sees past + r + 1 keys: the rows before the block's end see part of it, one call
        // each, and the rest (the run's last rows) all of it, in one call.
        int64_t local_row = run_begin;
        const auto attend_rows = [&](int64_t rows, int64_t count) {
          const int64_t r = seg.first_row + local_row;
          task.q = sequence.q + (r * q_heads + kv * group) * head_dim;
          task.rows = rows;
          task.count = count;
          task.fetch_ahead = local_row == 0 && seg.rows <= kRowsReadingTheCache;
          task.partial = partials.data() + (seg.first_partial +
                                            (local_row * kv_heads + kv) * seg.max_blocks + block) *
                                               partial_size;
          attend_block(task);
          local_row += rows;
        };
        for (; local_row < run_end;) {
          const int64_t seen = sequence.past + seg.first_row + local_row + 1 - begin;
          if (seen <= 0) {
            ++local_row;
          } else if (seen < kAttentionKeyBlock) {
            attend_rows(1, seen);
          } else {
            attend_rows(run_end - local_row, kAttentionKeyBlock);
          }
        }
      }
    });
    // Merge the blocks of each (row, q head) in block order.
    pool.parallel_for(wave_outputs, 4, [&](int64_t first, int64_t last, int) {
      size_t s = segment_of(wave, first, [](const Segment& seg) { return seg.first_output; });
      for (int64_t index = first; index < last; ++index) {
        while (s + 1 < wave.size() && index >= wave[s + 1].first_output) ++s;
        const Segment& seg = wave[s];
        const AttentionSequence& sequence = *seg.sequence;
        const int64_t local = index - seg.first_output;
        const int64_t local_row = local / q_heads, h = local % q_heads;
        const int64_t r = seg.first_row + local_row;
        const int64_t kv = h / group, g = h % group;
        const int64_t blocks =
            (sequence.past + r + 1 + kAttentionKeyBlock - 1) / kAttentionKeyBlock;
        const float* base =
            partials.data() +
            (seg.first_partial + (local_row * kv_heads + kv) * seg.max_blocks) * partial_size +
            g * (2 + head_dim);
        float* o = sequence.out + (r * q_heads + h) * head_dim;
        if (blocks == 1) {
          const float inv = 1.0f / base[1];
          for (int64_t d = 0; d < head_dim; ++d) o[d] = base[2 + d] * inv;
          continue;
        }
        merge_partials(base, blocks, partial_size, head_dim, nullptr, o);
      }
    });
    wave.clear();
    wave_items = wave_partials = wave_outputs = 0;
  };
  for (int64_t i = 0; i < count; ++i) {
    const AttentionSequence& sequence = sequences[i];
    if (sequence.rows <= 0) continue;
    const int64_t max_blocks =
        (sequence.past + sequence.rows + kAttentionKeyBlock - 1) / kAttentionKeyBlock;
    const int64_t row_items = kv_heads * max_blocks;
    const int64_t batch =
        std::clamp<int64_t>(kPartialBudget / (row_items * partial_size), 1, sequence.rows);
    for (int64_t first_row = 0; first_row < sequence.rows; first_row += batch) {
      const int64_t rows = std::min(batch, sequence.rows - first_row);
      if (!wave.empty() && (wave_partials + rows * row_items) * partial_size > kPartialBudget) {
        run_wave();
      }
      wave.push_back(
          {&sequence, first_row, rows, max_blocks, wave_items, wave_partials, wave_outputs});
      wave_items += wave.back().row_runs() * row_items;
      wave_partials += rows * row_items;
      wave_outputs += rows * q_heads;
    }
  }
  run_wave();
}

void block_attention(const BlockAttentionSpec& spec, const float* q, BlockQueries queries,
                     const float* context_keys, const float* context_values, int64_t past,
                     const float* block_keys, const float* block_values, int64_t rows, float* out) {
  block_attention_isa(best_isa(), spec, q, queries, context_keys, context_values, past, block_keys,
                      block_values, rows, out);
}

void block_attention_isa(Isa isa, const BlockAttentionSpec& spec, const float* q,
                         BlockQueries queries, const float* context_keys,
                         const float* context_values, int64_t past, const float* block_keys,
                         const float* block_values, int64_t rows, float* out) {
  if (spec.kv_heads <= 0 || spec.q_heads % spec.kv_heads != 0) {
    fail("block_attention: {} query heads cannot share {} key heads", spec.q_heads, spec.kv_heads);
  }
  if (queries.first < 0 || queries.count < 0 || queries.first + queries.count > rows) {
    fail("block_attention: rows [{}, {}) of a {}-row block cannot ask", queries.first,
         queries.first + queries.count, rows);
  }
  const BlockKernel attend_block = attention_kernels(isa).attend_block;
  const int64_t dim = spec.head_dim, group = spec.q_heads / spec.kv_heads;
  const int64_t stride = spec.kv_heads * dim, partial_size = group * (2 + dim);
  // Asking row i (block row queries.first + i) sees the context keys [context_begin(i), past) and
  // the block's rows [block_begin(i), block_end(i)), each taken in runs of up to
  // kAttentionKeyBlock keys (the context's first).
  struct RowRuns {
    int64_t context_begin, block_begin, block_end, context_runs, runs;
  };
  const int64_t asking = queries.count;
  std::vector<RowRuns> row_runs(static_cast<size_t>(asking));
  int64_t max_runs = 0;
  for (int64_t i = 0; i < asking; ++i) {
    const int64_t block_row = queries.first + i, position = past + block_row;
    const int64_t earliest = spec.window > 0 ? std::max<int64_t>(0, position - spec.window + 1) : 0;
    RowRuns& r = row_runs[i];
    r.context_begin = std::min(earliest, past);
    r.block_begin = std::max<int64_t>(0, earliest - past);
    r.block_end = spec.causal ? block_row + 1 : rows;
    r.context_runs = (past - r.context_begin + kAttentionKeyBlock - 1) / kAttentionKeyBlock;
    r.runs = r.context_runs +
             (r.block_end - r.block_begin + kAttentionKeyBlock - 1) / kAttentionKeyBlock;
    max_runs = std::max(max_runs, r.runs);
  }
  // Work item (kv head, run): the rows that read the same keys in a run (every row, for a
  // context without a window) take them in one kernel call, each key tile and value row read once
  // for all of them, where items of (row, kv head) each streamed the whole context (a 7-row draft
  // block at 3,000 tokens of context read it 7 times). The partials are merged per (row, query
  // head) in run order, as one row alone would merge them.
  std::vector<float> partials(
      static_cast<size_t>(asking * spec.kv_heads * max_runs * partial_size));
  float* const base = partials.data();
  const auto partial_of = [base, &spec, max_runs, partial_size](int64_t i, int64_t kv,
                                                                int64_t run) {
    return base + ((i * spec.kv_heads + kv) * max_runs + run) * partial_size;
  };
  // The keys row i reads in a run: [begin, end) of the context or the block, empty when it has
  // fewer runs.
  struct RunKeys {
    bool in_context = false;
    int64_t begin = 0, end = 0;
    bool operator==(const RunKeys&) const = default;
  };
  const auto keys_of = [&](int64_t i, int64_t run) -> RunKeys {
    const RowRuns& r = row_runs[i];
    if (run >= r.runs) return {};
    if (run < r.context_runs) {
      const int64_t begin = r.context_begin + run * kAttentionKeyBlock;
      return {true, begin, std::min(past, begin + kAttentionKeyBlock)};
    }
    const int64_t begin = r.block_begin + (run - r.context_runs) * kAttentionKeyBlock;
    return {false, begin, std::min(r.block_end, begin + kAttentionKeyBlock)};
  };
  ThreadPool& pool = default_pool();
  pool.parallel_for(spec.kv_heads * max_runs, 1, [&](int64_t first, int64_t last, int) {
    thread_local std::vector<float> scores;
    if (scores.size() < static_cast<size_t>(asking * group * kAttentionKeyBlock)) {
      scores.resize(asking * group * kAttentionKeyBlock);
    }
    for (int64_t item = first; item < last; ++item) {
      const int64_t run = item % max_runs, kv = item / max_runs;
      for (int64_t i = 0; i < asking;) {
        const RunKeys keys = keys_of(i, run);
        const auto [in_context, begin, end] = keys;
        int64_t next = i + 1;
        while (next < asking && keys_of(next, run) == keys) ++next;
        if (end > begin) {
          const int64_t offset = begin * stride + kv * dim;
          cpu::AttentionBlock task;
          task.q = q + (i * spec.q_heads + kv * group) * dim;
          task.keys = (in_context ? context_keys : block_keys) + offset;
          task.values = (in_context ? context_values : block_values) + offset;
          task.kv_stride = stride;
          task.count = end - begin;
          task.group = group;
          task.head_dim = dim;
          task.scale = spec.scale;
          task.rows = next - i;
          task.q_row_stride = spec.q_heads * dim;
          task.partial_row_stride = spec.kv_heads * max_runs * partial_size;
          task.scores = scores.data();
          task.partial = partial_of(i, kv, run);
          attend_block(task);
        }
        i = next;
      }
    }
  });
  pool.parallel_for(asking * spec.q_heads, 4, [&](int64_t first, int64_t last, int) {
    for (int64_t index = first; index < last; ++index) {
      const int64_t i = index / spec.q_heads, h = index % spec.q_heads;
      const int64_t kv = h / group, g = h % group;
      merge_partials(partial_of(i, kv, 0) + g * (2 + dim), row_runs[i].runs, partial_size, dim,
                     spec.sinks != nullptr ? spec.sinks + h : nullptr,
                     out + (i * spec.q_heads + h) * dim);
    }
  });
}

}  // namespace dspark::kernels
