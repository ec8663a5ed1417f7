// trainsup/tracking_backend.h — a c10d Backend that wraps another one (gloo, NCCL) and reports
// every collective to the CollectiveTracker: op, bytes, enter time, and the exit time read from
// the work itself (CompletionWatcher), so that a collective still running on the device stays in
// flight in the tracker.
//
// Contract: each collective call records begin() with the total bytes of its tensors, forwards
// to the wrapped backend unchanged and returns its work unchanged; the work is then polled
// (Work::isCompleted(), exception()) until it finishes. Between startCoalescing() and
// endCoalescing() the calls are one record (what the backend launches as one group), ended by
// the coalesced work. Anything that is not a collective (options, timeouts, splitting, error
// state, memory) is forwarded. Thread-safe as c10d backends are. Torch-version-specific: written
// against torch 2.x's c10d::Backend (torch >= 2.9; the virtuals added since are forwarded
// where the installed torch has them, TRAINSUP_TORCH_AT_LEAST below).
//
// How records are matched across ranks (collective_tracker.h, issue 20): every op carries its
// group's identity and a number every member gives it. A GroupSequencer, shared by the wrappers
// of one group's device types, numbers the group's collectives (a coalesced batch of
// collectives is one) and each point-to-point channel (the k-th send from a to b meets b's k-th
// receive from a), and maps a peer's group rank to its global rank. Each point-to-point op is
// its own record, also inside a coalesced batch (batch_isend_irecv), ended by the batch's work.
// A receive from any source is tracked unmatched (kUnmatchedGroup): nobody can say from which peer.
//
// trackProcessGroup() puts a wrapper in front of a process group's backend for each of its
// device types, so that everything dispatched through ProcessGroup::getBackend(device) —
// dist.all_reduce, DDP's bucketed all-reduces, FSDP's all-gathers and reduce-scatters,
// functional collectives — is tracked, while the group keeps its name and backend type:
// dist.get_backend() still says "gloo" or "nccl", monitored_barrier, abort and shutdown reach
// the real backend directly (never twice). What changes: group._get_backend(device) returns the
// wrapper (a plain c10d Backend to Python); inner() is the real one. Idempotent per group.
#pragma once

#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/version.h>

#include <atomic>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "trainsup/collective_tracker.h"
#include "trainsup/completion_watcher.h"

#define TRAINSUP_TORCH_AT_LEAST(major, minor) \
  (TORCH_VERSION_MAJOR > (major) || (TORCH_VERSION_MAJOR == (major) && TORCH_VERSION_MINOR >= (minor)))

namespace trainsup {

// Numbers one process group's ops as every member does. Thread-safe.
class TRAINSUP_EXPORT GroupSequencer {
 public:
  // `global_ranks`: the members' global ranks by group rank (empty: group rank = global rank).
  // `id` kUnmatchedGroup: a group whose records are not matched.
  GroupSequencer(uint64_t id, std::vector<int> global_ranks);
  uint64_t id() const { return id_; }
  int globalRank(int group_rank) const;
  uint64_t nextCollective();
  uint64_t nextSend(int peer_global);
  uint64_t nextRecv(int peer_global);

 private:
  const uint64_t id_;
  const std::vector<int> global_ranks_;
  std::mutex mu_;
  uint64_t collectives_ = 0;                 // guarded by mu_
  std::unordered_map<int, uint64_t> sends_;  // guarded by mu_: by receiver
  std::unordered_map<int, uint64_t> recvs_;  // guarded by mu_: by sender
};

class TRAINSUP_EXPORT TrackingBackend : public c10d::Backend {
 public:
  // `group`: the sequencer of the group this backend serves; null: an unmatched one.
  explicit TrackingBackend(c10::intrusive_ptr<c10d::Backend> inner,
                           CollectiveTracker& tracker = CollectiveTracker::global(),
                           CompletionWatcher& watcher = CompletionWatcher::global(),
                           std::shared_ptr<GroupSequencer> group = nullptr);

  const c10::intrusive_ptr<c10d::Backend>& inner() const { return inner_; }

  // The last strong reference went while a weak one is still held (the exit registry of
  // holdTrackedBackendsUntilExit): c10 then defers the destructor, so the real backend is let
  // go here, when the destructor would have (c10::intrusive_ptr calls it).
  void release_resources() override;

