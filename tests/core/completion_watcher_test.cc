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

// At interpreter exit the last owner of a work must not be a backend thread (gloo's worker keeps
// its reference a moment past completion; if it drops the last one while Python finalizes, the
// process aborts). The watcher keeps an ended work until it is the only owner.
TEST(CompletionWatcherTest, EndedWorkIsReleasedOnlyOnceNobodyElseHoldsIt) {
  CollectiveTracker tracker;
  auto unthreaded = TelemetryTesting::unthreadedWatcher(tracker);
  CompletionWatcher& watcher = *unthreaded;
  auto work = std::make_shared<int>(7);
  std::shared_ptr<int> worker_ref = work;  // the backend's worker, still finishing its iteration
  std::weak_ptr<int> alive = work;
  const uint64_t seq = tracker.begin(CollectiveOp::kAllreduce, 64);
  watcher.watch(
      seq, [work]() -> std::optional<bool> { return true; },
      [alive]() { return alive.use_count() == 1; });  // the entry's copy is the only one
  work.reset();  // the user let go: only the entry and the worker hold it
  EXPECT_EQ(TelemetryTesting::pollOnce(watcher), 1u);
  EXPECT_GT(recordOf(tracker, seq).exit_ns, 0) << "the record ends when the work does";
  EXPECT_EQ(watcher.retiring(), 1u) << "kept while the worker still holds the work";
  EXPECT_EQ(alive.use_count(), 2);
  worker_ref.reset();  // the worker's iteration ends: not the last owner
  EXPECT_FALSE(alive.expired());
  EXPECT_EQ(TelemetryTesting::pollOnce(watcher), 0u);
  EXPECT_TRUE(alive.expired()) << "released by the watcher once it was the only owner";
  EXPECT_EQ(watcher.retiring(), 0u);
}

TEST(CompletionWatcherTest, ReleaseAtExitKeepsWhatAnotherThreadStillHolds) {
  CollectiveTracker tracker;
  auto unthreaded = TelemetryTesting::unthreadedWatcher(tracker);
  CompletionWatcher& watcher = *unthreaded;
  auto make = [&](std::shared_ptr<int>& outside, std::weak_ptr<int>& alive, bool ends) {
    auto w = std::make_shared<int>(1);
    outside = w;
    alive = w;
    std::weak_ptr<int> probe = w;
    watcher.watch(
        tracker.begin(CollectiveOp::kAllreduce, 8),
        [w, ends]() -> std::optional<bool> { return ends ? std::optional<bool>(true) : std::nullopt; },
        [probe]() { return probe.use_count() == 1; });
  };
  std::shared_ptr<int> released_worker, stuck_worker, running_user;
  std::weak_ptr<int> released, stuck, running;
  make(released_worker, released, true);
  make(stuck_worker, stuck, true);
  make(running_user, running, false);
  EXPECT_EQ(TelemetryTesting::pollOnce(watcher), 2u);
  EXPECT_EQ(watcher.retiring(), 2u);
  released_worker.reset();  // this worker let go before exit
  EXPECT_EQ(watcher.releaseAtExit(std::chrono::milliseconds(20)), 2u)
      << "the work still held by a worker and the one still running are kept";
  EXPECT_TRUE(released.expired()) << "released on the exiting thread";
  stuck_worker.reset();   // the worker's release is not the last: the watcher keeps one
  running_user.reset();
  EXPECT_FALSE(stuck.expired());
  EXPECT_FALSE(running.expired());
}

}  // namespace
}  // namespace trainsup
