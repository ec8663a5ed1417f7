// The Supervisor facade's checkpoint calls (trainsup/supervisor.h), and the learned section
// budgets they carry in checkpoint metadata so that a restarted job starts calibrated.
#include "rank/supervisor_impl.h"

namespace trainsup {

using namespace supervisor_internal;

namespace {

// "name=count:learned:max_ns;..." — the learned budgets, carried in checkpoint metadata.
constexpr const char* kBudgetsKey = "trainsup.budgets";

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
  if (Status s = needCheckpointer(impl_->checkpointer); !s.isOk()) return s;
  // The save runs first on every rank, whatever an earlier persist left behind: skipping it on
  // one rank would put that rank's decisions out of step with the others'.
  Result<Checkpointer::Outcome> r = saveCheckpointNow(step, collect, now);
  if (Status s = impl_->checkpointer->takeError(); !s.isOk()) return s;
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
  auto r = now ? c.save(step, with_budgets) : c.maybeSave(step, with_budgets);
  impl_->stop_agreed.store(c.stopAgreed());
  return r;
}

Status Supervisor::awaitSnapshot() {
  // Called every step by guarded optimizers: enter the section only when there is a copy to
  // wait for, so that the "checkpoint" budget is learned from real snapshots.
  if (!impl_->checkpointer || !impl_->checkpointer->snapshotOutstanding()) return Status::ok();
  auto scope = section(kCheckpointSectionName);
  return impl_->checkpointer->awaitSnapshot();
}

Result<std::optional<int64_t>> Supervisor::restore(const Checkpointer::Load& load) {
  if (Status s = needCheckpointer(impl_->checkpointer); !s.isOk()) return s;
  auto scope = section("restore");
  ProgressTracker& p = *impl_->progress;
  Impl* m = impl_.get();
  return impl_->checkpointer->restore([&](const Manifest& manifest, const ShardReader& shard) {
    Status s = load(manifest, shard);
    if (s.isOk()) {
      auto it = manifest.metadata.find(kBudgetsKey);
      if (it != manifest.metadata.end()) {
        int n = seedBudgets(p, it->second);
        if (n > 0) m->logger.logger->info("seeded {} learned section budgets from checkpoint step {}", n, manifest.step);
      }
    }
    return s;
  });
}

}  // namespace trainsup
