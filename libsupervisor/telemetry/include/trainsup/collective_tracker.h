// trainsup/collective_tracker.h — every collective of this rank: sequence number, op, bytes,
// enter and exit time (the raw material of hang and straggler detection, issue #5).
//
// Contract: one process-wide tracker (CollectiveTracker::global()). The torch layer's process
// group wrapper calls begin() when a collective is issued — from the training thread or from
// DDP's autograd hooks — and end() when its work completes (from a c10d callback thread).
// Every record names what the job coordinator needs to match it across ranks (issue 20):
// - `group`: the process group's identity, the same on all its members (a hash of the name
//   torch gives the group on every member: groupId()). 0 is the implicit group of all ranks,
//   whose collectives the tracker numbers itself (for trainers that call begin() directly).
//   kUnmatchedGroup marks an op no peer can name the same way (a receive from any source, a
//   backend wrapped without a group): tracked here (the rank waits in it), never sent;
// - `group_seq`: 1, 2, 3, ... over the group's collectives, as every member issues them in the
//   same order; for a point-to-point op, over the ops of its channel (this rank -> `peer` for a
//   send, `peer` -> this rank for a receive), so that the k-th send of a channel meets its k-th
//   receive whatever else either side does;
// - `peer`: the other side's global rank for point-to-point ops, -1 otherwise.
// registerGroup() records this rank's membership of a group (its rank in it, the group's size,
// its description, e.g. "mesh_tp" for a DeviceMesh dimension), which the telemetry client
// announces on every connection.
// Thread-safe; each call is a short critical section (tens of ns) on a fixed-size ring of the
// last kCapacity records, like PyTorch's flight recorder: memory is bounded, old records are
// overwritten, counters are exact. Times are CLOCK_MONOTONIC (Clock::real()).
#pragma once

#include <array>
#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include "trainsup/clock.h"
#include "trainsup/export.h"
#include "trainsup/mutex.h"

namespace trainsup {

enum class CollectiveOp : uint8_t {
  kAllreduce, kBroadcast, kReduce, kAllgather, kGather, kScatter, kReduceScatter, kAlltoall,
  kBarrier, kSend, kRecv, kOther,
};
inline constexpr int kCollectiveOpCount = 12;
TRAINSUP_EXPORT const char* collectiveOpName(CollectiveOp op);

inline bool isPointToPoint(CollectiveOp op) { return op == CollectiveOp::kSend || op == CollectiveOp::kRecv; }

inline constexpr uint64_t kUnmatchedGroup = ~0ull;
// The identity of a process group on every member: FNV-1a of the name torch gives it (never 0
// nor kUnmatchedGroup).
TRAINSUP_EXPORT uint64_t groupId(const std::string& group_name);

// This rank's membership of a process group.
struct GroupMembership {
  uint64_t group = 0;
  int32_t group_rank = 0;  // this rank's rank in the group
  int32_t group_size = 0;
  std::string desc;        // e.g. "mesh_tp", "default_pg"; may be empty
  std::string name;        // torch's group name
};

struct CollectiveRecord {
  uint64_t seq = 0;        // 1, 2, 3, ... in issue order on this rank, every tracked op
  uint64_t group = 0;      // the group's identity; 0: all ranks; kUnmatchedGroup: never matched
  uint64_t group_seq = 0;  // per group (collectives) or per channel (point-to-point)
  int32_t peer = -1;       // point-to-point: the other side's global rank
  CollectiveOp op = CollectiveOp::kOther;
  uint64_t bytes = 0;
  int64_t enter_ns = 0;
  int64_t exit_ns = 0;  // 0 while pending, -1 if its completion cannot be observed
  bool ok = true;
};

class TRAINSUP_EXPORT CollectiveTracker {
 public:
  static constexpr size_t kCapacity = 4096;
  static CollectiveTracker& global();

  // Returns the record's seq. A collective of group 0 without a group_seq is numbered here.
  uint64_t begin(CollectiveOp op, uint64_t bytes, uint64_t group = 0, uint64_t group_seq = 0, int32_t peer = -1);
  // Idempotent per group id (a later call with the same id replaces the entry).
  void registerGroup(const GroupMembership& membership);
  std::vector<GroupMembership> groups() const;
  void end(uint64_t seq, bool ok);
  // The collective's completion cannot be observed (a work without a future): its record gets
  // exit_ns = -1, so that detection never mistakes it for a hang.
  void untrack(uint64_t seq);

  struct Stats {
    std::array<uint64_t, kCollectiveOpCount> count{};  // issued, by op
    std::array<uint64_t, kCollectiveOpCount> bytes{};
    uint64_t issued = 0, completed = 0, failed = 0, untracked = 0;  // completed includes failed
    uint64_t last_seq = 0;
    uint64_t last_world_seq = 0;  // the numbering of group 0's collectives
    // Issued and neither completed (nor failed) nor untracked: collectives this rank waits in.
    uint64_t pending() const { return issued - completed - untracked; }
  };
  Stats stats() const;
  // The newest `n` records (or fewer), oldest first.
  std::vector<CollectiveRecord> recent(size_t n) const;

 private:
  friend struct TelemetryTesting;  // telemetry/telemetry_testing.h
  void reset();                    // forgets every record and count
  mutable Mutex mu_;
  std::array<CollectiveRecord, kCapacity> ring_ TRAINSUP_GUARDED_BY(mu_);  //; slot = seq % kCapacity
  Stats stats_ TRAINSUP_GUARDED_BY(mu_);
  std::vector<GroupMembership> groups_ TRAINSUP_GUARDED_BY(mu_);
};

}  // namespace trainsup
