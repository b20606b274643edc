#pragma once
// The states of every sequence one model runs, addressed by sequence id: the per-sequence KV
// caches, conv windows, SSM states and the recordings that roll them back (model/state.h). The
// batched forward (Model::forward_batch) takes a pool and runs that name sequence ids, and the
// layers above the model (the decoders, the server's slots, its prefix cache) hold ids and ask the
// pool for lengths, trims and snapshots. Every state lives in the pool's backend's memory
// (backend/backend.h), which only the model's layers read, so a device backend keeps the same ids
// and operations with its states in device memory (docs/architecture.md, "State pool").
//
// Ids are slot indices in [0, capacity), reused after close. The pool allocates a sequence's KV
// as the sequence grows (ModelState::reserve), so capacity bounds how many sequences exist at
// once, not memory up front; bytes() reports what they hold.
#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "model/state.h"

namespace dspark {

using SequenceId = int32_t;

// Per-sequence data of another module that lives and dies with the sequence: a drafter's context
// of the target rows it consumed. Trimming or restoring the sequence cuts it to the same rows, so
// a prefix-cache hit resumes it with exactly the rows the state keeps.
class SequenceAttachment {
 public:
  virtual ~SequenceAttachment() = default;
  // Target rows it holds.
  virtual int64_t rows() const = 0;
  // Keeps the first `rows` rows; nothing to do when it holds no more.
  virtual void truncate(int64_t rows) = 0;
  virtual int64_t bytes() const = 0;
};

class StatePool {
 public:
  // States in `backend`'s memory.
  StatePool(const StateLayout& layout, int capacity,
            backend::Backend& backend = backend::cpu_backend());

  const StateLayout& layout() const { return layout_; }
  backend::Backend& backend() const { return *backend_; }
  int capacity() const { return static_cast<int>(states_.size()); }
  int open_count() const;

  // An empty sequence; throws naming the capacity when every id is in use.
  SequenceId open();
  // Frees the sequence and its memory; the id may be handed out again.
  void close(SequenceId sequence);
  bool is_open(SequenceId sequence) const;

  // Tokens the sequence holds.
  int64_t length(SequenceId sequence) const { return get(sequence).length(); }
  // Rolls back to `new_length` tokens (ModelState::trim: Mamba layers need a recorded forward),
  // the attachments with it.
  void trim(SequenceId sequence, int64_t new_length);
  // While on, every forward of more than one row records what a trim needs.
  void set_recording(SequenceId sequence, bool on) { get(sequence).set_recording(on); }
  StateSnapshot snapshot(SequenceId sequence) const { return get(sequence).snapshot(); }
  // The sequence's state downloaded to the host (for comparisons).
  StateContents contents(SequenceId sequence) const { return get(sequence).contents(); }
  // Sets the state to `snapshot` and cuts the attachments to its length.
  void restore(SequenceId sequence, const StateSnapshot& snapshot);
  // Bytes the sequence holds (its KV capacity, conv windows, SSM states, recording, attachments).
  int64_t bytes(SequenceId sequence) const;

  // The sequence's attachment under `owner` (an identity, such as a drafter head); null if none.
  SequenceAttachment* attachment(SequenceId sequence, const void* owner) const;
  // Gives the sequence an attachment under `owner`, replacing any it had there.
  void attach(SequenceId sequence, const void* owner,
              std::unique_ptr<SequenceAttachment> attachment);
  // The fewest rows an attachment of the sequence holds (its length when it has none): how much
  // of it a later generation can resume with every attachment complete.
  int64_t attached_rows(SequenceId sequence) const;
  // Bytes every open sequence holds.
  int64_t bytes() const;

  // A sequence's state, for the model's forward (whose layers reach its memory inside a compute
  // section) and for checks of it.
  ModelState& state(SequenceId sequence) { return get(sequence); }
  const ModelState& state(SequenceId sequence) const { return get(sequence); }

 private:
  ModelState& get(SequenceId sequence);
  const ModelState& get(SequenceId sequence) const;

  StateLayout layout_;
  backend::Backend* backend_;
  std::vector<ModelState> states_;  // [capacity]; an entry holds no memory while closed
  using Attachments = std::vector<std::pair<const void*, std::unique_ptr<SequenceAttachment>>>;
  std::vector<Attachments> attachments_;  // [capacity]
  // Bytes, not std::vector<bool>: the server reads a cached sequence's entry while its step
  // thread opens and closes others, and distinct bytes are distinct memory locations.
  std::vector<uint8_t> open_;
};

// One open sequence of a pool, closed when this is destroyed (unless released): what a slot or a
// prefix-cache entry owns, so that no path that drops one (an error, an eviction) leaks an id.
class OwnedSequence {
 public:
  OwnedSequence() = default;
  explicit OwnedSequence(StatePool& pool) : pool_(&pool), id_(pool.open()) {}
  OwnedSequence(OwnedSequence&& other) noexcept { *this = std::move(other); }
  OwnedSequence& operator=(OwnedSequence&& other) noexcept;
  OwnedSequence(const OwnedSequence&) = delete;
  OwnedSequence& operator=(const OwnedSequence&) = delete;
  ~OwnedSequence() { reset(); }

  explicit operator bool() const { return pool_ != nullptr; }
  StatePool& pool() const { return *pool_; }
  SequenceId id() const { return id_; }
  // Closes the sequence now.
  void reset();

 private:
  StatePool* pool_ = nullptr;
  SequenceId id_ = -1;
};

}  // namespace dspark
