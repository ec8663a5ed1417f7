// Checkpointer, the facade (trainsup/checkpointer.h): creation, the save calls of the training
// thread, and what it asks of the writer. The jobs behind it: checkpoint/checkpointer_impl.h.
#include "trainsup/checkpointer.h"

#include "checkpoint/checkpointer_impl.h"

namespace trainsup {

using namespace checkpoint_internal;

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
    return Status::ioError(options.memory_tier ? "snapshot directory (TRAINSUP_SNAPSHOT_DIR): " + s.message()
                                               : "checkpoint directory (TRAINSUP_CHECKPOINT_DIR): " + s.message());
  }
  auto impl = std::make_unique<Impl>();
  impl->options = options;
  impl->identity = identity;
  impl->fs = &fs;
  impl->clock = &clock;
  impl->channel = std::move(channel);
  impl->hooks = std::move(hooks);
  impl->key_base = "trainsup/ckpt/" + identity.job_id + "/" + std::to_string(identity.restart_count) +
                   (options.memory_tier ? "/mem" : "");
  impl->agent_link = AgentLink(options.agent, options.agent_token);
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


Status Checkpointer::awaitSnapshot() { return impl_->awaitSnapshot(); }
void Checkpointer::setPersistHook(PersistHook hook) {
  impl_->waitNotBusy();  // the writer thread reads it during a persist
  impl_->persist_hook = std::move(hook);
}
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

}  // namespace trainsup
