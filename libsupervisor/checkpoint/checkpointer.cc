#include "trainsup/checkpointer.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <limits>
#include <thread>

#include "device/gpu.h"
#include "trainsup/mutex.h"
#include "trainsup/version.h"

namespace trainsup {

namespace {

constexpr size_t kAlign = 64;
// Rank 0 spaces decision points so that they happen about this often.
constexpr double kDecisionSpacingS = 5.0;

size_t alignUp(size_t n) { return (n + kAlign - 1) / kAlign * kAlign; }

// Time left until a real-clock deadline; at least 1 ms, because a zero timeout means "wait
// forever" to some c10d stores.
Nanos remaining(Nanos deadline) {
  return std::max<Nanos>(deadline - Clock::real().monotonicNow(), std::chrono::milliseconds(1));
}

constexpr size_t kCopyPiece = size_t{16} << 20;

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
// to `max_threads` threads (the caller is one of them); one core rarely saturates memory
// bandwidth. Returns the first failure, naming the tensor.
Status runCopies(const std::vector<CopyPiece>& pieces, const std::vector<BufferRef>& buffers, unsigned max_threads) {
  size_t total = 0, host_pieces = 0;
  for (const auto& p : pieces) {
    if (p.device >= 0) {
      if (Status s = copyDeviceToHost(p.dst, p.src, p.n, p.device); !s.isOk()) {
        return Status(s.code(), "checkpoint tensor '" + buffers[p.buffer].meta.name + "': " + s.message());
      }
      continue;
    }
    total += p.n;
    ++host_pieces;
  }
  unsigned hw = std::max(1u, std::thread::hardware_concurrency());
  unsigned threads = static_cast<unsigned>(
      std::min<size_t>({size_t{max_threads}, hw, host_pieces, total / (size_t{64} << 20) + 1}));
  threads = std::max(threads, 1u);
  std::atomic<size_t> next{0};
  auto work = [&] {
    for (size_t i = next.fetch_add(1); i < pieces.size(); i = next.fetch_add(1)) {
      if (pieces[i].device < 0) std::memcpy(pieces[i].dst, pieces[i].src, pieces[i].n);
    }
  };
  std::vector<std::thread> helpers;
  for (unsigned t = 1; t < threads; ++t) helpers.emplace_back(work);
  work();
  for (auto& h : helpers) h.join();
  return Status::ok();
}

// Staging memory: page-locked when a GPU is there (fast device-to-host copies), always freed
// the same way it was taken.
struct AlignedFree {
  bool pinned = false;
  void operator()(uint8_t* p) const {
    if (pinned) unpinHostMemory(p);
    std::free(p);
  }
};

}  // namespace

struct Checkpointer::Impl {
  // Set at construction.
  CheckpointOptions options;
  Identity identity;
  FileSystem* fs = nullptr;
  Clock* clock = nullptr;
  std::shared_ptr<CommitChannel> channel;
  Hooks hooks;
  std::string key_base;  // trainsup/ckpt/<job>/<restart>

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
};

std::string Checkpointer::stepDir(int64_t step) const { return impl_->stepDir(step); }

Result<std::unique_ptr<Checkpointer>> Checkpointer::create(const CheckpointOptions& options, const Identity& identity,
                                                           FileSystem& fs, Clock& clock,
                                                           std::shared_ptr<CommitChannel> channel, Hooks hooks) {
  if (!channel) {
    if (identity.world_size != 1) {
      return Status::invalidArgument("checkpoints of a job with world size " + std::to_string(identity.world_size) +
                                     " need a commit channel (the job's c10d store)");
    }
    channel = std::make_shared<LocalCommitChannel>();
  }
  if (Status s = fs.createDirs(options.dir); !s.isOk()) {
    return Status::ioError("checkpoint directory (TRAINSUP_CHECKPOINT_DIR): " + s.message());
  }
  auto impl = std::make_unique<Impl>();
  impl->options = options;
  impl->identity = identity;
  impl->fs = &fs;
  impl->clock = &clock;
  impl->channel = std::move(channel);
  impl->hooks = std::move(hooks);
  impl->key_base = "trainsup/ckpt/" + identity.job_id + "/" + std::to_string(identity.restart_count);
  impl->sync_steps = options.sync_steps;
  impl->last_save_time = clock.monotonicNow();
  impl->last_decision_time = impl->last_save_time;
  Impl* m = impl.get();
  impl->writer = std::thread([m] { m->writerLoop(); });
  return std::unique_ptr<Checkpointer>(new Checkpointer(std::move(impl)));
}

Checkpointer::Checkpointer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

Checkpointer::~Checkpointer() {
  {
    MutexLock lock(impl_->mu);
    impl_->stopping = true;
  }
  impl_->cv.notifyAll();
  if (impl_->writer.joinable()) impl_->writer.join();
}

// A stop request of a rank other than 0 goes to rank 0 as a count under <base>/stop, read at its
// decision points (a failure to say it leaves the stop to the supervisor's fallback).
void Checkpointer::Impl::announceStop() {
  if (!stop_local || stop_announced || identity.world_size <= 1 || identity.rank == 0) return;
  stop_announced = true;
  if (auto r = channel->add(key_base + "/stop", 1); !r) {
    log(LogLevel::kWarn, "could not tell rank 0 that this rank was asked to stop: " + r.status().message());
  }
}

void Checkpointer::requestStop() {
  Impl& m = *impl_;
  if (m.stop_local) return;
  m.stop_local = true;
  if (m.identity.world_size <= 1) m.stop_agreed.store(true);
}

bool Checkpointer::stopAgreed() const { return impl_->stop_agreed.load(); }

// Decision points: rank 0 decides, the others read its decision. With one rank, no channel.
Result<Checkpointer::Impl::Action> Checkpointer::Impl::decide(int64_t step, bool explicit_save) {
  const Nanos now = clock->monotonicNow();
  const bool multi = identity.world_size > 1;
  // A step at or below the last one saved or restored is never saved again: that would
  // rewrite a committed checkpoint in place (rank 0 decides this too, for everyone).
  const bool already = step <= last_snapshot_step;
  if (!multi) {
    if (already || (!explicit_save && !localDue(step, now))) return Action::kNone;
    return (isBusy() && options.busy_policy == BusyPolicy::kSkip) ? Action::kSkip : Action::kSave;
  }
  const int64_t seq = ++decision_seq;
  const std::string key = key_base + "/decision/" + std::to_string(seq);
  std::string value;
  if (identity.rank == 0) {
    Action a = Action::kNone;
    if (!already && (explicit_save || localDue(step, now))) {
      a = (isBusy() && options.busy_policy == BusyPolicy::kSkip) ? Action::kSkip : Action::kSave;
    }
    // Space the next decision point about kDecisionSpacingS apart (or a tenth of the interval).
    if (last_decision_step >= 0 && step > last_decision_step) {
      double step_s = toSeconds(now - last_decision_time) / static_cast<double>(step - last_decision_step);
      double target = options.interval_s > 0 ? std::min(kDecisionSpacingS, options.interval_s / 10) : kDecisionSpacingS;
      if (step_s > 0) sync_steps = static_cast<int>(std::clamp(std::floor(target / step_s), 1.0, 10000.0));
    }
    // Stop when this rank, or any other (through the channel), was asked to.
    bool stop = stop_local;
    if (!stop) {
      auto n = channel->add(key_base + "/stop", 0);
      stop = n && *n > 0;
    }
    value = std::string(a == Action::kSave ? "save" : a == Action::kSkip ? "skip" : "none") + " " +
            std::to_string(sync_steps) + (stop ? " stop" : "");
    if (Status s = channel->set(key, value); !s.isOk()) return s;
    if (seq > 2) channel->remove(key_base + "/decision/" + std::to_string(seq - 2));
  } else {
    auto got = channel->get(key, commitTimeout());
    if (!got) return Status(got.status().code(), "checkpoint decision from rank 0: " + got.status().message());
    value = *got;
  }
  last_decision_time = now;
  last_decision_step = step;
  size_t sp = value.find(' ');
  std::string word = value.substr(0, sp);
  if (sp != std::string::npos) sync_steps = std::max(1, std::atoi(value.c_str() + sp + 1));
  if (value.find(" stop") != std::string::npos && !stop_agreed.exchange(true)) {
    event("stop_agreed", {{"step", step}});
    log(LogLevel::kWarn, "every rank stops after step " + std::to_string(step) + " (a rank was asked to stop)");
  }
  if (word == "save") return Action::kSave;
  if (word == "skip") return Action::kSkip;
  return Action::kNone;
}

Status Checkpointer::awaitSnapshot() { return impl_->awaitSnapshot(); }
bool Checkpointer::snapshotOutstanding() const { return impl_->snapshot_outstanding; }

Result<Checkpointer::Outcome> Checkpointer::maybeSave(int64_t step, const Collect& collect) {
  Impl& m = *impl_;
  m.announceStop();
  m.awaitSnapshot();  // a copy failure is reported by the persist (takeError)
  bool decision_point = m.identity.world_size == 1 || step >= m.next_decision_step ||
                        (m.options.every_steps > 0 && step > 0 && step % m.options.every_steps == 0);
  if (!decision_point) return Outcome::kNotDue;
  auto action = m.decide(step, /*explicit_save=*/false);
  if (!action) return action.status();
  m.next_decision_step = step + m.sync_steps;
  if (*action == Impl::Action::kNone) return Outcome::kNotDue;
  if (*action == Impl::Action::kSkip) {
    MutexLock lock(m.mu);
    ++m.stats.skipped_busy;
  }
  if (*action == Impl::Action::kSkip) {
    m.last_save_time = m.clock->monotonicNow();  // the next one is due an interval from now
    m.event("checkpoint_skipped_busy", {{"step", step}, {"policy", busyPolicyName(m.options.busy_policy)}});
    m.log(LogLevel::kWarn, "checkpoint at step " + std::to_string(step) +
                               " skipped: the previous one is still persisting (busy policy 'skip')");
    return Outcome::kSkippedBusy;
  }
  return m.snapshotOrReport(step, m.decision_seq, collect);
}

Result<Checkpointer::Outcome> Checkpointer::save(int64_t step, const Collect& collect) {
  Impl& m = *impl_;
  m.announceStop();
  m.awaitSnapshot();
  auto action = m.decide(step, /*explicit_save=*/true);
  if (!action) return action.status();
  if (*action == Impl::Action::kSkip) {
    {
      MutexLock lock(m.mu);
      ++m.stats.skipped_busy;
    }
    m.event("checkpoint_skipped_busy", {{"step", step}, {"policy", busyPolicyName(m.options.busy_policy)}});
    return Outcome::kSkippedBusy;
  }
  return m.snapshotOrReport(step, m.decision_seq, collect);
}

// Every rank told to save must report, or rank 0 waits for the whole commit timeout.
Result<Checkpointer::Outcome> Checkpointer::Impl::snapshotOrReport(int64_t step, int64_t seq, const Collect& collect) {
  auto r = snapshot(step, seq, collect);
  if (!r) {
    const std::string prefix = key_base + "/save/" + std::to_string(seq);
    channel->set(prefix + "/shard/" + std::to_string(identity.rank), "fail snapshot: " + r.status().message());
    // Rank 0 commits: without it nobody would ever publish the result the others wait for.
    if (identity.rank == 0) channel->set(prefix + "/result", "failed: rank 0 snapshot: " + r.status().message());
    event("checkpoint_failed", {{"step", step}, {"dir", stepDir(step)}, {"reason", r.status().message()}});
  }
  return r;
}

Result<Checkpointer::Outcome> Checkpointer::Impl::snapshot(int64_t step, int64_t seq, const Collect& collect) {
  // Told to save while our previous persist is still finishing (wait policy, or rank 0 found
  // itself idle a moment before us): wait for it, so every rank saves the same steps.
  const Nanos wait_start = clock->monotonicNow();
  waitNotBusy();
  const double waited_s = toSeconds(clock->monotonicNow() - wait_start);
  const Nanos start = clock->monotonicNow();
  std::vector<BufferRef> sources;
  std::map<std::string, std::string> metadata;
  if (Status s = collect(sources, metadata); !s.isOk()) return s;
  size_t total = 0;
  for (const auto& b : sources) total += alignUp(b.nbytes);
  if (total > arena_capacity) {
    // Grows only; reused by every later checkpoint of the same or smaller size.
    void* p = nullptr;
    if (posix_memalign(&p, 4096, std::max<size_t>(total, 4096)) != 0) {
      return Status::ioError("cannot allocate " + std::to_string(total) + " bytes of checkpoint staging memory");
    }
    arena.reset();
    bool pinned = pinHostMemory(p, std::max<size_t>(total, 4096));
    arena = std::unique_ptr<uint8_t, AlignedFree>(static_cast<uint8_t*>(p), AlignedFree{pinned});
    arena_capacity = total;
    event("checkpoint_staging", {{"bytes", static_cast<int64_t>(total)}, {"pinned", pinned}});
  }
  Job j;
  j.step = step;
  j.seq = seq;
  j.metadata = std::move(metadata);
  std::vector<CopyPiece> pieces;
  std::vector<int> devices;
  size_t off = 0;
  for (const auto& b : sources) {
    BufferRef staged = b;
    staged.data = arena.get() + off;
    staged.device = -1;
    const size_t index = j.buffers.size();
    if (b.device >= 0) {
      // GPU memory: one device-to-host copy straight into (pinned) staging memory.
      pieces.push_back({arena.get() + off, static_cast<const uint8_t*>(b.data), b.nbytes, b.device, index});
      if (std::find(devices.begin(), devices.end(), b.device) == devices.end()) devices.push_back(b.device);
    } else {
      for (size_t p = 0; p < b.nbytes; p += kCopyPiece) {
        pieces.push_back({arena.get() + off + p, static_cast<const uint8_t*>(b.data) + p,
                          std::min(kCopyPiece, b.nbytes - p), -1, index});
      }
    }
    j.buffers.push_back(std::move(staged));
    off += alignUp(b.nbytes);
    j.bytes += b.nbytes;
  }
  // The copies run on streams of their own: first let the device finish the queued work that
  // produces the values being saved (the end of this step).
  for (int d : devices) {
    if (Status s = synchronizeDevice(d); !s.isOk()) return Status(s.code(), "checkpoint snapshot: " + s.message());
  }
  const bool overlapped = options.snapshot == SnapshotMode::kOverlapped;
  if (overlapped) {
    j.overlapped = true;
    j.copies = std::move(pieces);
  } else if (Status s = runCopies(pieces, j.buffers, 4); !s.isOk()) {
    return s;
  }
  j.stall_s = toSeconds(clock->monotonicNow() - start);
  last_save_time = clock->monotonicNow();
  last_snapshot_step = step;
  const double stall = j.stall_s;
  const uint64_t bytes = j.bytes;
  {
    MutexLock lock(mu);
    busy = true;
    job = std::move(j);
    ++stats.started;
    if (overlapped) {
      snapshot_pending = true;
      snapshot_status = Status::ok();
    } else {
      recordStall(stall);
    }
  }
  cv.notifyAll();
  if (overlapped) {
    snapshot_outstanding = true;
    outstanding_step = step;
    outstanding_bytes = bytes;
    outstanding_save_s = stall + waited_s;
    outstanding_waited_s = waited_s;
  } else {
    event("checkpoint_snapshot", {{"step", step}, {"bytes", bytes}, {"stall_s", stall}, {"waited_s", waited_s},
                                  {"mode", "blocking"}});
  }
  return Outcome::kStarted;
}

Status Checkpointer::Impl::awaitSnapshot() {
  if (!snapshot_outstanding) return Status::ok();
  snapshot_outstanding = false;
  const Nanos start = clock->monotonicNow();
  Status copied;
  double copy_s = 0, blocked_s = 0, stall = 0;
  {
    MutexLock lock(mu);
    cv.wait(mu, [&] { mu.assertHeld(); return !snapshot_pending; });
    copied = snapshot_status;
    copy_s = snapshot_copy_s;
    blocked_s = toSeconds(clock->monotonicNow() - start);
    stall = outstanding_save_s + blocked_s;
    recordStall(stall);
  }
  event("checkpoint_snapshot", {{"step", outstanding_step}, {"bytes", outstanding_bytes}, {"stall_s", stall},
                                {"waited_s", outstanding_waited_s}, {"mode", "overlapped"}, {"copy_s", copy_s},
                                {"blocked_s", blocked_s}, {"ok", copied.isOk()}, {"error", copied.message()}});
  return copied;
}

void Checkpointer::Impl::writerLoop() {
  for (;;) {
    Job j;
    {
      MutexLock lock(mu);
      cv.wait(mu, [&] { mu.assertHeld(); return stopping || job.has_value(); });
      if (!job) return;  // stopping with nothing queued
      j = std::move(*job);
      job.reset();
    }
    if (j.overlapped) {
      // Fewer threads than a blocking copy: this one runs beside the training's own compute.
      const Nanos copy_start = clock->monotonicNow();
      Status copied = runCopies(j.copies, j.buffers, std::max(1u, std::thread::hardware_concurrency() / 4));
      j.copies.clear();
      j.copy_status = copied;
      {
        MutexLock lock(mu);
        snapshot_pending = false;
        snapshot_status = copied;
        snapshot_copy_s = toSeconds(clock->monotonicNow() - copy_start);
      }
      cv.notifyAll();
    }
    try {
      persist(j);
    } catch (const std::exception& e) {
      // A bug or resource failure in one persist must not terminate the training process.
      MutexLock lock(mu);
      ++stats.failed;
      Status st = Status::internal(std::string("checkpoint persist: ") + e.what());
      if (bg_error.isOk()) bg_error = st;
      last_persist = st;
    }
    {
      MutexLock lock(mu);
      busy = false;
    }
    cv.notifyAll();
  }
}

void Checkpointer::Impl::persist(Job& j) {
  const Nanos start = clock->monotonicNow();
  // Waits on the channel happen in real time, whatever clock the statistics use.
  const Nanos deadline = Clock::real().monotonicNow() + commitTimeout();
  const std::string dir = stepDir(j.step);
  const std::string prefix = key_base + "/save/" + std::to_string(j.seq);
  ShardInfo mine;
  Status s = j.copy_status;
  if (s.isOk()) s = fs->createDirs(dir);
  // The step directory's entry in the checkpoint directory must be durable before anything in
  // it counts: without this fsync a power loss can drop the whole directory of a checkpoint
  // reported committed, after retention has already deleted the older ones
  // (tests/core/crash_safety_test.cc).
  if (s.isOk()) s = fs->syncDir(options.dir);
  if (s.isOk()) s = writeShard(*fs, dir, identity.rank, identity.world_size, j.step, j.buffers, &mine);
  // Report to rank 0 either way, so it does not wait for a shard that will never come.
  std::string report = s.isOk() ? "ok " + std::to_string(mine.file_size) + " " + std::to_string(mine.index_xxh3)
                                : "fail " + s.message();
  Status ps = channel->set(prefix + "/shard/" + std::to_string(identity.rank), report);
  Status result = s;
  if (result.isOk() && !ps.isOk()) result = ps;
  if (identity.rank == 0) {
    Status c = commitAsRankZero(j, mine, prefix, deadline);
    if (result.isOk()) result = c;
  } else if (result.isOk()) {
    result = awaitCommit(j, mine, dir, prefix, deadline);
  }
  const double persist_s = toSeconds(clock->monotonicNow() - start);
  if (result.isOk()) {
    double yd = 0;
    {
      MutexLock lock(mu);
      ++stats.committed;
      stats.last_committed_step = j.step;
      stats.last_persist_s = persist_s;
      stats.last_bytes = j.bytes;
      yd = stats.young_daly_s;
      last_persist = Status::ok();
    }
    event("checkpoint_committed", {{"step", j.step},
                                   {"dir", dir},
                                   {"bytes", j.bytes},
                                   {"stall_s", j.stall_s},
                                   {"persist_s", persist_s},
                                   {"young_daly_interval_s", yd}});
    // Housekeeping after the commit is recorded: deleting old shards is not part of persisting.
    if (identity.rank == 0) applyRetention(j.step);
    log(LogLevel::kInfo, "checkpoint step " + std::to_string(j.step) + " committed in " + dir + " (" +
                             std::to_string(j.bytes >> 20) + " MiB, stall " + std::to_string(j.stall_s) +
                             " s, persist " + std::to_string(persist_s) + " s" +
                             (yd > 0 ? ", Young/Daly interval " + std::to_string(yd) + " s" : "") + ")");
  } else {
    {
      MutexLock lock(mu);
      ++stats.failed;
      if (bg_error.isOk()) bg_error = result;
      last_persist = result;
    }
    event("checkpoint_failed", {{"step", j.step}, {"dir", dir}, {"reason", result.message()}});
    log(LogLevel::kError, "checkpoint step " + std::to_string(j.step) + " FAILED (training continues; older "
                          "checkpoints are intact): " + result.message());
  }
}

// A rank other than 0 waits for rank 0's result. The manifest on disk is the commit itself: if
// rank 0 wrote it but could not publish the result (its store connection failed), the ranks
// learn of the commit from the manifest within a second instead of waiting out the timeout.
Status Checkpointer::Impl::awaitCommit(const Job& j, const ShardInfo& mine, const std::string& dir,
                                       const std::string& prefix, Nanos deadline) {
  for (;;) {
    const Nanos left = remaining(deadline);
    auto got = channel->get(prefix + "/result", std::min<Nanos>(left, std::chrono::seconds(1)));
    if (got) {
      return *got == "committed" ? Status::ok() : Status::ioError("checkpoint not committed: " + *got);
    }
    if (got.status().code() != StatusCode::kTimedOut) {
      return Status(got.status().code(), "waiting for rank 0 to commit: " + got.status().message());
    }
    if (auto m = readManifest(*fs, dir); m && m->step == j.step &&
        static_cast<size_t>(identity.rank) < m->shards.size() &&
        m->shards[static_cast<size_t>(identity.rank)].xxh3 == mine.index_xxh3 &&
        m->shards[static_cast<size_t>(identity.rank)].size == mine.file_size) {
      event("checkpoint_result_from_manifest", {{"step", j.step}});
      return Status::ok();
    }
    if (left <= std::chrono::seconds(1)) {
      return Status::timedOut("waiting for rank 0 to commit: no result and no manifest within the commit timeout (" +
                              std::to_string(toSeconds(commitTimeout())) + " s)");
    }
  }
}

Status Checkpointer::Impl::commitAsRankZero(const Job& j, const ShardInfo& mine, const std::string& prefix,
                                            Nanos deadline) {
  const std::string dir = stepDir(j.step);
  Manifest m;
  m.step = j.step;
  m.world_size = identity.world_size;
  m.created_unix_s = std::chrono::duration<double>(clock->wallNow().time_since_epoch()).count();
  m.library_version = kVersionString;
  m.job_id = identity.job_id;
  m.metadata = j.metadata;
  std::string failure;
  for (int r = 0; r < identity.world_size; ++r) {
    auto got = channel->get(prefix + "/shard/" + std::to_string(r), remaining(deadline));
    if (!got) {
      failure = "rank " + std::to_string(r) + " did not report its shard: " + got.status().message();
      break;
    }
    if (got->rfind("ok ", 0) != 0) {
      failure = "rank " + std::to_string(r) + ": " + got->substr(std::min<size_t>(5, got->size()));
      break;
    }
    ManifestShard ms;
    ms.rank = r;
    ms.file = shardFileName(r, identity.world_size);
    char* end = nullptr;
    ms.size = std::strtoull(got->c_str() + 3, &end, 10);
    ms.xxh3 = std::strtoull(end, nullptr, 10);
    m.shards.push_back(ms);
  }
  (void)mine;
  Status s = failure.empty() ? writeManifest(*fs, dir, m) : Status::ioError(failure);
  // The other ranks wait for this: retry a store hiccup for a moment. If it cannot be said,
  // a committed checkpoint is still committed (its manifest is on disk, where they look too).
  const std::string said = s.isOk() ? "committed" : "failed: " + s.message();
  Status published;
  for (int attempt = 0; attempt < 5; ++attempt) {
    if ((published = channel->set(prefix + "/result", said)).isOk()) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(50 << attempt));  // backoff, not synchronization
  }
  if (!published.isOk()) {
    event("checkpoint_result_unpublished", {{"step", j.step}, {"result", said}, {"error", published.message()}});
    log(LogLevel::kWarn, "checkpoint step " + std::to_string(j.step) + ": could not tell the other ranks '" + said +
                             "': " + published.message() + (s.isOk() ? " (they find the manifest instead)" : ""));
  }
  // Everyone has finished the previous save's keys by now (they reported this one).
  if (previous_save_seq > 0) {
    const std::string old = key_base + "/save/" + std::to_string(previous_save_seq);
    for (int r = 0; r < identity.world_size; ++r) channel->remove(old + "/shard/" + std::to_string(r));
    channel->remove(old + "/result");
  }
  previous_save_seq = j.seq;
  return s;
}

