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

namespace {

bool same_layout(const StateLayout& a, const StateLayout& b) {
  return a.attention_layers == b.attention_layers && a.mamba_layers == b.mamba_layers &&
         a.kv_row() == b.kv_row() && a.ssm_size() == b.ssm_size() &&
         a.conv_window() == b.conv_window();
}

}  // namespace

void Model::check_run(const SequenceRun& run, StatePool& pool) const {
  if (!same_layout(pool.layout(), state_layout())) {
    fail("forward: the state pool was not made by this {} model", config_.architecture);
  }
  if (!pool.is_open(run.sequence)) {
    fail("forward: sequence {} is not open in the state pool", run.sequence);
  }
  check_state_run(run, pool.state(run.sequence));
}

void Model::check_state_run(const SequenceRun& run, ModelState& state) const {
  if (run.out == nullptr) fail("forward: a run needs an output");
  if (!same_layout(state.layout(), state_layout())) {
    fail("forward: the state was not made by this {} model", config_.architecture);
  }
  for (int64_t row : run.logit_rows) {
    if (row < 0 || row >= run.n) {
      fail("forward: logit row {} is outside the run of {} tokens", row, run.n);
    }
  }
  for (int layer : run.tap_layers) {
    if (layer < -1 || layer >= config_.num_layers) {
      fail("forward: tap layer {} is outside [-1, {})", layer, config_.num_layers);
    }
  }
  for (int64_t i = 0; i < run.n; ++i) {
    if (run.tokens[i] < 0 || run.tokens[i] >= embedding_.rows()) {
      fail("forward: token id {} at row {} is outside the vocabulary [0, {})", run.tokens[i], i,
           embedding_.rows());
    }
  }
  if (run.n > 0) state.reserve(state.length() + run.n);
}

void Model::forward(const int32_t* tokens, int64_t n, ModelState& state,
                    const std::vector<int64_t>& logit_rows, const std::vector<int>& tap_layers,
                    ForwardOutput& out) const {
  const SequenceRun run{tokens, n, -1, logit_rows, tap_layers, &out};
  check_state_run(run, state);
  forward_states({run}, {&state});
}

void Model::forward_batch(const std::vector<SequenceRun>& runs, StatePool& pool) const {
  std::vector<ModelState*> states;
  for (size_t r = 0; r < runs.size(); ++r) {
    check_run(runs[r], pool);
    for (size_t other = 0; other < r; ++other) {
      if (runs[other].sequence == runs[r].sequence) {
        fail("forward: two runs of one batch continue sequence {}", runs[r].sequence);
      }
    }
    states.push_back(&pool.state(runs[r].sequence));
  }
  forward_states(runs, states);
}

