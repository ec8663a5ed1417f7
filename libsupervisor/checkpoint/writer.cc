// The writer thread: persists a staged snapshot (shard file, fsync, durable report through the
// channel); rank 0 writes the manifest once every rank reported, and retention follows.
#include "checkpoint/checkpointer_impl.h"
#include "trainsup/version.h"

#include <sstream>

#include <nlohmann/json.hpp>

namespace trainsup {

using namespace checkpoint_internal;

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
      Status copied;
      try {
        copied = runCopies(j.copies, j.buffers, std::max(1u, std::thread::hardware_concurrency() / 4));
      } catch (const std::exception& e) {  // the training thread waits for this copy: it must end
        copied = Status::internal(std::string("checkpoint snapshot copy: ") + e.what());
      }
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
  std::vector<BufferRef> buffers = j.buffers;
  std::vector<std::pair<std::string, std::string>> extra;
  if (persist_hook && j.copy_status.isOk()) {
    // Called whether or not the directory could be made here: the hook's own writers may agree
    // with the other ranks' (torch.distributed.checkpoint does), and fail there at once.
    auto written = persist_hook(dir, j.step);
    if (!written && s.isOk()) s = Status(written.status().code(), "writing the checkpoint data: " + written.status().message());
    if (written) extra = std::move(*written);
    for (const auto& [name, bytes] : extra) {
      BufferRef r;
      r.meta.name = name;
      r.meta.dtype = DType::kBytes;
      r.meta.shape = {static_cast<int64_t>(bytes.size())};
      r.data = bytes.data();
      r.nbytes = bytes.size();
      buffers.push_back(std::move(r));
    }
  }
  if (s.isOk()) s = writeShard(*fs, dir, identity.rank, identity.world_size, j.step, buffers, &mine);
  // The memory tier: the shard counts only once a peer host's agent holds a verified copy.
  std::string replica;
  if (s.isOk() && options.memory_tier && options.replicas > 0) {
    auto peer = agent_link.replicate(shardFile(j.step, identity.rank, identity.world_size), remaining(deadline));
    if (peer) {
      replica = *peer;
    } else {
      s = Status(peer.status().code(), "copying this rank's snapshot to a peer host: " + peer.status().message());
    }
  }
  // Report to rank 0 either way, so it does not wait for a shard that will never come.
  std::string report = s.isOk() ? "ok " + std::to_string(mine.file_size) + " " + std::to_string(mine.index_xxh3)
                                : "fail " + s.message();
  if (s.isOk() && options.memory_tier) report += " " + identity.host + " " + (replica.empty() ? "-" : replica);
  Status ps = channel->set(prefix + "/shard/" + std::to_string(identity.rank), report);
  Status result = s;
  if (result.isOk() && !ps.isOk()) result = ps;
  if (identity.rank == 0) {
    Status c = commitAsRankZero(j, mine, prefix, deadline);
    if (result.isOk()) result = c;
  } else if (result.isOk()) {
    result = awaitCommit(j, mine, dir, prefix, deadline);
    if (result.isOk() && options.memory_tier && identity.local_rank == 0) adoptManifest(j, prefix);
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
    event(options.memory_tier ? "snapshot_committed" : "checkpoint_committed", {{"step", j.step},
                                   {"dir", dir},
                                   {"bytes", j.bytes},
                                   {"stall_s", j.stall_s},
                                   {"persist_s", persist_s},
                                   {"young_daly_interval_s", yd}});
    // Housekeeping after the commit is recorded: deleting old shards is not part of persisting.
    if (options.memory_tier) {
      if (identity.local_rank == 0) applyMemoryRetention(j.step);  // one rank per host, on its host
    } else if (identity.rank == 0) {
      applyRetention(j.step);
    }
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
    event(options.memory_tier ? "snapshot_failed" : "checkpoint_failed",
          {{"step", j.step}, {"dir", dir}, {"reason", result.message()}});
    log(LogLevel::kError, std::string(options.memory_tier ? "snapshot" : "checkpoint") + " step " +
                              std::to_string(j.step) + " FAILED (training continues; older ones are intact): " +
                              result.message());
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
  nlohmann::json placement = nlohmann::json::array();
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
    ms.xxh3 = std::strtoull(end, &end, 10);
    m.shards.push_back(ms);
    if (options.memory_tier) {
      // "<host> <replica host or ->": where the shard and its peer copy are held.
      std::istringstream words(end);
      std::string host, replica;
      words >> host >> replica;
      placement.push_back({host, replica == "-" ? "" : replica});
    }
  }
  (void)mine;
  if (options.memory_tier) m.metadata[kPlacementKey] = placement.dump();
  const std::string text = manifestText(m);
  Status s = failure.empty() ? writeManifestText(*fs, dir, text) : Status::ioError(failure);
  // Every host keeps its own copy of the manifest (its local rank 0 writes it, adoptManifest):
  // published before the result, which the other ranks wait for.
  if (s.isOk() && options.memory_tier) {
    if (Status p = channel->set(prefix + "/manifest", text); !p.isOk()) {
      s = Status(p.code(), "publishing the snapshot's manifest to the other hosts: " + p.message());
    }
  }
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
    channel->remove(old + "/manifest");
  }
  previous_save_seq = j.seq;
  return s;
}

}  // namespace trainsup
