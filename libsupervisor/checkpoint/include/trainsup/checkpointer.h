// trainsup/checkpointer.h — asynchronous, multi-rank, verified checkpoints (two phases).
//
// Phase 1, on the training thread at a step boundary: save() copies the named buffers into
// reusable staging memory (the only stall) and hands them to the writer thread. Phase 2, on
// the writer thread: write this rank's shard (temporary name, fsync, rename, fsync dir),
// report it through the CommitChannel; rank 0 waits until every rank reported a durable shard,
// then writes MANIFEST.json the same atomic way and applies retention. A checkpoint without its
// manifest does not exist. At most one persist is in flight; when a checkpoint is due while one
// is still persisting, the busy policy applies (skip, the default, or wait) and is recorded.
//
// Collective calls: maybeSave() must be called by every rank at every step boundary, and
// save()/restore() by every rank at the same step. Decisions that must agree across ranks
// (is a time-based checkpoint due? skip because busy?) are made by rank 0 and read by the
// others through the channel at "decision points": every `sync_steps` steps (rank 0 adapts
// the value so that decisions happen about every 5 s of wall time) and at every explicit save.
//
// Failures: a failed persist (ENOSPC, EIO, a rank that never reported) fails that checkpoint
// only: the temporary files are removed, older checkpoints are untouched, an event and a log
// line say why at once, and takeError() returns it on the training thread's next call.
// restore() takes the newest checkpoint that verifies on every rank, skipping each invalid
// one with a "checkpoint_skipped" event naming the file and the reason.
//
// Overlapped snapshots (CheckpointOptions::snapshot = kOverlapped): save() only collects the
// buffers and returns; the writer thread copies them into staging memory while the training
// runs its next forward/backward, which read but do not modify the state. The caller must
// call awaitSnapshot() before it next modifies any saved buffer (before the optimizer step;
// also before a forward pass that updates saved buffers in place, such as batch-norm running
// statistics) and keep the buffers alive until then. maybeSave/save/restore/waitIdle await an
// outstanding snapshot first. The stall recorded is the time spent in save() plus the time
// blocked in awaitSnapshot().
//
// Threads: save/maybeSave/restore/takeError/waitIdle/awaitSnapshot are for the training thread; stats() and
// the destructor may be called from any thread. The destructor waits for an in-flight persist.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "trainsup/checkpoint_format.h"
#include "trainsup/clock.h"
#include "trainsup/commit_channel.h"
#include "trainsup/config.h"
#include "trainsup/event_log.h"
#include "trainsup/export.h"
#include "trainsup/file_system.h"
#include "trainsup/status.h"

namespace trainsup {

class TRAINSUP_EXPORT Checkpointer {
 public:
  struct Hooks {
    std::function<void(std::string_view event, const EventFields& fields)> event;
    std::function<void(LogLevel level, const std::string& message)> log;
  };

  // `channel` may be null only when world_size is 1 (a LocalCommitChannel is used then).
  static Result<std::unique_ptr<Checkpointer>> create(const CheckpointOptions& options, const Identity& identity,
                                                      FileSystem& fs, Clock& clock,
                                                      std::shared_ptr<CommitChannel> channel, Hooks hooks);
  ~Checkpointer();
  Checkpointer(const Checkpointer&) = delete;
  Checkpointer& operator=(const Checkpointer&) = delete;

  enum class Outcome { kNotDue, kStarted, kSkippedBusy };

