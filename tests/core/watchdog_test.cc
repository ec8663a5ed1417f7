// Watchdog logic with an injected clock (no sleeps), plus its two threads with a real clock
// (waiting on futures with generous bounds, never on fixed sleeps).
#include "trainsup/watchdog.h"
#include "base/manual_clock.h"
#include "rank/watchdog_testing.h"

#include <gtest/gtest.h>

#include <future>
#include <random>

namespace trainsup {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;

struct Fixture {
  explicit Fixture(WatchdogOptions opts = {}, Watchdog::Hooks hooks = {})
      : progress(clock.monotonicNow(), opts.policy.warmup_count) {
    auto w = Watchdog::create(progress, clock, std::move(opts), std::move(hooks));
    if (!w) throw std::runtime_error(w.status().toString());
    watchdog = std::move(*w);
  }
  // Runs one section of `d`, checking every 100 ms of clock time like the real loop; returns
  // the worst verdict seen.
  Watchdog::Verdict runSection(SectionId id, int64_t step, Nanos d) {
    Watchdog::Verdict worst = Watchdog::Verdict::kOk;
    progress.enter(id, step, clock.monotonicNow());
    for (Nanos t{0}; t < d;) {
      Nanos dt = std::min<Nanos>(milliseconds(100), d - t);
      clock.advance(dt);
      t += dt;
      worst = std::max(worst, WatchdogTesting::checkOnce(*watchdog).verdict);
    }
    progress.exit(clock.monotonicNow());
    return worst;
  }
  ManualClock clock;
  ProgressTracker progress;
  std::unique_ptr<Watchdog> watchdog;
};

WatchdogOptions options(double floor_s, double multiplier, int warmup_count, double warmup_s,
                        std::map<std::string, double> explicit_s = {}) {
  WatchdogOptions o;
  o.policy.floor_s = floor_s;
  o.policy.multiplier = multiplier;
  o.policy.warmup_count = warmup_count;
  o.policy.warmup_s = warmup_s;
  o.explicit_budgets_s = std::move(explicit_s);
  return o;
}

TEST(WatchdogTest, ExplicitBudgetIsEnforcedOnceAndNamesTheSection) {
  Fixture f(options(10, 5, 3, 900, {{"step", 2.0}}));
  f.progress.enter(kStepSection, 41, f.clock.monotonicNow());
  f.clock.advance(milliseconds(900));
  EXPECT_EQ(WatchdogTesting::checkOnce(*f.watchdog).verdict, Watchdog::Verdict::kOk);
  f.clock.advance(milliseconds(200));  // 1.1 s: past half the budget
  auto warn = WatchdogTesting::checkOnce(*f.watchdog);
  EXPECT_EQ(warn.verdict, Watchdog::Verdict::kWarn);
  EXPECT_EQ(WatchdogTesting::checkOnce(*f.watchdog).verdict, Watchdog::Verdict::kOk);  // warned once
  f.clock.advance(milliseconds(899));  // 1.999 s
  EXPECT_EQ(WatchdogTesting::checkOnce(*f.watchdog).verdict, Watchdog::Verdict::kOk);
  f.clock.advance(milliseconds(2));  // 2.001 s
  auto c = WatchdogTesting::checkOnce(*f.watchdog);
  ASSERT_EQ(c.verdict, Watchdog::Verdict::kStall);
  EXPECT_EQ(c.report.section, "step");
  EXPECT_EQ(c.report.step, 41);
  EXPECT_EQ(c.report.budget.limit, seconds(2));
  EXPECT_EQ(c.report.budget.kind, BudgetKind::kExplicit);
  EXPECT_EQ(c.report.elapsed, milliseconds(2001));
  f.clock.advance(seconds(10));
  EXPECT_EQ(WatchdogTesting::checkOnce(*f.watchdog).verdict, Watchdog::Verdict::kOk);  // reported once per stall
}

TEST(WatchdogTest, LearnedBudgetAdaptsToObservedDurations) {
  Fixture f(options(/*floor*/ 0.5, /*mult*/ 3, /*warmup*/ 2, /*warmup_s*/ 100));
  // Warm-up: slow first steps are allowed (100 s) and not learned.
  EXPECT_EQ(f.runSection(kStepSection, 0, seconds(20)), Watchdog::Verdict::kOk);
  EXPECT_EQ(f.runSection(kStepSection, 1, seconds(1)), Watchdog::Verdict::kOk);
  EXPECT_EQ(f.watchdog->budgetFor(kStepSection).kind, BudgetKind::kWarmup);
  for (int i = 2; i < 5; ++i) EXPECT_EQ(f.runSection(kStepSection, i, seconds(1)), Watchdog::Verdict::kOk);
  EXPECT_EQ(f.watchdog->budgetFor(kStepSection).limit, seconds(3));
  EXPECT_EQ(f.watchdog->budgetFor(kStepSection).kind, BudgetKind::kLearned);
  // A slower but healthy phase raises the budget instead of alarming.
  EXPECT_EQ(f.runSection(kStepSection, 5, seconds(2)), Watchdog::Verdict::kWarn);
  EXPECT_EQ(f.watchdog->budgetFor(kStepSection).limit, seconds(6));
  EXPECT_EQ(f.runSection(kStepSection, 6, milliseconds(5900)), Watchdog::Verdict::kWarn);
  // A step that really stops is caught at the learned budget (now 3 x 5.9 s).
  f.progress.enter(kStepSection, 7, f.clock.monotonicNow());
  f.clock.advance(milliseconds(17600));
  EXPECT_NE(WatchdogTesting::checkOnce(*f.watchdog).verdict, Watchdog::Verdict::kStall);
  f.clock.advance(milliseconds(200));
  auto c = WatchdogTesting::checkOnce(*f.watchdog);
  EXPECT_EQ(c.verdict, Watchdog::Verdict::kStall);
  EXPECT_EQ(c.report.budget.kind, BudgetKind::kLearned);
  EXPECT_EQ(c.report.step, 7);
}

TEST(WatchdogTest, FloorProtectsFastSteps) {
  Fixture f(options(/*floor*/ 2, 5, 0, 100));
  for (int i = 0; i < 20; ++i) f.runSection(kStepSection, i, milliseconds(10));
  EXPECT_EQ(f.watchdog->budgetFor(kStepSection).limit, seconds(2));
  EXPECT_EQ(f.runSection(kStepSection, 20, milliseconds(1900)), Watchdog::Verdict::kWarn);
}

TEST(WatchdogTest, NoFalseAlarmUnderThirtyPercentJitter) {
  // Default policy but a low floor, so the learned budget (not the floor) is what is tested.
  WatchdogOptions o;
  o.policy.floor_s = 0.1;
  Fixture f(o);
  std::mt19937 rng(20261202);
  std::uniform_real_distribution<double> jitter(0.7, 1.3);
  int alarms = 0;
  for (int i = 0; i < 600; ++i) {
    auto step = fromSeconds(1.0 * jitter(rng));
    auto gap = fromSeconds(0.05 * jitter(rng));  // data loading between steps
    if (f.runSection(kStepSection, i, step) != Watchdog::Verdict::kOk) ++alarms;
    f.clock.advance(gap);
    if (WatchdogTesting::checkOnce(*f.watchdog).verdict != Watchdog::Verdict::kOk) ++alarms;
  }
  EXPECT_EQ(alarms, 0);
  // ...and a real stall of the same job is still caught.
  f.progress.enter(kStepSection, 600, f.clock.monotonicNow());
  f.clock.advance(seconds(7));
  EXPECT_EQ(WatchdogTesting::checkOnce(*f.watchdog).verdict, Watchdog::Verdict::kStall);
}

TEST(WatchdogTest, SectionSwitchesUseEachSectionsBudget) {
  Fixture f(options(0.1, 5, 0, 100, {{"step", 2}, {"checkpoint", 100}, {"eval", 30}}));
  auto ckpt = *f.progress.intern("checkpoint");
  auto eval = *f.progress.intern("eval");
  // A long checkpoint inside a step is judged by the checkpoint budget, not the step's.
  f.progress.enter(kStepSection, 3, f.clock.monotonicNow());
  f.clock.advance(milliseconds(500));
  f.progress.enter(ckpt, -1, f.clock.monotonicNow());
  f.clock.advance(seconds(60));
  auto c = WatchdogTesting::checkOnce(*f.watchdog);
  EXPECT_NE(c.verdict, Watchdog::Verdict::kStall);
  f.progress.exit(f.clock.monotonicNow());
  // Back in the step: 0.5 s before the checkpoint + 1 s after it.
  f.clock.advance(seconds(1));
  EXPECT_NE(WatchdogTesting::checkOnce(*f.watchdog).verdict, Watchdog::Verdict::kStall);
  f.clock.advance(milliseconds(600));
  c = WatchdogTesting::checkOnce(*f.watchdog);
  ASSERT_EQ(c.verdict, Watchdog::Verdict::kStall);
  EXPECT_EQ(c.report.section, "step");
  EXPECT_EQ(c.report.elapsed, milliseconds(2100));
  f.progress.exit(f.clock.monotonicNow());
  // Eval after the step has its own budget.
  f.progress.enter(eval, -1, f.clock.monotonicNow());
  f.clock.advance(seconds(29));
  EXPECT_NE(WatchdogTesting::checkOnce(*f.watchdog).verdict, Watchdog::Verdict::kStall);
  f.clock.advance(seconds(2));
  c = WatchdogTesting::checkOnce(*f.watchdog);
  ASSERT_EQ(c.verdict, Watchdog::Verdict::kStall);
  EXPECT_EQ(c.report.section, "eval");
  EXPECT_EQ(c.report.step, 3);  // the last step seen
}

TEST(WatchdogTest, StuckBetweenStepsIsNamedIdle) {
  Fixture f(options(1, 5, 0, 100));
  for (int i = 0; i < 5; ++i) {
    f.runSection(kStepSection, i, milliseconds(100));
    f.clock.advance(milliseconds(100));
  }
  f.clock.advance(milliseconds(1000));  // the data loader hangs
  auto c = WatchdogTesting::checkOnce(*f.watchdog);
  ASSERT_EQ(c.verdict, Watchdog::Verdict::kStall);
  EXPECT_EQ(c.report.section, "idle");
  EXPECT_EQ(c.report.step, 4);
}

TEST(WatchdogTest, StartupHasTheWarmupBudget) {
  Fixture f(options(1, 5, 0, 100));
  f.clock.advance(seconds(99));
  EXPECT_NE(WatchdogTesting::checkOnce(*f.watchdog).verdict, Watchdog::Verdict::kStall);
  f.clock.advance(seconds(2));
  auto c = WatchdogTesting::checkOnce(*f.watchdog);
  ASSERT_EQ(c.verdict, Watchdog::Verdict::kStall);
  EXPECT_EQ(c.report.section, "startup");
}

TEST(WatchdogTest, HeartbeatMonitorFiresOnceWhenTheWatchdogStops) {
  int fired = 0;
  Nanos silent{0};
  Watchdog::Hooks hooks;
  hooks.on_unresponsive = [&](Nanos s) {
    ++fired;
    silent = s;
  };
  WatchdogOptions o;
  o.heartbeat_timeout = seconds(30);
  Fixture f(o, hooks);
  WatchdogTesting::checkHeartbeatOnce(*f.watchdog);
  for (int i = 0; i < 10; ++i) {
    f.clock.advance(seconds(20));
    f.watchdog->bumpHeartbeat();
    EXPECT_FALSE(WatchdogTesting::checkHeartbeatOnce(*f.watchdog));
  }
  f.clock.advance(seconds(29));
  EXPECT_FALSE(WatchdogTesting::checkHeartbeatOnce(*f.watchdog));
  f.clock.advance(seconds(2));
  EXPECT_TRUE(WatchdogTesting::checkHeartbeatOnce(*f.watchdog));
  EXPECT_EQ(fired, 1);
  EXPECT_EQ(silent, seconds(31));
  f.clock.advance(seconds(60));
  EXPECT_FALSE(WatchdogTesting::checkHeartbeatOnce(*f.watchdog));
  EXPECT_EQ(fired, 1);
}

TEST(WatchdogTest, AbortDeadlineReplacesTheHeartbeatCheck) {
  int unresponsive = 0, deadline = 0;
  Watchdog::Hooks hooks;
  hooks.on_unresponsive = [&](Nanos) { ++unresponsive; };
  hooks.on_abort_deadline = [&] { ++deadline; };
  WatchdogOptions o;
  o.heartbeat_timeout = seconds(5);
  Fixture f(o, hooks);
  f.watchdog->setAbortDeadline(f.clock.monotonicNow() + seconds(10));
  f.clock.advance(seconds(9));  // heartbeat silent past its timeout: expected while aborting
  EXPECT_FALSE(WatchdogTesting::checkHeartbeatOnce(*f.watchdog));
  f.clock.advance(seconds(2));
  EXPECT_TRUE(WatchdogTesting::checkHeartbeatOnce(*f.watchdog));
  EXPECT_EQ(deadline, 1);
  EXPECT_EQ(unresponsive, 0);
}

TEST(WatchdogThreadTest, StartTwiceIsAnErrorStopIsIdempotent) {
  Fixture f;
  f.watchdog->stop();  // before start: harmless
  Fixture g;
  g.watchdog->start();
  EXPECT_THROW(g.watchdog->start(), std::logic_error);
  g.watchdog->stop();
  g.watchdog->stop();
}

TEST(WatchdogThreadTest, ThreadDetectsARealStall) {
  std::promise<StallReport> stalled;
  std::atomic<int> stalls{0};
  Watchdog::Hooks hooks;
  hooks.on_stall = [&](const StallReport& r) {
    if (stalls.fetch_add(1) == 0) stalled.set_value(r);
  };
  ProgressTracker progress(Clock::real().monotonicNow(), 0);
  WatchdogOptions o;
  o.interval = milliseconds(10);
  o.explicit_budgets_s = {{"step", 0.2}};
  auto w = Watchdog::create(progress, Clock::real(), o, hooks);
  ASSERT_TRUE(w.isOk());
  auto t0 = std::chrono::steady_clock::now();
  progress.enter(kStepSection, 5, Clock::real().monotonicNow());
  (*w)->start();
  auto fut = stalled.get_future();
  ASSERT_EQ(fut.wait_for(seconds(10)), std::future_status::ready);
  auto took = std::chrono::steady_clock::now() - t0;
  StallReport r = fut.get();
  EXPECT_EQ(r.section, "step");
  EXPECT_EQ(r.step, 5);
  EXPECT_GE(took, milliseconds(200));
  (*w)->stop();
  EXPECT_EQ(stalls.load(), 1);
  EXPECT_GT((*w)->heartbeat(), 0u);
}

TEST(WatchdogThreadTest, MonitorNoticesAWedgedWatchdog) {
  std::promise<void> release;
  std::shared_future<void> released = release.get_future().share();
  std::promise<Nanos> unresponsive;
  std::atomic<int> ticks{0};
  Watchdog::Hooks hooks;
  hooks.on_tick = [&] {
    if (ticks.fetch_add(1) == 2) released.wait();  // the watchdog thread wedges on its 3rd tick
  };
  hooks.on_unresponsive = [&](Nanos s) { unresponsive.set_value(s); };
  ProgressTracker progress(Clock::real().monotonicNow(), 0);
  WatchdogOptions o;
  o.interval = milliseconds(10);
  o.heartbeat_timeout = milliseconds(300);
  auto w = Watchdog::create(progress, Clock::real(), o, hooks);
  ASSERT_TRUE(w.isOk());
  // Whatever happens below, un-wedge the tick so that stop() can join.
  struct Release {
    std::promise<void>& p;
    ~Release() { p.set_value(); }
  } guard{release};
  (*w)->start();
  auto fut = unresponsive.get_future();
  ASSERT_EQ(fut.wait_for(seconds(10)), std::future_status::ready);
  EXPECT_GT(fut.get(), milliseconds(300));
}

TEST(WatchdogTest, BadOptionsAreRejected) {
  ManualClock clock;
  ProgressTracker progress(clock.monotonicNow(), 0);
  WatchdogOptions o;
  o.interval = seconds(5);
  o.heartbeat_timeout = seconds(1);
  EXPECT_FALSE(Watchdog::create(progress, clock, o, {}).isOk());
}

}  // namespace
}  // namespace trainsup
