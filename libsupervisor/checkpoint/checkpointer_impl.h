// checkpoint/checkpointer_impl.h (internal) — the state of a Checkpointer, shared by the units
// that each do one of its jobs:
//   checkpointer.cc  the facade: create, save/maybeSave, waitIdle, errors, stats
//   decisions.cc     decision points: when to save, agreed by every rank; stop agreement
//   staging.cc       snapshots into the staging arena (the only stall), overlapped copies
//   writer.cc        the writer thread: shard, durable report, commit by rank 0
//   restore.cc       the newest checkpoint that loads on every rank
//   retention.cc     which checkpoints to remove, never the newest valid one
// Threads: see the comments on each member (training thread, writer thread, or guarded by mu).
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "checkpoint/agent_link.h"
#include "device/gpu.h"
#include "trainsup/checkpointer.h"
#include "trainsup/mutex.h"

namespace trainsup {
namespace checkpoint_internal {

inline constexpr size_t kAlign = 64;
// Rank 0 spaces decision points so that they happen about this often.
inline constexpr double kDecisionSpacingS = 5.0;

inline size_t alignUp(size_t n) { return (n + kAlign - 1) / kAlign * kAlign; }

// Time left until a real-clock deadline; at least 1 ms, because a zero timeout means "wait
// forever" to some c10d stores.
inline Nanos remaining(Nanos deadline) {
  return std::max<Nanos>(deadline - Clock::real().monotonicNow(), std::chrono::milliseconds(1));
}

inline constexpr size_t kCopyPiece = size_t{16} << 20;

// One copy of a snapshot: host memory (a piece of at most kCopyPiece bytes, so that several
// threads can share one large tensor) or a whole buffer on CUDA device `device`.
struct CopyPiece {
  uint8_t* dst;
  const uint8_t* src;
  size_t n;
  int device;    // -1: host memory
  size_t buffer; // index into the job's buffers, for error messages
};

// Copies every piece: device buffers one by one (each is one DMA transfer), host pieces by up
// to `max_threads` threads (the caller is one of them). Returns the first failure, naming the
// tensor (staging.cc).
Status runCopies(const std::vector<CopyPiece>& pieces, const std::vector<BufferRef>& buffers, unsigned max_threads);

// Staging memory: page-locked when a GPU is there (fast device-to-host copies), always freed
// the same way it was taken.
struct AlignedFree {
  bool pinned = false;
  void operator()(uint8_t* p) const {
    if (pinned) unpinHostMemory(p);
    std::free(p);
  }
};

}  // namespace checkpoint_internal

struct Checkpointer::Impl {
  using CopyPiece = checkpoint_internal::CopyPiece;
  using AlignedFree = checkpoint_internal::AlignedFree;
  // Set at construction.
  CheckpointOptions options;
  Identity identity;
  FileSystem* fs = nullptr;
  Clock* clock = nullptr;
  std::shared_ptr<CommitChannel> channel;
  Hooks hooks;
  std::string key_base;  // trainsup/ckpt/<job>/<restart>
  PersistHook persist_hook;  // set before the first save; called on the writer thread
  checkpoint_internal::AgentLink agent_link{"", ""};  // the memory tier's agent (options.agent)

  // Training thread only.
  int64_t decision_seq = 0;
  int64_t next_decision_step = 0;
  int sync_steps = 10;
  Nanos last_save_time{0};           // rank 0's clock: when the last checkpoint was taken
  Nanos last_decision_time{0};
  int64_t last_decision_step = -1;
  int64_t last_snapshot_step = std::numeric_limits<int64_t>::min();  // saved or restored
  int64_t previous_save_seq = 0;  // writer thread (rank 0): whose keys to delete next
  int64_t restore_attempts = 0;   // training thread: restore() calls, the same on every rank
  bool stop_local = false;        // training thread: requestStop() was called
  bool stop_announced = false;    // training thread: ...and told rank 0 through the channel
  std::atomic<bool> stop_agreed{false};
  void announceStop();

  // Staging memory: written by the training thread while no persist is in flight, then read
  // by the writer thread until the persist ends (handed over under mu).
  std::unique_ptr<uint8_t, AlignedFree> arena;
  size_t arena_capacity = 0;

