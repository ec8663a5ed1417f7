// The torch-version-specific adapter: c10d::Backend as torch 2.x defines it.
#include "trainsup/tracking_backend.h"

#include <algorithm>
#include <atomic>
#include <exception>
#include <mutex>
#include <memory>
#include <unordered_map>
#include <vector>

namespace trainsup {
namespace {

uint64_t bytesOf(const at::Tensor& t) { return t.defined() ? t.numel() * t.element_size() : 0; }
uint64_t bytesOf(const std::vector<at::Tensor>& ts) {
  uint64_t n = 0;
  for (const auto& t : ts) n += bytesOf(t);
  return n;
}
uint64_t bytesOf(const std::vector<std::vector<at::Tensor>>& ls) {
  uint64_t n = 0;
  for (const auto& l : ls) n += bytesOf(l);
  return n;
}

// ProcessGroup keeps its device -> backend map protected; a pointer to that member, formed in a
// derived class's scope, reads it without copying the class layout.
struct ProcessGroupAccess : c10d::ProcessGroup {
  using DeviceMap = std::unordered_map<c10::DeviceType, c10::intrusive_ptr<c10d::Backend>>;
  static DeviceMap c10d::ProcessGroup::*deviceMap() { return &ProcessGroupAccess::deviceTypeToBackend_; }
};

// Every wrapper trackProcessGroup() made, weakly: holdTrackedBackendsUntilExit() takes those alive.
std::mutex& trackedMu() {
  static auto* mu = new std::mutex();  // never destroyed: used at exit
  return *mu;
}
std::vector<c10::weak_intrusive_ptr<c10d::Backend>>& tracked() {
  static auto* list = new std::vector<c10::weak_intrusive_ptr<c10d::Backend>>();
  return *list;
}

// A work whose completion its backend does not report: gloo's _reduce_scatter_base (FSDP2's
// reduce-scatter) in torch 2.13 returns a work that has no future and whose isCompleted() stays
// false after wait() has returned. Wrapped, the return of wait() is its completion; everything
// else is the real work's.
class ObservedWork : public c10d::Work {
 public:
  explicit ObservedWork(c10::intrusive_ptr<c10d::Work> inner) : inner_(std::move(inner)) {}
  const c10::intrusive_ptr<c10d::Work>& inner() const { return inner_; }
  bool isCompleted() override { return done_.load() || inner_->isCompleted(); }
  bool isSuccess() const override { return inner_->isSuccess(); }
  std::exception_ptr exception() const override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (failure_) return failure_;
    }
    return inner_->exception();
  }
  int sourceRank() const override { return inner_->sourceRank(); }
  std::vector<at::Tensor> result() override { return inner_->result(); }
  void synchronize() override { inner_->synchronize(); }
  bool wait(std::chrono::milliseconds timeout) override {
    bool ok = false;
    try {
      ok = inner_->wait(timeout);
    } catch (...) {
      {
        std::lock_guard<std::mutex> lock(mu_);
        failure_ = std::current_exception();
      }
      done_ = true;
      throw;
    }
    if (ok) done_ = true;
    return ok;
  }
  void blockCurrentStream() override { inner_->blockCurrentStream(); }
  void abort() override { inner_->abort(); }
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override { return inner_->getFuture(); }
  c10::intrusive_ptr<c10::ivalue::Future> getFutureResult() override { return inner_->getFutureResult(); }
  float getDuration() const override { return inner_->getDuration(); }
  uint64_t getSequencenumber() const override { return inner_->getSequencenumber(); }

 private:
  const c10::intrusive_ptr<c10d::Work> inner_;
  std::atomic<bool> done_{false};
  mutable std::mutex mu_;
  std::exception_ptr failure_;  // guarded by mu_
};

bool hasFuture(c10d::Work& work) {
  try {
    return work.getFuture() != nullptr;
  } catch (const c10::Error&) {
    return false;
  }
}

}  // namespace

size_t holdTrackedBackendsUntilExit() {
  static auto* held = new std::vector<c10::intrusive_ptr<c10d::Backend>>();  // leaked on purpose
  std::lock_guard<std::mutex> lock(trackedMu());
  for (auto& weak : tracked()) {
    if (auto strong = weak.lock()) held->push_back(std::move(strong));
  }
  tracked().clear();
  return held->size();
}

