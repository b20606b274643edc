#pragma once
// Ctrl-C during a download: while a SigintGuard lives, SIGINT only raises a flag that the
// download threads poll between chunks, so they stop with their partial .incomplete files intact
// (to resume later) instead of dying mid-write. A second Ctrl-C kills the process as usual.
#include <csignal>

namespace dspark {

class SigintGuard {
 public:
  SigintGuard();
  ~SigintGuard();
  SigintGuard(const SigintGuard&) = delete;
  SigintGuard& operator=(const SigintGuard&) = delete;

 private:
  struct sigaction previous_ {};
};

// True once SIGINT arrived while a SigintGuard was installed.
bool sigint_received();

}  // namespace dspark
