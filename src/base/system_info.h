#pragma once
// Facts about the running machine: CPU features, memory, peak RSS, monotonic time.
#include <cstdint>
#include <string>

namespace dspark {

struct CpuFeatures {
  bool avx2 = false;
  bool avxvnni = false;  // AVX-VNNI: VEX-encoded vpdpbusd / vpdpwssd on 128/256-bit vectors
  bool fma = false;
  bool f16c = false;
  bool avx512f = false;
  bool avx512bw = false;
  bool avx512vl = false;
  bool avx512dq = false;
  bool avx512vnni = false;
  bool avx512bf16 = false;
  bool clflushopt = false;  // a cache-line flush ordered only by fences, so flushes overlap
  std::string model_name;
};

const CpuFeatures& cpu_features();

// Peak resident set size of this process in bytes (VmHWM).
int64_t peak_rss_bytes();
// Current resident set size in bytes (VmRSS).
int64_t current_rss_bytes();
// Total and available physical memory in bytes (MemTotal, MemAvailable).
int64_t total_memory_bytes();
int64_t available_memory_bytes();

// Seconds on a monotonic clock.
double now_seconds();

}  // namespace dspark
