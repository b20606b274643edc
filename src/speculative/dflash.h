#pragma once
// The z-lab DFlash drafter (docs/speculative.md §12.1): the shared parallel backbone over
// [anchor, mask x (B - 1)], embedded with the target's embedding and projected with the target's
// raw lm_head; slots 1 .. B - 1 each give one draft, drawn independently (no Markov chain).
// DFlash 2 checkpoints (candidate selector, grouped convolutions) are refused.
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "model/model.h"
#include "speculative/drafter.h"
#include "speculative/dspark.h"

namespace dspark {

class DFlashHead {
 public:
  DFlashHead(const std::string& directory, const Model& target, const DrafterLoadOptions& options);

  const DFlashConfig& config() const { return config_; }
  const DrafterBackbone& backbone() const { return *backbone_; }
  const Model& target() const { return target_; }
  int max_drafts() const { return static_cast<int>(config_.backbone.block_size - 1); }
  int64_t block_width(int cap) const;
  // The block [anchor, mask ...] of `width` rows, embedded with the target's embedding: out
  // [width, hidden].
  void embed_block(int32_t anchor, int64_t width, float* out) const;
  // Logits [rows, vocab] of normed rows through the target's raw lm_head (+ the head's softcap).
  void logits(const float* hidden, int64_t rows, float* out) const;
  int64_t weight_bytes() const { return backbone_->weight_bytes(); }

 private:
  std::unique_ptr<Checkpoint> checkpoint_;
  const Model& target_;
  DFlashConfig config_;
  std::unique_ptr<DrafterBackbone> backbone_;
  std::vector<float> mask_embedding_;  // [hidden]: every block row after the anchor
};

class DFlashDrafter final : public BackboneDrafter {
 public:
  explicit DFlashDrafter(std::shared_ptr<const DFlashHead> head);

  std::string name() const override { return "dflash"; }
  // Every DFlash drafter of one head drafts together: the blocks through the backbone as one
  // batch and every drafting row through the target's lm_head in one product.
  void propose_group(std::span<Drafter* const> members,
                     std::span<const DraftRequest* const> requests,
                     std::span<Draft> drafts) override;
  // Logits [drafts, vocab] of the last propose (for the reference comparison).
  const std::vector<float>& last_logits() const { return last_logits_; }

 private:
  std::shared_ptr<const DFlashHead> head_;
  std::vector<float> last_logits_;
};

std::function<std::unique_ptr<Drafter>()> dflash_drafter_factory(
    std::shared_ptr<const DFlashHead> head);

}  // namespace dspark
