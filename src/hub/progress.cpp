#include "hub/progress.h"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>

namespace dspark {
namespace {

constexpr auto kBarInterval = std::chrono::milliseconds(100);
constexpr auto kLineInterval = std::chrono::seconds(15);
constexpr int kBarWidth = 30;

}  // namespace

std::string human_bytes(int64_t bytes) {
  const double value = static_cast<double>(bytes);
  if (bytes >= 1000LL * 1000 * 1000) return fmt::format("{:.2f} GB", value / 1e9);
  if (bytes >= 1000LL * 1000) return fmt::format("{:.1f} MB", value / 1e6);
  if (bytes >= 1000) return fmt::format("{:.1f} kB", value / 1e3);
  return fmt::format("{} B", bytes);
}

DownloadProgress::Style DownloadProgress::style_for_stderr() {
  return ::isatty(STDERR_FILENO) ? Style::kBar : Style::kLines;
}

DownloadProgress::DownloadProgress(Style style, std::string label, int64_t total_bytes,
                                   int total_files)
    : style_(style),
      label_(std::move(label)),
      total_bytes_(total_bytes),
      total_files_(total_files),
      last_draw_(start_) {}

void DownloadProgress::add_bytes(int64_t bytes) {
  std::lock_guard<std::mutex> lock(mutex_);
  done_bytes_ += bytes;
  draw_locked(false);
}

void DownloadProgress::add_resumed_bytes(int64_t bytes) {
  std::lock_guard<std::mutex> lock(mutex_);
  done_bytes_ += bytes;
  start_bytes_ += bytes;
}

void DownloadProgress::remove_bytes(int64_t bytes) {
  std::lock_guard<std::mutex> lock(mutex_);
  done_bytes_ -= bytes;
  start_bytes_ = std::min(start_bytes_, done_bytes_);
}

void DownloadProgress::file_done(const std::string& path, int64_t size) {
  std::lock_guard<std::mutex> lock(mutex_);
  ++done_files_;
  if (style_ == Style::kLines) {
    std::fprintf(stderr, "%s: %s (%s) [%d/%d files]\n", label_.c_str(), path.c_str(),
                 human_bytes(size).c_str(), done_files_, total_files_);
  } else {
    draw_locked(true);
  }
}

void DownloadProgress::note(const std::string& line) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (style_ == Style::kNone) return;
  clear_bar_locked();
  std::fprintf(stderr, "%s: %s\n", label_.c_str(), line.c_str());
  draw_locked(true);
}

void DownloadProgress::finish() {
  std::lock_guard<std::mutex> lock(mutex_);
  if (style_ == Style::kBar) {
    draw_locked(true);
    if (bar_visible_) std::fputc('\n', stderr);
    bar_visible_ = false;
  }
}

void DownloadProgress::clear_bar_locked() {
  if (bar_visible_) std::fputs("\r\033[K", stderr);
  bar_visible_ = false;
}

void DownloadProgress::draw_locked(bool force) {
  if (style_ == Style::kNone) return;
  const auto now = Clock::now();
  if (!force && now - last_draw_ < (style_ == Style::kBar ? kBarInterval : kLineInterval)) return;
  if (style_ == Style::kLines && force) return;  // lines mode only prints the periodic summary
  last_draw_ = now;
  const double seconds = std::chrono::duration<double>(now - start_).count();
  const double rate = seconds > 0 ? static_cast<double>(done_bytes_ - start_bytes_) / seconds : 0;
  const double fraction =
      total_bytes_ > 0 ? static_cast<double>(done_bytes_) / static_cast<double>(total_bytes_) : 1;
  const std::string amounts =
      fmt::format("{}/{}  {}/s  {}/{} files", human_bytes(done_bytes_), human_bytes(total_bytes_),
                  human_bytes(static_cast<int64_t>(rate)), done_files_, total_files_);
  if (style_ == Style::kLines) {
    std::fprintf(stderr, "%s: %.0f%% %s\n", label_.c_str(), 100 * fraction, amounts.c_str());
    return;
  }
  const int filled = static_cast<int>(fraction * kBarWidth + 0.5);
  std::string bar(static_cast<size_t>(std::clamp(filled, 0, kBarWidth)), '#');
  bar.resize(kBarWidth, '.');
  std::fprintf(stderr, "\r\033[K%s [%s] %3.0f%% %s", label_.c_str(), bar.c_str(), 100 * fraction,
               amounts.c_str());
  std::fflush(stderr);
  bar_visible_ = true;
}

}  // namespace dspark
