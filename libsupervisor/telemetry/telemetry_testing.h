// telemetry/telemetry_testing.h (internal) — test hooks of the collective tracker and the
// completion watcher, as leveldb keeps its TEST_ methods in db/db_impl.h: a watcher without a
// thread whose poll rounds the test runs, and a tracker emptied between tests. Production code
// never includes this header; installed trainsup has none.
#pragma once

#include <chrono>
#include <cstddef>
#include <memory>

#include "trainsup/collective_tracker.h"
#include "trainsup/completion_watcher.h"

namespace trainsup {

struct TelemetryTesting {
  // A watcher that never starts a thread: works are ended only by pollOnce().
  static std::unique_ptr<CompletionWatcher> unthreadedWatcher(
      CollectiveTracker& tracker, std::chrono::microseconds interval = CompletionWatcher::kDefaultInterval) {
    return std::unique_ptr<CompletionWatcher>(new CompletionWatcher(tracker, interval, /*threaded=*/false));
  }
  // One round over the pending works on this thread; how many it ended.
  static size_t pollOnce(CompletionWatcher& w) { return w.pollOnce(); }
  // Forgets every record and count (CollectiveTracker::global() is shared by a test binary).
  static void reset(CollectiveTracker& t) { t.reset(); }
};

}  // namespace trainsup
