// The memory tier of a Checkpointer (docs/snapshots.md): after a commit each host keeps its own
// copy of the manifest and only the newest snapshots; a restore takes each rank's shard from
// this host's memory, else from a peer host's copy that the agent fetches, verified either way.
#include "checkpoint/checkpointer_impl.h"

#include <set>
#include <sstream>

#include <nlohmann/json.hpp>

namespace trainsup {

using namespace checkpoint_internal;

// A rank other than 0, the first of its host: rank 0's manifest, byte for byte, in this host's
// step directory, so that every host that held a shard (or a copy) can vouch for the snapshot.
void Checkpointer::Impl::adoptManifest(const Job& j, const std::string& prefix) {
  auto text = channel->get(prefix + "/manifest", std::chrono::seconds(5));
  Status s = text ? writeManifestText(*fs, stepDir(j.step), *text) : text.status();
  if (!s.isOk()) {
    event("snapshot_manifest_missing", {{"step", j.step}, {"dir", stepDir(j.step)}, {"reason", s.message()}});
    log(LogLevel::kWarn, "snapshot step " + std::to_string(j.step) + " is committed, but this host keeps no copy of "
                         "its manifest (a restore fetches it from another host): " + s.message());
  }
}

// This host's snapshot memory holds the newest `keep` committed steps (own shards and peer
// copies alike); older step directories, and failed ones older than the commit, go.
void Checkpointer::Impl::applyMemoryRetention(int64_t committed_step) {
  auto names = fs->listDir(options.dir);
  if (!names) return;
  std::vector<int64_t> steps;
  for (const auto& n : *names) {
    if (auto s = parseCheckpointDirName(n); s && *s < committed_step) steps.push_back(*s);
  }
  std::sort(steps.rbegin(), steps.rend());
  int kept = 1;  // the one just committed
  for (int64_t step : steps) {
    const bool has_manifest = readManifest(*fs, stepDir(step)).isOk();
    if (has_manifest && kept < options.keep) {
      ++kept;
      continue;
    }
    Status s = removeCheckpoint(*fs, stepDir(step));
    if (!s.isOk()) log(LogLevel::kWarn, "snapshot retention could not remove " + stepDir(step) + ": " + s.message());
  }
}

namespace {

std::string joinSteps(const std::vector<int64_t>& steps) {
  std::string out;
  for (int64_t s : steps) out += (out.empty() ? "" : ",") + std::to_string(s);
  return out;
}

std::vector<int64_t> splitSteps(const std::string& text) {
  std::vector<int64_t> out;
  std::istringstream in(text);
  std::string item;
  while (std::getline(in, item, ',')) {
    if (!item.empty()) out.push_back(std::stoll(item));
  }
  return out;
}

// Where the manifest says rank `r`'s shard and its peer copy are held, in that order.
std::vector<std::string> holdersOf(const Manifest& m, int r) {
  std::vector<std::string> hosts;
  auto it = m.metadata.find(kPlacementKey);
  if (it == m.metadata.end()) return hosts;
  nlohmann::json p = nlohmann::json::parse(it->second, nullptr, /*allow_exceptions=*/false);
  if (!p.is_array() || r < 0 || static_cast<size_t>(r) >= p.size() || !p[static_cast<size_t>(r)].is_array()) return hosts;
  for (const auto& h : p[static_cast<size_t>(r)]) {
    if (h.is_string() && !h.get<std::string>().empty()) hosts.push_back(h.get<std::string>());
  }
  return hosts;
}

}  // namespace

Result<std::optional<int64_t>> Checkpointer::Impl::restoreMemory(const Load& load, int64_t at_least) {
  const Nanos start = clock->monotonicNow();
  const std::string attempt = key_base + "/restore/" + std::to_string(++restore_attempts);
  // The committed steps this host holds a manifest of.
  std::vector<int64_t> mine;
  if (auto names = fs->listDir(options.dir)) {
    for (const auto& n : *names) {
      auto s = parseCheckpointDirName(n);
      if (s && *s >= at_least && readManifest(*fs, stepDir(*s)).isOk()) mine.push_back(*s);
    }
  }
  // Candidates: every step any host holds a manifest of (a spare holds none), newest first.
  // Rank 0 reads every rank's list and publishes the union (one read per rank).
  std::set<int64_t, std::greater<>> all(mine.begin(), mine.end());
  if (identity.world_size > 1) {
    if (Status s = channel->set(attempt + "/have/" + std::to_string(identity.rank), joinSteps(mine)); !s.isOk()) return s;
    if (identity.rank == 0) {
      for (int r = 1; r < identity.world_size; ++r) {
        auto list = channel->get(attempt + "/have/" + std::to_string(r), commitTimeout());
        if (!list) return Status(list.status().code(), "snapshot lists of the other ranks: " + list.status().message());
        for (int64_t s : splitSteps(*list)) all.insert(s);
      }
      if (Status s = channel->set(attempt + "/candidates", joinSteps({all.begin(), all.end()})); !s.isOk()) return s;
    } else {
      auto list = channel->get(attempt + "/candidates", commitTimeout());
      if (!list) return Status(list.status().code(), "snapshot candidates from rank 0: " + list.status().message());
      auto steps = splitSteps(*list);
      all = std::set<int64_t, std::greater<>>(steps.begin(), steps.end());
    }
  }
  int loads_attempted = 0;
  std::string skipped;  // why each candidate was not restored
  for (int64_t step : all) {
    const std::string dir = stepDir(step);
    const std::string manifest_file = checkpointDirName(step) + "/" + kManifestName;
    Status st;
    bool fatal = false;
    std::string source = "local";
    auto manifest = readManifest(*fs, dir);
    if (!manifest && manifest.status().code() != StatusCode::kNotFound) {
      event("snapshot_copy_skipped", {{"step", step}, {"file", joinPath(dir, kManifestName)},
                                      {"reason", manifest.status().message()}});
    }
    if (!manifest) {
      // This host held no part of it (a spare), or its copy was bad: any host of the round.
      if (Status f = agent_link.fetch(manifest_file, {}, commitTimeout()); f.isOk()) {
        manifest = readManifest(*fs, dir);
      } else {
        manifest = Status(f.code(), "no host has its manifest: " + f.message());
      }
    }
    std::string file = joinPath(dir, kManifestName);
    Result<std::unique_ptr<ShardReader>> opened = Status::internal("not opened");
    if (!manifest) {
      st = manifest.status();
    } else if (manifest->step != step) {
      st = Status::corruption("the manifest is of step " + std::to_string(manifest->step) + ", its directory of step " +
                              std::to_string(step));
    } else if (manifest->world_size != identity.world_size && !options.replicated) {
      st = Status::invalidArgument("world-size mismatch: written by world size " + std::to_string(manifest->world_size) +
                                   ", this job has " + std::to_string(identity.world_size) +
                                   " (snapshots are restored by a job of the same size; the disk tier reshards)");
    } else {
      const int shard_rank = identity.rank % std::max(1, manifest->world_size);
      file = joinPath(dir, manifest->shards[static_cast<size_t>(shard_rank)].file);
      opened = openCheckedShard(*fs, dir, *manifest, shard_rank, step);
      if (!opened && opened.status().code() != StatusCode::kNotFound) {
        // A damaged copy here: skip it (removed, so that the fetch can put a good one in its place).
        event("snapshot_copy_skipped", {{"step", step}, {"file", file}, {"reason", opened.status().message()}});
        log(LogLevel::kWarn, "skipping this host's copy of " + file + ": " + opened.status().message());
        fs->removeFile(file);
      }
      if (!opened) {
        const std::vector<std::string> holders = holdersOf(*manifest, shard_rank);
        Status f = agent_link.fetch(shardFile(step, shard_rank, manifest->world_size), holders, commitTimeout());
        if (f.isOk()) {
          opened = openCheckedShard(*fs, dir, *manifest, shard_rank, step);
          source = "peer";
        } else {
          opened = Status(f.code(), "this host has no copy of " + file + ", and " + f.message());
        }
      }
      if (!opened) st = opened.status();
    }
    // Load only once every rank holds its shard (every rank votes, whatever failed): a rank
    // whose copies are lost would otherwise leave the others' state loaded from a snapshot that
    // is then not restored.
    if (identity.world_size > 1) {
      const std::string k = attempt + "/" + std::to_string(step) + "/open";
      auto all = sumOverRanks(k, st, {{"ok", st.isOk() ? 1 : 0}});
      if (!all) return all.status();
      if (st.isOk() && (*all)[0] != identity.world_size) {
        st = Status::notFound(whyOf(k, "another rank could not get its shard"));
      }
    }
    if (st.isOk()) {
      ++loads_attempted;
      st = load(*manifest, **opened);
      fatal = st.code() == StatusCode::kInvalidArgument;
    }
    std::string agreed_failure;
    int64_t from_peers = source == "peer" && st.isOk() ? 1 : 0;
    if (identity.world_size > 1) {
      const std::string k = attempt + "/" + std::to_string(step);
      auto totals = sumOverRanks(k, st, {{"ok", st.isOk() ? 1 : 0}, {"abort", fatal ? 1 : 0}, {"peer", from_peers}});
      if (!totals) return totals.status();
      if ((*totals)[1] > 0 && !fatal) {
        return Status::invalidArgument("restore of snapshot " + dir + " stopped: " +
                                       whyOf(k, "another rank's state does not match"));
      }
      if (st.isOk() && (*totals)[0] != identity.world_size) agreed_failure = whyOf(k, "another rank could not load it");
      from_peers = (*totals)[2];
    }
    if (st.isOk() && agreed_failure.empty()) {
      const double took = toSeconds(clock->monotonicNow() - start);
      event("checkpoint_restored", {{"step", step}, {"dir", dir}, {"restore_s", took}, {"tier", "memory"},
                                    {"source", source}, {"ranks_from_peers", from_peers}});
      log(LogLevel::kInfo, "restored snapshot step " + std::to_string(step) + " from " +
                               (source == "local" ? "this host's memory (" + dir + ")" : "a peer host's copy") +
                               " in " + std::to_string(took) + " s; " + std::to_string(from_peers) +
                               " rank(s) took a peer's copy");
      last_save_time = clock->monotonicNow();
      last_snapshot_step = step;
      return std::optional<int64_t>(step);
    }
    if (fatal) {
      event("checkpoint_restore_failed", {{"step", step}, {"dir", dir}, {"file", file}, {"reason", st.message()},
                                          {"tier", "memory"}});
      return Status::invalidArgument("restore of snapshot " + dir + " stopped: " + st.message());
    }
    std::string reason = st.isOk() ? agreed_failure : st.message();
    skipped += (skipped.empty() ? "" : "; ") + checkpointDirName(step) + ": " + reason;
    event("checkpoint_skipped", {{"step", step}, {"dir", dir}, {"file", file}, {"reason", reason}, {"tier", "memory"}});
    log(LogLevel::kWarn, "skipping snapshot " + dir + ": " + reason);
  }
  if (loads_attempted > 0) {
    return Status::unavailable("no snapshot verified on every rank after " + std::to_string(loads_attempted) +
                               " load attempt(s); the state may be partly loaded: " + skipped);
  }
  if (!skipped.empty()) return Status::notFound("no snapshot can be restored by every rank: " + skipped);
  return std::optional<int64_t>(std::nullopt);
}

}  // namespace trainsup
