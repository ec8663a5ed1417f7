// trainsup/completion_watcher.h — ends a collective's record when its work has really finished,
// read from the work itself, not from a callback that may fire when it is merely enqueued.
//
// Why: NCCL marks a work's future complete as soon as the collective is enqueued on the stream,
// so a completion callback cannot show a collective that hangs on the GPU (the fault of the
// incidents). Like ProcessGroupNCCL's own watchdog, a thread polls each pending work's
// isCompleted() (CUDA event queries for NCCL; a flag for gloo) and records the exit time when it
// turns true. A collective that never finishes on the device stays pending in the tracker, which
// is what hang detection needs.
//
// Contract: watch() is called by whoever issued the collective (training thread, DDP's autograd
// hooks), right after CollectiveTracker::begin(); `poll` is then called only from the watcher's
// thread until it reports an outcome, and released after that. nudge() (any thread, e.g. from a
// future callback) asks for a poll now instead of at the next interval: for backends whose
// callbacks fire at true completion (gloo) the exit time is then exact, and for the others it
// costs one extra poll. While nothing is pending the thread sleeps on a condition variable;
// while works are pending it polls every `interval` (default 1 ms, the resolution of exit times
// of works that complete without a nudge). Cost per collective: one vector push under a mutex
// plus one poll per interval while it is in flight.
//
// Who drops a work last matters at interpreter exit. A work holds tensors that Python created;
// whichever thread releases the last reference decrefs their Python objects and so takes the GIL.
// gloo's worker thread keeps its reference a moment after the work completed (runLoop destroys
// it at the end of its iteration); if the caller has let go by then, the worker is the last
// owner, and if the interpreter is finalizing it dies in take_gil: Python ends the thread with a
// forced unwind that meets the noexcept destructor, and the process aborts with "terminate called
// without an active exception" (issue 19; core: runLoop -> ~AsyncAllreduceWork ->
// TensorImpl::decref_pyobject -> gil_scoped_acquire -> take_gil -> pthread_exit). So a watched
// work may come with `releasable`, which says whether releasing it now would be the last release
// (nobody else holds it): an ended entry is kept, polled at the same interval, until that is
// true, and released then, by this watcher. releaseAtExit() (before the interpreter finalizes)
// waits a bounded time for what it keeps to become releasable, releases that on the caller's
// thread, and keeps the rest for the life of the process, so that no other thread can be last.
//
// global() is the process-wide instance the torch layer uses; its thread starts on the first
// watch(). stop() joins it (idempotent; pending records stay pending). Tests drive poll rounds
// of a watcher without a thread through the internal telemetry/telemetry_testing.h.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include "trainsup/collective_tracker.h"
#include "trainsup/export.h"
#include "trainsup/mutex.h"

namespace trainsup {

class TRAINSUP_EXPORT CompletionWatcher {
 public:
  // nullopt while the work runs; true when it finished well, false when it failed.
  using Poll = std::function<std::optional<bool>()>;
  // Whether releasing the entry now drops the last reference to what its poll holds.
  using Releasable = std::function<bool()>;
  static constexpr std::chrono::microseconds kDefaultInterval{1000};

  explicit CompletionWatcher(CollectiveTracker& tracker,
                             std::chrono::microseconds interval = kDefaultInterval)
      : CompletionWatcher(tracker, interval, /*threaded=*/true) {}
  ~CompletionWatcher();
  CompletionWatcher(const CompletionWatcher&) = delete;
  CompletionWatcher& operator=(const CompletionWatcher&) = delete;

  static CompletionWatcher& global();  // feeds CollectiveTracker::global(); never destroyed

  // `releasable`: empty for an entry that may be released as soon as it ends.
  void watch(uint64_t seq, Poll poll, Releasable releasable = {});
  void nudge();
  size_t pending() const;
  // Ended entries kept until they are releasable.
  size_t retiring() const;
  void stop();
  // stop(), then up to `wait` for the entries kept to become releasable; releases those on this
  // thread and keeps the others (and any still in flight) until the process ends. Returns how
  // many it kept. For interpreter exit, before Py_FinalizeEx.
  size_t releaseAtExit(std::chrono::milliseconds wait);

 private:
  friend struct TelemetryTesting;  // telemetry/telemetry_testing.h
  // threaded = false: no thread; poll rounds run only in pollOnce().
  CompletionWatcher(CollectiveTracker& tracker, std::chrono::microseconds interval, bool threaded);
  // One round over the pending works, on the caller's thread; returns how many it ended.
  size_t pollOnce();
  struct Entry {
    uint64_t seq;
    Poll poll;
    Releasable releasable;
  };
  // Releases the retiring entries that are releasable now; returns how many are left.
  size_t releaseRetiredLocked() TRAINSUP_REQUIRES(poll_mu_);
  void run();
  void ensureThreadLocked() TRAINSUP_REQUIRES(mu_);

  CollectiveTracker& tracker_;               // set at construction
  const std::chrono::microseconds interval_;  // set at construction
  const bool threaded_;                       // set at construction

  mutable Mutex mu_;
  CondVar cv_;
  std::vector<Entry> incoming_ TRAINSUP_GUARDED_BY(mu_);  // watched, not yet taken by a poll round
  bool nudged_ TRAINSUP_GUARDED_BY(mu_) = false;
  bool stopping_ TRAINSUP_GUARDED_BY(mu_) = false;
  size_t polling_ TRAINSUP_GUARDED_BY(mu_) = 0;  // entries held by the polling side
  size_t retiring_count_ TRAINSUP_GUARDED_BY(mu_) = 0;  // retiring_.size() after the last round
  std::thread thread_ TRAINSUP_GUARDED_BY(mu_);  // started on the first watch()

  Mutex poll_mu_;           // serializes poll rounds (thread and pollOnce)
  std::vector<Entry> active_ TRAINSUP_GUARDED_BY(poll_mu_);
  std::vector<Entry> retiring_ TRAINSUP_GUARDED_BY(poll_mu_);  // ended, waiting to be the last owner
};

}  // namespace trainsup
