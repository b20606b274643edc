#pragma once
// Download progress on stderr: a bar redrawn in place on a terminal, plain lines otherwise (one
// per finished file, plus a periodic summary) so that logs stay readable. Thread-safe.
#include <chrono>
#include <cstdint>
#include <mutex>
#include <string>

namespace dspark {

class DownloadProgress {
 public:
  enum class Style { kNone, kBar, kLines };
  // Style::kBar when stderr is a terminal, else kLines.
  static Style style_for_stderr();

  DownloadProgress(Style style, std::string label, int64_t total_bytes, int total_files);
  void add_bytes(int64_t bytes);
  // Bytes an earlier run left in a partial file: done, but not part of this run's speed.
  void add_resumed_bytes(int64_t bytes);
  // Also used when an interrupted download restarts from scratch.
  void remove_bytes(int64_t bytes);
  void file_done(const std::string& path, int64_t size);
  void note(const std::string& line);
  void finish();

 private:
  void draw_locked(bool force);
  void clear_bar_locked();

  using Clock = std::chrono::steady_clock;
  Style style_;
  std::string label_;
  int64_t total_bytes_;
  int total_files_;
  int64_t done_bytes_ = 0;
  int64_t start_bytes_ = 0;
  int done_files_ = 0;
  Clock::time_point start_ = Clock::now();
  Clock::time_point last_draw_{};
  bool bar_visible_ = false;
  std::mutex mutex_;
};

std::string human_bytes(int64_t bytes);

}  // namespace dspark
