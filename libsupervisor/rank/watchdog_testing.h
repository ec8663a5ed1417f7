// rank/watchdog_testing.h (internal) — test hooks of trainsup::Watchdog, as leveldb keeps its
// TEST_ methods in db/db_impl.h: the watchdog's and the heartbeat monitor's loop bodies, for
// tests that drive them with a ManualClock (base/manual_clock.h) instead of threads. Production
// code never includes this header; installed trainsup has none.
#pragma once

#include "trainsup/watchdog.h"

namespace trainsup {

struct WatchdogTesting {
  // One watchdog evaluation at the clock's now (what the watchdog thread does every interval).
  static Watchdog::Check checkOnce(Watchdog& w) { return w.checkOnce(); }
  // One heartbeat-monitor evaluation; true when it called a hook.
  static bool checkHeartbeatOnce(Watchdog& w) { return w.checkHeartbeatOnce(); }
};

}  // namespace trainsup
