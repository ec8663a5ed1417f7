// trainsup/watchdog.h — the thread that notices a stalled loop, and the monitor that watches it.
//
// Contract: Watchdog owns two threads once start()ed. The watchdog thread wakes every
// `interval`, bumps its heartbeat, runs hooks.on_tick, and checks the innermost section of the
// ProgressTracker against its budget (explicit, warm-up or learned; see computeBudget): past
// `warn_fraction` of the budget it calls hooks.on_warn once for that section instance, past
// the budget hooks.on_stall once. on_stall runs on the watchdog thread and may end the process.
// The heartbeat monitor thread checks that the heartbeat advances within `heartbeat_timeout`
// and calls hooks.on_unresponsive if not; once setAbortDeadline() was called it instead calls
// hooks.on_abort_deadline when that deadline passes (the abort path must end in bounded time).
// start() twice is a logic_error; stop() is idempotent, wakes both threads and joins them
// (never call it from a hook). Hooks must be set before start(). Tests drive the two loop
// bodies without threads through the internal rank/watchdog_testing.h.
#pragma once

#include <condition_variable>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "trainsup/clock.h"
#include "trainsup/config.h"
#include "trainsup/export.h"
#include "trainsup/mutex.h"
#include "trainsup/progress.h"

namespace trainsup {

struct StallReport {
  SectionId section_id = kStartupSection;
  std::string section;
  int64_t step = -1;
  int depth = 0;
  Nanos elapsed{0};
  Budget budget;
};

struct WatchdogOptions {
  Nanos interval = std::chrono::milliseconds(200);
  Nanos heartbeat_timeout = std::chrono::seconds(30);
  BudgetPolicy policy;
  std::map<std::string, double> explicit_budgets_s;
};

class TRAINSUP_EXPORT Watchdog {
 public:
  struct Hooks {
    std::function<void()> on_tick;
    std::function<void(const StallReport&)> on_warn;
    std::function<void(const StallReport&)> on_stall;
    std::function<void(Nanos silent_for)> on_unresponsive;
    std::function<void()> on_abort_deadline;
  };

  enum class Verdict { kOk, kWarn, kStall };
  struct Check {
    Verdict verdict = Verdict::kOk;
    StallReport report;
  };

  // Interns every name of options.explicit_budgets_s in `progress` (error if that fails).
  static Result<std::unique_ptr<Watchdog>> create(ProgressTracker& progress, Clock& clock,
                                                  WatchdogOptions options, Hooks hooks);
  ~Watchdog();  // stop()
  Watchdog(const Watchdog&) = delete;
  Watchdog& operator=(const Watchdog&) = delete;

  void start();
  void stop();

  void bumpHeartbeat() { heartbeat_.fetch_add(1, std::memory_order_relaxed); }
  uint64_t heartbeat() const { return heartbeat_.load(std::memory_order_relaxed); }
  void setAbortDeadline(Nanos deadline);
  void clearAbortDeadline();
  // From the on_stall hook: the stall just reported is reported again at `until` if its section
  // instance is still running then (instead of once). For a rank that waits in a collective,
  // which the job coordinator judges with every rank in view.
  void deferStall(Nanos until) { stall_deferred_until_ns_ = until.count(); }

  // The budget currently applying to `id` (for logs and tests).
  Budget budgetFor(SectionId id) const;

 private:
  Watchdog(ProgressTracker& progress, Clock& clock, WatchdogOptions options, Hooks hooks,
           std::vector<Nanos> explicit_by_id);
  friend struct WatchdogTesting;  // rank/watchdog_testing.h
  // One evaluation at clock.now(). Warn and stall are each reported once per section instance.
  Check checkOnce();
  // One heartbeat-monitor evaluation; true when it called a hook.
  bool checkHeartbeatOnce();
  void watchLoop();
  void monitorLoop();

  // Set at construction.
  ProgressTracker& progress_;
  Clock& clock_;
  const WatchdogOptions options_;
  const Hooks hooks_;
  const std::vector<Nanos> explicit_by_id_;  // indexed by SectionId; 0 = none

  std::atomic<uint64_t> heartbeat_{0};
  std::atomic<int64_t> abort_deadline_ns_{0};  // 0 = not aborting

  // Watchdog thread only (and tests calling checkOnce()).
  uint64_t warned_generation_ = ~uint64_t{0};
  uint64_t stalled_generation_ = ~uint64_t{0};
  int64_t stall_deferred_until_ns_ = 0;  // 0: the reported stall is not reported again
  // Monitor thread only (and tests calling checkHeartbeatOnce()).
  uint64_t seen_heartbeat_ = 0;
  Nanos heartbeat_changed_at_{0};
  bool fired_ = false;

  Mutex mu_;
  CondVar cv_;
  bool started_ TRAINSUP_GUARDED_BY(mu_) = false;
  bool stopping_ TRAINSUP_GUARDED_BY(mu_) = false;
  std::thread watch_thread_;
  std::thread monitor_thread_;
};

}  // namespace trainsup
