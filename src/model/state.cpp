#include "model/state.h"

#include <algorithm>
#include <cstring>

#include "base/error.h"

namespace dspark {
namespace {

constexpr int64_t kFloat = sizeof(float);

// Per-row float counts of a record's row buffers, in MambaRecord's order (xbc, x, B, C, dt).
struct RecordWidths {
  int64_t xbc, x, bc, dt;
};

RecordWidths record_widths(const StateLayout& layout) {
  const kernels::SsmDims& ssm = layout.ssm;
  return {layout.conv_channels, ssm.heads * ssm.head_dim, ssm.groups * ssm.state_size, ssm.heads};
}

std::vector<std::byte> download_all(const backend::Buffer& buffer) {
  std::vector<std::byte> host(buffer.bytes());
  if (!host.empty()) buffer.backend()->download(buffer, 0, buffer.bytes(), host.data());
  return host;
}

std::vector<float> download_floats(const backend::Buffer& buffer) {
  std::vector<float> host(buffer.bytes() / kFloat);
  if (!host.empty()) buffer.backend()->download(buffer, 0, buffer.bytes(), host.data());
  return host;
}

MambaLayerState duplicate(backend::Backend& backend, const MambaLayerState& layer) {
  return {backend.duplicate(layer.conv, 0, layer.conv.bytes()),
          backend.duplicate(layer.ssm, 0, layer.ssm.bytes())};
}

void copy_into(backend::Backend& backend, const MambaLayerState& from, MambaLayerState& to) {
  backend.copy(from.conv, 0, to.conv, 0, from.conv.bytes());
  backend.copy(from.ssm, 0, to.ssm, 0, from.ssm.bytes());
}

}  // namespace

int64_t StateSnapshot::bytes() const {
  int64_t total = 0;
  for (size_t l = 0; l < keys.size(); ++l) total += keys[l].bytes() + values[l].bytes();
  for (const MambaLayerState& layer : mamba) total += layer.conv.bytes() + layer.ssm.bytes();
  return total;
}

StateContents contents_of(const StateSnapshot& snapshot) {
  StateContents contents;
  contents.length = snapshot.length;
  contents.kv_type = snapshot.kv_type;
  for (size_t l = 0; l < snapshot.keys.size(); ++l) {
    contents.keys.push_back(download_all(snapshot.keys[l]));
    contents.values.push_back(download_all(snapshot.values[l]));
  }
  for (const MambaLayerState& layer : snapshot.mamba) {
    contents.conv.push_back(download_floats(layer.conv));
    contents.ssm.push_back(download_floats(layer.ssm));
  }
  return contents;
}

ModelState::ModelState(const StateLayout& layout, backend::Backend& backend)
    : layout_(layout), backend_(&backend) {
  keys_.resize(layout.attention_layers);
  values_.resize(layout.attention_layers);
  for (int64_t i = 0; i < layout.mamba_layers; ++i) {
    mamba_.push_back({backend.allocate(layout.conv_window() * kFloat),
                      backend.allocate(layout.ssm_size() * kFloat)});
  }
  records_.resize(layout.mamba_layers);
  reset();
}

void ModelState::reset() {
  length_ = 0;
  for (MambaLayerState& layer : mamba_) {
    backend_->fill_zero(layer.conv, 0, layer.conv.bytes());
    backend_->fill_zero(layer.ssm, 0, layer.ssm.bytes());
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
  const int64_t used = length_ * layout_.kv_row_bytes();
  for (auto* caches : {&keys_, &values_}) {
    for (backend::Buffer& cache : *caches) {
      backend::Buffer grown = backend_->allocate(capacity * layout_.kv_row_bytes());
      backend_->copy(cache, 0, grown, 0, used);
      cache = std::move(grown);
    }
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
  const bool grow = rows > record_capacity_;
  if (grow) record_capacity_ = rows;
  const RecordWidths widths = record_widths(layout_);
  for (int64_t i = 0; i < layout_.mamba_layers; ++i) {
    MambaRecord& record = records_[i];
    // Allocated by the first recorded forward: states that never roll back never hold them.
    if (record.before.ssm.empty()) {
      record.before = duplicate(*backend_, mamba_[i]);
    } else {
      copy_into(*backend_, mamba_[i], record.before);
    }
    if (grow) {
      const int64_t row_bytes = record_capacity_ * kFloat;
      record.A = backend_->allocate(layout_.ssm.heads * kFloat);
      record.xbc = backend_->allocate(widths.xbc * row_bytes);
      record.x = backend_->allocate(widths.x * row_bytes);
      record.B = backend_->allocate(widths.bc * row_bytes);
      record.C = backend_->allocate(widths.bc * row_bytes);
      record.dt = backend_->allocate(widths.dt * row_bytes);
    }
  }
}

void ModelState::append_record(int64_t mamba_layer, const MambaRows& rows, int64_t count) {
  MambaRecord& record = records_[mamba_layer];
  const int64_t at = length_ - record_start_;
  const RecordWidths widths = record_widths(layout_);
  const auto put = [&](const backend::Buffer& to, const float* from, int64_t width) {
    std::memcpy(to.as<float>() + at * width, from, count * width * kFloat);
  };
  std::memcpy(record.A.as<float>(), rows.A, layout_.ssm.heads * kFloat);
  put(record.xbc, rows.xbc, widths.xbc);
  put(record.x, rows.x, widths.x);
  put(record.B, rows.B, widths.bc);
  put(record.C, rows.C, widths.bc);
  put(record.dt, rows.dt, widths.dt);
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
    copy_into(*backend_, records_[i].before, mamba_[i]);
  }
  if (keep == 0) return;
  backend::ComputeSection section(*backend_);
  for (int64_t i = 0; i < layout_.mamba_layers; ++i) {
    const MambaRecord& record = records_[i];
    kernels::ssd_sequential(dims, ssm(i), record.x.as<float>(), record.B.as<float>(),
                            record.C.as<float>(), record.dt.as<float>(), record.A.as<float>(),
                            nullptr, keep, nullptr);
    kernels::conv_window_advance(conv(i), record.xbc.as<float>(), keep, layout_.conv_channels,
                                 layout_.conv_kernel);
  }
}

StateSnapshot ModelState::snapshot() const {
  StateSnapshot snapshot;
  snapshot.length = length_;
  snapshot.kv_type = layout_.kv_type;
  const int64_t used = length_ * layout_.kv_row_bytes();
  for (int64_t l = 0; l < layout_.attention_layers; ++l) {
    snapshot.keys.push_back(backend_->duplicate(keys_[l], 0, used));
    snapshot.values.push_back(backend_->duplicate(values_[l], 0, used));
  }
  for (const MambaLayerState& layer : mamba_) snapshot.mamba.push_back(duplicate(*backend_, layer));
  return snapshot;
}

StateContents ModelState::contents() const {
  return contents_of(snapshot());
}

int64_t ModelState::bytes() const {
  int64_t total = 0;
  for (const auto& keys : keys_) total += keys.bytes();
  for (const auto& values : values_) total += values.bytes();
  for (const auto& layer : mamba_) total += layer.conv.bytes() + layer.ssm.bytes();
  for (const auto& r : records_) {
    for (const backend::Buffer* buffer :
         {&r.before.conv, &r.before.ssm, &r.A, &r.xbc, &r.x, &r.B, &r.C, &r.dt}) {
      total += buffer->bytes();
    }
  }
  return total;
}

void ModelState::restore(const StateSnapshot& snapshot) {
  const int64_t used = snapshot.length * layout_.kv_row_bytes();
  bool fits = snapshot.kv_type == layout_.kv_type &&
              static_cast<int64_t>(snapshot.keys.size()) == layout_.attention_layers &&
              static_cast<int64_t>(snapshot.mamba.size()) == layout_.mamba_layers;
  for (size_t l = 0; fits && l < snapshot.keys.size(); ++l) {
    fits = snapshot.keys[l].bytes() == used && snapshot.values[l].bytes() == used &&
           (used == 0 ||
            (snapshot.keys[l].backend() == backend_ && snapshot.values[l].backend() == backend_));
  }
  for (size_t i = 0; fits && i < snapshot.mamba.size(); ++i) {
    fits = snapshot.mamba[i].conv.bytes() == layout_.conv_window() * kFloat &&
           snapshot.mamba[i].ssm.bytes() == layout_.ssm_size() * kFloat &&
           snapshot.mamba[i].ssm.backend() == backend_;
  }
  if (!fits) fail("restore: the snapshot does not fit this state's layout, KV type and backend");
  reserve(snapshot.length);
  for (int64_t l = 0; l < layout_.attention_layers; ++l) {
    backend_->copy(snapshot.keys[l], 0, keys_[l], 0, used);
    backend_->copy(snapshot.values[l], 0, values_[l], 0, used);
  }
  for (int64_t i = 0; i < layout_.mamba_layers; ++i) {
    copy_into(*backend_, snapshot.mamba[i], mamba_[i]);
  }
  length_ = snapshot.length;
  record_valid_ = false;
  recording_active_ = false;
  record_rows_ = 0;
}

}  // namespace dspark
