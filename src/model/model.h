#pragma once
// The one model interface everything above the model layer uses: load a checkpoint, make a
// state, run a forward over new tokens on top of that state, get fp32 logits for chosen rows and
// the residual stream ("taps") after chosen layers. Architectures (nemotron_h.cpp, dense.cpp)
// implement one layer at a time; this base class owns the embedding, the final norm, the output
// head and the chunking of long runs.
//
// Numerics: activations, norms, attention, the SSM and the router are fp32; weights are read in
// their stored type (bf16 / f16 / f32 or MLX affine quantized) and accumulated in fp32. Matching
// mlx-lm is checked against mlx-lm running the same checkpoint in float32.
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "formats/checkpoint.h"
#include "model/state.h"
#include "model/state_pool.h"
#include "model/weights.h"

namespace dspark {

struct ModelConfig {
  std::string architecture;  // config.json model_type
  int64_t vocab_size = 0;    // rows of the output head
  int64_t num_layers = 0;
  int64_t hidden_size = 0;
  int64_t max_context = 0;  // max_position_embeddings
  // One character per layer: nemotron_h's M, *, E, - ; 'T' for a dense transformer block.
  std::string layer_kinds;
};

struct ForwardOutput {
  // [logit_rows.size(), vocab_size]: row i holds the logits of run row logit_rows[i].
  std::vector<float> logits;
  // [n, tap_layers.size(), hidden_size]: for each run row, the residual stream after each
  // requested layer, in the order requested (layer -1 = the embedding output).
  std::vector<float> taps;
};

// How often each routed expert was chosen, per layer: the spread that decides how many expert bytes
// a run of tokens touches (a router that always picks the same experts understates MoE cost).
struct RoutingCounts {
  // [layer][expert] rows routed to the expert; empty for layers without a router.
  std::vector<std::vector<int64_t>> chosen;
  // [layer] rows the layer routed (each to top_k experts).
  std::vector<int64_t> rows;

  // ids: [n, top_k] expert ids of n rows.
  void record(int64_t layer, int64_t experts, const int32_t* ids, int64_t n, int64_t top_k);
  // Per routed layer, how many distinct experts were chosen at least once.
  std::vector<int64_t> distinct_per_layer() const;
};

// One sequence's part of a batched forward (Model::forward_batch): its new tokens, the pool
// sequence they continue (at positions length() .. length() + n - 1), and what to return, as in
// Model::forward.
struct SequenceRun {
  const int32_t* tokens = nullptr;
  int64_t n = 0;
  SequenceId sequence = -1;
  std::vector<int64_t> logit_rows;
  std::vector<int> tap_layers;
  ForwardOutput* out = nullptr;
};

// The rows of one sequence inside the rows a layer runs: rows [first, first + rows) of the hidden
// buffer continue `state`, at positions state->length() ...
struct RowSpan {
  ModelState* state = nullptr;
  int64_t first = 0;
  int64_t rows = 0;
};

class Model {
 public:
  virtual ~Model() = default;
  Model(const Model&) = delete;
  Model& operator=(const Model&) = delete;

  const ModelConfig& config() const { return config_; }
  const std::string& architecture() const { return config_.architecture; }
  int64_t vocab_size() const { return config_.vocab_size; }
  int64_t num_layers() const { return config_.num_layers; }
  int64_t hidden_size() const { return config_.hidden_size; }
  int64_t max_context() const { return config_.max_context; }
  const Checkpoint& checkpoint() const { return *checkpoint_; }

  // An empty state for one sequence outside any pool (tools, calibration, tests), in `backend`'s
  // memory.
  ModelState new_state(backend::Backend& backend = backend::cpu_backend()) const {
    return ModelState(state_layout(), backend);
  }
  // A pool for up to `capacity` sequences at once, their states in `backend`'s memory.
  StatePool new_pool(int capacity, backend::Backend& backend = backend::cpu_backend()) const {
    return StatePool(state_layout(), capacity, backend);
  }
  virtual StateLayout state_layout() const = 0;

  // Runs the n tokens after the state's current contents (positions state.length() ..
  // state.length() + n - 1) and advances the state. logit_rows are row indices within this run
  // (any order, repeats allowed); tap_layers are layer indices in [-1, num_layers). Long runs are
  // processed in chunks of prefill_chunk() tokens, so memory stays bounded: logits are only ever
  // computed for the requested rows. Forwards must not run concurrently: they share the kernels'
  // thread pool.
  void forward(const int32_t* tokens, int64_t n, ModelState& state,
               const std::vector<int64_t>& logit_rows, const std::vector<int>& tap_layers,
               ForwardOutput& out) const;
  // The forwards of several sequences of `pool` as one: every layer's matrices run once over all
  // their rows (the weights are streamed once per step, not once per sequence), while attention
  // and the Mamba recurrence run per sequence on its own state. Every row's result is
  // bit-identical to the sequence's own forward, whatever the other runs are (the kernels are row
  // invariant). Each run is checked (check_run) before any state changes; the sequences must be
  // distinct. Steps hold at most prefill_chunk() rows in all, taken from the runs in order. The
  // layers run inside a compute section of the pool's backend per step; what leaves the forward
  // is the runs' host outputs.
  void forward_batch(const std::vector<SequenceRun>& runs, StatePool& pool) const;
  // Throws naming the fault unless `run` fits this model and pool: an open sequence of a pool
  // whose layout this model made, logit rows inside the run, tap layers in [-1, num_layers),
  // token ids in the vocabulary, and room in the context. Makes room in the sequence's caches.
  void check_run(const SequenceRun& run, StatePool& pool) const;