std::optional<bool> pollWork(c10d::Work& work, c10::ivalue::Future* cpu_future) {
  if (work.isCompleted()) return work.exception() == nullptr;
  // gloo marks a work's (CPU) future complete a moment before the work itself, when the
  // collective has truly finished; a CUDA future (NCCL) completes at enqueue and says nothing.
  if (cpu_future != nullptr && cpu_future->completed()) return !cpu_future->hasError();
  return std::nullopt;
}

GroupSequencer::GroupSequencer(uint64_t id, std::vector<int> global_ranks)
    : id_(id), global_ranks_(std::move(global_ranks)) {}

int GroupSequencer::globalRank(int group_rank) const {
  if (global_ranks_.empty()) return group_rank;
  return group_rank >= 0 && static_cast<size_t>(group_rank) < global_ranks_.size() ? global_ranks_[group_rank] : -1;
}

uint64_t GroupSequencer::nextCollective() {
  std::lock_guard<std::mutex> lock(mu_);
  return ++collectives_;
}

uint64_t GroupSequencer::nextSend(int peer_global) {
  std::lock_guard<std::mutex> lock(mu_);
  return ++sends_[peer_global];
}

uint64_t GroupSequencer::nextRecv(int peer_global) {
  std::lock_guard<std::mutex> lock(mu_);
  return ++recvs_[peer_global];
}

TrackingBackend::TrackingBackend(c10::intrusive_ptr<c10d::Backend> inner, CollectiveTracker& tracker,
                                 CompletionWatcher& watcher, std::shared_ptr<GroupSequencer> group)
    : c10d::Backend(inner->getRank(), inner->getSize()),
      inner_(std::move(inner)),
      tracker_(tracker),
      watcher_(watcher),
      group_(group ? std::move(group) : std::make_shared<GroupSequencer>(kUnmatchedGroup, std::vector<int>{})),
      gloo_(inner_->getBackendName() == "gloo") {
  // ProcessGroup::getGroupName() reads the uid of its first device's backend, which is now this
  // one: carry the group's name and description (DeviceMesh resolves groups by that name).
  setBoundDeviceId(inner_->getBoundDeviceId());
  pg_uid_ = inner_->getGroupUid();
  pg_desc_ = inner_->getGroupDesc();
}

void TrackingBackend::release_resources() {
  c10::intrusive_ptr<c10d::Backend> gone = std::move(inner_);  // ~ProcessGroupGloo, if the last one
}

void TrackingBackend::watchWork(uint64_t seq, const c10::intrusive_ptr<c10d::Work>& work) {
  if (!work) {
    tracker_.untrack(seq);  // nothing to observe (a backend that returns no work)
    return;
  }
  // A CPU future (gloo) completes at true completion: its callback wakes the watcher and the
  // poll reads it. A CUDA one (NCCL) completes at enqueue: the work alone tells.
  c10::intrusive_ptr<c10::ivalue::Future> cpu_future;
  try {
    auto future = work->getFuture();
    if (future && future->devices().empty()) cpu_future = std::move(future);
  } catch (const c10::Error&) {
    // a work without a future: the interval poll of the work alone sees it finish
  }
  // Released by the watcher only once nobody else holds the work: not gloo's worker, which
  // keeps its reference a moment past completion and must not be the last owner while the
  // interpreter exits (completion_watcher.h).
  struct Held {
    c10::intrusive_ptr<c10d::Work> work;
    c10::intrusive_ptr<c10::ivalue::Future> cpu_future;
    c10::intrusive_ptr<c10d::Work> observed;  // the real work behind an ObservedWork
  };
  auto* wrapper = dynamic_cast<ObservedWork*>(work.get());
  auto held = std::make_shared<Held>(Held{work, cpu_future, wrapper != nullptr ? wrapper->inner() : nullptr});
  const Held* h = held.get();  // lives as long as the entry's poll, which owns `held`
  watcher_.watch(
      seq, [held]() { return pollWork(*held->work, held->cpu_future.get()); },
      // The work's own reference to its future, and ours; the wrapper's reference to the real
      // work, and ours.
      [h]() {
        return h->work.use_count() == 1 && (!h->cpu_future || h->cpu_future.use_count() <= 2) &&
               (!h->observed || h->observed.use_count() <= 2);
      });
  if (cpu_future) {
    CompletionWatcher* watcher = &watcher_;
    cpu_future->addCallback([watcher](c10::ivalue::Future&) { watcher->nudge(); });
  }
}

