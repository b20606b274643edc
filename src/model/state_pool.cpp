#include "model/state_pool.h"

#include <utility>

#include "base/error.h"

namespace dspark {

StatePool::StatePool(const StateLayout& layout, int capacity) : layout_(layout) {
  if (capacity < 1) fail("state pool: capacity {} is not a positive number of sequences", capacity);
  states_.resize(capacity);
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
    states_[id] = ModelState(layout_);
    open_[id] = 1;
    return static_cast<SequenceId>(id);
  }
  fail("state pool: all {} sequences are in use", capacity());
}

void StatePool::close(SequenceId sequence) {
  get(sequence);
  states_[sequence] = ModelState();
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

int64_t StatePool::bytes(SequenceId sequence) const {
  return get(sequence).bytes();
}

int64_t StatePool::bytes() const {
  int64_t total = 0;
  for (SequenceId id = 0; id < capacity(); ++id) {
    if (open_[id]) total += states_[id].bytes();
  }
  return total;
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
