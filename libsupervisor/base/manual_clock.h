// base/manual_clock.h (internal) — a clock for tests, which advance time instead of sleeping.
// Production code never includes this header; installed trainsup has none.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>

#include "trainsup/clock.h"

namespace trainsup {

// A clock that only moves when told to. Thread-safe: advance() may race with readers.
class ManualClock final : public Clock {
 public:
  explicit ManualClock(Nanos start = std::chrono::seconds(1000),
                       WallTime wall_start = WallTime(std::chrono::seconds(1'700'000'000)))
      : mono_ns_(start.count()), wall_offset_ns_(wall_start.time_since_epoch().count() - start.count()) {}

  Nanos monotonicNow() const override { return Nanos(mono_ns_.load(std::memory_order_acquire)); }
  WallTime wallNow() const override {
    return WallTime(std::chrono::duration_cast<WallTime::duration>(
        Nanos(mono_ns_.load(std::memory_order_acquire) + wall_offset_ns_)));
  }
  void advance(Nanos d) { mono_ns_.fetch_add(d.count(), std::memory_order_acq_rel); }

 private:
  std::atomic<int64_t> mono_ns_;
  const int64_t wall_offset_ns_;
};

}  // namespace trainsup
