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
  mask_embedding_.resize(config_.backbone.hidden);
  target.embed(&config_.backbone.mask_token_id, 1, mask_embedding_.data());
}

int64_t DFlashHead::block_width(int cap) const {
  const BackboneConfig& b = config_.backbone;
  const bool causal = std::all_of(b.causal.begin(), b.causal.end(), [](bool c) { return c; });
  if (!causal) return b.block_size;
  return std::min<int64_t>(b.block_size, 1 + std::max(1, cap));
}

void DFlashHead::embed_block(int32_t anchor, int64_t width, float* out) const {
  embed_draft_block([&](float* row) { target_.embed(&anchor, 1, row); }, mask_embedding_, width,
                    out);
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
    : BackboneDrafter(head->backbone(), head.get()), head_(std::move(head)) {}

void DFlashDrafter::propose_group(std::span<Drafter* const> members,
                                  std::span<const DraftRequest* const> requests,
                                  std::span<Draft> drafts) {
  const DFlashHead& head = *head_;
  const BackboneConfig& b = head.config().backbone;
  const int64_t H = b.hidden, V = head.target().vocab_size();
  // The members that draft this pass (cap > 0), checked before any of them draws a number.
  std::vector<DFlashDrafter*> drafting;
  std::vector<size_t> slot;
  std::vector<int64_t> caps, widths;
  std::vector<const DrafterContext*> contexts;
  std::vector<int32_t> anchors;
  for (size_t m = 0; m < members.size(); ++m) {
    auto* drafter = static_cast<DFlashDrafter*>(members[m]);
    const DraftRequest& request = *requests[m];
    const int64_t position = static_cast<int64_t>(request.committed.size()) - 1;
    if (position != drafter->context().length) {
      fail("DFlash drafter context holds {} rows but {} tokens precede the pending one",
           drafter->context().length, position);
    }
    drafts[m] = Draft{};
    drafter->last_logits_.clear();
    const int cap = std::min(request.cap, head.max_drafts());
    if (cap <= 0) continue;
    drafting.push_back(drafter);
    slot.push_back(m);
    caps.push_back(cap);
    widths.push_back(head.block_width(cap));
    contexts.push_back(&drafter->context());
    anchors.push_back(request.committed.back());
  }
  const size_t n = drafting.size();
  if (n == 0) return;
  int64_t rows = 0, draft_rows = 0;
  for (size_t k = 0; k < n; ++k) rows += widths[k], draft_rows += caps[k];
  std::vector<float> embedded(rows * H);
  for (int64_t k = 0, first = 0; k < static_cast<int64_t>(n); first += widths[k], ++k) {
    head.embed_block(anchors[k], widths[k], embedded.data() + first * H);
  }
  // Slots 1 .. cap of every block out of the backbone, and through the lm_head in one pass.
  std::vector<float> drafting_hidden(draft_rows * H), logits(draft_rows * V);
  head.backbone().run_blocks(embedded.data(), widths, 1, caps, contexts, drafting_hidden.data());
  head.logits(drafting_hidden.data(), draft_rows, logits.data());
  for (int64_t k = 0, at = 0; k < static_cast<int64_t>(n); at += caps[k], ++k) {
    const DraftRequest& request = *requests[slot[k]];
    Draft& draft = drafts[slot[k]];
    drafting[k]->last_logits_.assign(logits.begin() + at * V, logits.begin() + (at + caps[k]) * V);
    for (int64_t i = 0; i < caps[k]; ++i) {
      const float* row = logits.data() + (at + i) * V;
      if (request.sampling.greedy()) {
        draft.tokens.push_back(argmax(row, V));
      } else {
        TokenDistribution q = target_distribution(request.sampling, row, V);
        draft.tokens.push_back(sample_from(q, request.rng.uniform()));
        draft.proposals.push_back(std::move(q));
      }
    }
  }
}

std::function<std::unique_ptr<Drafter>()> dflash_drafter_factory(
    std::shared_ptr<const DFlashHead> head) {
  return [head]() -> std::unique_ptr<Drafter> { return std::make_unique<DFlashDrafter>(head); };
}

}  // namespace dspark
