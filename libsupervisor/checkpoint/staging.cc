// Snapshots: the state is copied into the reusable staging arena at a step boundary (the only
// stall of the training thread), or copied by the writer thread while training goes on
// (overlapped snapshots, device tensors by DMA into pinned memory).
#include "checkpoint/checkpointer_impl.h"
#include "base/worker_threads.h"

#include <algorithm>
#include <cstring>

namespace trainsup {

using namespace checkpoint_internal;

// Copies every piece: device buffers one by one (each is one DMA transfer), host pieces by up
// to `max_threads` threads (the caller is one of them); one core rarely saturates memory
// bandwidth. Returns the first failure, naming the tensor.
Status checkpoint_internal::runCopies(const std::vector<CopyPiece>& pieces, const std::vector<BufferRef>& buffers,
                                       unsigned max_threads) {
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
  // Fewer helpers than asked (the process at its thread limit) make a slower copy, not a
  // failed one; every helper is joined on every path (base/worker_threads.h).
  return runOnThreads(threads, work, "checkpoint snapshot copy");
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

}  // namespace trainsup
