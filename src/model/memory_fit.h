#pragma once
// Whether a model fits in this machine's memory, decided before its weights are read. Weights are
// memory-mapped: opening a model maps them and the forwards page them in. A model whose mapped
// weights exceed the memory the kernel can give it still runs, but once the page cache is full
// every token rereads evicted experts from disk, so decoding drops to disk speed; the CLI says so
// before the first forward (cli/memory_check.h).
#include <cstdint>
#include <string>

#include "model/model.h"

namespace dspark {

struct MemoryEstimate {
  int64_t mapped_bytes = 0;     // every tensor of the checkpoint: what a long run pages in
  int64_t per_token_bytes = 0;  // weights one decode step reads (top_k experts per MoE layer)
  int64_t state_bytes = 0;      // KV caches at `context` tokens, conv windows and SSM states
  int64_t scratch_bytes = 0;    // activations, logits, tokenizer and allocator slack
  int64_t context = 0;
  kernels::KvType kv_type = kernels::KvType::f32;

  // Resident once every weight has been read: MoE routing reaches every expert within a few
  // hundred tokens, so this is what a conversation needs, not per_token_bytes.
  int64_t working_set() const { return mapped_bytes + state_bytes + scratch_bytes; }
  // What one decode step needs resident; below it even a single token pages.
  int64_t token_working_set() const { return per_token_bytes + state_bytes + scratch_bytes; }
};

// One sequence of `context` tokens on `model` (already opened: nothing read but the headers).
MemoryEstimate estimate_memory(const Model& model, int64_t context);
// KV rows (of the layout's KV type), fp32 conv windows and SSM states of one sequence of `context`
// tokens.
int64_t state_bytes(const StateLayout& layout, int64_t context);

enum class MemoryFit {
  fits,        // the working set fits in available memory
  page_cache,  // one token's weights fit, all of them do not: runs, rereading from disk
  too_small,   // not even one token's weights and state fit
};

struct MemoryVerdict {
  MemoryFit fit = MemoryFit::fits;
  std::string summary;  // the estimate against the machine, one line
};

// total / available: MemTotal / MemAvailable in bytes.
MemoryVerdict judge_memory(const MemoryEstimate& estimate, int64_t total, int64_t available);

}  // namespace dspark