void Checkpointer::Impl::applyRetention(int64_t committed_step) {
  auto plan = planRetention(*fs, options.dir, options.keep, committed_step);
  if (!plan) {
    log(LogLevel::kWarn, "checkpoint retention skipped: " + plan.status().message());
    return;
  }
  for (int64_t step : plan->remove) {
    Status s = removeCheckpoint(*fs, stepDir(step));
    event("checkpoint_removed", {{"step", step}, {"dir", stepDir(step)}, {"ok", s.isOk()}, {"error", s.message()}});
    if (!s.isOk()) log(LogLevel::kWarn, "retention could not remove " + stepDir(step) + ": " + s.message());
  }
}

Status Checkpointer::waitIdle(Nanos timeout) {
  impl_->awaitSnapshot();
  MutexLock lock(impl_->mu);
  if (!impl_->cv.waitFor(impl_->mu, timeout, [&] { impl_->mu.assertHeld(); return !impl_->busy; })) {
    return Status::timedOut("checkpoint persist still running after " + std::to_string(toSeconds(timeout)) + " s");
  }
  return impl_->last_persist;
}

Status Checkpointer::takeError() {
  MutexLock lock(impl_->mu);
  Status s = impl_->bg_error;
  impl_->bg_error = Status::ok();
  return s;
}

