#include "model/state_pool.h"

#include <algorithm>
#include <utility>

#include "base/error.h"

namespace dspark {

StatePool::StatePool(const StateLayout& layout, int capacity, backend::Backend& backend)
    : layout_(layout), backend_(&backend) {
  if (capacity < 1) fail("state pool: capacity {} is not a positive number of sequences", capacity);
  states_.resize(capacity);
  attachments_.resize(capacity);
  open_.assign(capacity, 0);
}

int StatePool::open_count() const {
  int count = 0;
  for (uint8_t open : open_) count += open;
  return count;
}

SequenceId StatePool::open() {
  for (size_t id = 0; id < open_.size(); ++id) {
    if (open_[id]) continue;
    states_[id] = ModelState(layout_, *backend_);
    open_[id] = 1;
    return static_cast<SequenceId>(id);
  }
  fail("state pool: all {} sequences are in use", capacity());
}

void StatePool::close(SequenceId sequence) {
  get(sequence);
  states_[sequence] = ModelState();
  attachments_[sequence].clear();
  open_[sequence] = 0;
}

bool StatePool::is_open(SequenceId sequence) const {
  return sequence >= 0 && sequence < capacity() && open_[sequence];
}

ModelState& StatePool::get(SequenceId sequence) {
  return const_cast<ModelState&>(std::as_const(*this).get(sequence));
}

const ModelState& StatePool::get(SequenceId sequence) const {
  if (!is_open(sequence)) {
    fail("state pool: sequence {} is not open (capacity {})", sequence, capacity());
  }
  return states_[sequence];
}

void StatePool::trim(SequenceId sequence, int64_t new_length) {
  get(sequence).trim(new_length);
  for (auto& [owner, attachment] : attachments_[sequence]) attachment->truncate(new_length);
}

void StatePool::restore(SequenceId sequence, const StateSnapshot& snapshot) {
  get(sequence).restore(snapshot);
  for (auto& [owner, attachment] : attachments_[sequence]) attachment->truncate(snapshot.length);
}

int64_t StatePool::bytes(SequenceId sequence) const {
  int64_t total = get(sequence).bytes();
  for (const auto& [owner, attachment] : attachments_[sequence]) total += attachment->bytes();
  return total;
}

int64_t StatePool::bytes() const {
  int64_t total = 0;
  for (SequenceId id = 0; id < capacity(); ++id) {
    if (open_[id]) total += bytes(id);
  }
  return total;
}

SequenceAttachment* StatePool::attachment(SequenceId sequence, const void* owner) const {
  get(sequence);
  for (const auto& [key, attachment] : attachments_[sequence]) {
    if (key == owner) return attachment.get();
  }
  return nullptr;
}

void StatePool::attach(SequenceId sequence, const void* owner,
                       std::unique_ptr<SequenceAttachment> attachment) {
  get(sequence);
  for (auto& [key, held] : attachments_[sequence]) {
    if (key == owner) {
      held = std::move(attachment);
      return;
    }
  }
  attachments_[sequence].emplace_back(owner, std::move(attachment));
}

int64_t StatePool::attached_rows(SequenceId sequence) const {
  int64_t rows = get(sequence).length();
  for (const auto& [owner, attachment] : attachments_[sequence]) {
    rows = std::min(rows, attachment->rows());
  }
  return rows;
}

OwnedSequence& OwnedSequence::operator=(OwnedSequence&& other) noexcept {
  if (this != &other) {
    reset();
    pool_ = std::exchange(other.pool_, nullptr);
    id_ = std::exchange(other.id_, -1);
  }
  return *this;
}

void OwnedSequence::reset() {
  if (pool_ != nullptr) pool_->close(id_);
  pool_ = nullptr;
  id_ = -1;
}

}  // namespace dspark