// The work as returned, or wrapped when it cannot say when it finished (ObservedWork): a gloo
// work without a future (every other gloo work has one). Works of other backends are never
// wrapped: their type is theirs (NCCL's works have a CUDA future anyway).
c10::intrusive_ptr<c10d::Work> TrackingBackend::observable(c10::intrusive_ptr<c10d::Work> work) {
  if (!work || !gloo_ || hasFuture(*work) || work->isCompleted()) return work;
  return c10::make_intrusive<ObservedWork>(std::move(work));
}

template <class F>
c10::intrusive_ptr<c10d::Work> TrackingBackend::track(CollectiveOp op, uint64_t bytes, F&& call) {
  {
    std::lock_guard<std::mutex> lock(coalescing_mu_);
    if (coalescing_) {  // one record for the batch's collectives, begun at endCoalescing()
      coalesced_bytes_ += bytes;
      coalesced_op_ = coalesced_ops_++ == 0 || coalesced_op_ == op ? op : CollectiveOp::kOther;
      return call();
    }
  }
  const bool matched = group_->id() != kUnmatchedGroup;
  const uint64_t seq = tracker_.begin(op, bytes, group_->id(), matched ? group_->nextCollective() : 0);
  c10::intrusive_ptr<c10d::Work> work;
  try {
    work = observable(call());
  } catch (...) {
    tracker_.end(seq, false);
    throw;
  }
  watchWork(seq, work);
  return work;
}

template <class F>
c10::intrusive_ptr<c10d::Work> TrackingBackend::trackP2P(CollectiveOp op, uint64_t bytes, int peer_group_rank,
                                                         F&& call) {
  const int peer = peer_group_rank >= 0 ? group_->globalRank(peer_group_rank) : -1;
  const bool matched = group_->id() != kUnmatchedGroup && peer >= 0;
  const uint64_t channel_seq = !matched ? 0 : op == CollectiveOp::kSend ? group_->nextSend(peer) : group_->nextRecv(peer);
  const uint64_t seq = tracker_.begin(op, bytes, matched ? group_->id() : kUnmatchedGroup, channel_seq, peer);
  bool in_batch = false;
  {
    std::lock_guard<std::mutex> lock(coalescing_mu_);
    if (coalescing_) {  // its own record, ended by the batch's work
      coalesced_p2p_.push_back(seq);
      in_batch = true;
    }
  }
  c10::intrusive_ptr<c10d::Work> work;
  try {
    work = in_batch ? call() : observable(call());
  } catch (...) {
    tracker_.end(seq, false);
    if (in_batch) {
      std::lock_guard<std::mutex> lock(coalescing_mu_);
      coalesced_p2p_.erase(std::remove(coalesced_p2p_.begin(), coalesced_p2p_.end(), seq), coalesced_p2p_.end());
    }
    throw;
  }
  if (!in_batch) watchWork(seq, work);
  return work;
}

void TrackingBackend::startCoalescing() {
  inner_->startCoalescing();
  std::lock_guard<std::mutex> lock(coalescing_mu_);
  coalescing_ = true;
  coalesced_bytes_ = 0;
  coalesced_ops_ = 0;
  coalesced_op_ = CollectiveOp::kOther;
  coalesced_p2p_.clear();
}

c10::intrusive_ptr<c10d::Work> TrackingBackend::endCoalescing() {
  CollectiveOp op;
  uint64_t bytes;
  int ops;
  std::vector<uint64_t> p2p;
  {
    std::lock_guard<std::mutex> lock(coalescing_mu_);
    coalescing_ = false;
    op = coalesced_op_;
    bytes = coalesced_bytes_;
    ops = coalesced_ops_;
    p2p.swap(coalesced_p2p_);
  }
  c10::intrusive_ptr<c10d::Work> work;
  if (ops == 0) {
    try {
      work = observable(inner_->endCoalescing());
    } catch (...) {
      for (uint64_t seq : p2p) tracker_.end(seq, false);
      throw;
    }
  } else {
    work = track(op, bytes, [&] { return inner_->endCoalescing(); });  // coalescing_ is off again
  }
  for (uint64_t seq : p2p) watchWork(seq, work);
  return work;
}

