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

uint64_t groupId(const std::string& group_name) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : group_name) {
    h ^= c;
    h *= 1099511628211ull;
  }
  return h == 0 || h == kUnmatchedGroup ? 1 : h;
}

uint64_t CollectiveTracker::begin(CollectiveOp op, uint64_t bytes, uint64_t group, uint64_t group_seq, int32_t peer) {
  const int64_t now = Clock::real().monotonicNow().count();
  MutexLock lock(mu_);
  uint64_t seq = ++stats_.last_seq;
  if (group == 0 && group_seq == 0 && !isPointToPoint(op)) group_seq = ++stats_.last_world_seq;
  auto i = static_cast<size_t>(op);
  ++stats_.count[i];
  stats_.bytes[i] += bytes;
  ++stats_.issued;
  ring_[seq % kCapacity] = {seq, group, group_seq, peer, op, bytes, now, 0, true};
  return seq;
}

void CollectiveTracker::registerGroup(const GroupMembership& membership) {
  MutexLock lock(mu_);
  for (auto& g : groups_) {
    if (g.group == membership.group) {
      g = membership;
      return;
    }
  }
  groups_.push_back(membership);
}

std::vector<GroupMembership> CollectiveTracker::groups() const {
  MutexLock lock(mu_);
  return groups_;
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
  groups_.clear();
}

}  // namespace trainsup
