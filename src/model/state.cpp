#include "model/state.h"

#include <algorithm>

#include "base/error.h"

namespace dspark {

ModelState::ModelState(const StateLayout& layout) : layout_(layout) {
  keys_.resize(layout.attention_layers);
  values_.resize(layout.attention_layers);
  mamba_.resize(layout.mamba_layers);
  records_.resize(layout.mamba_layers);
  reset();
}

void ModelState::reset() {
  length_ = 0;
  for (auto& layer : mamba_) {
    layer.conv.assign(layout_.conv_window(), 0.0f);
    layer.ssm.assign(layout_.ssm_size(), 0.0f);
  }
  record_valid_ = false;
  recording_active_ = false;
  record_rows_ = 0;
}

void ModelState::reserve(int64_t tokens) {
  if (layout_.max_context > 0 && tokens > layout_.max_context) {
    fail("context of {} tokens exceeds the model's maximum of {}", tokens, layout_.max_context);
  }
  if (tokens <= capacity_) return;
  int64_t capacity = std::max<int64_t>(tokens, capacity_ + capacity_ / 2);
  if (layout_.max_context > 0) capacity = std::min(capacity, layout_.max_context);
  for (int64_t l = 0; l < layout_.attention_layers; ++l) {
    keys_[l].resize(capacity * layout_.kv_row_bytes());
    values_[l].resize(capacity * layout_.kv_row_bytes());
  }
  capacity_ = capacity;
}

void ModelState::begin_forward(int64_t rows) {
  record_valid_ = false;
  record_rows_ = 0;
  recording_active_ = recording_ && rows > 1 && layout_.mamba_layers > 0;
  if (!recording_active_) return;
  record_valid_ = true;
  record_start_ = length_;
  for (int64_t i = 0; i < layout_.mamba_layers; ++i) {
    MambaRecord& record = records_[i];
    record.ssm_before = mamba_[i].ssm;
    record.conv_before = mamba_[i].conv;
    record.A.clear();
    record.xbc.clear();
    record.x.clear();
    record.B.clear();
    record.C.clear();
    record.dt.clear();
  }
}

void ModelState::advance(int64_t rows) {
  length_ += rows;
  if (recording_active_) record_rows_ += rows;
}

void ModelState::end_forward() {
  recording_active_ = false;
}

void ModelState::trim(int64_t new_length) {
  if (new_length < 0 || new_length > length_) {
    fail("cannot trim a state of {} tokens to {}", length_, new_length);
  }
  if (new_length == length_) return;
  if (layout_.mamba_layers > 0) {
    if (!record_valid_ || new_length < record_start_ || record_start_ + record_rows_ != length_) {
      fail(
          "cannot trim the recurrent (Mamba) state from {} to {} tokens: only a recorded "
          "forward can be rolled back ({})",
          length_, new_length,
          record_valid_ ? fmt::format("the record covers positions [{}, {})", record_start_,
                                      record_start_ + record_rows_)
                        : std::string("no record: enable recording before the forward"));
    }
    rebuild_mamba_to(new_length - record_start_);
  }
  length_ = new_length;
  record_valid_ = false;
}

void ModelState::rebuild_mamba_to(int64_t keep) {
  if (!record_valid_) fail("rebuild_mamba_to({}): no recorded forward", keep);
  if (keep < 0 || keep > record_rows_) {
    fail("rebuild_mamba_to({}): the record holds {} rows", keep, record_rows_);
  }
  const kernels::SsmDims& dims = layout_.ssm;
  for (int64_t i = 0; i < layout_.mamba_layers; ++i) {
    const MambaRecord& record = records_[i];
    MambaLayerState& layer = mamba_[i];
    layer.ssm = record.ssm_before;
    layer.conv = record.conv_before;
    if (keep == 0) continue;
    kernels::ssd_sequential(dims, layer.ssm.data(), record.x.data(), record.B.data(),
                            record.C.data(), record.dt.data(), record.A.data(), nullptr, keep,
                            nullptr);
    kernels::conv_window_advance(layer.conv.data(), record.xbc.data(), keep, layout_.conv_channels,
                                 layout_.conv_kernel);
  }
}

StateSnapshot ModelState::snapshot() const {
  StateSnapshot snapshot;
  snapshot.length = length_;
  snapshot.kv_type = layout_.kv_type;
  const int64_t used = length_ * layout_.kv_row_bytes();
  for (int64_t l = 0; l < layout_.attention_layers; ++l) {
    snapshot.keys.emplace_back(keys_[l].begin(), keys_[l].begin() + used);
    snapshot.values.emplace_back(values_[l].begin(), values_[l].begin() + used);
  }
  snapshot.mamba = mamba_;
  return snapshot;
}

int64_t ModelState::bytes() const {
  size_t kv_bytes = 0;
  for (const auto& keys : keys_) kv_bytes += keys.capacity();
  for (const auto& values : values_) kv_bytes += values.capacity();
  size_t floats = 0;
  for (const auto& layer : mamba_) floats += layer.conv.capacity() + layer.ssm.capacity();
  for (const auto& r : records_) {
    floats += r.ssm_before.capacity() + r.conv_before.capacity() + r.A.capacity() +
              r.xbc.capacity() + r.x.capacity() + r.B.capacity() + r.C.capacity() + r.dt.capacity();
  }
  return static_cast<int64_t>(kv_bytes + floats * sizeof(float));
}

void ModelState::restore(const StateSnapshot& snapshot) {
  const int64_t used = snapshot.length * layout_.kv_row_bytes();
  bool fits = snapshot.kv_type == layout_.kv_type &&
              static_cast<int64_t>(snapshot.keys.size()) == layout_.attention_layers &&
              static_cast<int64_t>(snapshot.mamba.size()) == layout_.mamba_layers;
  for (size_t l = 0; fits && l < snapshot.keys.size(); ++l) {
    fits = static_cast<int64_t>(snapshot.keys[l].size()) == used &&
           static_cast<int64_t>(snapshot.values[l].size()) == used;
  }
  for (size_t i = 0; fits && i < snapshot.mamba.size(); ++i) {
    fits = static_cast<int64_t>(snapshot.mamba[i].conv.size()) == layout_.conv_window() &&
           static_cast<int64_t>(snapshot.mamba[i].ssm.size()) == layout_.ssm_size();
  }
  if (!fits) fail("restore: the snapshot does not fit this state's layout and KV type");
  reserve(snapshot.length);
  for (int64_t l = 0; l < layout_.attention_layers; ++l) {
    std::copy(snapshot.keys[l].begin(), snapshot.keys[l].end(), keys_[l].begin());
    std::copy(snapshot.values[l].begin(), snapshot.values[l].end(), values_[l].begin());
  }
  mamba_ = snapshot.mamba;
  length_ = snapshot.length;
  record_valid_ = false;
  recording_active_ = false;
  record_rows_ = 0;
}

}  // namespace dspark
