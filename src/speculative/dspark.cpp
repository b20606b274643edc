#include "speculative/dspark.h"

#include <algorithm>
#include <cmath>

#include "base/error.h"

namespace dspark {
namespace {

// An embedding row (own embed_tokens, Markov W1) dequantized in fp32, as the target's own
// embedding is (Model::embed). Rounding s·q and then + b to the 16-bit scale dtype, as MLX does
// for a bf16 head, would make these two lookups alone carry bf16 error (up to 2^-9 relative)
// into an otherwise fp32 drafter: the Markov bias and the confidence features would then follow
// neither mlx-dspark's bf16 arithmetic nor the fp32 arithmetic of everything else.
void embedding_row(const LinearWeights& table, int64_t index, float* out) {
  if (index < 0 || index >= table.rows()) {
    fail("token {} is outside the drafter embedding of {} rows", index, table.rows());
  }
  table.row(index, out);
}

}  // namespace

DSparkHead::DSparkHead(const std::string& directory, const Model& target,
                       const DrafterLoadOptions& options)
    : checkpoint_(std::make_unique<Checkpoint>(directory)), target_(target) {
  const std::string source = checkpoint_->path() + "/config.json";
  config_ = read_dspark_config(checkpoint_->config(), source);
  const BackboneConfig& b = config_.backbone;
  check_taps_in_target(b, target, source);
  DrafterTensors t(*checkpoint_, options.bits);
  const int64_t H = b.hidden, V = b.vocab, Vd = config_.draft_vocab, r = config_.markov_rank;
  backbone_ = std::make_unique<DrafterBackbone>(b, t);
  if (t.has("embed_tokens.weight")) embed_ = t.linear("embed_tokens", V, H, true, true);
  if (t.has("lm_head.weight")) {
    lm_head_ = t.linear("lm_head", Vd, H);
  } else if (Vd != V) {
    fail("{}: a reduced draft vocabulary ({} of {}) needs the drafter's own lm_head", source, Vd,
         V);
  }
  if (r > 0) {
    t.require("markov_head.markov_w1.weight", "Markov W1");
    t.require("markov_head.markov_w2.weight", "Markov W2");
    markov_w1_ = t.linear("markov_head.markov_w1", V, r, true, true);
    markov_w2_ = t.linear("markov_head.markov_w2", Vd, r);
  }
  if (t.has("confidence_head.proj.weight")) {
    confidence_ = t.linear("confidence_head.proj", 1, H + (config_.confidence_with_markov ? r : 0));
  }
  config_.confidence_head = confidence_ != nullptr;
  std::vector<std::string> ignored{"t2d"};
  if (Vd != V) {
    if (!t.has("d2t")) {
      fail("{}: draft_vocab_size {} < vocab_size {} but the checkpoint has no d2t table", source,
           Vd, V);
    }
    const TensorView& d2t = t.tensor("d2t");
    if (d2t.rank() != 1 || d2t.dim(0) != Vd) fail("{}: d2t must have shape [{}]", source, Vd);
    draft_to_target_.resize(Vd);
    for (int64_t i = 0; i < Vd; ++i) {
      draft_to_target_[i] = i + static_cast<int64_t>(d2t.load_float(i));
      if (draft_to_target_[i] < 0 || draft_to_target_[i] >= V) {
        fail("{}: d2t maps draft id {} outside the target vocabulary", source, i);
      }
    }
  } else if (t.has("d2t")) {
    fail("{}: the checkpoint has a d2t table but the config declares no reduced draft vocabulary",
         source);
  }
  t.check_all_used(ignored);
  mask_embedding_.resize(H);
  embed_token(b.mask_token_id, mask_embedding_.data());
}

int DSparkHead::max_drafts() const {
  return static_cast<int>(config_.backbone.block_size - config_.backbone.logits_start);
}

int64_t DSparkHead::block_width(int cap) const {
  const BackboneConfig& b = config_.backbone;
  const bool causal = std::all_of(b.causal.begin(), b.causal.end(), [](bool c) { return c; });
  if (!causal) return b.block_size;
  return std::min<int64_t>(b.block_size, b.logits_start + std::max(1, cap));
}

void DSparkHead::embed_token(int32_t token, float* out) const {
  if (embed_ != nullptr) {
    embedding_row(embed_->weights, token, out);
  } else {
    target_.embed(&token, 1, out);
  }
}

void DSparkHead::embed_block(int32_t anchor, int64_t width, float* out) const {
  embed_draft_block([&](float* row) { embed_token(anchor, row); }, mask_embedding_, width, out);
}

void DSparkHead::base_logits(const float* hidden, int64_t rows, float* logits) const {
  const LinearWeights& head = lm_head_ != nullptr ? lm_head_->weights : target_.lm_head();
  head.apply(hidden, rows, logits);
  if (config_.logit_softcap > 0.0f) {
    const float cap = config_.logit_softcap;
    for (int64_t i = 0; i < rows * config_.draft_vocab; ++i) {
      logits[i] = cap * std::tanh(logits[i] / cap);
    }
  }
}

void DSparkHead::markov_embedding(int32_t token, float* out) const {
  embedding_row(markov_w1_->weights, token, out);
}

void DSparkHead::markov_bias(const float* embeddings, int64_t rows, float* biases) const {
  markov_w2_->weights.apply(embeddings, rows, biases);
}

float DSparkHead::confidence(const float* hidden, const float* prev_embedding) const {
  const int64_t H = config_.backbone.hidden;
  const int64_t r = config_.confidence_with_markov ? config_.markov_rank : 0;
  std::vector<float> features(hidden, hidden + H);
  features.insert(features.end(), prev_embedding, prev_embedding + r);
  float logit = 0.0f;
  confidence_->weights.apply(features.data(), 1, &logit);
  return 1.0f / (1.0f + std::exp(-logit));
}

int32_t DSparkHead::to_target(int32_t draft_id) const {
  return draft_to_target_.empty() ? draft_id : static_cast<int32_t>(draft_to_target_[draft_id]);
}

int64_t DSparkHead::weight_bytes() const {
  int64_t bytes = backbone_->weight_bytes();
  for (const auto* linear : {&embed_, &lm_head_, &markov_w1_, &markov_w2_, &confidence_}) {
    if (*linear != nullptr) bytes += linear_bytes((*linear)->weights);
  }
  return bytes;
}

DSparkDrafter::DSparkDrafter(std::shared_ptr<const DSparkHead> head, float confidence_threshold)
    : BackboneDrafter(head->backbone(), head.get()),
      head_(std::move(head)),
      confidence_threshold_(confidence_threshold) {}

void DSparkDrafter::propose_group(std::span<Drafter* const> members,
                                  std::span<const DraftRequest* const> requests,
                                  std::span<Draft> drafts) {
  const DSparkHead& head = *head_;
  const DSparkConfig& c = head.config();
  const int64_t H = c.backbone.hidden, Vd = c.draft_vocab, r = c.markov_rank;
  const int64_t start = c.backbone.logits_start;
  // The members that draft this pass (cap > 0), checked before any of them draws a number.
  std::vector<DSparkDrafter*> drafting;
  std::vector<const DraftRequest*> asked;
  std::vector<size_t> slot;
  std::vector<int64_t> caps, widths;
  std::vector<const DrafterContext*> contexts;
  for (size_t m = 0; m < members.size(); ++m) {
    auto* drafter = static_cast<DSparkDrafter*>(members[m]);
    const DraftRequest& request = *requests[m];
    const int64_t position = static_cast<int64_t>(request.committed.size()) - 1;
    if (position != drafter->context().length) {
      fail(
          "DSpark drafter context holds {} rows but {} tokens precede the pending one (every "
          "target row must reach the drafter)",
          drafter->context().length, position);
    }
    drafts[m] = Draft{};
    drafter->last_logits_.clear();
    drafter->last_confidences_.clear();
    const int cap = std::min(request.cap, head.max_drafts());
    if (cap <= 0) continue;
    drafting.push_back(drafter);
    asked.push_back(&request);
    slot.push_back(m);
    caps.push_back(cap);
    widths.push_back(head.block_width(cap));
    contexts.push_back(&drafter->context());
  }
  const size_t n = drafting.size();
  if (n == 0) return;

  // The blocks [anchor, mask ...] through the backbone in one pass, each block's drafting rows
  // (start ... start + cap - 1) out of it, and those through the lm_head in one pass.
  int64_t rows = 0, draft_rows = 0;
  for (size_t k = 0; k < n; ++k) rows += widths[k], draft_rows += caps[k];
  std::vector<float> block(rows * H), drafting_hidden(draft_rows * H);
  std::vector<int64_t> first_draft_row(n);
  for (int64_t k = 0, first = 0, at = 0; k < static_cast<int64_t>(n); first += widths[k], ++k) {
    head.embed_block(asked[k]->committed.back(), widths[k], block.data() + first * H);
    first_draft_row[k] = at;
    at += caps[k];
  }
  head.backbone().run_blocks(block.data(), widths, start, caps, contexts, drafting_hidden.data());
  std::vector<float> logits(static_cast<size_t>(draft_rows * Vd));
  head.base_logits(drafting_hidden.data(), draft_rows, logits.data());

  // Draft i of every block that drafts that far depends on draft i - 1 (the Markov bias of the
  // previous token): one pass per position, the bias of every block's previous token together.
  std::vector<int32_t> prev(n);
  for (size_t k = 0; k < n; ++k) prev[k] = asked[k]->committed.back();
  const int64_t most = *std::max_element(caps.begin(), caps.end());
  std::vector<size_t> live;
  std::vector<float> embeddings, biases;
  for (int64_t i = 0; i < most; ++i) {
    live.clear();
    for (size_t k = 0; k < n; ++k) {
      if (caps[k] > i) live.push_back(k);
    }
    const auto count = static_cast<int64_t>(live.size());
    embeddings.assign(count * r, 0.0f);
    if (r > 0) {
      biases.resize(static_cast<size_t>(count * Vd));
      for (int64_t j = 0; j < count; ++j) {
        head.markov_embedding(prev[live[j]], embeddings.data() + j * r);
      }
      head.markov_bias(embeddings.data(), count, biases.data());
    }
    for (int64_t j = 0; j < count; ++j) {
      const size_t k = live[j];
      const DraftRequest& request = *asked[k];
      Draft& draft = drafts[slot[k]];
      float* row = logits.data() + (first_draft_row[k] + i) * Vd;
      if (r > 0) {
        const float* bias = biases.data() + j * Vd;
        for (int64_t v = 0; v < Vd; ++v) row[v] += bias[v];
      }
      if (c.confidence_head) {
        drafting[k]->last_confidences_.push_back(head.confidence(
            drafting_hidden.data() + (first_draft_row[k] + i) * H, embeddings.data() + j * r));
      }
      int32_t token;
      if (request.sampling.greedy()) {
        token = head.to_target(argmax(row, Vd));
      } else {
        TokenDistribution q = target_distribution(request.sampling, row, Vd);
        for (int32_t& id : q.ids) id = head.to_target(id);
        token = sample_from(q, request.rng.uniform());
        draft.proposals.push_back(std::move(q));
      }
      draft.tokens.push_back(token);
      prev[k] = token;
    }
  }

  for (size_t k = 0; k < n; ++k) {
    DSparkDrafter& drafter = *drafting[k];
    Draft& draft = drafts[slot[k]];
    drafter.last_logits_.assign(logits.begin() + first_draft_row[k] * Vd,
                                logits.begin() + (first_draft_row[k] + caps[k]) * Vd);
    const std::vector<float>& confidences = drafter.last_confidences_;
    if (drafter.confidence_threshold_ > 0.0f && !confidences.empty()) {
      double survival = 1.0;
      size_t keep = 0;
      for (float confidence : confidences) {
        survival *= confidence;
        if (survival < drafter.confidence_threshold_) break;
        ++keep;
      }
      keep = std::max<size_t>(keep, 1);
      draft.keep_first(keep);
    }
    double survival = 1.0;
    for (size_t i = 0; i < confidences.size() && i < draft.tokens.size(); ++i) {
      draft.survival.push_back(survival *= confidences[i]);
    }
  }
}

std::function<std::unique_ptr<Drafter>()> dspark_drafter_factory(
    std::shared_ptr<const DSparkHead> head, float confidence_threshold) {
  return [head, confidence_threshold]() -> std::unique_ptr<Drafter> {
    return std::make_unique<DSparkDrafter>(head, confidence_threshold);
  };
}

}  // namespace dspark