  // The embedding rows of n tokens: out [n, hidden_size].
  void embed(const int32_t* tokens, int64_t n, float* out) const;
  // The final norm of rows of the residual stream: out [rows, hidden_size] (may alias residual).
  void final_norm(const float* residual, int64_t rows, float* out) const;
  // The output head on normed rows: logits [rows, vocab_size].
  void apply_lm_head(const float* normed, int64_t rows, float* logits) const;
  // final_norm then apply_lm_head.
  void compute_logits(const float* residual, int64_t rows, float* logits) const;
  // The output projection (for tied models, the embedding table); drafters share it.
  const LinearWeights& lm_head() const { return tied_ ? embedding_ : lm_head_; }
  const LinearWeights& embeddings() const { return embedding_; }
  const std::vector<float>& final_norm_weight() const { return final_norm_; }
  float norm_eps() const { return norm_eps_; }

  int64_t prefill_chunk() const { return prefill_chunk_; }
  void set_prefill_chunk(int64_t tokens);

  // Bytes of weights one decode step streams: every matrix once, routed experts top_k times,
  // one embedding row. The sum of the parts below.
  int64_t decode_weight_bytes() const;
  // The share of one layer, and of the embedding row, final norm and output head.
  virtual int64_t layer_decode_weight_bytes(int64_t layer) const = 0;
  int64_t shared_decode_weight_bytes() const;
  // Bytes of one routed expert of `layer` (0 where the layer routes none).
  virtual int64_t routed_expert_bytes(int64_t /*layer*/) const { return 0; }
  // Bytes of weights a forward of `rows` rows streams, given the experts its routed layers chose
  // (`routing`, recorded over that forward alone): decode_weight_bytes with each routed layer's
  // top_k experts replaced by the union of the rows' experts, and one embedding row per row
  // (docs/performance.md §4).
  int64_t forward_weight_bytes(const RoutingCounts& routing, int64_t rows) const;

  // When set, forward adds each layer's wall time (seconds) to (*seconds)[layer]; for benchmarks.
  void set_layer_timing(std::vector<double>* seconds) const { layer_seconds_ = seconds; }
  // When set, every routed layer adds its choices to *counts; for checking checkpoints' routers.
  void set_routing_counts(RoutingCounts* counts) const { routing_counts_ = counts; }
  // When set, a forward longer than one prefill chunk calls (*progress)(rows done, rows) after
  // each chunk; for progress lines of long prompts.
  using PrefillProgress = std::function<void(int64_t done, int64_t rows)>;
  void set_prefill_progress(const PrefillProgress* progress) const { prefill_progress_ = progress; }

 protected:
  explicit Model(std::unique_ptr<Checkpoint> checkpoint);

  // Runs layer `layer` on the residual stream hidden [n, hidden_size] in place (pre-norm, mixer,
  // residual add). `spans` cut the n rows into sequences, each continuing its own state.
  virtual void run_layer(int64_t layer, float* hidden, int64_t n,
                         const std::vector<RowSpan>& spans) const = 0;

  std::unique_ptr<Checkpoint> checkpoint_;
  ModelConfig config_;
  LinearWeights embedding_;
  LinearWeights lm_head_;  // unused when tied_
  bool tied_ = false;
  std::vector<float> final_norm_;
  float norm_eps_ = 1e-5f;
  mutable RoutingCounts* routing_counts_ = nullptr;

 private:
  // forward_batch over the states the runs continue (states[i] for runs[i]; runs[i].sequence is
  // not read), after check_state_run of each.
  void forward_states(const std::vector<SequenceRun>& runs,
                      const std::vector<ModelState*>& states) const;
  void check_state_run(const SequenceRun& run, ModelState& state) const;

  int64_t prefill_chunk_ = 2048;
  mutable std::vector<double>* layer_seconds_ = nullptr;
  mutable const PrefillProgress* prefill_progress_ = nullptr;
};

// Opens a checkpoint directory and builds the model its config.json model_type names
// ("nemotron_h", "llama", "qwen2", "qwen3").
std::unique_ptr<Model> load_model(const std::string& checkpoint_dir);

// Weight bytes streamed when `experts` experts of the matrix are read once.
int64_t linear_bytes(const LinearWeights& linear, int64_t experts = 1);

}  // namespace dspark