  // --- forwarded as they are ---
  const std::string getBackendName() const override;
  c10::intrusive_ptr<Options> getBackendOptions() override;
  bool supportsSplitting() const override;
  bool supportsCoalescing() const override;
  bool supportsTimeEstimation() const override;
#if TRAINSUP_TORCH_AT_LEAST(2, 10)
  bool supportsShrinking() const override;
  c10::intrusive_ptr<c10d::Backend> shrink(const std::vector<int64_t>& ranks_to_exclude, int shrink_flags,
                                           const c10::intrusive_ptr<Options>& opts_override) override;
  void setGroupUid(const std::string& pg_uid) override;
#endif
  void setTimeout(std::chrono::milliseconds timeout) override;
  void monitoredBarrier(const c10d::BarrierOptions& o, bool wait_all_ranks) override;
  void setSequenceNumberForGroup() override;
  uint64_t getSequenceNumberForGroup() override;
  void registerOnCompletionHook(std::function<void(std::shared_ptr<c10d::WorkInfo>)>&& hook) override;
  void waitForPendingWorks() override;
  void enableCollectivesTiming() override;
  c10::intrusive_ptr<c10d::Backend> split(const c10::intrusive_ptr<c10d::Store>& store, const std::vector<int>& ranks,
                                          const c10::intrusive_ptr<Options>& opts) override;
  c10::intrusive_ptr<c10d::Backend> merge(const c10::intrusive_ptr<c10d::Store>& store,
                                          const c10::intrusive_ptr<Options>& opts, const int& rank,
                                          const int& size) override;
  void eagerConnectSingleDevice(at::Device device) override;
  c10d::ErrorType getError() override;
  std::shared_ptr<c10::Allocator> getMemAllocator() override;
  at::Tensor allocateTensor(long size, at::TensorOptions options) override;
  bool supportsTensorAlloc(c10::DeviceIndex device_idx) override;
  void abort() override;
  void shutdown() override;
#if TRAINSUP_TORCH_AT_LEAST(2, 13)
  void suspend() override;
  void resume() override;
  std::unordered_map<std::string, uint64_t> getMemoryStats() override;
#endif

  // --- collectives: tracked ---
  void startCoalescing() override;
  c10::intrusive_ptr<c10d::Work> endCoalescing() override;
  c10::intrusive_ptr<c10d::Work> broadcast(std::vector<at::Tensor>& t, const c10d::BroadcastOptions& o) override;
  c10::intrusive_ptr<c10d::Work> allreduce(std::vector<at::Tensor>& t, const c10d::AllreduceOptions& o) override;
  c10::intrusive_ptr<c10d::Work> allreduce_sparse(std::vector<at::Tensor>& t, const c10d::AllreduceOptions& o) override;
  c10::intrusive_ptr<c10d::Work> allreduce_coalesced(std::vector<at::Tensor>& t,
                                                     const c10d::AllreduceCoalescedOptions& o) override;
  c10::intrusive_ptr<c10d::Work> reduce(std::vector<at::Tensor>& t, const c10d::ReduceOptions& o) override;
  c10::intrusive_ptr<c10d::Work> allgather(std::vector<std::vector<at::Tensor>>& out, std::vector<at::Tensor>& in,
                                           const c10d::AllgatherOptions& o) override;
  c10::intrusive_ptr<c10d::Work> _allgather_base(at::Tensor& out, at::Tensor& in, const c10d::AllgatherOptions& o) override;
  c10::intrusive_ptr<c10d::Work> allgather_coalesced(std::vector<std::vector<at::Tensor>>& out,
                                                     std::vector<at::Tensor>& in, const c10d::AllgatherOptions& o) override;
  c10::intrusive_ptr<c10d::Work> allgather_into_tensor_coalesced(std::vector<at::Tensor>& out, std::vector<at::Tensor>& in,
                                                                 const c10d::AllgatherOptions& o) override;
  c10::intrusive_ptr<c10d::Work> gather(std::vector<std::vector<at::Tensor>>& out, std::vector<at::Tensor>& in,
                                        const c10d::GatherOptions& o) override;
  c10::intrusive_ptr<c10d::Work> scatter(std::vector<at::Tensor>& out, std::vector<std::vector<at::Tensor>>& in,
                                         const c10d::ScatterOptions& o) override;
  c10::intrusive_ptr<c10d::Work> reduce_scatter(std::vector<at::Tensor>& out, std::vector<std::vector<at::Tensor>>& in,
                                                const c10d::ReduceScatterOptions& o) override;
  c10::intrusive_ptr<c10d::Work> _reduce_scatter_base(at::Tensor& out, at::Tensor& in,
                                                      const c10d::ReduceScatterOptions& o) override;
  c10::intrusive_ptr<c10d::Work> reduce_scatter_tensor_coalesced(std::vector<at::Tensor>& out, std::vector<at::Tensor>& in,
                                                                 const c10d::ReduceScatterOptions& o) override;
  c10::intrusive_ptr<c10d::Work> alltoall_base(at::Tensor& out, at::Tensor& in, std::vector<int64_t>& out_splits,
                                               std::vector<int64_t>& in_splits, const c10d::AllToAllOptions& o) override;
  c10::intrusive_ptr<c10d::Work> alltoall(std::vector<at::Tensor>& out, std::vector<at::Tensor>& in,
                                          const c10d::AllToAllOptions& o) override;
  c10::intrusive_ptr<c10d::Work> send(std::vector<at::Tensor>& t, int dst, int tag) override;
  c10::intrusive_ptr<c10d::Work> recv(std::vector<at::Tensor>& t, int src, int tag) override;
  c10::intrusive_ptr<c10d::Work> recvAnysource(std::vector<at::Tensor>& t, int tag) override;
  c10::intrusive_ptr<c10d::Work> barrier(const c10d::BarrierOptions& o) override;