Checkpointer::Stats Checkpointer::stats() const {
  MutexLock lock(impl_->mu);
  return impl_->stats;
}

// Every rank checks its own shard of each candidate (newest first) while loading it, then the
// ranks agree through the channel: a candidate is restored only if it loaded on every rank.
Result<std::optional<int64_t>> Checkpointer::restore(const Load& load) {
  Impl& m = *impl_;
  m.awaitSnapshot();
  const Nanos start = m.clock->monotonicNow();
  const std::string attempt = m.key_base + "/restore/" + std::to_string(++m.restore_attempts);
  std::vector<int64_t> steps;
  if (m.identity.rank == 0 || m.identity.world_size == 1) {
    auto names = m.fs->listDir(m.options.dir);
    if (!names && names.status().code() != StatusCode::kNotFound) return names.status();
    if (names) {
      for (const auto& n : *names) {
        if (auto s = parseCheckpointDirName(n)) steps.push_back(*s);
      }
    }
    std::sort(steps.rbegin(), steps.rend());
  }
  if (m.identity.world_size > 1) {
    // Rank 0's listing is everyone's: listings of a shared file system can differ between
    // hosts for a while (client caching), and every rank must vote on the same candidates.
    if (m.identity.rank == 0) {
      std::string list;
      for (int64_t st : steps) list += (list.empty() ? "" : ",") + std::to_string(st);
      if (Status s = m.channel->set(attempt + "/candidates", list); !s.isOk()) return s;
    } else {
      auto list = m.channel->get(attempt + "/candidates", m.commitTimeout());
      if (!list) return Status(list.status().code(), "restore candidates from rank 0: " + list.status().message());
      for (size_t pos = 0; pos < list->size();) {
        size_t end = list->find(',', pos);
        if (end == std::string::npos) end = list->size();
        steps.push_back(std::stoll(list->substr(pos, end - pos)));
        pos = end + 1;
      }
    }
  }
  int world_mismatches = 0;
  int mismatch_world = 0;
  int loads_attempted = 0;  // after one, the caller's state may be partly overwritten
  for (int64_t step : steps) {
    const std::string dir = m.stepDir(step);
    std::string file = joinPath(dir, kManifestName);
    Status st;
    bool fatal = false;
    auto manifest = readManifest(*m.fs, dir);
    Result<std::unique_ptr<ShardReader>> opened = Status::internal("not opened");
    if (!manifest) {
      st = manifest.status().code() == StatusCode::kNotFound ? Status::notFound("missing manifest") : manifest.status();
    } else if (manifest->step != step) {
      st = Status::corruption("the manifest is of step " + std::to_string(manifest->step) + ", its directory of step " +
                              std::to_string(step));
    } else if (manifest->world_size != m.identity.world_size && !m.options.replicated) {
      ++world_mismatches;
      mismatch_world = manifest->world_size;
      st = Status::invalidArgument("world-size mismatch: written by world size " + std::to_string(manifest->world_size) +
                                   ", this job has " + std::to_string(m.identity.world_size));
    } else {
      // Replicated state (every rank saved the same, as with DDP): any shard will do, so a job
      // of another size reads shard rank % N of the N written.
      const int shard_rank = m.identity.rank % std::max(1, manifest->world_size);
      file = joinPath(dir, manifest->shards[static_cast<size_t>(shard_rank)].file);
      opened = openCheckedShard(*m.fs, dir, *manifest, shard_rank, step);
      if (!opened) {
        st = opened.status();
      } else {
        ++loads_attempted;
        st = load(*manifest, **opened);
        // The model does not match the checkpoint: an older one will not match either, and
        // silently starting from scratch would lose the run. Stop, on every rank.
        fatal = st.code() == StatusCode::kInvalidArgument;
      }
    }
    // Agree: every rank adds its vote; the last one publishes the count of successes.
    std::string agreed_failure;
    if (m.identity.world_size > 1) {
      const std::string k = attempt + "/" + std::to_string(step);
      if (!st.isOk()) m.channel->set(k + "/why", "rank " + std::to_string(m.identity.rank) + ": " + st.message());
      auto oks = m.channel->add(k + "/ok", st.isOk() ? 1 : 0);
      auto aborts = m.channel->add(k + "/abort", fatal ? 1 : 0);
      auto n = m.channel->add(k + "/n", 1);
      if (!aborts) return aborts.status();
      if (!oks || !n) return !oks ? oks.status() : n.status();
      if (*n == m.identity.world_size) m.channel->set(k + "/done", "1");
      auto done = m.channel->get(k + "/done", m.commitTimeout());
      if (!done) return Status(done.status().code(), "restore agreement: " + done.status().message());
      auto total_ok = m.channel->add(k + "/ok", 0);
      if (!total_ok) return total_ok.status();
      auto total_abort = m.channel->add(k + "/abort", 0);
      if (total_abort && *total_abort > 0 && !fatal) {
        auto why = m.channel->get(k + "/why", std::chrono::seconds(5));
        return Status::invalidArgument("restore of " + dir + " stopped: " + (why ? *why : "another rank's state does not match"));
      }
      if (st.isOk() && *total_ok != m.identity.world_size) {
        auto why = m.channel->get(k + "/why", std::chrono::seconds(5));
        agreed_failure = why ? *why : "another rank could not load it";
      }
    }
    if (st.isOk() && agreed_failure.empty()) {
      const double took = toSeconds(m.clock->monotonicNow() - start);
      m.event("checkpoint_restored", {{"step", step}, {"dir", dir}, {"restore_s", took}});
      m.log(LogLevel::kInfo, "restored checkpoint step " + std::to_string(step) + " from " + dir + " in " +
                                 std::to_string(took) + " s");
      m.last_save_time = m.clock->monotonicNow();
      m.last_snapshot_step = step;
      return std::optional<int64_t>(step);
    }
    if (fatal) {
      m.event("checkpoint_restore_failed", {{"step", step}, {"dir", dir}, {"file", file}, {"reason", st.message()}});
      return Status::invalidArgument("restore of " + dir + " stopped: " + st.message());
    }
    std::string reason = st.isOk() ? agreed_failure : st.message();
    m.event("checkpoint_skipped", {{"step", step}, {"dir", dir}, {"file", file}, {"reason", reason}});
    m.log(LogLevel::kWarn, "skipping checkpoint " + dir + ": " + reason + " (" + file + ")");
  }
  if (loads_attempted > 0) {
    return Status::unavailable("no checkpoint in '" + m.options.dir + "' verified on every rank after " +
                               std::to_string(loads_attempted) +
                               " load attempt(s); the state may be partly loaded, so training cannot start from it");
  }
  if (world_mismatches > 0) {
    return Status::invalidArgument("no usable checkpoint in '" + m.options.dir + "': " +
                                   std::to_string(world_mismatches) + " were written by world size " +
                                   std::to_string(mismatch_world) + ", this job has " +
                                   std::to_string(m.identity.world_size) + "; resharding is not supported");
  }
  return std::optional<int64_t>(std::nullopt);
}

