#pragma once
// The per-sequence state of a model: a KV cache per attention layer and, per Mamba layer, the
// conv window and the SSM state (docs/model-math.md §6).
//
// Storage: conv windows and SSM states are fp32. K/V are f16 under int8 numerics and fp32 under
// fp32 numerics (kernels::kv_cache_type). mlx-lm keeps K/V and the conv window in the activation
// dtype (bf16). f16 halves the bytes a decode step reads from the cache (at 512 tokens of context
// the default model's fp32 cache is a quarter of a step's reads) and the cache's memory (Nemotron
// Nano: 6 instead of 12 KiB per token); fp32 keeps the oracle path equal to an fp32 reference.
// Either way a row is stored before any row reads it, so rows computed together equal rows
// computed one at a time.
//
// Rollback. Attention layers trim by moving the length back. Mamba layers cannot run backwards,
// so a forward with recording on stores, per Mamba layer, the SSM state and conv window before the
// run, the run's pre-conv xBC rows and the post-conv x, B, C and post-softplus dt rows
// (docs/speculative.md §7.2). trim() then rebuilds each Mamba layer by re-running only the
// recurrence over the kept rows, one token at a time with the same kernel that one-token decoding
// uses, so the rebuilt state is bit-identical to the state plain decoding of those tokens reaches.
//
// Memory: every array of a state, its records and its snapshots is a Buffer of the state's
// backend (backend/backend.h). Only the model's layers touch their bytes, inside the compute
// section of a forward or a rollback; everything else moves them with the backend's copies, and
// contents() downloads them for inspection.
#include <cstddef>
#include <cstdint>
#include <vector>

#include "backend/backend.h"
#include "kernels/ops.h"

namespace dspark {

struct StateLayout {
  int64_t attention_layers = 0;
  int64_t kv_heads = 0;
  int64_t head_dim = 0;
  int64_t mamba_layers = 0;
  int64_t conv_channels = 0;
  int64_t conv_kernel = 0;
  kernels::SsmDims ssm;
  int64_t max_context = 0;
  // Not part of the shape: a model runs states of either type.
  kernels::KvType kv_type = kernels::KvType::f32;

  int64_t kv_row() const { return kv_heads * head_dim; }
  int64_t kv_row_bytes() const { return kv_row() * kernels::kv_type_bytes(kv_type); }
  int64_t conv_window() const { return (conv_kernel - 1) * conv_channels; }
  int64_t ssm_size() const { return ssm.heads * ssm.head_dim * ssm.state_size; }
};

struct MambaLayerState {
  backend::Buffer conv;  // floats [conv_kernel - 1, conv_channels], raw xBC rows, oldest first
  backend::Buffer ssm;   // floats [heads, head_dim, state_size]
};

// What one recorded forward fed into one Mamba layer's recurrence, row by row from the record's
// first position; each row buffer holds room for the forward's rows.
struct MambaRecord {
  MambaLayerState before;  // the conv window and SSM state before the run
  backend::Buffer A;       // floats [heads] = -exp(A_log)
  backend::Buffer xbc;     // floats [rows, conv_channels] pre-conv inputs
  backend::Buffer x;       // floats [rows, heads, head_dim] post-conv, post-SiLU
  backend::Buffer B;       // floats [rows, groups, state_size]
  backend::Buffer C;       // floats [rows, groups, state_size]
  backend::Buffer dt;      // floats [rows, heads] after softplus and clamp
};

// A copy of a state's contents (K/V up to its length, in the state's KV type) in the state's
// backend, for prefix caching.
struct StateSnapshot {
  int64_t length = 0;
  kernels::KvType kv_type = kernels::KvType::f32;
  std::vector<backend::Buffer> keys;  // per attention layer, length rows
  std::vector<backend::Buffer> values;
  std::vector<MambaLayerState> mamba;

  // Bytes the snapshot holds.
  int64_t bytes() const;
};

// A state's contents downloaded to host memory, for tests and tools that compare states.
struct StateContents {
  int64_t length = 0;
  kernels::KvType kv_type = kernels::KvType::f32;
  std::vector<std::vector<std::byte>> keys;  // per attention layer, length rows
  std::vector<std::vector<std::byte>> values;
  std::vector<std::vector<float>> conv;  // per Mamba layer
  std::vector<std::vector<float>> ssm;

