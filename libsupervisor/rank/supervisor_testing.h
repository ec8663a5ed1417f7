// rank/supervisor_testing.h (internal) — test hooks of trainsup::Supervisor, as leveldb keeps
// its TEST_ methods in db/db_impl.h: a clock to advance instead of sleeping, and a stand-in for
// the process exit. Production code never includes this header; installed trainsup has none.
#pragma once

#include <functional>
#include <memory>

#include "trainsup/clock.h"
#include "trainsup/export.h"
#include "trainsup/supervisor.h"

namespace trainsup {

struct SupervisorTestOptions {
  Clock* clock = nullptr;                      // default: Clock::real()
  std::function<void(int code)> exit_process;  // default: _exit(code) (logs are flushed before)
};

struct TRAINSUP_EXPORT SupervisorTesting {
  // Supervisor::create(config) with these hooks.
  static Result<std::unique_ptr<Supervisor>> create(Config config, SupervisorTestOptions hooks);
};

}  // namespace trainsup
