// trainsup/collective_tracker.h — every collective of this rank: sequence number, op, bytes,
// enter and exit time (the raw material of hang and straggler detection, issue #5).
//
// Contract: one process-wide tracker (CollectiveTracker::global()). The torch layer's process
// group wrapper calls begin() when a collective is issued — from the training thread or from
// DDP's autograd hooks — and end() when its work completes (from a c10d callback thread).
// Two numberings: `seq` counts every tracked op of this process (the record's identity here);
// `job_seq` counts only the collectives of the job's group — the group every rank issues in the
// same order, whose records the coordinator matches across ranks. Point-to-point ops (a pipeline
// stage sends and receives as often as its schedule says, not as its peers do) and the
// collectives of a subgroup (only its members issue them) are tracked with job_seq 0: they
// count as pending here (the rank waits in them) but never feed the cross-rank match, where
// they would shift every later number on some ranks only and make healthy ranks look as if
// they never entered a collective (issue 19).
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

struct CollectiveRecord {
  uint64_t seq = 0;      // 1, 2, 3, ... in issue order on this rank, every tracked op
  uint64_t job_seq = 0;  // 1, 2, 3, ... over the job group's collectives; 0 for any other op
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

  // `matched`: a collective of the job's group (numbered by job_seq); false for point-to-point
  // ops and subgroups' collectives. Returns the record's seq.
  uint64_t begin(CollectiveOp op, uint64_t bytes, bool matched = true);
  void end(uint64_t seq, bool ok);
  // The collective's completion cannot be observed (a work without a future): its record gets
  // exit_ns = -1, so that detection never mistakes it for a hang.
  void untrack(uint64_t seq);

  struct Stats {
    std::array<uint64_t, kCollectiveOpCount> count{};  // issued, by op
    std::array<uint64_t, kCollectiveOpCount> bytes{};
    uint64_t issued = 0, completed = 0, failed = 0, untracked = 0;  // completed includes failed
    uint64_t last_seq = 0;
    uint64_t last_job_seq = 0;
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
};

}  // namespace trainsup
