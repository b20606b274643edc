#include "speculative/dflash.h"

#include <algorithm>
#include <cmath>

#include "base/error.h"

namespace dspark {

DFlashHead::DFlashHead(const std::string& directory, const Model& target,
                       const DrafterLoadOptions& options)
    : checkpoint_(std::make_unique<Checkpoint>(directory)), target_(target) {
  const std::string source = checkpoint_->path() + "/config.json";
  config_ = read_dflash_config(checkpoint_->config(), source);
  check_taps_in_target(config_.backbone, target, source);
  DrafterTensors tensors(*checkpoint_, options.bits);
  backbone_ = std::make_unique<DrafterBackbone>(config_.backbone, tensors);
  tensors.check_all_used({});
}

int64_t DFlashHead::block_width(int cap) const {
  const BackboneConfig& b = config_.backbone;
  const bool causal = std::all_of(b.causal.begin(), b.causal.end(), [](bool c) { return c; });
  if (!causal) return b.block_size;
  return std::min<int64_t>(b.block_size, 1 + std::max(1, cap));
}

void DFlashHead::logits(const float* hidden, int64_t rows, float* out) const {
  target_.lm_head().apply(hidden, rows, out);
  if (config_.logit_softcap > 0.0f) {
    const float cap = config_.logit_softcap;
    for (int64_t i = 0; i < rows * target_.vocab_size(); ++i)
      out[i] = cap * std::tanh(out[i] / cap);
  }
}

DFlashDrafter::DFlashDrafter(std::shared_ptr<const DFlashHead> head)
    : head_(std::move(head)), context_(head_->backbone().new_context()) {}

std::vector<int> DFlashDrafter::tap_layers() const {
  return head_->config().backbone.target_layer_ids;
}

void DFlashDrafter::on_target_rows(const int32_t* tokens, int64_t n, const float* taps) {
  (void)tokens;
  if (n > 0) head_->backbone().append_context(taps, n, context_);
}

void DFlashDrafter::truncate_context(int64_t rows) {
  head_->backbone().truncate_context(rows, context_);
}

Draft DFlashDrafter::propose(const DraftRequest& request) {
  const BackboneConfig& b = head_->config().backbone;
  const int64_t H = b.hidden, V = head_->target().vocab_size();
  const int64_t position = static_cast<int64_t>(request.committed.size()) - 1;
  if (position != context_.length) {
    fail("DFlash drafter context holds {} rows but {} tokens precede the pending one",
         context_.length, position);
  }
  Draft draft;
  last_logits_.clear();
  const int cap = std::min(request.cap, head_->max_drafts());
  if (cap <= 0) return draft;
  const int64_t width = head_->block_width(cap);
  std::vector<int32_t> block(width, b.mask_token_id);
  block[0] = request.committed.back();
  std::vector<float> embedded(width * H), hidden(width * H);
  head_->target().embed(block.data(), width, embedded.data());
  head_->backbone().run_block(embedded.data(), width, context_, hidden.data());
  last_logits_.resize(static_cast<size_t>(cap * V));
  head_->logits(hidden.data() + H, cap, last_logits_.data());
  for (int i = 0; i < cap; ++i) {
    const float* logits = last_logits_.data() + static_cast<int64_t>(i) * V;
    if (request.sampling.greedy()) {
      draft.tokens.push_back(argmax(logits, V));
    } else {
      TokenDistribution q = target_distribution(request.sampling, logits, V);
      draft.tokens.push_back(sample_from(q, request.rng.uniform()));
      draft.proposals.push_back(std::move(q));
    }
  }
  return draft;
}

std::function<std::unique_ptr<Drafter>()> dflash_drafter_factory(
    std::shared_ptr<const DFlashHead> head) {
  return [head]() -> std::unique_ptr<Drafter> { return std::make_unique<DFlashDrafter>(head); };
}

}  // namespace dspark