  struct Job {
    int64_t step = 0;
    int64_t seq = 0;
    std::vector<BufferRef> buffers;  // into arena
    std::map<std::string, std::string> metadata;
    uint64_t bytes = 0;
    double stall_s = 0;
    // Overlapped snapshots: the copies the writer thread makes before it persists.
    bool overlapped = false;
    std::vector<CopyPiece> copies;
    Status copy_status;  // a failed copy fails the persist (reported to rank 0 like a write error)
  };

  // Overlapped snapshot taken by save() and not yet awaited (training thread only).
  bool snapshot_outstanding = false;
  int64_t outstanding_step = 0;
  uint64_t outstanding_bytes = 0;
  double outstanding_save_s = 0;    // time the save call itself took
  double outstanding_waited_s = 0;  // ...of which waiting for the previous persist

  mutable Mutex mu;
  CondVar cv;
  bool busy TRAINSUP_GUARDED_BY(mu) = false;  // a job is queued or persisting
  bool stopping TRAINSUP_GUARDED_BY(mu) = false;
  bool snapshot_pending TRAINSUP_GUARDED_BY(mu) = false;  // the writer is copying an overlapped snapshot
  Status snapshot_status TRAINSUP_GUARDED_BY(mu);  // how that copy ended
  double snapshot_copy_s TRAINSUP_GUARDED_BY(mu) = 0;  // how long it took
  std::optional<Job> job TRAINSUP_GUARDED_BY(mu);
  Status bg_error TRAINSUP_GUARDED_BY(mu);  // first unreported persist error
  Status last_persist TRAINSUP_GUARDED_BY(mu);
  Stats stats TRAINSUP_GUARDED_BY(mu);
  std::thread writer;

  void event(std::string_view name, const EventFields& f) {
    if (hooks.event) hooks.event(name, f);
  }
  void log(LogLevel l, const std::string& m) {
    if (hooks.log) hooks.log(l, m);
  }
  std::string stepDir(int64_t step) const { return joinPath(options.dir, checkpointDirName(step)); }
  Nanos commitTimeout() const { return fromSeconds(options.commit_timeout_s); }

  bool localDue(int64_t step, Nanos now) const {
    if (options.every_steps > 0 && step > 0 && step % options.every_steps == 0) return true;
    return options.interval_s > 0 && now - last_save_time >= fromSeconds(options.interval_s);
  }
  bool isBusy() const {
    MutexLock lock(mu);
    return busy;
  }
  void waitNotBusy() {
    MutexLock lock(mu);
    cv.wait(mu, [&] { mu.assertHeld(); return !busy; });
  }

  enum class Action { kNone, kSave, kSkip };
  Result<Action> decide(int64_t step, bool explicit_save);
  Result<Outcome> snapshot(int64_t step, int64_t seq, const Collect& collect);
  Result<Outcome> snapshotOrReport(int64_t step, int64_t seq, const Collect& collect);
  Status awaitSnapshot();
  // The time the training thread was held by the last snapshot, and Young/Daly from it.
  void recordStall(double stall_s) TRAINSUP_REQUIRES(mu) {
    stats.last_stall_s = stall_s;
    if (options.mtbf_s > 0) stats.young_daly_s = std::sqrt(2 * stall_s * options.mtbf_s);
  }
  void writerLoop();
  void persist(Job& job);
  Status awaitCommit(const Job& j, const ShardInfo& mine, const std::string& dir, const std::string& prefix,
                     Nanos deadline);
  Status commitAsRankZero(const Job& job, const ShardInfo& mine, const std::string& prefix, Nanos deadline);
  void applyRetention(int64_t committed_step);
  // The memory tier (memory_tier.cc): this host's copy of rank 0's manifest after a commit, the
  // host's retention, and the restore that looks in this host's memory, then a peer's.
  void adoptManifest(const Job& j, const std::string& prefix);
  void applyMemoryRetention(int64_t committed_step);
  Result<std::optional<int64_t>> restoreMemory(const Load& load, int64_t at_least);
  std::string shardFile(int64_t step, int rank, int world) const {
    return checkpointDirName(step) + "/" + shardFileName(rank, world);
  }
  // Restore's agreements across ranks (restore.cc).
  Result<std::vector<int64_t>> sumOverRanks(const std::string& k, const Status& mine,
                                            const std::vector<std::pair<std::string, int64_t>>& counts);
  std::string whyOf(const std::string& k, const std::string& otherwise);
};


}  // namespace trainsup
