#include "trainsup/clock.h"

namespace trainsup {
namespace {

class RealClock final : public Clock {
 public:
  Nanos monotonicNow() const override {
    return std::chrono::duration_cast<Nanos>(std::chrono::steady_clock::now().time_since_epoch());
  }
  WallTime wallNow() const override { return std::chrono::system_clock::now(); }
};

}  // namespace

Clock& Clock::real() {
  static RealClock* clock = new RealClock();  // never destroyed: used by threads at exit
  return *clock;
}

}  // namespace trainsup
