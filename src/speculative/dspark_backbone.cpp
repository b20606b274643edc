#include "speculative/dspark_backbone.h"

#include <algorithm>
#include <cmath>
#include <deque>

#include "base/error.h"
#include "kernels/ops.h"
#include "model/qwen3_block.h"

namespace dspark {
namespace {

std::vector<float> offset_if(std::vector<float> weight, bool offset) {
  if (offset) {
    for (float& w : weight) w += 1.0f;
  }
  return weight;
}

// One compute section per context, so that the backbone reaches every context's rows whichever
// backend holds it (the contexts of one group share their pool's, and sections nest).
class ComputeSections {
 public:
  template <typename Contexts>
  explicit ComputeSections(const Contexts& contexts) {
    for (const DrafterContext* context : contexts) sections_.emplace_back(*context->backend);
  }

 private:
  std::deque<backend::ComputeSection> sections_;
};

}  // namespace

DrafterBackbone::DrafterBackbone(const BackboneConfig& config, DrafterTensors& t)
    : config_(config) {
  const BackboneConfig& c = config_;
  const int64_t H = c.hidden, hd = c.head_dim;
  const int64_t taps = static_cast<int64_t>(c.target_layer_ids.size());
  for (const auto& [name, what] :
       {std::pair{"fc", "fc (tap projection)"}, std::pair{"hidden_norm.weight", "hidden_norm"},
        std::pair{"norm.weight", "final norm"}}) {
    t.require(name, what);
  }
  fc_ = t.linear("fc", H, taps * H);
  if (!fc_->weights.bias.empty()) fail("{}: fc must have no bias", t.source());
  hidden_norm_ = offset_if(t.floats("hidden_norm.weight", {H}), c.offset_norms);
  final_norm_ = offset_if(t.floats("norm.weight", {H}), c.offset_norms);
  for (int64_t l = 0; l < c.layers; ++l) {
    const std::string p = "layers." + std::to_string(l);
    Layer layer;
    layer.input_norm = offset_if(t.floats(p + ".input_layernorm.weight", {H}), c.offset_norms);
    layer.post_attention_norm =
        offset_if(t.floats(p + ".post_attention_layernorm.weight", {H}), c.offset_norms);
    layer.q_proj = t.linear(p + ".self_attn.q_proj", c.heads * hd * (c.gated_q ? 2 : 1), H);
    layer.k_proj = t.linear(p + ".self_attn.k_proj", c.kv_heads * hd, H);
    layer.v_proj = t.linear(p + ".self_attn.v_proj", c.kv_heads * hd, H);
    layer.o_proj = t.linear(p + ".self_attn.o_proj", H, c.heads * hd);
    layer.q_norm = offset_if(t.floats(p + ".self_attn.q_norm.weight", {hd}), c.offset_norms);
    layer.k_norm = offset_if(t.floats(p + ".self_attn.k_norm.weight", {hd}), c.offset_norms);
    if (c.attention_sinks) {
      layer.sinks = t.floats(p + ".self_attn.attention_sink_bias", {c.heads});
    }
    layer.gate_proj = t.linear(p + ".mlp.gate_proj", c.intermediate, H);
    layer.up_proj = t.linear(p + ".mlp.up_proj", c.intermediate, H);
    layer.down_proj = t.linear(p + ".mlp.down_proj", H, c.intermediate);
    layers_.push_back(std::move(layer));
  }
  inv_freq_.resize(c.rope_dims / 2);
  for (int64_t i = 0; i < c.rope_dims / 2; ++i) {
    inv_freq_[i] =
        static_cast<float>(1.0 / std::pow(c.rope_theta, static_cast<double>(2 * i) /
                                                            static_cast<double>(c.rope_dims)));
  }
}

DrafterContext DrafterBackbone::new_context(backend::Backend& backend) const {
  DrafterContext context;
  context.backend = &backend;
  context.keys.resize(config_.layers);
  context.values.resize(config_.layers);
  context.kv_width = config_.kv_heads * config_.head_dim;
  return context;
}

void DrafterBackbone::project_keys(const Layer& layer, float* keys, int64_t rows,
                                   int64_t first_position) const {
  const BackboneConfig& c = config_;
  kernels::rms_norm(keys, rows * c.kv_heads, c.head_dim, layer.k_norm.data(), c.eps, keys);
  const kernels::RopeSpec rope{inv_freq_.data(), c.rope_dims, c.rope_traditional, 1.0f};
  kernels::rope(keys, rows, c.kv_heads, c.head_dim, first_position, rope);
}

void DrafterBackbone::append_context(const float* taps, int64_t n, DrafterContext& context) const {
  DrafterContext* contexts[] = {&context};
  append_contexts({&taps, 1}, {&n, 1}, contexts);
}

void DrafterBackbone::append_contexts(std::span<const float* const> taps,
                                      std::span<const int64_t> counts,
                                      std::span<DrafterContext* const> contexts) const {
  const BackboneConfig& c = config_;
  const int64_t H = c.hidden, kv_width = c.kv_heads * c.head_dim;
  const int64_t tap_width = static_cast<int64_t>(c.target_layer_ids.size()) * H;
  int64_t rows = 0;
  for (int64_t n : counts) rows += n;
  if (rows == 0) return;
  // Every context's taps as one block of rows.
  std::vector<float> all_taps;
  const float* block = taps[0];
  if (taps.size() > 1) {
    all_taps.resize(static_cast<size_t>(rows * tap_width));
    for (size_t i = 0, at = 0; i < taps.size(); at += counts[i], ++i) {
      std::copy_n(taps[i], counts[i] * tap_width, all_taps.data() + at * tap_width);
    }
    block = all_taps.data();
  }
  std::vector<float> fused(static_cast<size_t>(rows * H));
  fc_->weights.apply(block, rows, fused.data());
  kernels::rms_norm(fused.data(), rows, H, hidden_norm_.data(), c.eps, fused.data());
  std::vector<float> keys(static_cast<size_t>(rows * kv_width)), values(keys.size());
  for (size_t i = 0; i < contexts.size(); ++i)
    contexts[i]->reserve(contexts[i]->length + counts[i]);
  const ComputeSections sections(contexts);
  for (int64_t l = 0; l < c.layers; ++l) {
    const Layer& layer = layers_[l];
    const LinearWeights* const projections[] = {&layer.k_proj->weights, &layer.v_proj->weights};
    float* const outputs[] = {keys.data(), values.data()};
    apply_shared(fused.data(), rows, projections, outputs);
    for (size_t i = 0, at = 0; i < contexts.size(); at += counts[i], ++i) {
      DrafterContext& context = *contexts[i];
      const int64_t n = counts[i];
      float* new_keys = context.keys[l].as<float>() + context.length * kv_width;
      std::copy_n(keys.data() + at * kv_width, n * kv_width, new_keys);
      std::copy_n(values.data() + at * kv_width, n * kv_width,
                  context.values[l].as<float>() + context.length * kv_width);
      project_keys(layer, new_keys, n, context.length);
    }
  }
  for (size_t i = 0; i < contexts.size(); ++i) contexts[i]->length += counts[i];
}

void DrafterContext::truncate(int64_t rows) {
  length = std::clamp<int64_t>(rows, 0, length);
}

int64_t DrafterContext::bytes() const {
  int64_t total = 0;
  for (size_t l = 0; l < keys.size(); ++l) total += keys[l].bytes() + values[l].bytes();
  return total;
}

void DrafterContext::reserve(int64_t rows) {
  if (rows <= capacity) return;
  const int64_t grown = std::max(rows, capacity + capacity / 2);
  const int64_t row_bytes = kv_width * static_cast<int64_t>(sizeof(float));
  for (auto* buffers : {&keys, &values}) {
    for (backend::Buffer& buffer : *buffers) {
      backend::Buffer larger = backend->allocate(grown * row_bytes);
      backend->copy(buffer, 0, larger, 0, length * row_bytes);
      buffer = std::move(larger);
    }
  }
  capacity = grown;
}

void DrafterBackbone::run_blocks(const float* embedded, std::span<const int64_t> widths,
                                 int64_t first_output, std::span<const int64_t> outputs,
                                 std::span<const DrafterContext* const> contexts,
                                 float* hidden) const {
  const BackboneConfig& c = config_;
  const int64_t H = c.hidden, hd = c.head_dim;
  if (outputs.size() != widths.size() || contexts.size() != widths.size()) {
    fail("drafter blocks: {} widths, {} output counts and {} contexts", widths.size(),
         outputs.size(), contexts.size());
  }
  int64_t rows = 0;
  std::vector<int64_t> kept;
  for (size_t b = 0; b < widths.size(); ++b) {
    if (first_output < 0 || outputs[b] < 0 || first_output + outputs[b] > widths[b]) {
      fail("drafter block {}: rows [{}, {}) of {} asked", b, first_output,
           first_output + outputs[b], widths[b]);
    }
    for (int64_t i = 0; i < outputs[b]; ++i) kept.push_back(rows + first_output + i);
    rows += widths[b];
  }
  std::vector<float> x(embedded, embedded + rows * H);
  const ComputeSections sections(contexts);
  const kernels::RopeSpec rope{inv_freq_.data(), c.rope_dims, c.rope_traditional, 1.0f};
  const AttentionShape shape{c.heads, c.kv_heads, hd, c.eps, c.gated_q};
  const int64_t q_width = c.heads * hd, kv_width = c.kv_heads * hd;
  for (int64_t l = 0; l < c.layers; ++l) {
    const Layer& layer = layers_[l];
    const bool last = l + 1 == c.layers;
    const Qwen3BlockWeights weights{
        layer.input_norm.data(),
        layer.post_attention_norm.data(),
        {&layer.q_proj->weights, &layer.k_proj->weights, &layer.v_proj->weights,
         &layer.o_proj->weights, layer.q_norm.data(), layer.k_norm.data()},
        {&layer.gate_proj->weights, &layer.up_proj->weights, &layer.down_proj->weights}};
    const kernels::BlockAttentionSpec attention{c.heads,
                                                c.kv_heads,
                                                hd,
                                                c.causal[l],
                                                c.window[l],
                                                1.0f / std::sqrt(static_cast<float>(hd)),
                                                layer.sinks.empty() ? nullptr : layer.sinks.data()};
    // Each block sits at positions p ..., after its own context; in the last layer only its
    // output rows ask, their queries one block after another.
    const Attend blocks_over_contexts = [&](float* q, float* k, const float* v, int64_t, float* o) {
      int64_t first = 0, first_query = 0;
      for (size_t b = 0; b < widths.size(); ++b) {
        const DrafterContext& context = *contexts[b];
        const int64_t p = context.length, width = widths[b];
        const kernels::BlockQueries queries = last ? kernels::BlockQueries{first_output, outputs[b]}
                                                   : kernels::BlockQueries{0, width};
        float* block_q = q + first_query * q_width;
        float* block_k = k + first * kv_width;
        kernels::rope(block_q, queries.count, c.heads, hd, p + queries.first, rope);
        kernels::rope(block_k, width, c.kv_heads, hd, p, rope);
        kernels::block_attention(attention, block_q, queries, context.keys[l].as<float>(),
                                 context.values[l].as<float>(), p, block_k, v + first * kv_width,
                                 width, o + first_query * q_width);
        first += width;
        first_query += queries.count;
      }
    };
    if (last) {
      std::vector<float> kept_hidden(kept.size() * H);
      qwen3_block_rows(weights, shape, H, c.eps, x.data(), rows, kept, blocks_over_contexts,
                       kept_hidden.data());
      x = std::move(kept_hidden);
    } else {
      qwen3_block(weights, shape, H, c.eps, x.data(), rows, blocks_over_contexts);
    }
  }
  kernels::rms_norm(x.data(), static_cast<int64_t>(kept.size()), H, final_norm_.data(), c.eps,
                    hidden);
}

BackboneDrafter::BackboneDrafter(const DrafterBackbone& backbone, const void* head)
    : own_context_(backbone.new_context()), backbone_(backbone), head_(head) {}

void BackboneDrafter::bind_sequence(StatePool& pool, SequenceId sequence) {
  if (own_context_.length > 0) fail("a drafter is bound to a sequence after it was fed rows");
  if (pool.attachment(sequence, &backbone_) == nullptr) {
    pool.attach(sequence, &backbone_,
                std::make_unique<DrafterContext>(backbone_.new_context(pool.backend())));
  }
  pool_ = &pool;
  sequence_ = sequence;
}

DrafterContext& BackboneDrafter::context() const {
  if (pool_ == nullptr) return own_context_;
  // Looked up on every use, so that a sequence closed under the drafter fails by name.
  SequenceAttachment* attached = pool_->attachment(sequence_, &backbone_);
  if (attached == nullptr) fail("the drafter's context left sequence {}", sequence_);
  return static_cast<DrafterContext&>(*attached);
}

void BackboneDrafter::on_target_rows(const int32_t* tokens, int64_t n, const float* taps) {
  (void)tokens;
  if (n > 0) backbone_.append_context(taps, n, context());
}

Draft BackboneDrafter::propose(const DraftRequest& request) {
  Drafter* members[] = {this};
  const DraftRequest* requests[] = {&request};
  Draft draft;
  propose_group(members, requests, {&draft, 1});
  return draft;
}

void BackboneDrafter::feed_group(std::span<Drafter* const> members,
                                 std::span<const DrafterRows> rows) {
  std::vector<const float*> taps;
  std::vector<int64_t> counts;
  std::vector<DrafterContext*> contexts;
  for (size_t i = 0; i < members.size(); ++i) {
    if (rows[i].n <= 0) continue;
    taps.push_back(rows[i].taps);
    counts.push_back(rows[i].n);
    contexts.push_back(&static_cast<BackboneDrafter*>(members[i])->context());
  }
  if (!contexts.empty()) backbone_.append_contexts(taps, counts, contexts);
}

int64_t DrafterBackbone::weight_bytes() const {
  int64_t bytes = linear_bytes(fc_->weights);
  for (const Layer& layer : layers_) {
    for (const auto* linear : {&layer.q_proj, &layer.k_proj, &layer.v_proj, &layer.o_proj,
                               &layer.gate_proj, &layer.up_proj, &layer.down_proj}) {
      bytes += linear_bytes((*linear)->weights);
    }
  }
  return bytes;
}

}  // namespace dspark