  bool operator==(const StateContents&) const = default;
};

// The host copy of a snapshot.
StateContents contents_of(const StateSnapshot& snapshot);

class ModelState {
 public:
  ModelState() = default;
  explicit ModelState(const StateLayout& layout,
                      backend::Backend& backend = backend::cpu_backend());

  const StateLayout& layout() const { return layout_; }
  backend::Backend& backend() const { return *backend_; }
  // Tokens processed so far (= positions in every KV cache).
  int64_t length() const { return length_; }
  bool has_recurrent_layers() const { return layout_.mamba_layers > 0; }

  // Back to an empty sequence (zero conv windows and SSM states).
  void reset();

  // Speculative rollback support: while recording is on, every forward of more than one token
  // records its Mamba inputs (replacing the previous record); a one-token forward or a forward
  // with recording off drops the record.
  void set_recording(bool on) { recording_ = on; }
  bool recording() const { return recording_; }
  // The recorded run, if any: positions [record_start, record_start + record_rows).
  bool has_record() const { return record_valid_; }
  int64_t record_start() const { return record_start_; }
  int64_t record_rows() const { return record_rows_; }

  // Moves the sequence back to `new_length` tokens. Attention caches only need the length; Mamba
  // layers are rebuilt from the record of the last forward, which must cover new_length
  // (record_start <= new_length and the record ends at length()). Throws otherwise.
  void trim(int64_t new_length);
  // Rebuilds every Mamba layer to the state after the first `keep` rows of the recorded run
  // (0 <= keep <= record_rows). trim() calls this; it does not change length().
  void rebuild_mamba_to(int64_t keep);

  // A copy in the state's backend.
  StateSnapshot snapshot() const;
  // The contents downloaded to the host.
  StateContents contents() const;
  // Bytes the state holds: its KV capacity, conv windows, SSM states and recording.
  int64_t bytes() const;
  // Throws when the snapshot was taken from a state of another layout, KV type or backend.
  void restore(const StateSnapshot& snapshot);

  // --- used by the model forward ---
  // Makes room for `tokens` positions in every KV cache; throws past max_context.
  void reserve(int64_t tokens);
  // Inside a compute section of the state's backend: the layer's cache, layout().kv_row_bytes()
  // per position, of layout().kv_type, and a Mamba layer's conv window and SSM state.
  std::byte* keys(int64_t attention_layer) { return keys_[attention_layer].data(); }
  std::byte* values(int64_t attention_layer) { return values_[attention_layer].data(); }
  float* conv(int64_t mamba_layer) { return mamba_[mamba_layer].conv.as<float>(); }
  float* ssm(int64_t mamba_layer) { return mamba_[mamba_layer].ssm.as<float>(); }
  // Called once at the start of a forward of `rows` tokens: starts a record (capturing every
  // Mamba layer's state) when recording is on and rows > 1, else drops the record.
  void begin_forward(int64_t rows);
  // True while the current forward is being recorded.
  bool recording_forward() const { return record_valid_ && recording_active_; }
  // Inside a compute section, while recording_forward(): records `rows` rows of a Mamba layer's
  // recurrence inputs at the state's current position (each array row-major, as MambaRecord lists
  // them; A is the layer's [heads]).
  struct MambaRows {
    const float* A;
    const float* xbc;
    const float* x;
    const float* B;
    const float* C;
    const float* dt;
  };
  void append_record(int64_t mamba_layer, const MambaRows& rows, int64_t count);
  // Called after each processed chunk of a forward.
  void advance(int64_t rows);
  // Called at the end of a forward.
  void end_forward();

 private:
  StateLayout layout_;
  backend::Backend* backend_ = nullptr;
  int64_t length_ = 0;
  int64_t capacity_ = 0;
  std::vector<backend::Buffer> keys_;    // per attention layer [capacity, kv_heads, head_dim]
  std::vector<backend::Buffer> values_;  // same
  std::vector<MambaLayerState> mamba_;
  bool recording_ = false;
  bool recording_active_ = false;  // inside a forward that is being recorded
  bool record_valid_ = false;
  int64_t record_start_ = 0;
  int64_t record_rows_ = 0;
  int64_t record_capacity_ = 0;  // rows the records' row buffers hold
  std::vector<MambaRecord> records_;
};

}  // namespace dspark
