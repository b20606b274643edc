#include "model/memory_fit.h"

#include <fmt/format.h>

namespace dspark {
namespace {

// Anonymous memory beside the weights and the state: activations and prefill chunks, the
// logits, the tokenizer, allocator slack. An allowance, compared with the RssAnon of the
// full-size runs in docs/full-size.md.
constexpr int64_t kScratchBytes = 512ll << 20;

double gb(int64_t bytes) {
  return static_cast<double>(bytes) / 1e9;
}

}  // namespace

int64_t state_bytes(const StateLayout& layout, int64_t context) {
  const int64_t kv = 2 * layout.attention_layers * layout.kv_row_bytes() * context;
  const int64_t mamba = layout.mamba_layers * (layout.conv_window() + layout.ssm_size());
  return kv + static_cast<int64_t>(sizeof(float)) * mamba;
}

MemoryEstimate estimate_memory(const Model& model, int64_t context) {
  MemoryEstimate estimate;
  estimate.mapped_bytes = model.checkpoint().total_bytes();
  estimate.per_token_bytes = model.decode_weight_bytes();
  const StateLayout layout = model.state_layout();
  estimate.state_bytes = state_bytes(layout, context);
  estimate.kv_type = layout.kv_type;
  estimate.scratch_bytes = kScratchBytes;
  estimate.context = context;
  return estimate;
}

MemoryVerdict judge_memory(const MemoryEstimate& estimate, int64_t total, int64_t available) {
  MemoryVerdict verdict;
  if (estimate.working_set() <= available) {
    verdict.fit = MemoryFit::fits;
  } else if (estimate.token_working_set() <= available) {
    verdict.fit = MemoryFit::page_cache;
  } else {
    verdict.fit = MemoryFit::too_small;
  }
  verdict.summary = fmt::format(
      "needs {:.1f} GB ({:.1f} GB of weights, {:.2f} GB read per token, {:.2f} GB of KV ({}) and "
      "SSM state at {} tokens, {:.1f} GB scratch); {:.1f} GB available of {:.1f} GB",
      gb(estimate.working_set()), gb(estimate.mapped_bytes), gb(estimate.per_token_bytes),
      gb(estimate.state_bytes), kernels::kv_type_name(estimate.kv_type), estimate.context,
      gb(estimate.scratch_bytes), gb(available), gb(total));
  return verdict;
}

}  // namespace dspark
