// rank/supervisor_impl.h (internal) — the state of a Supervisor, shared by the units that each
// do one of its jobs:
//   supervisor.cc              the facade: create, steps and sections, stop requests, close
//   abort_path.cc              warn, stall, abort order, unresponsive watchdog: dump, callbacks, exit
//   supervisor_checkpoints.cc  the facade's checkpoint calls and the learned budgets they carry
#pragma once

#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cinttypes>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <future>
#include <mutex>
#include <thread>
#include <vector>

#include "base/logging.h"
#include "device/gpu.h"
#include "rank/stack_dump.h"
#include "rank/stop_signals.h"
#include "rank/supervisor_testing.h"
#include "telemetry/telemetry_client.h"
#include "trainsup/collective_tracker.h"
#include "trainsup/mutex.h"
#include "trainsup/nccl.h"
#include "trainsup/supervisor.h"
#include "trainsup/version.h"

namespace trainsup {
namespace supervisor_internal {

// A stop request across ranks that no checkpoint decision point confirmed takes effect after
// this long anyway (decision points come about every 5 s; Slurm kills 30 s after its SIGTERM).
inline constexpr double kStopAgreementFallbackS = 20.0;

inline std::string seconds(Nanos d) { return fmt::format("{:.3f}", toSeconds(d)); }

inline int currentTid() { return static_cast<int>(syscall(SYS_gettid)); }

}  // namespace supervisor_internal

struct Supervisor::Impl {
  // Set in create(), then read-only.
  Config config;
  SupervisorTestOptions options;
  Clock* clock = nullptr;
  std::string log_path;
  std::string event_path;
  RankLogger logger;
  std::unique_ptr<EventLog> events;
  std::unique_ptr<ProgressTracker> progress;
  std::unique_ptr<Watchdog> watchdog;
  bool owns_signals = false;
  int emergency_fd = -1;  // the rank log, opened at start for last words

  std::atomic<int> training_tid{0};  // the thread that called step()/section() first
  bool first_step_seen = false;      // training thread only
  std::unique_ptr<Checkpointer> checkpointer;  // training thread only
  std::unique_ptr<Checkpointer> snapshots;     // the memory tier (config.snapshot), training thread only
  std::shared_ptr<CommitChannel> channel;      // the checkpointers' (null with one rank)
  int64_t restore_calls = 0;                   // training thread only
  // With checkpoints across ranks, a stop request takes effect when the ranks agreed on it (the
  // same step everywhere); these mirror the checkpointer's state for stopRequested() callers.
  std::atomic<bool> stop_needs_agreement{false};
  std::atomic<bool> stop_agreed{false};
  std::unique_ptr<TelemetryClient> telemetry;  // set in create(); null when off
  std::atomic<bool> closed{false};
  int seen_stop_signal = 0;  // watchdog thread only (close() after the watchdog stopped)

  Mutex callbacks_mu;
  std::vector<std::pair<std::string, std::function<void(const StallReport&)>>> callbacks
      TRAINSUP_GUARDED_BY(callbacks_mu);
  std::vector<std::pair<std::string, std::function<std::string()>>> dump_hooks TRAINSUP_GUARDED_BY(callbacks_mu);

  void onTick();
  void onWarn(const StallReport& r);
  void onStall(const StallReport& r);
  // Stall deferrals while waiting in a collective (watchdog thread only).
  // 6: the coordinator names a hang held by a slow link at 6 x the collective's budget (plus a
  // 3 s grace), and a collective's budget is at most a step's (the step holds it).
  static constexpr int kStallDeferrals = 6;
  std::string deferred_section;
  int64_t deferred_step = -1;
  int stall_deferrals = 0;
  void dumpStacks(std::chrono::milliseconds timeout);
  // Half of the abort grace period (0.1 to 5 s) for a stack dump; the rest is for the abort
  // callbacks.
  std::chrono::milliseconds dumpTimeout() const {
    return std::chrono::milliseconds(static_cast<int64_t>(std::min(5.0, std::max(0.1, config.abort_grace_s / 2)) * 1000));
  }
  void onUnresponsive(Nanos silent);
  void onAbortDeadline();
  void onAbortOrder(const WireAbort& a);
  void runAbortCallbacks(const StallReport& r);
  void emergency(const std::string& message, int code);
  void terminate(int code);
  // The coordinator's abort order arrived (close(failed) waits for it briefly).
  Mutex abort_mu;
  CondVar abort_cv;
  bool abort_ordered TRAINSUP_GUARDED_BY(abort_mu) = false;
  bool abort_finished TRAINSUP_GUARDED_BY(abort_mu) = false;  // the abort path returned (test exit hooks only)
  ~Impl() {
    if (emergency_fd >= 0) ::close(emergency_fd);
  }
};

}  // namespace trainsup
