// TrackingBackend: the completion path with a c10d work whose completion the test controls,
// and the wrapper in front of a real c10d::ProcessGroup's backend. (The torch wheel ships no
// gloo headers; ProcessGroupGloo itself is covered from Python, tests/python/test_tracker.py.)
#include "trainsup/tracking_backend.h"
#include "telemetry/telemetry_testing.h"

#include <gtest/gtest.h>
#include <torch/csrc/distributed/c10d/HashStore.hpp>
#include <torch/types.h>

namespace trainsup {
namespace {

// A work that finishes when the test says so. It has no future: completion is read from the
// work alone, as for NCCL, whose (CUDA) future is complete already at enqueue.
class ControlledWork : public c10d::Work {
 public:
  ControlledWork() : c10d::Work(0, c10d::OpType::ALLREDUCE) {}
  void complete(std::exception_ptr error = nullptr) { finish(std::move(error)); }
};

// A backend whose allreduce returns the test's work.
class ControlledBackend : public c10d::Backend {
 public:
  ControlledBackend() : c10d::Backend(0, 1) {}
  const std::string getBackendName() const override { return name; }
  std::string name = "controlled";
  c10::intrusive_ptr<c10d::Work> allreduce(std::vector<at::Tensor>&, const c10d::AllreduceOptions&) override {
    return next;
  }
  c10::intrusive_ptr<c10d::Work> send(std::vector<at::Tensor>&, int, int) override { return next; }
  c10::intrusive_ptr<c10d::Work> recv(std::vector<at::Tensor>&, int, int) override { return next; }
  c10::intrusive_ptr<c10d::Work> recvAnysource(std::vector<at::Tensor>&, int) override { return next; }
  void startCoalescing() override {}
  c10::intrusive_ptr<c10d::Work> endCoalescing() override { return next; }
  c10::intrusive_ptr<c10d::Work> next;
};

CollectiveRecord last(const CollectiveTracker& t) { return t.recent(1).at(0); }

TEST(TrackingBackendTest, CollectiveStaysInFlightUntilItsWorkCompletes) {
  CollectiveTracker tracker;
  auto unthreaded = TelemetryTesting::unthreadedWatcher(tracker);
  CompletionWatcher& watcher = *unthreaded;
  auto inner = c10::make_intrusive<ControlledBackend>();
  TrackingBackend backend(inner, tracker, watcher);
  auto work = c10::make_intrusive<ControlledWork>();
  inner->next = work;
  std::vector<at::Tensor> t{torch::ones({16})};
  auto returned = backend.allreduce(t, c10d::AllreduceOptions());
  EXPECT_EQ(returned.get(), work.get()) << "the caller gets the backend's own work";
  EXPECT_EQ(last(tracker).bytes, 64u);
  for (int i = 0; i < 3; ++i) TelemetryTesting::pollOnce(watcher);
  EXPECT_EQ(last(tracker).exit_ns, 0) << "not finished on the device: still in flight";
  work->complete();
  TelemetryTesting::pollOnce(watcher);
  EXPECT_GT(last(tracker).exit_ns, 0);
  EXPECT_TRUE(last(tracker).ok);
}

TEST(TrackingBackendTest, FailedWorkEndsTheRecordAsFailed) {
  CollectiveTracker tracker;
  auto unthreaded = TelemetryTesting::unthreadedWatcher(tracker);
  CompletionWatcher& watcher = *unthreaded;
  auto inner = c10::make_intrusive<ControlledBackend>();
  TrackingBackend backend(inner, tracker, watcher);
  auto work = c10::make_intrusive<ControlledWork>();
  inner->next = work;
  std::vector<at::Tensor> t{torch::ones({4})};
  backend.allreduce(t, c10d::AllreduceOptions());
  work->complete(std::make_exception_ptr(std::runtime_error("peer gone")));
  TelemetryTesting::pollOnce(watcher);
  EXPECT_GT(last(tracker).exit_ns, 0);
  EXPECT_FALSE(last(tracker).ok);
  EXPECT_EQ(tracker.stats().failed, 1u);
}

TEST(TrackingBackendTest, CoalescedCollectivesAreOneRecordEndedByTheGroupsWork) {
  CollectiveTracker tracker;
  auto unthreaded = TelemetryTesting::unthreadedWatcher(tracker);
  CompletionWatcher& watcher = *unthreaded;
  auto inner = c10::make_intrusive<ControlledBackend>();
  TrackingBackend backend(inner, tracker, watcher);
  backend.startCoalescing();
  std::vector<at::Tensor> a{torch::ones({4})}, b{torch::ones({8})};
  backend.allreduce(a, c10d::AllreduceOptions());
  backend.allreduce(b, c10d::AllreduceOptions());
  EXPECT_EQ(tracker.stats().issued, 0u) << "nothing is launched before endCoalescing";
  auto group = c10::make_intrusive<ControlledWork>();
  inner->next = group;
  EXPECT_EQ(backend.endCoalescing().get(), group.get());
  EXPECT_EQ(tracker.stats().issued, 1u);
  EXPECT_EQ(last(tracker).op, CollectiveOp::kAllreduce);
  EXPECT_EQ(last(tracker).bytes, 48u);
  TelemetryTesting::pollOnce(watcher);
  EXPECT_EQ(last(tracker).exit_ns, 0);
  group->complete();
  TelemetryTesting::pollOnce(watcher);
  EXPECT_GT(last(tracker).exit_ns, 0);
}

// Every op carries its group's identity and a number all members give it (issue 20): a
// group's collectives are numbered in the group (a coalesced batch of them is one), a pipeline's
// sends and receives per channel (also inside a coalesced batch, as batch_isend_irecv issues
// them, each its own record) with the peer's global rank, so that P2P never shifts the
// collectives' numbers (issue 19, defect 1); two groups count independently.
TEST(TrackingBackendTest, OpsAreNumberedPerGroupAndPointToPointPerChannel) {
  CollectiveTracker tracker;
  auto unthreaded = TelemetryTesting::unthreadedWatcher(tracker);
  CompletionWatcher& watcher = *unthreaded;
  auto inner = c10::make_intrusive<ControlledBackend>();
  inner->next = c10::make_intrusive<ControlledWork>();
  // A pipeline group of global ranks {4, 6}; this backend is its group rank 0 (global 4).
  auto pp = std::make_shared<GroupSequencer>(groupId("pp"), std::vector<int>{4, 6});
  TrackingBackend job(inner, tracker, watcher, pp);
  std::vector<at::Tensor> t{torch::ones({4})};
  job.allreduce(t, c10d::AllreduceOptions());
  EXPECT_EQ(last(tracker).group, groupId("pp"));
  EXPECT_EQ(last(tracker).group_seq, 1u);
  EXPECT_EQ(last(tracker).peer, -1);
  job.send(t, 1, 0);
  EXPECT_EQ(last(tracker).op, CollectiveOp::kSend);
  EXPECT_EQ(last(tracker).peer, 6) << "the peer's global rank";
  EXPECT_EQ(last(tracker).group_seq, 1u) << "the first send on channel 4 -> 6";
  job.recv(t, 1, 0);
  EXPECT_EQ(last(tracker).group_seq, 1u) << "the first receive on channel 6 -> 4";
  job.startCoalescing();  // batch_isend_irecv: a record per op, ended by the batch's work
  job.send(t, 1, 0);
  job.recv(t, 1, 0);
  auto records = tracker.recent(2);
  EXPECT_EQ(records[0].op, CollectiveOp::kSend);
  EXPECT_EQ(records[0].group_seq, 2u);
  EXPECT_EQ(records[1].op, CollectiveOp::kRecv);
  EXPECT_EQ(records[1].group_seq, 2u);
  job.endCoalescing();
  job.startCoalescing();  // a coalesced batch of collectives is one record
  job.allreduce(t, c10d::AllreduceOptions());
  job.allreduce(t, c10d::AllreduceOptions());
  job.endCoalescing();
  EXPECT_EQ(last(tracker).group_seq, 2u) << "P2P never shifts the group's collective numbers";
  auto tp = std::make_shared<GroupSequencer>(groupId("tp"), std::vector<int>{4, 5});
  TrackingBackend other(inner, tracker, watcher, tp);
  other.allreduce(t, c10d::AllreduceOptions());
  EXPECT_EQ(last(tracker).group, groupId("tp"));
  EXPECT_EQ(last(tracker).group_seq, 1u);
  job.allreduce(t, c10d::AllreduceOptions());
  EXPECT_EQ(last(tracker).group_seq, 3u) << "each group counts its own";
  TrackingBackend bare(inner, tracker, watcher);
  bare.recvAnysource(t, 0);
  EXPECT_EQ(last(tracker).group, kUnmatchedGroup) << "a receive from any source cannot be matched";
  EXPECT_EQ(last(tracker).seq, 9u);
  EXPECT_EQ(tracker.stats().pending(), 9u) << "every op counts as one this rank waits in until it completes";
  TelemetryTesting::pollOnce(watcher);
}

// gloo's reduce-scatter of FSDP2 (torch 2.13) returns a work with no future whose isCompleted()
// stays false after wait(): its record never ended, so every FSDP2 reduce-scatter looked like a
// collective in flight forever. Such a gloo work is returned wrapped; its wait() ends the record.
class NeverCompletedWork : public c10d::Work {
 public:
  bool wait(std::chrono::milliseconds) override {
    ++waits;
    return true;
  }
  int waits = 0;
};

TEST(TrackingBackendTest, AGlooWorkThatNeverSaysItCompletedEndsWhenItsWaitReturns) {
  CollectiveTracker tracker;
  auto unthreaded = TelemetryTesting::unthreadedWatcher(tracker);
  CompletionWatcher& watcher = *unthreaded;
  auto inner = c10::make_intrusive<ControlledBackend>();
  inner->name = "gloo";
  auto work = c10::make_intrusive<NeverCompletedWork>();
  inner->next = work;
  TrackingBackend backend(inner, tracker, watcher);
  std::vector<at::Tensor> t{torch::ones({4})};
  auto returned = backend.allreduce(t, c10d::AllreduceOptions());
  TelemetryTesting::pollOnce(watcher);
  EXPECT_EQ(last(tracker).exit_ns, 0) << "in flight until waited for";
  EXPECT_TRUE(returned->wait());
  EXPECT_EQ(work->waits, 1) << "the real work is waited for";
  TelemetryTesting::pollOnce(watcher);
  EXPECT_GT(last(tracker).exit_ns, 0) << "ended when its wait returned";
  EXPECT_TRUE(last(tracker).ok);
  // Another backend's work is never wrapped.
  auto nccl = c10::make_intrusive<ControlledBackend>();
  nccl->name = "nccl";
  nccl->next = work;
  TrackingBackend other_backend(nccl, tracker, watcher);
  auto other = other_backend.allreduce(t, c10d::AllreduceOptions());
  EXPECT_EQ(other.get(), work.get());
}

TEST(TrackingBackendTest, UnsupportedCollectiveFailsAsItWouldHaveAndEndsItsRecord) {
  CollectiveTracker tracker;
  auto unthreaded = TelemetryTesting::unthreadedWatcher(tracker);
  CompletionWatcher& watcher = *unthreaded;
  TrackingBackend backend(c10::make_intrusive<ControlledBackend>(), tracker, watcher);
  std::vector<at::Tensor> t{torch::ones({4})};
  EXPECT_THROW(backend.broadcast(t, c10d::BroadcastOptions()), c10::Error);
  EXPECT_FALSE(last(tracker).ok);
  EXPECT_EQ(watcher.pending(), 0u);
}

TEST(TrackingBackendTest, WrapsAProcessGroupsBackendWithoutChangingItsName) {
  CollectiveTracker tracker;
  auto unthreaded = TelemetryTesting::unthreadedWatcher(tracker);
  CompletionWatcher& watcher = *unthreaded;
  auto store = c10::make_intrusive<c10d::HashStore>();
  auto pg = c10::make_intrusive<c10d::ProcessGroup>(store, 0, 1);
  auto inner = c10::make_intrusive<ControlledBackend>();
  pg->setDefaultBackend(c10d::ProcessGroup::BackendType::GLOO);
  pg->setBackend(c10::DeviceType::CPU, c10d::ProcessGroup::BackendType::GLOO, inner);
  pg->setGroupName("7");  // what init_process_group gives the default group
  pg->setGroupDesc("default_pg");

  EXPECT_EQ(trackProcessGroup(*pg, tracker, watcher), 1);
  EXPECT_EQ(pg->getGroupName(), "7") << "DeviceMesh and functional collectives resolve the group by name";
  EXPECT_EQ(pg->getGroupDesc(), "default_pg");
  EXPECT_EQ(trackProcessGroup(*pg, tracker, watcher), 0) << "idempotent";
  EXPECT_EQ(pg->getBackendName(), "gloo");
  auto* wrapper = dynamic_cast<TrackingBackend*>(pg->getBackend(c10::DeviceType::CPU).get());
  ASSERT_NE(wrapper, nullptr);
  EXPECT_EQ(wrapper->inner().get(), inner.get());
  EXPECT_EQ(pg->getDefaultBackend().get(), inner.get()) << "abort/shutdown reach the real backend once";

  // Through the ProcessGroup's own dispatch (what dist.all_reduce and DDP use).
  auto work = c10::make_intrusive<ControlledWork>();
  inner->next = work;
  std::vector<at::Tensor> t{torch::full({8}, 2.0)};
  auto returned = pg->allreduce(t);
  EXPECT_EQ(tracker.stats().issued, 1u);
  EXPECT_EQ(last(tracker).op, CollectiveOp::kAllreduce);
  EXPECT_EQ(last(tracker).bytes, 32u);
  TelemetryTesting::pollOnce(watcher);
  EXPECT_EQ(tracker.stats().completed, 0u);
  work->complete();
  TelemetryTesting::pollOnce(watcher);
  EXPECT_EQ(tracker.stats().completed, 1u);
}

}  // namespace
}  // namespace trainsup
