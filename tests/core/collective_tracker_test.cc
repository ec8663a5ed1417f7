#include "trainsup/collective_tracker.h"

#include <gtest/gtest.h>

#include <thread>

namespace trainsup {
namespace {

TEST(CollectiveTrackerTest, CountsOrdersAndTimesCollectives) {
  CollectiveTracker t;
  uint64_t a = t.begin(CollectiveOp::kAllreduce, 1000);
  uint64_t b = t.begin(CollectiveOp::kBroadcast, 10);
  EXPECT_EQ(b, a + 1);
  t.end(b, true);
  auto s = t.stats();
  EXPECT_EQ(s.issued, 2u);
  EXPECT_EQ(s.completed, 1u);
  EXPECT_EQ(s.count[static_cast<int>(CollectiveOp::kAllreduce)], 1u);
  EXPECT_EQ(s.bytes[static_cast<int>(CollectiveOp::kAllreduce)], 1000u);
  auto r = t.recent(10);
  ASSERT_EQ(r.size(), 2u);
  EXPECT_EQ(r[0].seq, a);
  EXPECT_EQ(r[0].exit_ns, 0);  // still pending
  EXPECT_GE(r[1].exit_ns, r[1].enter_ns);
  t.end(a, false);
  EXPECT_EQ(t.stats().failed, 1u);
}

TEST(CollectiveTrackerTest, RingIsBoundedAndCountersExactUnderThreads) {
  CollectiveTracker t;
  std::vector<std::thread> threads;
  for (int k = 0; k < 4; ++k) {
    threads.emplace_back([&] {
      for (int i = 0; i < 5000; ++i) t.end(t.begin(CollectiveOp::kAllreduce, 8), true);
    });
  }
  for (auto& th : threads) th.join();
  auto s = t.stats();
  EXPECT_EQ(s.issued, 20000u);
  EXPECT_EQ(s.completed, 20000u);
  auto r = t.recent(100000);
  ASSERT_EQ(r.size(), CollectiveTracker::kCapacity);
  EXPECT_EQ(r.back().seq, 20000u);
  for (size_t i = 1; i < r.size(); ++i) EXPECT_EQ(r[i].seq, r[i - 1].seq + 1);
}

}  // namespace
}  // namespace trainsup
