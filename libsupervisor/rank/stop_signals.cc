#include "rank/stop_signals.h"
#include "trainsup/mutex.h"

#include <signal.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <mutex>

namespace trainsup {
namespace stop_signals {
namespace {

std::atomic<int> g_requested{0};
static_assert(std::atomic<int>::is_always_lock_free, "the handler needs a lock-free flag");

Mutex g_mu;
bool g_installed TRAINSUP_GUARDED_BY(g_mu) = false;
struct sigaction g_old_term TRAINSUP_GUARDED_BY(g_mu);
struct sigaction g_old_int TRAINSUP_GUARDED_BY(g_mu);

std::atomic<pid_t> g_owner{0};
std::atomic<int64_t> g_first_ns{0};                // when the first signal came (CLOCK_MONOTONIC)
constexpr int64_t kRepeatWindowNs = 2'000'000'000;  // a repeat within this is the same request
static_assert(std::atomic<int64_t>::is_always_lock_free, "the handler needs lock-free timestamps");

int64_t monotonicNs() {  // clock_gettime is async-signal-safe
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1'000'000'000 + ts.tv_nsec;
}

void onStopSignal(int sig) {
  // A forked child (data-loader worker, multiprocessing) inherits this handler but nobody in it
  // reads the flag: it must die of the signal as before.
  if (getpid() != g_owner.load()) {
    signal(sig, SIG_DFL);
    raise(sig);
    return;
  }
  const int64_t now = monotonicNs();
  if (g_requested.load() == 0) g_first_ns.store(now);  // before the flag: readers see a time
  int expected = 0;
  if (g_requested.compare_exchange_strong(expected, sig)) return;
  if (expected == sig && now - g_first_ns.load() >= kRepeatWindowNs) {
    // Asked again, later: the user means it.
    signal(sig, SIG_DFL);
    raise(sig);
  }
}

}  // namespace

bool install() {
  MutexLock lock(g_mu);
  if (g_installed) return false;
  g_requested.store(0);
  g_owner.store(getpid());
  struct sigaction sa;
  std::memset(&sa, 0, sizeof(sa));
  sa.sa_handler = onStopSignal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  sigaction(SIGTERM, &sa, &g_old_term);
  sigaction(SIGINT, &sa, &g_old_int);
  g_installed = true;
  return true;
}

void uninstall() {
  MutexLock lock(g_mu);
  if (!g_installed) return;
  sigaction(SIGTERM, &g_old_term, nullptr);
  sigaction(SIGINT, &g_old_int, nullptr);
  g_installed = false;
}

int requestedBy() { return g_requested.load(); }
int64_t requestedForNs() { return g_requested.load() == 0 ? 0 : monotonicNs() - g_first_ns.load(); }
void reset() {
  g_requested.store(0);
  g_first_ns.store(0);
}

}  // namespace stop_signals
}  // namespace trainsup
