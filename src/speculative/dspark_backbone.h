#pragma once
// The parallel block backbone DSpark and DFlash share (docs/speculative.md §11.3–§11.5, §12.1):
// committed tokens' fused target taps are projected once (fc, hidden_norm) into per-layer
// context K/V (append-only, roped at their absolute positions); a draft block [anchor, mask ...]
// at positions p .. p + w - 1 runs through qwen3 layers whose attention reads [ctx ; block]
// with the head's pattern (bidirectional, or causal with a sliding window, optional sinks).
#include <algorithm>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "speculative/drafter.h"
#include "speculative/drafter_loader.h"

namespace dspark {

// One sequence's drafter context: per layer, token-major [positions, kv_heads, head_dim], in
// backend buffers (backend/backend.h) of the pool the sequence lives in. Kept in the target's
// state pool beside the sequence (BackboneDrafter::bind_sequence); the backbone reaches the rows
// inside compute sections of that backend.
struct DrafterContext : SequenceAttachment {
  backend::Backend* backend = &backend::cpu_backend();
  std::vector<backend::Buffer> keys, values;  // floats [capacity, kv_width] per layer
  int64_t length = 0;
  int64_t capacity = 0;  // rows the buffers hold
  int64_t kv_width = 0;  // kv_heads * head_dim

  int64_t rows() const override { return length; }
  // Each row depends only on its own taps and position, so the result equals a context fed only
  // the rows kept.
  void truncate(int64_t rows) override;
  int64_t bytes() const override;
  // Room for `rows` rows (the rows held are kept).
  void reserve(int64_t rows);
};

class DrafterBackbone {
 public:
  // Binds fc, hidden_norm, layers.* and norm from `tensors` (prefix "" = DeepSpec names).
  DrafterBackbone(const BackboneConfig& config, DrafterTensors& tensors);

  const BackboneConfig& config() const { return config_; }
  // An empty context in `backend`'s memory.
  DrafterContext new_context(backend::Backend& backend = backend::cpu_backend()) const;
  // Appends n rows of fused taps [n, n_taps * hidden] at positions context.length ...
  void append_context(const float* taps, int64_t n, DrafterContext& context) const;
  // append_context for many contexts in one pass: taps[i] (counts[i] rows) to contexts[i], each
  // context exactly what its own append_context leaves, each weight read once.
  void append_contexts(std::span<const float* const> taps, std::span<const int64_t> counts,
                       std::span<DrafterContext* const> contexts) const;
  // Runs the embedded blocks, widths[i] rows after contexts[i] each, one after another in
  // `embedded`, at positions contexts[i].length ..., and writes the final-normed hidden states of
  // each block's rows first_output .. first_output + outputs[i] - 1, one block after another, to
  // hidden [Σ outputs, hidden]. The last layer runs queries, o_proj and the MLP for those rows
  // alone; the other rows only lend it their keys and values. A row's result is the same whatever
  // the other blocks and rows asked (products, norms and attention work row by row; rope and the
  // contexts are per sequence), while each weight is read once for all the blocks.
  void run_blocks(const float* embedded, std::span<const int64_t> widths, int64_t first_output,
                  std::span<const int64_t> outputs, std::span<const DrafterContext* const> contexts,
                  float* hidden) const;
  int64_t weight_bytes() const;

 private:
  struct Layer {
    std::vector<float> input_norm, post_attention_norm, q_norm, k_norm, sinks;
    std::unique_ptr<DrafterLinear> q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj;
  };
  void project_keys(const Layer& layer, float* keys, int64_t rows, int64_t first_position) const;

  BackboneConfig config_;
  std::vector<float> inv_freq_;
  std::unique_ptr<DrafterLinear> fc_;
  std::vector<float> hidden_norm_, final_norm_;
  std::vector<Layer> layers_;
};

// A drafter over a DrafterBackbone (DSpark, DFlash): it holds one sequence's context and feeds it
// the target's taps, alone or, with the other drafters of its head (`head` is the group key), in
// one pass (DrafterBackbone::append_contexts). The backbone must outlive it.
class BackboneDrafter : public Drafter {
 public:
  BackboneDrafter(const DrafterBackbone& backbone, const void* head);
  std::vector<int> tap_layers() const override { return backbone_.config().target_layer_ids; }
  void on_target_rows(const int32_t* tokens, int64_t n, const float* taps) override;
  // The context goes into the pool beside the sequence: resumed from what a drafter of the same
  // head left there (cut to the sequence's rows by the pool's trims and restores), else started
  // empty.
  void bind_sequence(StatePool& pool, SequenceId sequence) override;
  int64_t context_rows() const override { return context().length; }
  Drafter* grouped() override { return this; }
  const void* group() const override { return head_; }
  void feed_group(std::span<Drafter* const> members, std::span<const DrafterRows> rows) override;
  // Drafts as a group of one: the drafter's propose_group does the work.
  Draft propose(const DraftRequest& request) final;

 protected:
  // The bound sequence's context in the pool, else the drafter's own.
  DrafterContext& context() const;

 private:
  mutable DrafterContext own_context_;
  StatePool* pool_ = nullptr;
  SequenceId sequence_ = -1;
  const DrafterBackbone& backbone_;
  const void* head_;
};

// A draft block's embedded rows [anchor, mask, ..., mask] into out [width, hidden]: embed_anchor
// writes the anchor's row, and every later row copies mask_row, which the head embedded at load.
template <typename EmbedAnchor>
void embed_draft_block(EmbedAnchor&& embed_anchor, std::span<const float> mask_row, int64_t width,
                       float* out) {
  if (width <= 0) return;
  embed_anchor(out);
  const int64_t hidden = static_cast<int64_t>(mask_row.size());
  for (int64_t i = 1; i < width; ++i) std::copy_n(mask_row.data(), hidden, out + i * hidden);
}

}  // namespace dspark