// --- forwarded ---
const std::string TrackingBackend::getBackendName() const { return inner_->getBackendName(); }
c10::intrusive_ptr<c10d::Backend::Options> TrackingBackend::getBackendOptions() { return inner_->getBackendOptions(); }
bool TrackingBackend::supportsSplitting() const { return inner_->supportsSplitting(); }
bool TrackingBackend::supportsCoalescing() const { return inner_->supportsCoalescing(); }
bool TrackingBackend::supportsTimeEstimation() const { return inner_->supportsTimeEstimation(); }
#if TRAINSUP_TORCH_AT_LEAST(2, 10)
bool TrackingBackend::supportsShrinking() const { return inner_->supportsShrinking(); }
c10::intrusive_ptr<c10d::Backend> TrackingBackend::shrink(const std::vector<int64_t>& ranks_to_exclude, int shrink_flags,
                                                          const c10::intrusive_ptr<Options>& opts_override) {
  return inner_->shrink(ranks_to_exclude, shrink_flags, opts_override);
}
void TrackingBackend::setGroupUid(const std::string& pg_uid) {
  c10d::Backend::setGroupUid(pg_uid);
  inner_->setGroupUid(pg_uid);
}
#endif
void TrackingBackend::setTimeout(std::chrono::milliseconds timeout) { inner_->setTimeout(timeout); }
void TrackingBackend::monitoredBarrier(const c10d::BarrierOptions& o, bool wait_all_ranks) {
  inner_->monitoredBarrier(o, wait_all_ranks);
}
void TrackingBackend::setSequenceNumberForGroup() { inner_->setSequenceNumberForGroup(); }
uint64_t TrackingBackend::getSequenceNumberForGroup() { return inner_->getSequenceNumberForGroup(); }
void TrackingBackend::registerOnCompletionHook(std::function<void(std::shared_ptr<c10d::WorkInfo>)>&& hook) {
  inner_->registerOnCompletionHook(std::move(hook));
}
void TrackingBackend::waitForPendingWorks() { inner_->waitForPendingWorks(); }
void TrackingBackend::enableCollectivesTiming() { inner_->enableCollectivesTiming(); }
c10::intrusive_ptr<c10d::Backend> TrackingBackend::split(const c10::intrusive_ptr<c10d::Store>& store,
                                                         const std::vector<int>& ranks,
                                                         const c10::intrusive_ptr<Options>& opts) {
  return inner_->split(store, ranks, opts);
}
c10::intrusive_ptr<c10d::Backend> TrackingBackend::merge(const c10::intrusive_ptr<c10d::Store>& store,
                                                         const c10::intrusive_ptr<Options>& opts, const int& rank,
                                                         const int& size) {
  return inner_->merge(store, opts, rank, size);
}
void TrackingBackend::eagerConnectSingleDevice(at::Device device) { inner_->eagerConnectSingleDevice(device); }
c10d::ErrorType TrackingBackend::getError() { return inner_->getError(); }
std::shared_ptr<c10::Allocator> TrackingBackend::getMemAllocator() { return inner_->getMemAllocator(); }
at::Tensor TrackingBackend::allocateTensor(long size, at::TensorOptions options) {
  return inner_->allocateTensor(size, options);
}
bool TrackingBackend::supportsTensorAlloc(c10::DeviceIndex device_idx) { return inner_->supportsTensorAlloc(device_idx); }
void TrackingBackend::abort() { inner_->abort(); }
void TrackingBackend::shutdown() { inner_->shutdown(); }
#if TRAINSUP_TORCH_AT_LEAST(2, 13)
void TrackingBackend::suspend() { inner_->suspend(); }
void TrackingBackend::resume() { inner_->resume(); }
std::unordered_map<std::string, uint64_t> TrackingBackend::getMemoryStats() { return inner_->getMemoryStats(); }
#endif

