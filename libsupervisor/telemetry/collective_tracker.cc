#include "trainsup/collective_tracker.h"
#include "trainsup/mutex.h"

#include <algorithm>

namespace trainsup {

const char* collectiveOpName(CollectiveOp op) {
  switch (op) {
    case CollectiveOp::kAllreduce: return "allreduce";
    case CollectiveOp::kBroadcast: return "broadcast";
    case CollectiveOp::kReduce: return "reduce";
    case CollectiveOp::kAllgather: return "allgather";
    case CollectiveOp::kGather: return "gather";
    case CollectiveOp::kScatter: return "scatter";
    case CollectiveOp::kReduceScatter: return "reduce_scatter";
    case CollectiveOp::kAlltoall: return "alltoall";
    case CollectiveOp::kBarrier: return "barrier";
    case CollectiveOp::kSend: return "send";
    case CollectiveOp::kRecv: return "recv";
    case CollectiveOp::kOther: return "other";
  }
  return "other";
}

CollectiveTracker& CollectiveTracker::global() {
  static CollectiveTracker* t = new CollectiveTracker();  // never destroyed: callbacks may run at exit
  return *t;
}

uint64_t CollectiveTracker::begin(CollectiveOp op, uint64_t bytes, bool matched) {
  const int64_t now = Clock::real().monotonicNow().count();
  MutexLock lock(mu_);
  uint64_t seq = ++stats_.last_seq;
  const uint64_t job_seq = matched ? ++stats_.last_job_seq : 0;
  auto i = static_cast<size_t>(op);
  ++stats_.count[i];
  stats_.bytes[i] += bytes;
  ++stats_.issued;
  ring_[seq % kCapacity] = {seq, job_seq, op, bytes, now, 0, true};
  return seq;
}

void CollectiveTracker::end(uint64_t seq, bool ok) {
  const int64_t now = Clock::real().monotonicNow().count();
  MutexLock lock(mu_);
  ++stats_.completed;
  if (!ok) ++stats_.failed;
  CollectiveRecord& r = ring_[seq % kCapacity];
  if (r.seq == seq) {  // not yet overwritten by a newer one
    r.exit_ns = now;
    r.ok = ok;
  }
}

void CollectiveTracker::untrack(uint64_t seq) {
  MutexLock lock(mu_);
  ++stats_.untracked;
  CollectiveRecord& r = ring_[seq % kCapacity];
  if (r.seq == seq) r.exit_ns = -1;
}

CollectiveTracker::Stats CollectiveTracker::stats() const {
  MutexLock lock(mu_);
  return stats_;
}

std::vector<CollectiveRecord> CollectiveTracker::recent(size_t n) const {
  MutexLock lock(mu_);
  uint64_t last = stats_.last_seq;
  n = std::min<size_t>({n, kCapacity, static_cast<size_t>(last)});
  std::vector<CollectiveRecord> out;
  out.reserve(n);
  for (uint64_t seq = last - n + 1; seq <= last && n > 0; ++seq) out.push_back(ring_[seq % kCapacity]);
  return out;
}

void CollectiveTracker::reset() {
  MutexLock lock(mu_);
  stats_ = Stats();
  ring_.fill(CollectiveRecord());
}

}  // namespace trainsup
