// trainsup/clock.h — the time source every component takes.
//
// Contract: components never read std::chrono clocks directly; they take a Clock& so that
// tests can advance time instead of sleeping (ManualClock, internal base/manual_clock.h). monotonicNow() is CLOCK_MONOTONIC in the real
// clock (std::chrono::steady_clock), so values are comparable across processes of one host.
// Both methods are thread-safe and cheap (one clock read).
#pragma once

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