Result<RetentionPlan> planRetention(FileSystem& fs, const std::string& dir, int keep, int64_t committed_step) {
  auto names = fs.listDir(dir);
  if (!names) return names.status();
  std::vector<int64_t> steps;
  for (const auto& n : *names) {
    auto s = parseCheckpointDirName(n);
    // Directories newer than what was just committed are not ours to judge (a skipped,
    // possibly corrupt checkpoint of an earlier attempt): they neither count nor go.
    if (s && *s <= committed_step) steps.push_back(*s);
  }
  std::sort(steps.rbegin(), steps.rend());
  RetentionPlan plan;
  bool seen_valid = false;
  for (int64_t step : steps) {
    const std::string d = joinPath(dir, checkpointDirName(step));
    const bool valid = checkCheckpoint(fs, d, step).isOk();  // as restore sees it, short of the data
    if (step == committed_step || (valid && static_cast<int>(plan.keep.size()) < keep)) {
      plan.keep.push_back(step);  // the just-committed one is always kept
      seen_valid = seen_valid || valid || step == committed_step;
    } else if (seen_valid) {
      plan.remove.push_back(step);  // older than the newest valid: a surplus or a broken one
    }
  }
  return plan;
}

Status removeCheckpoint(FileSystem& fs, const std::string& step_dir) {
  if (Status s = fs.removeFile(joinPath(step_dir, kManifestName)); !s.isOk()) return s;
  if (Status s = fs.syncDir(step_dir); !s.isOk() && s.code() != StatusCode::kIoError) return s;
  auto names = fs.listDir(step_dir);
  if (!names) return names.status().code() == StatusCode::kNotFound ? Status::ok() : names.status();
  for (const auto& n : *names) {
    if (Status s = fs.removeFile(joinPath(step_dir, n)); !s.isOk()) return s;
  }
  return fs.removeDir(step_dir);
}

}  // namespace trainsup