  // Saves if due (interval, every-N-steps). `collect` is called only when a snapshot is taken,
  // and returns the buffers to copy (valid until it returns to save) and metadata.
  using Collect = std::function<Status(std::vector<BufferRef>& buffers, std::map<std::string, std::string>& metadata)>;
  Result<Outcome> maybeSave(int64_t step, const Collect& collect);
  // Saves now (collective), subject to the busy policy. kNotDue for a step at or below the last
  // one saved or restored (a committed checkpoint is never rewritten in place).
  Result<Outcome> save(int64_t step, const Collect& collect);
  // Overlapped mode: blocks until the snapshot taken by the last save() is copied, after which
  // the state may change. Returns that copy's error (the checkpoint then fails). OK at once
  // when nothing is outstanding (always in blocking mode).
  Status awaitSnapshot();
  bool snapshotOutstanding() const;
  // Preemption across ranks: this rank was asked to stop (SIGTERM). The request reaches rank 0
  // through the channel at this rank's next save()/maybeSave(), and rank 0's next decision point
  // tells every rank, so that all of them stop after the same step and their stop checkpoints
  // are of one step. Training thread; idempotent. With one rank it is agreed at once.
  void requestStop();
  // Whether the ranks agreed to stop (from a decision point, the same step on every rank).
  // Any thread.
  bool stopAgreed() const;
  // Another writer of this rank's checkpoint data, beside the shard: the writer thread calls it
  // at every persist, on every rank, after the step directory exists and before this rank's
  // shard is written, so that everything it writes is durable before the shard that describes
  // it, and the shard before the manifest. It returns named byte strings that go into the shard
  // as `bytes` entries (checksums of the files it wrote; kCompanionsEntry lists files that must
  // be present for the checkpoint to be valid). An error fails that checkpoint on this rank,
  // like a write error. Python's torch.distributed.checkpoint path uses it
  // (docs/checkpoint-format.md). Set it before the first save; training thread.
  using PersistHook =
      std::function<Result<std::vector<std::pair<std::string, std::string>>>(const std::string& step_dir, int64_t step)>;
  void setPersistHook(PersistHook hook);
  // Waits until no persist is in flight; returns that persist's error if it failed.
  Status waitIdle(Nanos timeout);
  // The first persist error since the last call, or OK.
  Status takeError();

  // Restores the newest checkpoint that verifies on every rank. `load` gets the manifest and
  // this rank's shard and reads what it needs (reads verify checksums); a failure makes every
  // rank move on to the next older checkpoint — except InvalidArgument from `load` (the state
  // does not match the checkpoint's tensors), which stops the restore with that error on every
  // rank. Returns the restored step, or nullopt if there is none. A checkpoint written by
  // another world size is offered to `load` only if its layout reshards (manifest metadata
  // kLayoutKey = "dcp", or replicated state); otherwise it is skipped.
  //
  // Only steps >= `at_least` are candidates (a memory tier is not restored from when the disk
  // holds a newer checkpoint). A memory-tier Checkpointer (CheckpointOptions::memory_tier)
  // looks for each rank's shard in this host's snapshot directory, then asks its agent to fetch
  // it from the hosts that held it or its peer copy (manifest metadata kPlacementKey); each
  // copy is verified, and one that fails is skipped with a "snapshot_copy_skipped" event.
  using Load = std::function<Status(const Manifest& manifest, const ShardReader& shard)>;
  Result<std::optional<int64_t>> restore(const Load& load, int64_t at_least = INT64_MIN);

  struct Stats {
    int64_t started = 0, committed = 0, failed = 0, skipped_busy = 0;
    int64_t last_committed_step = -1;
    double last_stall_s = 0;     // time the training thread was held by the last snapshot
    double last_persist_s = 0;   // write + commit time of the last committed checkpoint
    uint64_t last_bytes = 0;
    double young_daly_s = 0;     // sqrt(2 x stall x MTBF); 0 until both are known
  };
  Stats stats() const;

  // The directory of a step's checkpoint.
  std::string stepDir(int64_t step) const;

 private:
  struct Impl;
  explicit Checkpointer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// What retention would keep and delete in `dir` after `committed_step` was committed: that one
// always, then the newest valid ones up to `keep` in all; older valid ones and broken ones older
// than the newest valid go; directories newer than `committed_step` are left alone. "Valid"
// means a manifest whose shards are present with its sizes and index checksums. Exposed for
// tools and tests; Checkpointer applies it after each commit.
struct RetentionPlan {
  std::vector<int64_t> keep;
  std::vector<int64_t> remove;
};
TRAINSUP_EXPORT Result<RetentionPlan> planRetention(FileSystem& fs, const std::string& dir, int keep,
                                                    int64_t committed_step);
// Deletes one checkpoint directory: the manifest first (so a crash leaves it invalid, never
// half-valid), then shards and temporaries, then the directory.
TRAINSUP_EXPORT Status removeCheckpoint(FileSystem& fs, const std::string& step_dir);

}  // namespace trainsup