 private:
  template <class F>
  c10::intrusive_ptr<c10d::Work> track(CollectiveOp op, uint64_t bytes, F&& call);
  // A send (peer_group_rank: the receiver) or receive (the sender; -1: any source).
  template <class F>
  c10::intrusive_ptr<c10d::Work> trackP2P(CollectiveOp op, uint64_t bytes, int peer_group_rank, F&& call);
  void watchWork(uint64_t seq, const c10::intrusive_ptr<c10d::Work>& work);
  // A gloo work that cannot report its completion (no future, isCompleted() false even after
  // wait(): gloo's _reduce_scatter_base in torch 2.13) is returned wrapped, its wait() the
  // completion; any other work is returned as it is.
  c10::intrusive_ptr<c10d::Work> observable(c10::intrusive_ptr<c10d::Work> work);

  c10::intrusive_ptr<c10d::Backend> inner_;  // set at construction; reset by release_resources()
  CollectiveTracker& tracker_;
  CompletionWatcher& watcher_;
  const std::shared_ptr<GroupSequencer> group_;  // set at construction; never null
  const bool gloo_;  // set at construction: the wrapped backend is gloo (observable())
  std::mutex coalescing_mu_;
  bool coalescing_ = false;         // guarded by coalescing_mu_
  uint64_t coalesced_bytes_ = 0;    // guarded by coalescing_mu_
  CollectiveOp coalesced_op_ = CollectiveOp::kOther;  // guarded by coalescing_mu_
  int coalesced_ops_ = 0;           // guarded by coalescing_mu_
  std::vector<uint64_t> coalesced_p2p_;  // guarded by coalescing_mu_: the batch's send/recv records
};

// Wraps the backend of each device type of `group` in a TrackingBackend (one wrapper per
// distinct backend object, one GroupSequencer for the group) and registers this rank's
// membership with the tracker: id groupId(group name), its rank in the group, the group's size
// and `desc` (default: the group's description, e.g. "mesh_tp"). `global_ranks`: the members'
// global ranks by group rank (empty: the group of all ranks, group rank = global rank). Returns
// how many device types it wrapped now (0 when the group was tracked already).
TRAINSUP_EXPORT int trackProcessGroup(c10d::ProcessGroup& group,
                                      CollectiveTracker& tracker = CollectiveTracker::global(),
                                      CompletionWatcher& watcher = CompletionWatcher::global(),
                                      std::vector<int> global_ranks = {}, const std::string& desc = "");

// At interpreter exit (trainsup's atexit handler, before the interpreter is torn down): keeps
// every backend trackProcessGroup() wrapped that is still alive, and the real backend behind
// it, alive until the process ends (leaked on purpose). Destroyed while the interpreter is
// finalizing, a ProcessGroupGloo joins its worker threads with the GIL released by the
// destructor's caller, and any thread that takes the GIL then is ended by Python (pthread_exit)
// and, inside a C++ destructor, ends the process ("terminate called without an active
// exception"). Returns how many were held. Thread-safe; idempotent.
TRAINSUP_EXPORT size_t holdTrackedBackendsUntilExit();

// Polls a c10d work for the CompletionWatcher: nullopt while it runs, else whether it succeeded.
// `cpu_future` is the work's future when it is a CPU one (gloo: complete at true completion,
// slightly before the work says so), looked up once when the work is watched; else null.
TRAINSUP_EXPORT std::optional<bool> pollWork(c10d::Work& work, c10::ivalue::Future* cpu_future = nullptr);

}  // namespace trainsup
