// trainsup/tracking_process_group.h — a c10d process group that wraps another one (gloo, NCCL)
// and reports every collective to the CollectiveTracker: op, bytes, enter, exit.
//
// Contract: each collective call records begin() with the total bytes of its tensors, forwards
// to the wrapped group unchanged, and records end() from the work's completion callback
// (Work::getFuture()), so DDP's bucketed all-reduces issued from autograd hooks are counted
// like explicit dist.all_reduce calls. Collectives the wrapped group does not support fail
// the same way they would have. Thread-safe as c10d process groups are.
// Torch-version-specific: this is the c10d::ProcessGroup (torch 1.x) form; torch 2.x dispatches
// to c10d::Backend objects instead and needs the port described in docs/python.md.
#pragma once

#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>

#include "trainsup/collective_tracker.h"

namespace trainsup {

class TRAINSUP_EXPORT TrackingProcessGroup : public c10d::ProcessGroup {
 public:
  explicit TrackingProcessGroup(c10::intrusive_ptr<c10d::ProcessGroup> inner,
                                CollectiveTracker& tracker = CollectiveTracker::global());

  const std::string getBackendName() const override;
  const c10::intrusive_ptr<c10d::ProcessGroup>& inner() const { return inner_; }

  c10::intrusive_ptr<c10d::Work> broadcast(std::vector<at::Tensor>& t, const c10d::BroadcastOptions& o) override;
  c10::intrusive_ptr<c10d::Work> allreduce(std::vector<at::Tensor>& t, const c10d::AllreduceOptions& o) override;
  c10::intrusive_ptr<c10d::Work> allreduce_coalesced(std::vector<at::Tensor>& t,
                                                     const c10d::AllreduceCoalescedOptions& o) override;
  c10::intrusive_ptr<c10d::Work> reduce(std::vector<at::Tensor>& t, const c10d::ReduceOptions& o) override;
  c10::intrusive_ptr<c10d::Work> allgather(std::vector<std::vector<at::Tensor>>& out, std::vector<at::Tensor>& in,
                                           const c10d::AllgatherOptions& o) override;
  c10::intrusive_ptr<c10d::Work> _allgather_base(at::Tensor& out, at::Tensor& in, const c10d::AllgatherOptions& o) override;
  c10::intrusive_ptr<c10d::Work> allgather_coalesced(std::vector<std::vector<at::Tensor>>& out,
                                                     std::vector<at::Tensor>& in, const c10d::AllgatherOptions& o) override;
  c10::intrusive_ptr<c10d::Work> gather(std::vector<std::vector<at::Tensor>>& out, std::vector<at::Tensor>& in,
                                        const c10d::GatherOptions& o) override;
  c10::intrusive_ptr<c10d::Work> scatter(std::vector<at::Tensor>& out, std::vector<std::vector<at::Tensor>>& in,
                                         const c10d::ScatterOptions& o) override;
  c10::intrusive_ptr<c10d::Work> reduce_scatter(std::vector<at::Tensor>& out, std::vector<std::vector<at::Tensor>>& in,
                                                const c10d::ReduceScatterOptions& o) override;
  c10::intrusive_ptr<c10d::Work> _reduce_scatter_base(at::Tensor& out, at::Tensor& in,
                                                      const c10d::ReduceScatterOptions& o) override;
  c10::intrusive_ptr<c10d::Work> alltoall_base(at::Tensor& out, at::Tensor& in, std::vector<int64_t>& out_splits,
                                               std::vector<int64_t>& in_splits, const c10d::AllToAllOptions& o) override;
  c10::intrusive_ptr<c10d::Work> alltoall(std::vector<at::Tensor>& out, std::vector<at::Tensor>& in,
                                          const c10d::AllToAllOptions& o) override;
  c10::intrusive_ptr<c10d::Work> send(std::vector<at::Tensor>& t, int dst, int tag) override;
  c10::intrusive_ptr<c10d::Work> recv(std::vector<at::Tensor>& t, int src, int tag) override;
  c10::intrusive_ptr<c10d::Work> recvAnysource(std::vector<at::Tensor>& t, int tag) override;
  c10::intrusive_ptr<c10d::Work> barrier(const c10d::BarrierOptions& o) override;
  void monitoredBarrier(const c10d::BarrierOptions& o, bool wait_all_ranks) override;
  void setSequenceNumberForGroup() override;
  uint64_t getSequenceNumberForGroup() override;

 private:
  template <class F>
  c10::intrusive_ptr<c10d::Work> track(CollectiveOp op, uint64_t bytes, F&& call);

  c10::intrusive_ptr<c10d::ProcessGroup> inner_;
  CollectiveTracker& tracker_;
};

}  // namespace trainsup
