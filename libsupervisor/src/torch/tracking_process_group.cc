// The torch-version-specific adapter: c10d::ProcessGroup as torch 1.x defines it.
#include "trainsup/tracking_process_group.h"

namespace trainsup {
namespace {

uint64_t bytesOf(const std::vector<at::Tensor>& ts) {
  uint64_t n = 0;
  for (const auto& t : ts) n += t.numel() * t.element_size();
  return n;
}
uint64_t bytesOf(const std::vector<std::vector<at::Tensor>>& ls) {
  uint64_t n = 0;
  for (const auto& l : ls) n += bytesOf(l);
  return n;
}
uint64_t bytesOf(const at::Tensor& t) { return t.numel() * t.element_size(); }

}  // namespace

TrackingProcessGroup::TrackingProcessGroup(c10::intrusive_ptr<c10d::ProcessGroup> inner, CollectiveTracker& tracker)
    : c10d::ProcessGroup(inner->getRank(), inner->getSize()), inner_(std::move(inner)), tracker_(tracker) {}

const std::string TrackingProcessGroup::getBackendName() const { return inner_->getBackendName(); }

template <class F>
c10::intrusive_ptr<c10d::Work> TrackingProcessGroup::track(CollectiveOp op, uint64_t bytes, F&& call) {
  const uint64_t seq = tracker_.begin(op, bytes);
  c10::intrusive_ptr<c10d::Work> work;
  try {
    work = call();
  } catch (...) {
    tracker_.end(seq, false);
    throw;
  }
  CollectiveTracker* tracker = &tracker_;
  try {
    work->getFuture()->addCallback(
        [tracker, seq](c10::ivalue::Future& f) { tracker->end(seq, !f.hasError()); });
  } catch (const c10::Error&) {
    // A work without a future (gloo send/recv in torch 1.x): its completion cannot be seen
    // from here; say so rather than leave a record that looks like a hang.
    tracker_.untrack(seq);
  }
  return work;
}

c10::intrusive_ptr<c10d::Work> TrackingProcessGroup::broadcast(std::vector<at::Tensor>& t, const c10d::BroadcastOptions& o) {
  return track(CollectiveOp::kBroadcast, bytesOf(t), [&] { return inner_->broadcast(t, o); });
}
c10::intrusive_ptr<c10d::Work> TrackingProcessGroup::allreduce(std::vector<at::Tensor>& t, const c10d::AllreduceOptions& o) {
  return track(CollectiveOp::kAllreduce, bytesOf(t), [&] { return inner_->allreduce(t, o); });
}
c10::intrusive_ptr<c10d::Work> TrackingProcessGroup::allreduce_coalesced(std::vector<at::Tensor>& t,
                                                                         const c10d::AllreduceCoalescedOptions& o) {
  return track(CollectiveOp::kAllreduce, bytesOf(t), [&] { return inner_->allreduce_coalesced(t, o); });
}
c10::intrusive_ptr<c10d::Work> TrackingProcessGroup::reduce(std::vector<at::Tensor>& t, const c10d::ReduceOptions& o) {
  return track(CollectiveOp::kReduce, bytesOf(t), [&] { return inner_->reduce(t, o); });
}
c10::intrusive_ptr<c10d::Work> TrackingProcessGroup::allgather(std::vector<std::vector<at::Tensor>>& out,
                                                               std::vector<at::Tensor>& in, const c10d::AllgatherOptions& o) {
  return track(CollectiveOp::kAllgather, bytesOf(in), [&] { return inner_->allgather(out, in, o); });
}
c10::intrusive_ptr<c10d::Work> TrackingProcessGroup::_allgather_base(at::Tensor& out, at::Tensor& in,
                                                                     const c10d::AllgatherOptions& o) {
  return track(CollectiveOp::kAllgather, bytesOf(in), [&] { return inner_->_allgather_base(out, in, o); });
}
c10::intrusive_ptr<c10d::Work> TrackingProcessGroup::allgather_coalesced(std::vector<std::vector<at::Tensor>>& out,
                                                                         std::vector<at::Tensor>& in,
                                                                         const c10d::AllgatherOptions& o) {
  return track(CollectiveOp::kAllgather, bytesOf(in), [&] { return inner_->allgather_coalesced(out, in, o); });
}
c10::intrusive_ptr<c10d::Work> TrackingProcessGroup::gather(std::vector<std::vector<at::Tensor>>& out,
                                                            std::vector<at::Tensor>& in, const c10d::GatherOptions& o) {
  return track(CollectiveOp::kGather, bytesOf(in), [&] { return inner_->gather(out, in, o); });
}
c10::intrusive_ptr<c10d::Work> TrackingProcessGroup::scatter(std::vector<at::Tensor>& out,
                                                             std::vector<std::vector<at::Tensor>>& in,
                                                             const c10d::ScatterOptions& o) {
  return track(CollectiveOp::kScatter, bytesOf(out), [&] { return inner_->scatter(out, in, o); });
}
c10::intrusive_ptr<c10d::Work> TrackingProcessGroup::reduce_scatter(std::vector<at::Tensor>& out,
                                                                    std::vector<std::vector<at::Tensor>>& in,
                                                                    const c10d::ReduceScatterOptions& o) {
  return track(CollectiveOp::kReduceScatter, bytesOf(in), [&] { return inner_->reduce_scatter(out, in, o); });
}
c10::intrusive_ptr<c10d::Work> TrackingProcessGroup::_reduce_scatter_base(at::Tensor& out, at::Tensor& in,
                                                                          const c10d::ReduceScatterOptions& o) {
  return track(CollectiveOp::kReduceScatter, bytesOf(in), [&] { return inner_->_reduce_scatter_base(out, in, o); });
}
c10::intrusive_ptr<c10d::Work> TrackingProcessGroup::alltoall_base(at::Tensor& out, at::Tensor& in,
                                                                   std::vector<int64_t>& out_splits,
                                                                   std::vector<int64_t>& in_splits,
                                                                   const c10d::AllToAllOptions& o) {
  return track(CollectiveOp::kAlltoall, bytesOf(in), [&] { return inner_->alltoall_base(out, in, out_splits, in_splits, o); });
}
c10::intrusive_ptr<c10d::Work> TrackingProcessGroup::alltoall(std::vector<at::Tensor>& out, std::vector<at::Tensor>& in,
                                                              const c10d::AllToAllOptions& o) {
  return track(CollectiveOp::kAlltoall, bytesOf(in), [&] { return inner_->alltoall(out, in, o); });
}
c10::intrusive_ptr<c10d::Work> TrackingProcessGroup::send(std::vector<at::Tensor>& t, int dst, int tag) {
  return track(CollectiveOp::kSend, bytesOf(t), [&] { return inner_->send(t, dst, tag); });
}
c10::intrusive_ptr<c10d::Work> TrackingProcessGroup::recv(std::vector<at::Tensor>& t, int src, int tag) {
  return track(CollectiveOp::kRecv, bytesOf(t), [&] { return inner_->recv(t, src, tag); });
}
c10::intrusive_ptr<c10d::Work> TrackingProcessGroup::recvAnysource(std::vector<at::Tensor>& t, int tag) {
  return track(CollectiveOp::kRecv, bytesOf(t), [&] { return inner_->recvAnysource(t, tag); });
}
c10::intrusive_ptr<c10d::Work> TrackingProcessGroup::barrier(const c10d::BarrierOptions& o) {
  return track(CollectiveOp::kBarrier, 0, [&] { return inner_->barrier(o); });
}
void TrackingProcessGroup::monitoredBarrier(const c10d::BarrierOptions& o, bool wait_all_ranks) {
  inner_->monitoredBarrier(o, wait_all_ranks);
}
void TrackingProcessGroup::setSequenceNumberForGroup() { inner_->setSequenceNumberForGroup(); }
uint64_t TrackingProcessGroup::getSequenceNumberForGroup() { return inner_->getSequenceNumberForGroup(); }

}  // namespace trainsup
