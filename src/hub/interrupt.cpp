#include "hub/interrupt.h"

#include <atomic>

namespace dspark {
namespace {

std::atomic<bool> g_sigint{false};
static_assert(std::atomic<bool>::is_always_lock_free, "the signal handler needs a lock-free flag");

extern "C" void on_sigint(int) {
  g_sigint.store(true);
}

}  // namespace

SigintGuard::SigintGuard() {
  g_sigint.store(false);
  struct sigaction action {};
  action.sa_handler = on_sigint;
  sigemptyset(&action.sa_mask);
  action.sa_flags = SA_RESETHAND;  // the second Ctrl-C gets the default action
  sigaction(SIGINT, &action, &previous_);
}

SigintGuard::~SigintGuard() {
  sigaction(SIGINT, &previous_, nullptr);
}

bool sigint_received() {
  return g_sigint.load();
}

}  // namespace dspark
