#include "base/system_info.h"

#include <cpuid.h>

#include <chrono>
#include <fstream>
#include <sstream>

namespace dspark {
namespace {

CpuFeatures detect_cpu_features() {
  CpuFeatures features;
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  if (__get_cpuid(1, &eax, &ebx, &ecx, &edx)) {
    features.fma = (ecx >> 12) & 1;
    features.f16c = (ecx >> 29) & 1;
  }
  const bool os_saves_ymm = [] {
    unsigned a = 0, b = 0, c = 0, d = 0;
    if (!__get_cpuid(1, &a, &b, &c, &d) || !((c >> 27) & 1)) return false;
    unsigned xcr0_low = 0, xcr0_high = 0;
    __asm__ volatile("xgetbv" : "=a"(xcr0_low), "=d"(xcr0_high) : "c"(0));
    return (xcr0_low & 0x6) == 0x6;
  }();
  unsigned xcr0_low = 0, xcr0_high = 0;
  if (os_saves_ymm) __asm__ volatile("xgetbv" : "=a"(xcr0_low), "=d"(xcr0_high) : "c"(0));
  const bool os_saves_zmm = os_saves_ymm && (xcr0_low & 0xE6) == 0xE6;
  if (__get_cpuid_count(7, 0, &eax, &ebx, &ecx, &edx)) {
    features.avx2 = os_saves_ymm && ((ebx >> 5) & 1);
    features.avx512f = os_saves_zmm && ((ebx >> 16) & 1);
    features.avx512dq = os_saves_zmm && ((ebx >> 17) & 1);
    features.avx512bw = os_saves_zmm && ((ebx >> 30) & 1);
    features.avx512vl = os_saves_zmm && ((ebx >> 31) & 1);
    features.avx512vnni = os_saves_zmm && ((ecx >> 11) & 1);
    features.clflushopt = (ebx >> 23) & 1;
  }
  if (__get_cpuid_count(7, 1, &eax, &ebx, &ecx, &edx)) {
    features.avxvnni = os_saves_ymm && ((eax >> 4) & 1);
    features.avx512bf16 = os_saves_zmm && ((eax >> 5) & 1);
  }
  std::ifstream cpuinfo("/proc/cpuinfo");
  for (std::string line; std::getline(cpuinfo, line);) {
    if (line.rfind("model name", 0) == 0) {
      auto colon = line.find(':');
      if (colon != std::string::npos) features.model_name = line.substr(colon + 2);
      break;
    }
  }
  return features;
}

int64_t read_kib_field(const char* file, const std::string& key) {
  std::ifstream in(file);
  for (std::string line; std::getline(in, line);) {
    if (line.rfind(key, 0) == 0) {
      std::istringstream fields(line.substr(key.size()));
      int64_t kib = 0;
      fields >> kib;
      return kib * 1024;
    }
  }
  return 0;
}

}  // namespace

const CpuFeatures& cpu_features() {
  static const CpuFeatures features = detect_cpu_features();
  return features;
}

int64_t peak_rss_bytes() {
  return read_kib_field("/proc/self/status", "VmHWM:");
}
int64_t current_rss_bytes() {
  return read_kib_field("/proc/self/status", "VmRSS:");
}
int64_t total_memory_bytes() {
  return read_kib_field("/proc/meminfo", "MemTotal:");
}
int64_t available_memory_bytes() {
  return read_kib_field("/proc/meminfo", "MemAvailable:");
}

double now_seconds() {
  using clock = std::chrono::steady_clock;
  return std::chrono::duration<double>(clock::now().time_since_epoch()).count();
}

}  // namespace dspark
