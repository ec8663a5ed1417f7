// The Supervisor facade's checkpoint calls (trainsup/supervisor.h), and the learned section
// budgets they carry in checkpoint metadata so that a restarted job starts calibrated.
#include "rank/supervisor_impl.h"

namespace trainsup {

using namespace supervisor_internal;

namespace {

// "name=count:learned:max_ns;..." — the learned budgets, carried in checkpoint metadata.
constexpr const char* kBudgetsKey = "trainsup.budgets";
// "memory" in the metadata a memory-tier snapshot's collect callback is handed (and its manifest).
constexpr const char* kTierKey = "trainsup.tier";

std::string encodeBudgets(ProgressTracker& p) {
  std::string out;
  for (SectionId id = 0; id < ProgressTracker::kMaxSections; ++id) {
    SectionStats st = p.stats(id);
    if (st.count == 0) continue;
    out += p.sectionName(id) + "=" + std::to_string(st.count) + ":" + std::to_string(st.learned_count) + ":" +
           std::to_string(st.max_learned.count()) + ";";
  }
  return out;
}

int seedBudgets(ProgressTracker& p, const std::string& text) {
  int seeded = 0;
  size_t pos = 0;
  while (pos < text.size()) {
    size_t end = text.find(';', pos);
    if (end == std::string::npos) end = text.size();
    std::string item = text.substr(pos, end - pos);
    pos = end + 1;
    size_t eq = item.find('=');
    if (eq == std::string::npos) continue;
    int64_t count = 0, learned = 0, max_ns = 0;
    if (std::sscanf(item.c_str() + eq + 1, "%" SCNd64 ":%" SCNd64 ":%" SCNd64, &count, &learned, &max_ns) != 3) continue;
    SectionStats st{count, learned, Nanos(max_ns)};
    auto id = p.intern(item.substr(0, eq));
    if (!id || *id == kStartupSection) continue;
    // Only ever raise what this run has learned so far.
    SectionStats now = p.stats(*id);
    if (now.max_learned >= st.max_learned && now.learned_count >= st.learned_count) continue;
    st.count = std::max(st.count, now.count);
    p.seedStats(*id, st);
    ++seeded;
  }
  return seeded;
}

}  // namespace

Result<Checkpointer*> Supervisor::checkpointer(std::shared_ptr<CommitChannel> channel) {
  Impl& m = *impl_;
  if (m.checkpointer) return m.checkpointer.get();
  Checkpointer::Hooks hooks;
  Impl* mp = impl_.get();
  hooks.event = [mp](std::string_view name, const EventFields& f) { mp->events->write(name, f); };
  hooks.log = [this](LogLevel l, const std::string& msg) { log(l, msg); };
  if (m.config.snapshot.enabled()) {
    // The memory tier: its own schedule and directory, the disk tier's snapshot mode.
    const SnapshotOptions& sn = m.config.snapshot;
    CheckpointOptions o = m.config.checkpoint;
    o.dir = sn.dir;
    o.every_steps = sn.every_steps;
    o.interval_s = sn.interval_s;
    o.keep = 1;  // the newest committed snapshot (and the one being written)
    o.busy_policy = BusyPolicy::kSkip;
    o.format = "native";
    o.memory_tier = true;
    o.agent = sn.agent;
    o.agent_token = sn.token;
    o.replicas = sn.replicas;
    // A peer that does not answer fails one snapshot in a minute, not ten.
    o.commit_timeout_s = std::min(o.commit_timeout_s, 60.0);
    auto mem = Checkpointer::create(o, m.config.identity, FileSystem::posix(), *m.clock, channel, hooks);
    if (!mem) return mem.status();
    m.snapshots = std::move(*mem);
    m.events->write("snapshots_enabled", {{"dir", sn.dir}, {"every_steps", sn.every_steps},
                                          {"interval_s", sn.interval_s}, {"replicas", sn.replicas},
                                          {"agent", sn.agent}});
  }
  m.channel = channel;
  auto c = Checkpointer::create(m.config.checkpoint, m.config.identity, FileSystem::posix(), *m.clock,
                                std::move(channel), std::move(hooks));
  if (!c) return c.status();
  m.checkpointer = std::move(*c);
  m.stop_needs_agreement.store(m.config.identity.world_size > 1);
  return m.checkpointer.get();
}

namespace {
Status needCheckpointer(const std::unique_ptr<Checkpointer>& c) {
  return c ? Status::ok() : Status::invalidArgument("checkpoints are not set up: call Supervisor::checkpointer() first");
}
}  // namespace

Result<Checkpointer::Outcome> Supervisor::maybeCheckpoint(int64_t step, const Checkpointer::Collect& collect) {
  return saveCheckpoint(step, collect, /*now=*/false);
}

Result<Checkpointer::Outcome> Supervisor::checkpoint(int64_t step, const Checkpointer::Collect& collect) {
  return saveCheckpoint(step, collect, /*now=*/true);
}

Result<Checkpointer::Outcome> Supervisor::saveCheckpoint(int64_t step, const Checkpointer::Collect& collect, bool now) {
  Status earlier;
  Result<Checkpointer::Outcome> r = save(step, collect, now, &earlier);
  if (!earlier.isOk()) return earlier;
  return r;
}

Result<Checkpointer::Outcome> Supervisor::save(int64_t step, const Checkpointer::Collect& collect, bool now,
                                               Status* earlier) {
  if (Status s = needCheckpointer(impl_->checkpointer); !s.isOk()) return s;
  // The save runs first on every rank, whatever an earlier persist left behind: skipping it on
  // one rank would put that rank's decisions out of step with the others'.
  Result<Checkpointer::Outcome> r = saveCheckpointNow(step, collect, now);
  if (earlier) *earlier = impl_->checkpointer->takeError();
  return r;
}

Result<Checkpointer::Outcome> Supervisor::saveCheckpointNow(int64_t step, const Checkpointer::Collect& collect,
                                                            bool now) {
  auto scope = section(kCheckpointSectionName);
  ProgressTracker& p = *impl_->progress;
  Checkpointer::Collect with_budgets = [&](std::vector<BufferRef>& b, std::map<std::string, std::string>& meta) {
    Status s = collect(b, meta);
    meta[kBudgetsKey] = encodeBudgets(p);
    return s;
  };
  Checkpointer& c = *impl_->checkpointer;
  if (impl_->owns_signals && stop_signals::requestedBy() != 0) c.requestStop();
  if (impl_->snapshots && !now) {
    // The memory tier first, on its own schedule. Its failures are its own: an event, a log
    // line, and the disk tier goes on (takeError() below is the disk tier's).
    Checkpointer::Collect for_memory = [&](std::vector<BufferRef>& b, std::map<std::string, std::string>& meta) {
      meta[kTierKey] = "memory";
      return with_budgets(b, meta);
    };
    auto mr = impl_->snapshots->maybeSave(step, for_memory);
    if (!mr) {
      impl_->events->write("snapshot_failed", {{"step", step}, {"reason", mr.status().message()}});
      impl_->logger.logger->error("snapshot at step {} failed (training continues): {}", step, mr.status().message());
    }
    impl_->snapshots->takeError();  // reported by the writer thread already (snapshot_failed)
  }
  auto r = now ? c.save(step, with_budgets) : c.maybeSave(step, with_budgets);
  impl_->stop_agreed.store(c.stopAgreed());
  return r;
}

bool Supervisor::snapshotOutstanding() const {
  return (impl_->checkpointer && impl_->checkpointer->snapshotOutstanding()) ||
         (impl_->snapshots && impl_->snapshots->snapshotOutstanding());
}

Status Supervisor::awaitSnapshot() {
  // Called every step by guarded optimizers: enter the section only when there is a copy to
  // wait for, so that the "checkpoint" budget is learned from real snapshots.
  const bool memory = impl_->snapshots && impl_->snapshots->snapshotOutstanding();
  if (!memory && (!impl_->checkpointer || !impl_->checkpointer->snapshotOutstanding())) return Status::ok();
  auto scope = section(kCheckpointSectionName);
  if (memory) impl_->snapshots->awaitSnapshot();  // a failed copy fails that snapshot (its event)
  return impl_->checkpointer ? impl_->checkpointer->awaitSnapshot() : Status::ok();
}

Result<std::optional<int64_t>> Supervisor::restore(const Checkpointer::Load& load) {
  if (Status s = needCheckpointer(impl_->checkpointer); !s.isOk()) return s;
  auto scope = section("restore");
  ProgressTracker& p = *impl_->progress;
  Impl* m = impl_.get();
  Checkpointer::Load with_budgets = [&](const Manifest& manifest, const ShardReader& shard) {
    Status s = load(manifest, shard);
    if (s.isOk()) {
      auto it = manifest.metadata.find(kBudgetsKey);
      if (it != manifest.metadata.end()) {
        int n = seedBudgets(p, it->second);
        if (n > 0) m->logger.logger->info("seeded {} learned section budgets from checkpoint step {}", n, manifest.step);
      }
    }
    return s;
  };
  const int64_t call = ++m->restore_calls;
  if (!m->snapshots) return m->checkpointer->restore(with_budgets);
  // Memory first, but never a snapshot older than the newest disk checkpoint: rank 0 reads the
  // disk's newest committed step and tells the others.
  auto floor = newestDiskStep(call);
  if (!floor) return floor.status();
  auto mem = m->snapshots->restore(with_budgets, *floor);
  if (mem && *mem) return mem;
  if (!mem) {
    // Snapshots were there but none could be restored by every rank (every copy of a shard
    // lost or damaged: a host and its peer at once): the disk, saying why.
    m->events->write("snapshot_restore_fallback",
                     {{"reason", mem.status().message()}, {"disk_floor_step", std::max<int64_t>(*floor, -1)}});
    m->logger.logger->warn("restoring from disk instead of memory: {}", mem.status().message());
  }
  auto disk = m->checkpointer->restore(with_budgets);
  // A snapshot partly loaded and nothing on disk: the state is neither, say so.
  if (disk && !*disk && !mem && mem.status().code() == StatusCode::kUnavailable) return mem.status();
  return disk;
}

// The step of the newest committed disk checkpoint (INT64_MIN when there is none), the same on
// every rank: rank 0's reading of the directory, published through the channel.
Result<int64_t> Supervisor::newestDiskStep(int64_t call) {
  Impl& m = *impl_;
  const Identity& id = m.config.identity;
  const std::string key = "trainsup/ckpt/" + id.job_id + "/" + std::to_string(id.restart_count) + "/disk-floor/" +
                          std::to_string(call);
  int64_t newest = INT64_MIN;
  if (id.rank == 0 || !m.channel) {
    auto found = newestValidCheckpoint(FileSystem::posix(), m.config.checkpoint.dir);
    if (found) newest = found->step;
    if (m.channel) {
      if (Status s = m.channel->set(key, std::to_string(newest)); !s.isOk()) return s;
    }
    return newest;
  }
  auto got = m.channel->get(key, fromSeconds(m.config.checkpoint.commit_timeout_s));
  if (!got) return Status(got.status().code(), "the newest disk checkpoint, from rank 0: " + got.status().message());
  return std::stoll(*got);
}

}  // namespace trainsup