// --- collectives ---
c10::intrusive_ptr<c10d::Work> TrackingBackend::broadcast(std::vector<at::Tensor>& t, const c10d::BroadcastOptions& o) {
  return track(CollectiveOp::kBroadcast, bytesOf(t), [&] { return inner_->broadcast(t, o); });
}
c10::intrusive_ptr<c10d::Work> TrackingBackend::allreduce(std::vector<at::Tensor>& t, const c10d::AllreduceOptions& o) {
  return track(CollectiveOp::kAllreduce, bytesOf(t), [&] { return inner_->allreduce(t, o); });
}
c10::intrusive_ptr<c10d::Work> TrackingBackend::allreduce_sparse(std::vector<at::Tensor>& t,
                                                                 const c10d::AllreduceOptions& o) {
  return track(CollectiveOp::kAllreduce, bytesOf(t), [&] { return inner_->allreduce_sparse(t, o); });
}
c10::intrusive_ptr<c10d::Work> TrackingBackend::allreduce_coalesced(std::vector<at::Tensor>& t,
                                                                    const c10d::AllreduceCoalescedOptions& o) {
  return track(CollectiveOp::kAllreduce, bytesOf(t), [&] { return inner_->allreduce_coalesced(t, o); });
}
c10::intrusive_ptr<c10d::Work> TrackingBackend::reduce(std::vector<at::Tensor>& t, const c10d::ReduceOptions& o) {
  return track(CollectiveOp::kReduce, bytesOf(t), [&] { return inner_->reduce(t, o); });
}
c10::intrusive_ptr<c10d::Work> TrackingBackend::allgather(std::vector<std::vector<at::Tensor>>& out,
                                                          std::vector<at::Tensor>& in, const c10d::AllgatherOptions& o) {
  return track(CollectiveOp::kAllgather, bytesOf(in), [&] { return inner_->allgather(out, in, o); });
}
c10::intrusive_ptr<c10d::Work> TrackingBackend::_allgather_base(at::Tensor& out, at::Tensor& in,
                                                                const c10d::AllgatherOptions& o) {
  return track(CollectiveOp::kAllgather, bytesOf(in), [&] { return inner_->_allgather_base(out, in, o); });
}
c10::intrusive_ptr<c10d::Work> TrackingBackend::allgather_coalesced(std::vector<std::vector<at::Tensor>>& out,
                                                                    std::vector<at::Tensor>& in,
                                                                    const c10d::AllgatherOptions& o) {
  return track(CollectiveOp::kAllgather, bytesOf(in), [&] { return inner_->allgather_coalesced(out, in, o); });
}
c10::intrusive_ptr<c10d::Work> TrackingBackend::allgather_into_tensor_coalesced(std::vector<at::Tensor>& out,
                                                                                std::vector<at::Tensor>& in,
                                                                                const c10d::AllgatherOptions& o) {
  return track(CollectiveOp::kAllgather, bytesOf(in),
               [&] { return inner_->allgather_into_tensor_coalesced(out, in, o); });
}
c10::intrusive_ptr<c10d::Work> TrackingBackend::gather(std::vector<std::vector<at::Tensor>>& out,
                                                       std::vector<at::Tensor>& in, const c10d::GatherOptions& o) {
  return track(CollectiveOp::kGather, bytesOf(in), [&] { return inner_->gather(out, in, o); });
}
c10::intrusive_ptr<c10d::Work> TrackingBackend::scatter(std::vector<at::Tensor>& out,
                                                        std::vector<std::vector<at::Tensor>>& in,
                                                        const c10d::ScatterOptions& o) {
  return track(CollectiveOp::kScatter, bytesOf(out), [&] { return inner_->scatter(out, in, o); });
}
c10::intrusive_ptr<c10d::Work> TrackingBackend::reduce_scatter(std::vector<at::Tensor>& out,
                                                               std::vector<std::vector<at::Tensor>>& in,
                                                               const c10d::ReduceScatterOptions& o) {
  return track(CollectiveOp::kReduceScatter, bytesOf(in), [&] { return inner_->reduce_scatter(out, in, o); });
}
c10::intrusive_ptr<c10d::Work> TrackingBackend::_reduce_scatter_base(at::Tensor& out, at::Tensor& in,
                                                                     const c10d::ReduceScatterOptions& o) {
  return track(CollectiveOp::kReduceScatter, bytesOf(in), [&] { return inner_->_reduce_scatter_base(out, in, o); });
}
c10::intrusive_ptr<c10d::Work> TrackingBackend::reduce_scatter_tensor_coalesced(std::vector<at::Tensor>& out,
                                                                                std::vector<at::Tensor>& in,
                                                                                const c10d::ReduceScatterOptions& o) {
  return track(CollectiveOp::kReduceScatter, bytesOf(in),
               [&] { return inner_->reduce_scatter_tensor_coalesced(out, in, o); });
}
c10::intrusive_ptr<c10d::Work> TrackingBackend::alltoall_base(at::Tensor& out, at::Tensor& in,
                                                              std::vector<int64_t>& out_splits,
                                                              std::vector<int64_t>& in_splits,
                                                              const c10d::AllToAllOptions& o) {
  return track(CollectiveOp::kAlltoall, bytesOf(in),
               [&] { return inner_->alltoall_base(out, in, out_splits, in_splits, o); });
}
c10::intrusive_ptr<c10d::Work> TrackingBackend::alltoall(std::vector<at::Tensor>& out, std::vector<at::Tensor>& in,
                                                         const c10d::AllToAllOptions& o) {
  return track(CollectiveOp::kAlltoall, bytesOf(in), [&] { return inner_->alltoall(out, in, o); });
}
c10::intrusive_ptr<c10d::Work> TrackingBackend::send(std::vector<at::Tensor>& t, int dst, int tag) {
  return trackP2P(CollectiveOp::kSend, bytesOf(t), dst, [&] { return inner_->send(t, dst, tag); });
}
c10::intrusive_ptr<c10d::Work> TrackingBackend::recv(std::vector<at::Tensor>& t, int src, int tag) {
  return trackP2P(CollectiveOp::kRecv, bytesOf(t), src, [&] { return inner_->recv(t, src, tag); });
}
c10::intrusive_ptr<c10d::Work> TrackingBackend::recvAnysource(std::vector<at::Tensor>& t, int tag) {
  return trackP2P(CollectiveOp::kRecv, bytesOf(t), -1, [&] { return inner_->recvAnysource(t, tag); });
}
c10::intrusive_ptr<c10d::Work> TrackingBackend::barrier(const c10d::BarrierOptions& o) {
  return track(CollectiveOp::kBarrier, 0, [&] { return inner_->barrier(o); });
}

