// trainsup/clock.h — the time source every component takes.
//
// Contract: components never read std::chrono clocks directly; they take a Clock& so that
// tests can advance time instead of sleeping. monotonicNow() is CLOCK_MONOTONIC in the real
// clock (std::chrono::steady_clock), so values are comparable across processes of one host.
// Both methods are thread-safe and cheap (one clock read, or two atomic loads for ManualClock).
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>

#include "trainsup/export.h"

namespace trainsup {

using Nanos = std::chrono::nanoseconds;
using WallTime = std::chrono::system_clock::time_point;

class TRAINSUP_EXPORT Clock {
 public:
  virtual ~Clock() = default;
  virtual Nanos monotonicNow() const = 0;  // since an arbitrary epoch, never goes back
  virtual WallTime wallNow() const = 0;    // for humans and cross-host correlation

  // The process-wide real clock (steady_clock + system_clock). Never destroyed.
  static Clock& real();
};

// A clock that only moves when told to. Thread-safe: advance() may race with readers.
class TRAINSUP_EXPORT ManualClock final : public Clock {
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

inline double toSeconds(Nanos d) { return std::chrono::duration<double>(d).count(); }
// Saturates at about 292 years instead of overflowing.
inline Nanos fromSeconds(double s) {
  constexpr double kMax = 9.2e18;
  double ns = s * 1e9;
  if (!(ns < kMax)) return Nanos(static_cast<int64_t>(kMax));
  if (!(ns > -kMax)) return Nanos(-static_cast<int64_t>(kMax));
  return Nanos(static_cast<int64_t>(ns));
}

}  // namespace trainsup
