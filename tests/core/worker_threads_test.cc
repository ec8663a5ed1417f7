// base/worker_threads.h: a job shared by the caller and helper threads ends with every thread
// joined, whether a runner throws or a helper cannot be started (issue 19, defect 9: a joinable
// std::thread destroyed by an exception ended the process with "terminate called without an
// active exception").
#include <gtest/gtest.h>

#include <atomic>
#include <stdexcept>
#include <system_error>

#include "base/worker_threads.h"

namespace trainsup {
namespace {

// Items pulled from a shared counter, as the checkpoint copies and the loader do.
struct Job {
  std::atomic<int> next{0};
  std::atomic<int> done{0};
  int items = 1000;
  int throw_at = -1;  // the runner that takes this item throws
  void run() {
    for (int i = next.fetch_add(1); i < items; i = next.fetch_add(1)) {
      if (i == throw_at) throw std::runtime_error("item " + std::to_string(i) + " failed");
      done.fetch_add(1);
    }
  }
};

TEST(WorkerThreadsTest, EveryItemIsDoneByTheCallerAndTheHelpers) {
  Job job;
  Status s = runOnThreads(4, [&] { job.run(); }, "copy");
  EXPECT_TRUE(s.isOk()) << s.toString();
  EXPECT_EQ(job.done.load(), job.items);
}

TEST(WorkerThreadsTest, AnExceptionOnAnyThreadIsAStatusAndTheOthersStillFinish) {
  for (int throw_at : {0, 1, 500, 999}) {
    Job job;
    job.throw_at = throw_at;
    Status s = runOnThreads(4, [&] { job.run(); }, "loading the checkpoint's tensors");
    ASSERT_FALSE(s.isOk()) << throw_at;
    EXPECT_EQ(s.code(), StatusCode::kInternal);
    EXPECT_NE(s.message().find("loading the checkpoint's tensors: item " + std::to_string(throw_at) + " failed"),
              std::string::npos)
        << s.message();
    // The runner that threw stopped; the others took every item left.
    EXPECT_EQ(job.done.load(), job.items - 1) << throw_at;
  }
}

TEST(WorkerThreadsTest, AHelperThatCannotStartLeavesItsShareToTheOthers) {
  for (int fail_after : {0, 1, 2}) {
    Job job;
    int started = 0;
    ThreadStarter start = [&](std::function<void()> f) {
      if (started == fail_after) throw std::system_error(std::make_error_code(std::errc::resource_unavailable_try_again));
      ++started;
      return std::thread(std::move(f));
    };
    Status s = runOnThreads(4, [&] { job.run(); }, "copy", start);
    EXPECT_TRUE(s.isOk()) << s.toString();
    EXPECT_EQ(job.done.load(), job.items) << fail_after;
    EXPECT_EQ(started, fail_after);
  }
}

}  // namespace
}  // namespace trainsup