int trackProcessGroup(c10d::ProcessGroup& group, CollectiveTracker& tracker, CompletionWatcher& watcher,
                      std::vector<int> global_ranks, const std::string& desc) {
  auto& devices = group.*ProcessGroupAccess::deviceMap();
  // Resolve every device type first: getBackend() fills the map lazily from the backend types.
  for (const auto& device : group.getDeviceTypes()) group.getBackend(device.type());
  const std::string name = group.getGroupName();
  const uint64_t id = groupId(name);
  std::unordered_map<c10d::Backend*, c10::intrusive_ptr<c10d::Backend>> wrapped;
  std::shared_ptr<GroupSequencer> sequencer;
  int count = 0;
  for (auto& [type, backend] : devices) {
    if (!backend || dynamic_cast<TrackingBackend*>(backend.get())) continue;
    auto& wrapper = wrapped[backend.get()];
    if (!wrapper) {
      if (!sequencer) sequencer = std::make_shared<GroupSequencer>(id, global_ranks);
      wrapper = c10::make_intrusive<TrackingBackend>(backend, tracker, watcher, sequencer);
      std::lock_guard<std::mutex> lock(trackedMu());
      auto& list = tracked();
      list.erase(std::remove_if(list.begin(), list.end(), [](const auto& w) { return w.expired(); }), list.end());
      list.emplace_back(wrapper);
    }
    backend = wrapper;
    ++count;
  }
  if (count > 0) {
    GroupMembership m;
    m.group = id;
    m.group_rank = group.getRank();
    m.group_size = group.getSize();
    m.desc = desc.empty() ? group.getGroupDesc() : desc;
    m.name = name;
    tracker.registerGroup(m);
  }
  return count;
}

}  // namespace trainsup
