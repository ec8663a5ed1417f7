// CompletionWatcher: a collective's record ends when its work says it finished, not before.
#include "trainsup/completion_watcher.h"
#include "telemetry/telemetry_testing.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>

namespace trainsup {
namespace {

// A work whose outcome the test sets: nullopt while "running on the device".
struct FakeWork {
  std::atomic<int> state{0};  // 0 running, 1 ok, 2 failed
  std::atomic<int> polls{0};
  CompletionWatcher::Poll poll() {
    return [this]() -> std::optional<bool> {
      ++polls;
      int s = state.load();
      if (s == 0) return std::nullopt;
      return s == 1;
    };
  }
};

CollectiveRecord recordOf(const CollectiveTracker& t, uint64_t seq) {
  for (const auto& r : t.recent(CollectiveTracker::kCapacity))
    if (r.seq == seq) return r;
  ADD_FAILURE() << "no record " << seq;
  return {};
}

TEST(CompletionWatcherTest, RecordStaysPendingUntilTheWorkFinishes) {
  CollectiveTracker tracker;
  auto unthreaded = TelemetryTesting::unthreadedWatcher(tracker);
  CompletionWatcher& watcher = *unthreaded;
  FakeWork work;
  uint64_t seq = tracker.begin(CollectiveOp::kAllreduce, 64);
  watcher.watch(seq, work.poll());
  for (int i = 0; i < 5; ++i) EXPECT_EQ(TelemetryTesting::pollOnce(watcher), 0u);
  EXPECT_EQ(recordOf(tracker, seq).exit_ns, 0) << "a collective still running must stay in flight";
  EXPECT_EQ(watcher.pending(), 1u);
  EXPECT_EQ(tracker.stats().completed, 0u);

  work.state = 1;
  EXPECT_EQ(TelemetryTesting::pollOnce(watcher), 1u);
  auto r = recordOf(tracker, seq);
  EXPECT_GT(r.exit_ns, 0);
  EXPECT_GE(r.exit_ns, r.enter_ns);
  EXPECT_TRUE(r.ok);
  EXPECT_EQ(watcher.pending(), 0u);
  int polls = work.polls;
  TelemetryTesting::pollOnce(watcher);
  EXPECT_EQ(work.polls, polls) << "a finished work is never polled again";
}

TEST(CompletionWatcherTest, FailedAndThrowingWorksEndAsFailed) {
  CollectiveTracker tracker;
  auto unthreaded = TelemetryTesting::unthreadedWatcher(tracker);
  CompletionWatcher& watcher = *unthreaded;
  FakeWork failed;
  uint64_t a = tracker.begin(CollectiveOp::kBroadcast, 1);
  uint64_t b = tracker.begin(CollectiveOp::kBarrier, 0);
  watcher.watch(a, failed.poll());
  watcher.watch(b, []() -> std::optional<bool> { throw std::runtime_error("work gone"); });
  failed.state = 2;
  EXPECT_EQ(TelemetryTesting::pollOnce(watcher), 2u);
  EXPECT_FALSE(recordOf(tracker, a).ok);
  EXPECT_FALSE(recordOf(tracker, b).ok);
  EXPECT_EQ(tracker.stats().failed, 2u);
}

TEST(CompletionWatcherTest, WorksFinishingOutOfOrderEndIndependently) {
  CollectiveTracker tracker;
  auto unthreaded = TelemetryTesting::unthreadedWatcher(tracker);
  CompletionWatcher& watcher = *unthreaded;
  FakeWork first, second;
  uint64_t a = tracker.begin(CollectiveOp::kAllreduce, 8);
  uint64_t b = tracker.begin(CollectiveOp::kAllreduce, 8);
  watcher.watch(a, first.poll());
  watcher.watch(b, second.poll());
  second.state = 1;
  EXPECT_EQ(TelemetryTesting::pollOnce(watcher), 1u);
  EXPECT_EQ(recordOf(tracker, a).exit_ns, 0);
  EXPECT_GT(recordOf(tracker, b).exit_ns, 0);
  first.state = 1;
  EXPECT_EQ(TelemetryTesting::pollOnce(watcher), 1u);
  EXPECT_GT(recordOf(tracker, a).exit_ns, 0);
}

// The thread: a work that finishes is seen within a bounded time, and one that does not is
// never ended, however long the thread polls it.
TEST(CompletionWatcherTest, ThreadEndsFinishedWorksAndKeepsRunningOnesPending) {
  CollectiveTracker tracker;
  CompletionWatcher watcher(tracker, std::chrono::microseconds(200));
  FakeWork hung, done;
  uint64_t a = tracker.begin(CollectiveOp::kAllreduce, 8);
  uint64_t b = tracker.begin(CollectiveOp::kAllreduce, 8);
  watcher.watch(a, hung.poll());
  watcher.watch(b, done.poll());
  // Let the thread poll the running works a number of times (counted, not timed).
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (hung.polls < 20 && std::chrono::steady_clock::now() < deadline) std::this_thread::yield();
  ASSERT_GE(hung.polls, 20);
  EXPECT_EQ(tracker.stats().completed, 0u);
  done.state = 1;
  watcher.nudge();
  while (tracker.stats().completed < 1 && std::chrono::steady_clock::now() < deadline) std::this_thread::yield();
  EXPECT_EQ(tracker.stats().completed, 1u);
  EXPECT_GT(recordOf(tracker, b).exit_ns, 0);
  EXPECT_EQ(recordOf(tracker, a).exit_ns, 0);
  watcher.stop();
  watcher.stop();  // harmless twice
  EXPECT_EQ(watcher.pending(), 1u);
}

}  // namespace
}  // namespace trainsup
