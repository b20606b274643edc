#include "model/model.h"

#include <algorithm>
#include <cstring>
#include <numeric>

#include "base/error.h"
#include "base/system_info.h"
#include "kernels/ops.h"
#include "model/architectures.h"

namespace dspark {

Model::Model(std::unique_ptr<Checkpoint> checkpoint) : checkpoint_(std::move(checkpoint)) {}

void Model::set_prefill_chunk(int64_t tokens) {
  if (tokens < 1) fail("prefill chunk must be at least 1 token, got {}", tokens);
  prefill_chunk_ = tokens;
}

void Model::embed(const int32_t* tokens, int64_t n, float* out) const {
  const int64_t rows = embedding_.rows();
  for (int64_t i = 0; i < n; ++i) {
    if (tokens[i] < 0 || tokens[i] >= rows) {
      fail("token id {} is outside the vocabulary [0, {})", tokens[i], rows);
    }
    embedding_.row(tokens[i], out + i * config_.hidden_size);
  }
}

void Model::final_norm(const float* residual, int64_t rows, float* out) const {
  kernels::rms_norm(residual, rows, config_.hidden_size, final_norm_.data(), norm_eps_, out);
}

void Model::apply_lm_head(const float* normed, int64_t rows, float* logits) const {
  lm_head().apply(normed, rows, logits);
}

void Model::compute_logits(const float* residual, int64_t rows, float* logits) const {
  std::vector<float> normed(rows * config_.hidden_size);
  final_norm(residual, rows, normed.data());
  apply_lm_head(normed.data(), rows, logits);
}

void Model::forward(const int32_t* tokens, int64_t n, ModelState& state,
                    const std::vector<int64_t>& logit_rows, const std::vector<int>& tap_layers,
                    ForwardOutput& out) const {
  const StateLayout expected = state_layout();
  const StateLayout& layout = state.layout();
  if (layout.attention_layers != expected.attention_layers ||
      layout.mamba_layers != expected.mamba_layers || layout.kv_row() != expected.kv_row() ||
      layout.ssm_size() != expected.ssm_size() || layout.conv_window() != expected.conv_window()) {
    fail("forward: the state was not made by this {} model", config_.architecture);
  }
  for (int64_t row : logit_rows) {
    if (row < 0 || row >= n) fail("forward: logit row {} is outside the run of {} tokens", row, n);
  }
  for (int layer : tap_layers) {
    if (layer < -1 || layer >= config_.num_layers) {
      fail("forward: tap layer {} is outside [-1, {})", layer, config_.num_layers);
    }
  }
  for (int64_t i = 0; i < n; ++i) {
    if (tokens[i] < 0 || tokens[i] >= embedding_.rows()) {
      fail("forward: token id {} at row {} is outside the vocabulary [0, {})", tokens[i], i,
           embedding_.rows());
    }
  }
  const int64_t H = config_.hidden_size;
  const int64_t V = vocab_size();
  const int64_t n_taps = static_cast<int64_t>(tap_layers.size());
  // Every logit row and tap row is written below; resizing keeps a reused output's pages.
  out.logits.resize(logit_rows.size() * V);
  out.taps.resize(n * n_taps * H);
  if (n == 0) return;
  state.reserve(state.length() + n);

  auto capture = [&](int layer, const float* hidden, int64_t first_row, int64_t rows) {
    for (int64_t j = 0; j < n_taps; ++j) {
      if (tap_layers[j] != layer) continue;
      for (int64_t r = 0; r < rows; ++r) {
        std::memcpy(out.taps.data() + ((first_row + r) * n_taps + j) * H, hidden + r * H,
                    H * sizeof(float));
      }
    }
  };

  const int64_t chunk = std::min(prefill_chunk_, n);
  std::vector<float> hidden(chunk * H);
  std::vector<int64_t> wanted;  // indices into logit_rows whose row is in the current chunk
  std::vector<float> gathered, chunk_logits;
  state.begin_forward(n);
  for (int64_t first = 0; first < n; first += chunk) {
    const int64_t rows = std::min(chunk, n - first);
    embed(tokens + first, rows, hidden.data());
    capture(-1, hidden.data(), first, rows);
    for (int64_t layer = 0; layer < config_.num_layers; ++layer) {
      const double start = layer_seconds_ ? now_seconds() : 0.0;
      run_layer(layer, hidden.data(), rows, state);
      if (layer_seconds_) (*layer_seconds_)[layer] += now_seconds() - start;
      capture(static_cast<int>(layer), hidden.data(), first, rows);
    }
    wanted.clear();
    for (size_t i = 0; i < logit_rows.size(); ++i) {
      if (logit_rows[i] >= first && logit_rows[i] < first + rows) wanted.push_back(i);
    }
    if (!wanted.empty()) {
      const int64_t k = static_cast<int64_t>(wanted.size());
      gathered.resize(k * H);
      for (int64_t i = 0; i < k; ++i) {
        std::memcpy(gathered.data() + i * H, hidden.data() + (logit_rows[wanted[i]] - first) * H,
                    H * sizeof(float));
      }
      // Rows asked for in order (the usual case) land in place; otherwise through a buffer.
      const bool in_order = wanted.back() - wanted.front() == k - 1;
      if (in_order) {
        compute_logits(gathered.data(), k, out.logits.data() + wanted.front() * V);
      } else {
        chunk_logits.resize(k * V);
        compute_logits(gathered.data(), k, chunk_logits.data());
        for (int64_t i = 0; i < k; ++i) {
          std::memcpy(out.logits.data() + wanted[i] * V, chunk_logits.data() + i * V,
                      V * sizeof(float));
        }
      }
    }
    state.advance(rows);
    if (prefill_progress_ != nullptr && n > chunk) (*prefill_progress_)(first + rows, n);
  }
  state.end_forward();
}

void RoutingCounts::record(int64_t layer, int64_t experts, const int32_t* ids, int64_t n,
                           int64_t top_k) {
  if (static_cast<int64_t>(chosen.size()) <= layer) {
    chosen.resize(layer + 1);
    rows.resize(layer + 1, 0);
  }
  std::vector<int64_t>& counts = chosen[layer];
  counts.resize(experts, 0);
  for (int64_t i = 0; i < n * top_k; ++i) ++counts[ids[i]];
  rows[layer] += n;
}

std::vector<int64_t> RoutingCounts::distinct_per_layer() const {
  std::vector<int64_t> distinct;
  for (const auto& counts : chosen) {
    if (counts.empty()) continue;
    distinct.push_back(
        std::count_if(counts.begin(), counts.end(), [](int64_t c) { return c > 0; }));
  }
  return distinct;
}

int64_t linear_bytes(const LinearWeights& linear, int64_t experts) {
  if (linear.rows() == 0) return 0;
  if (linear.quantized) return linear.quant.bytes_per_expert() * experts;
  return linear.dense.rows * linear.dense.cols *
         static_cast<int64_t>(dtype_size(linear.dense.dtype)) * experts;
}

namespace {

int64_t embedding_row_bytes(const LinearWeights& embedding) {
  if (embedding.quantized) {
    const kernels::QuantMatrix& q = embedding.quant;
    return q.words_per_row() * 4 +
           2 * q.groups_per_row() * static_cast<int64_t>(dtype_size(q.scale_dtype));
  }
  return embedding.dense.cols * static_cast<int64_t>(dtype_size(embedding.dense.dtype));
}

}  // namespace

int64_t Model::shared_decode_weight_bytes() const {
  return embedding_row_bytes(embedding_) + linear_bytes(lm_head()) +
         static_cast<int64_t>(final_norm_.size() * sizeof(float));
}

int64_t Model::forward_weight_bytes(const RoutingCounts& routing, int64_t rows) const {
  int64_t bytes = decode_weight_bytes() + (rows - 1) * embedding_row_bytes(embedding_);
  for (size_t layer = 0; layer < routing.chosen.size(); ++layer) {
    const std::vector<int64_t>& counts = routing.chosen[layer];
    if (counts.empty() || routing.rows[layer] == 0) continue;
    const int64_t choices = std::accumulate(counts.begin(), counts.end(), int64_t{0});
    const int64_t top_k = choices / routing.rows[layer];
    const int64_t distinct =
        std::count_if(counts.begin(), counts.end(), [](int64_t c) { return c > 0; });
    bytes += (distinct - top_k) * routed_expert_bytes(static_cast<int64_t>(layer));
  }
  return bytes;
}

int64_t Model::decode_weight_bytes() const {
  int64_t bytes = shared_decode_weight_bytes();
  for (int64_t layer = 0; layer < config_.num_layers; ++layer) {
    bytes += layer_decode_weight_bytes(layer);
  }
  return bytes;
}

std::unique_ptr<Model> load_model(const std::string& checkpoint_dir) {
  auto checkpoint = std::make_unique<Checkpoint>(checkpoint_dir);
  const nlohmann::json& config = checkpoint->config();
  if (!config.contains("model_type") || !config["model_type"].is_string()) {
    fail("{}: config.json has no model_type", checkpoint_dir);
  }
  const std::string model_type = config["model_type"].get<std::string>();
  if (model_type == "nemotron_h") return make_nemotron_h(std::move(checkpoint));
  if (model_type == "llama" || model_type == "qwen2" || model_type == "qwen3") {
    return make_dense(std::move(checkpoint));
  }
  fail("{}: unsupported model_type '{}' (supported: nemotron_h, llama, qwen2, qwen3)",
       checkpoint_dir, model_type);
}

}  // namespace dspark