void Model::forward_states(const std::vector<SequenceRun>& runs,
                           const std::vector<ModelState*>& states) const {
  const int64_t H = config_.hidden_size;
  const int64_t V = vocab_size();
  int64_t total = 0;
  for (const SequenceRun& run : runs) {
    // Every logit row and tap row is written below; resizing keeps a reused output's pages.
    run.out->logits.resize(run.logit_rows.size() * V);
    run.out->taps.resize(run.n * run.tap_layers.size() * H);
    total += run.n;
  }
  if (total == 0) return;
  for (size_t r = 0; r < runs.size(); ++r) {
    if (&states[r]->backend() != &states[0]->backend()) {
      fail("forward: the sequences of one batch live in different backends ({} and {})",
           states[0]->backend().name(), states[r]->backend().name());
    }
  }
  for (size_t r = 0; r < runs.size(); ++r) {
    if (runs[r].n > 0) states[r]->begin_forward(runs[r].n);
  }
  backend::Backend& backend = states[0]->backend();

  // Where a step's rows come from: run `run`, its rows [start, start + span.rows).
  struct StepPart {
    size_t run;
    int64_t start;
  };
  // The residual stream of a step's rows lives in the backend; only the rows a run asks for as
  // taps or logits come back to the host.
  const int64_t chunk = std::min(prefill_chunk_, total);
  const int64_t row_bytes = H * static_cast<int64_t>(sizeof(float));
  backend::Buffer hidden_buffer = backend.allocate(chunk * row_bytes);
  auto capture = [&](int layer, const RowSpan& span, const StepPart& part) {
    const SequenceRun& run = runs[part.run];
    const int64_t n_taps = static_cast<int64_t>(run.tap_layers.size());
    for (int64_t j = 0; j < n_taps; ++j) {
      if (run.tap_layers[j] != layer) continue;
      for (int64_t r = 0; r < span.rows; ++r) {
        backend.download(hidden_buffer, (span.first + r) * row_bytes, row_bytes,
                         run.out->taps.data() + ((part.start + r) * n_taps + j) * H);
      }
    }
  };

  std::vector<int64_t> done_rows(runs.size(), 0);
  std::vector<RowSpan> spans;
  std::vector<StepPart> parts;
  // The logit rows of a step: source row in `hidden`, destination run and logit index.
  struct LogitRow {
    int64_t hidden_row;
    size_t run;
    size_t index;
  };
  std::vector<LogitRow> wanted;
  std::vector<float> gathered, step_logits;
  for (int64_t done = 0; done < total;) {
    const backend::ComputeSection section(backend);
    float* hidden = hidden_buffer.as<float>();
    spans.clear();
    parts.clear();
    int64_t step_rows = 0;
    for (size_t r = 0; r < runs.size() && step_rows < chunk; ++r) {
      const int64_t take = std::min(runs[r].n - done_rows[r], chunk - step_rows);
      if (take == 0) continue;
      spans.push_back({states[r], step_rows, take});
      parts.push_back({r, done_rows[r]});
      embed(runs[r].tokens + done_rows[r], take, hidden + step_rows * H);
      step_rows += take;
    }
    for (size_t s = 0; s < spans.size(); ++s) capture(-1, spans[s], parts[s]);
    for (int64_t layer = 0; layer < config_.num_layers; ++layer) {
      const double start = layer_seconds_ ? now_seconds() : 0.0;
      run_layer(layer, hidden, step_rows, spans);
      if (layer_seconds_) (*layer_seconds_)[layer] += now_seconds() - start;
      for (size_t s = 0; s < spans.size(); ++s) {
        capture(static_cast<int>(layer), spans[s], parts[s]);
      }
    }
    wanted.clear();
    for (size_t s = 0; s < spans.size(); ++s) {
      const std::vector<int64_t>& rows = runs[parts[s].run].logit_rows;
      for (size_t i = 0; i < rows.size(); ++i) {
        const int64_t at = rows[i] - parts[s].start;
        if (at >= 0 && at < spans[s].rows) wanted.push_back({spans[s].first + at, parts[s].run, i});
      }
    }
    if (!wanted.empty()) {
      // One output head over every sequence's rows, so the head is streamed once per step.
      const int64_t k = static_cast<int64_t>(wanted.size());
      gathered.resize(k * H);
      for (int64_t i = 0; i < k; ++i) {
        std::memcpy(gathered.data() + i * H, hidden + wanted[i].hidden_row * H, row_bytes);
      }
      // Rows of one run asked for in order (the usual case) land in place; else through a buffer.
      bool in_place = true;
      for (int64_t i = 1; i < k && in_place; ++i) {
        in_place = wanted[i].run == wanted[0].run && wanted[i].index == wanted[0].index + i;
      }
      if (in_place) {
        compute_logits(gathered.data(), k,
                       runs[wanted[0].run].out->logits.data() + wanted[0].index * V);
      } else {
        step_logits.resize(k * V);
        compute_logits(gathered.data(), k, step_logits.data());
        for (int64_t i = 0; i < k; ++i) {
          std::memcpy(runs[wanted[i].run].out->logits.data() + wanted[i].index * V,
                      step_logits.data() + i * V, V * sizeof(float));
        }
      }
    }
    for (size_t s = 0; s < spans.size(); ++s) {
      spans[s].state->advance(spans[s].rows);
      done_rows[parts[s].run] += spans[s].rows;
    }
    done += step_rows;
    if (prefill_progress_ != nullptr && total > chunk) (*prefill_progress_)(done, total);
  }
  for (size_t r = 0; r < runs.size(); ++r) {
    if (runs[r].n > 0) states[r]->end_forward();
  }
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
