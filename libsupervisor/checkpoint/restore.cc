// Restore: the newest checkpoint that loads and verifies on every rank, agreed through the
// channel; each invalid candidate is skipped with its reason.
#include "checkpoint/checkpointer_impl.h"

namespace trainsup {

using namespace checkpoint_internal;

// Every rank adds its `counts` under `k` (saying why under k/why when `mine` failed), the last
// to add publishes k/done, and each rank then reads the totals, in the order given. An error is
// the channel's.
Result<std::vector<int64_t>> Checkpointer::Impl::sumOverRanks(
    const std::string& k, const Status& mine, const std::vector<std::pair<std::string, int64_t>>& counts) {
  if (!mine.isOk()) channel->set(k + "/why", "rank " + std::to_string(identity.rank) + ": " + mine.message());
  for (const auto& [name, value] : counts) {
    if (auto added = channel->add(k + "/" + name, value); !added) return added.status();
  }
  auto n = channel->add(k + "/n", 1);
  if (!n) return n.status();
  if (*n == identity.world_size) channel->set(k + "/done", "1");
  auto done = channel->get(k + "/done", commitTimeout());
  if (!done) return Status(done.status().code(), "restore agreement: " + done.status().message());
  std::vector<int64_t> totals;
  for (const auto& [name, value] : counts) {
    auto total = channel->add(k + "/" + name, 0);
    if (!total) return total.status();
    totals.push_back(*total);
  }
  return totals;
}

// What a failed rank said under k/why (sumOverRanks), or `otherwise`.
std::string Checkpointer::Impl::whyOf(const std::string& k, const std::string& otherwise) {
  auto why = channel->get(k + "/why", std::chrono::seconds(5));
  return why ? *why : otherwise;
}

namespace {
// A layout that any world size reads (torch.distributed.checkpoint's planner reshards it).
bool reshards(const Manifest& m) {
  auto it = m.metadata.find(kLayoutKey);
  return it != m.metadata.end() && it->second == "dcp";
}
}  // namespace

// Every rank checks its own shard of each candidate (newest first) while loading it, then the
// ranks agree through the channel: a candidate is restored only if it loaded on every rank.
Result<std::optional<int64_t>> Checkpointer::restore(const Load& load, int64_t at_least) {
  Impl& m = *impl_;
  m.awaitSnapshot();
  if (m.options.memory_tier) return m.restoreMemory(load, at_least);
  const Nanos start = m.clock->monotonicNow();
  const std::string attempt = m.key_base + "/restore/" + std::to_string(++m.restore_attempts);
  std::vector<int64_t> steps;
  if (m.identity.rank == 0 || m.identity.world_size == 1) {
    auto names = m.fs->listDir(m.options.dir);
    if (!names && names.status().code() != StatusCode::kNotFound) return names.status();
    if (names) {
      for (const auto& n : *names) {
        std::string why;
        if (auto s = parseCheckpointDirName(n, &why)) {
          if (*s >= at_least) steps.push_back(*s);
        } else if (!why.empty()) {
          const std::string dir = joinPath(m.options.dir, n);
          m.event("checkpoint_skipped", {{"step", int64_t{-1}}, {"dir", dir}, {"file", dir}, {"reason", why}});
          m.log(LogLevel::kWarn, "skipping " + dir + ": " + why);
        }
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
    } else if (manifest->world_size != m.identity.world_size && !m.options.replicated && !reshards(*manifest)) {
      ++world_mismatches;
      mismatch_world = manifest->world_size;
      st = Status::invalidArgument("world-size mismatch: written by world size " + std::to_string(manifest->world_size) +
                                   ", this job has " + std::to_string(m.identity.world_size));
    } else {
      // Replicated state (every rank saved the same, as with DDP): any shard will do, so a job
      // of another size reads shard rank % N of the N written. A resharding layout (dcp) reads
      // what it needs from every shard; it is handed shard rank % N to start from.
      const int shard_rank = m.identity.rank % std::max(1, manifest->world_size);
      file = joinPath(dir, manifest->shards[static_cast<size_t>(shard_rank)].file);
      opened = openCheckedShard(*m.fs, dir, *manifest, shard_rank, step);
      if (!opened) st = opened.status();
      // A dcp load is itself collective (torch.distributed.checkpoint plans and reads across
      // ranks): either every rank enters it or none does, or the ranks that did would wait for
      // the one whose shard failed until the collective's timeout.
      if (reshards(*manifest) && m.identity.world_size > 1) {
        const std::string k = attempt + "/" + std::to_string(step) + "/open";
        auto all = m.sumOverRanks(k, st, {{"ok", st.isOk() ? 1 : 0}});
        if (!all) return all.status();
        if (st.isOk() && (*all)[0] != m.identity.world_size) {
          st = Status::corruption(m.whyOf(k, "another rank could not open its shard"));
        }
      }
      if (st.isOk()) {
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
      auto totals = m.sumOverRanks(k, st, {{"ok", st.isOk() ? 1 : 0}, {"abort", fatal ? 1 : 0}});
      if (!totals) return totals.status();
      if ((*totals)[1] > 0 && !fatal) {
        return Status::invalidArgument("restore of " + dir + " stopped: " +
                                       m.whyOf(k, "another rank's state does not match"));
      }
      if (st.isOk() && (*totals)[0] != m.identity.world_size) agreed_failure = m.whyOf(k, "another rank could not load it");
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

}  // namespace trainsup
