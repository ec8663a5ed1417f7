#include "trainsup/progress.h"
#include "base/manual_clock.h"

#include <gtest/gtest.h>

#include <thread>

namespace trainsup {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;

TEST(ProgressTest, NestedSectionsExcludeChildTime) {
  ManualClock clock;
  ProgressTracker p(clock.monotonicNow(), /*warmup_count=*/0);
  auto ckpt = p.intern("checkpoint");
  ASSERT_TRUE(ckpt.isOk());
  p.enter(kStepSection, 7, clock.monotonicNow());
  clock.advance(seconds(1));
  p.enter(*ckpt, -1, clock.monotonicNow());
  clock.advance(seconds(50));
  auto s = p.snapshot();
  EXPECT_EQ(s.section, *ckpt);
  EXPECT_EQ(s.depth, 2);
  EXPECT_EQ(s.elapsedAt(clock.monotonicNow()), seconds(50));
  p.exit(clock.monotonicNow());
  clock.advance(seconds(2));
  s = p.snapshot();
  EXPECT_EQ(s.section, kStepSection);
  EXPECT_EQ(s.step, 7);
  EXPECT_EQ(s.elapsedAt(clock.monotonicNow()), seconds(3));  // 1 + 2, not 53
  p.exit(clock.monotonicNow());
  EXPECT_EQ(p.stats(kStepSection).max_learned, seconds(3));
  EXPECT_EQ(p.stats(*ckpt).max_learned, seconds(50));
}

TEST(ProgressTest, StartupThenIdleBetweenSections) {
  ManualClock clock;
  ProgressTracker p(clock.monotonicNow(), 0);
  EXPECT_EQ(p.snapshot().section, kStartupSection);
  clock.advance(seconds(30));  // start-up time is not learned as "idle"
  p.enter(kStepSection, 0, clock.monotonicNow());
  clock.advance(seconds(1));
  p.exit(clock.monotonicNow());
  clock.advance(milliseconds(300));
  auto s = p.snapshot();
  EXPECT_EQ(s.section, kIdleSection);
  EXPECT_EQ(s.last_step, 0);
  EXPECT_EQ(s.elapsedAt(clock.monotonicNow()), milliseconds(300));
  p.enter(kStepSection, 1, clock.monotonicNow());
  EXPECT_EQ(p.stats(kIdleSection).count, 1);
  EXPECT_EQ(p.stats(kIdleSection).max_learned, milliseconds(300));
}

TEST(ProgressTest, WarmupObservationsAreNotLearned) {
  ManualClock clock;
  ProgressTracker p(clock.monotonicNow(), 2);
  for (int i = 0; i < 2; ++i) {
    p.enter(kStepSection, i, clock.monotonicNow());
    clock.advance(seconds(60));  // slow first steps (compilation, caches)
    p.exit(clock.monotonicNow());
  }
  EXPECT_EQ(p.stats(kStepSection).count, 2);
  EXPECT_EQ(p.stats(kStepSection).learned_count, 0);
  p.enter(kStepSection, 2, clock.monotonicNow());
  clock.advance(seconds(1));
  p.exit(clock.monotonicNow());
  EXPECT_EQ(p.stats(kStepSection).learned_count, 1);
  EXPECT_EQ(p.stats(kStepSection).max_learned, seconds(1));
}

TEST(ProgressTest, InternIsStableAndBounded) {
  ManualClock clock;
  ProgressTracker p(clock.monotonicNow(), 0);
  EXPECT_EQ(*p.intern("step"), kStepSection);
  auto eval = p.intern("eval");
  EXPECT_EQ(*p.intern("eval"), *eval);
  EXPECT_EQ(p.sectionName(*eval), "eval");
  EXPECT_FALSE(p.intern("").isOk());
  for (int i = 0; i < ProgressTracker::kMaxSections; ++i) (void)p.intern("s" + std::to_string(i));
  auto over = p.intern("one-too-many");
  ASSERT_FALSE(over.isOk());
  EXPECT_NE(over.status().message().find("one-too-many"), std::string::npos);
}

TEST(ProgressTest, MisuseIsALogicError) {
  ManualClock clock;
  ProgressTracker p(clock.monotonicNow(), 0);
  EXPECT_THROW(p.exit(clock.monotonicNow()), std::logic_error);
  for (int i = 0; i < ProgressTracker::kMaxDepth; ++i) p.enter(kStepSection, i, clock.monotonicNow());
  EXPECT_THROW(p.enter(kStepSection, 99, clock.monotonicNow()), std::logic_error);
}

// The watchdog reads while the loop writes: every snapshot must be internally consistent.
TEST(ProgressTest, ConcurrentSnapshotsAreConsistent) {
  ManualClock clock;
  ProgressTracker p(clock.monotonicNow(), 0);
  auto eval = *p.intern("eval");
  std::atomic<bool> done{false};
  std::atomic<int64_t> inside{0};  // snapshots taken while a section was open
  std::thread reader([&] {
    while (!done.load()) {
      auto s = p.snapshot();
      if (s.depth == 1) {
        ASSERT_EQ(s.section, kStepSection);
        ASSERT_EQ(s.started.count() % 1000, 1);   // written together with the step's start
        ASSERT_EQ(s.children.count() % 1000, 0);
      }
      if (s.depth == 2) {
        ASSERT_EQ(s.section, eval);
        ASSERT_EQ(s.step, -1);
      }
      ASSERT_LE(s.depth, 2);
      if (s.depth > 0) inside.fetch_add(1);
    }
  });
  // Keep writing until the reader has demonstrably overlapped with the writer many times.
  for (int64_t i = 0; i < 50'000'000 && inside.load() < 20000; ++i) {
    clock.advance(Nanos(1));
    p.enter(kStepSection, i, clock.monotonicNow());
    clock.advance(Nanos(999));
    p.enter(eval, -1, clock.monotonicNow());
    clock.advance(Nanos(1000));
    p.exit(clock.monotonicNow());
    clock.advance(Nanos(999));
    p.exit(clock.monotonicNow());
    clock.advance(Nanos(1));
  }
  done = true;
  reader.join();
  EXPECT_GE(inside.load(), 20000);
}

TEST(BudgetTest, ExplicitWarmupLearnedAndFloor) {
  BudgetPolicy policy;
  policy.multiplier = 3;
  policy.floor_s = 2;
  policy.warmup_s = 100;
  SectionStats none;
  EXPECT_EQ(computeBudget(kStepSection, none, policy, seconds(7)).limit, seconds(7));
  EXPECT_EQ(computeBudget(kStepSection, none, policy, seconds(7)).kind, BudgetKind::kExplicit);
  EXPECT_EQ(computeBudget(kStepSection, none, policy, Nanos(0)).limit, seconds(100));
  EXPECT_EQ(computeBudget(kStepSection, none, policy, Nanos(0)).kind, BudgetKind::kWarmup);
  SectionStats learned{10, 5, seconds(4)};
  EXPECT_EQ(computeBudget(kStepSection, learned, policy, Nanos(0)).limit, seconds(12));
  EXPECT_EQ(computeBudget(kStepSection, learned, policy, Nanos(0)).kind, BudgetKind::kLearned);
  SectionStats tiny{10, 5, milliseconds(10)};
  EXPECT_EQ(computeBudget(kStepSection, tiny, policy, Nanos(0)).limit, seconds(2));  // floor
  EXPECT_EQ(computeBudget(kStartupSection, learned, policy, Nanos(0)).limit, seconds(100));  // never learned
}

}  // namespace
}  // namespace trainsup
