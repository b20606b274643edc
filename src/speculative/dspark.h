#pragma once
// The DSpark drafter (docs/speculative.md §11): the shared parallel backbone over
// [anchor, mask ...], the drafter's own or the target's raw lm_head, the sequential rank-r Markov
// bias (logit_i = base_i + W2 · W1[prev]), and the confidence head that can truncate a block
// (--confidence-threshold: keep drafts while the product of confidences stays at or above it).
// A head is loaded once (quantized at load) and shared; each generation gets a fresh drafter
// holding its own context.
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "model/model.h"
#include "speculative/drafter.h"
#include "speculative/dspark_backbone.h"

namespace dspark {

struct DrafterLoadOptions {
  int bits = 4;  // 0 = keep the stored weights
};

class DSparkHead {
 public:
  // Loads a DSpark drafter directory for `target` (which must outlive the head); throws naming
  // the directory and the tensor or field at fault.
  DSparkHead(const std::string& directory, const Model& target, const DrafterLoadOptions& options);

  const DSparkConfig& config() const { return config_; }
  const DrafterBackbone& backbone() const { return *backbone_; }
  const Model& target() const { return target_; }
  const std::string& directory() const { return checkpoint_->path(); }
  // Most drafts one block yields: block_size - logits_start.
  int max_drafts() const;
  // Backbone rows needed for `cap` drafts: the full block unless the block is causal.
  int64_t block_width(int cap) const;

  // Embeds [anchor, mask x (width - 1)] into out [width, hidden] (the mask's row made once, at
  // load).
  void embed_block(int32_t anchor, int64_t width, float* out) const;
  // lm_head (+ softcap) on normed rows: logits [rows, draft_vocab].
  void base_logits(const float* hidden, int64_t rows, float* logits) const;
  // W1[token] -> out [rank].
  void markov_embedding(int32_t token, float* out) const;
  // W2 · e -> bias [draft_vocab], for `rows` embeddings [rows, rank] -> [rows, draft_vocab].
  void markov_bias(const float* embeddings, int64_t rows, float* biases) const;
  // sigmoid(w · [hidden ; W1[prev]] + b); requires config().confidence_head.
  float confidence(const float* hidden, const float* prev_embedding) const;
  // A draft-vocabulary id as a target id (identity unless the vocabulary is reduced).
  int32_t to_target(int32_t draft_id) const;
  int64_t weight_bytes() const;

 private:
  // The drafter's own embedding row of `token`, or the target's: out [hidden].
  void embed_token(int32_t token, float* out) const;

  std::unique_ptr<Checkpoint> checkpoint_;
  const Model& target_;
  DSparkConfig config_;
  std::unique_ptr<DrafterBackbone> backbone_;
  std::unique_ptr<DrafterLinear> embed_, lm_head_, markov_w1_, markov_w2_, confidence_;
  std::vector<int64_t> draft_to_target_;  // absolute target ids; empty for a full vocabulary
  std::vector<float> mask_embedding_;     // [hidden]: every block row after the anchor
};

class DSparkDrafter final : public BackboneDrafter {
 public:
  DSparkDrafter(std::shared_ptr<const DSparkHead> head, float confidence_threshold);

  std::string name() const override { return "dspark"; }
  // Every DSpark drafter of one head drafts together: the blocks run through the backbone as one
  // batch, and the lm_head, Markov bias and confidence each read their weights once per pass.
  void propose_group(std::span<Drafter* const> members,
                     std::span<const DraftRequest* const> requests,
                     std::span<Draft> drafts) override;

  // What the last propose computed, before confidence truncation (tests compare them with the
  // reference): logits [drafts, draft_vocab] with the Markov bias, and the confidences.
  const std::vector<float>& last_logits() const { return last_logits_; }
  const std::vector<float>& last_confidences() const { return last_confidences_; }

 private:
  std::shared_ptr<const DSparkHead> head_;
  float confidence_threshold_;
  std::vector<float> last_logits_, last_confidences_;
};

// A factory of fresh DSpark drafters for DecodeSetup::drafter.
std::function<std::unique_ptr<Drafter>()> dspark_drafter_factory(
    std::shared_ptr<const DSparkHead> head, float confidence_threshold);

}  // namespace dspark
