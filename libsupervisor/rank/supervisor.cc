// The Supervisor facade (trainsup/supervisor.h): creation, steps and sections, stop requests,
// close. Its escalation path is abort_path.cc, its checkpoint calls supervisor_checkpoints.cc.
#include "trainsup/supervisor.h"

#include "rank/supervisor_impl.h"

namespace trainsup {

using namespace supervisor_internal;

Result<std::unique_ptr<Supervisor>> SupervisorTesting::create(Config config, SupervisorTestOptions hooks) {
  return Supervisor::create(std::move(config), hooks);
}

Result<std::unique_ptr<Supervisor>> Supervisor::create(Config config) {
  return create(std::move(config), SupervisorTestOptions{});
}

Result<std::unique_ptr<Supervisor>> Supervisor::create(Config config, const SupervisorTestOptions& test_hooks) {
  installTerminateReporter();
  if (config.identity.host.empty()) config.identity.host = osHostName();
  if (Status s = config.validate(); !s.isOk()) return s;
  auto impl = std::make_unique<Impl>();
  impl->clock = test_hooks.clock != nullptr ? test_hooks.clock : &Clock::real();
  impl->options = test_hooks;
  std::error_code ec;
  std::filesystem::create_directories(config.log_dir, ec);
  if (ec) return Status::ioError("cannot create log directory (TRAINSUP_LOG_DIR) '" + config.log_dir + "': " + ec.message());
  const Identity& id = config.identity;
  std::string base = (std::filesystem::path(config.log_dir) /
                      (id.job_id + "-" + id.host + "-r" + std::to_string(id.rank))).string();
  impl->log_path = base + ".log";
  impl->event_path = base + ".events.jsonl";
  auto logger = openRankLogger(config, impl->log_path);
  if (!logger) return logger.status();
  impl->logger = std::move(*logger);
  impl->emergency_fd = ::open(impl->log_path.c_str(), O_WRONLY | O_APPEND | O_CLOEXEC);
  prepareStackDumps();
  auto events = EventLog::open(impl->event_path, id, *impl->clock);
  if (!events) return events.status();
  impl->events = std::move(*events);
  impl->progress = std::make_unique<ProgressTracker>(impl->clock->monotonicNow(), config.budgets.warmup_count);

  WatchdogOptions wopts;
  wopts.interval = fromSeconds(config.watchdog_interval_s);
  wopts.heartbeat_timeout = fromSeconds(config.heartbeat_timeout_s);
  wopts.policy = config.budgets;
  wopts.explicit_budgets_s = config.section_budgets_s;
  Impl* m = impl.get();
  Watchdog::Hooks hooks;
  hooks.on_tick = [m] { m->onTick(); };
  hooks.on_warn = [m](const StallReport& r) { m->onWarn(r); };
  hooks.on_stall = [m](const StallReport& r) { m->onStall(r); };
  hooks.on_unresponsive = [m](Nanos silent) { m->onUnresponsive(silent); };
  hooks.on_abort_deadline = [m] { m->onAbortDeadline(); };
  auto watchdog = Watchdog::create(*impl->progress, *impl->clock, wopts, std::move(hooks));
  if (!watchdog) return watchdog.status();
  impl->watchdog = std::move(*watchdog);
  impl->config = std::move(config);

  const Config& c = impl->config;
  auto gpu = describeLocalGpu(c.identity.local_rank);
  std::string gpu_text = gpu ? fmt::format("GPU {} {} bus {} {}", gpu->index, gpu->name, gpu->pci_bus_id, gpu->uuid)
                             : gpu.status().message();
  impl->logger.logger->info(
      "trainsup {} supervising job '{}' rank {}/{} (local {}/{}, group {}) pid {} restart {}; {}; logs {} and {}",
      kVersionString, c.identity.job_id, c.identity.rank, c.identity.world_size, c.identity.local_rank,
      c.identity.local_world_size, c.identity.group_rank, getpid(), c.identity.restart_count, gpu_text,
      impl->log_path, impl->event_path);
  std::string budgets;
  for (const auto& [name, s] : c.section_budgets_s) budgets += (budgets.empty() ? "" : ",") + name + "=" + fmt::format("{}", s);
  impl->events->write("supervisor_start",
                      {{"version", kVersionString},
                       {"group_rank", c.identity.group_rank},
                       {"local_world_size", c.identity.local_world_size},
                       {"master_addr", c.identity.master_addr},
                       {"master_port", c.identity.master_port},
                       {"run_id", c.identity.run_id},
                       {"gpu_index", gpu ? gpu->index : -1},
                       {"gpu_uuid", gpu ? gpu->uuid : std::string()},
                       {"gpu_pci_bus_id", gpu ? gpu->pci_bus_id : std::string()},
                       {"gpu_status", gpu ? std::string("ok") : gpu.status().message()},
                       {"watchdog", c.watchdog_enabled},
                       {"stall_action", stallActionName(c.stall_action)},
                       {"section_budgets", budgets},
                       {"budget_multiplier", c.budgets.multiplier},
                       {"budget_floor_s", c.budgets.floor_s},
                       {"budget_warmup_count", c.budgets.warmup_count},
                       {"budget_warmup_s", c.budgets.warmup_s},
                       {"log_file", impl->log_path}});
  if (!c.coordinator.empty()) {
    TelemetryClientOptions t;
    auto address = parseCoordinatorAddress(c.coordinator);  // validate() accepted it already
    if (!address) return address.status();
    t.unix_path = address->unix_path;
    t.host = address->host;
    t.port = address->port;
    t.token = *parseJobToken(c.job_token);
    t.rank = c.identity.rank;
    t.local_rank = c.identity.local_rank;
    t.node_name = c.identity.host;
    if (gpu) t.gpu = std::to_string(gpu->index) + ":" + gpu->uuid;
    Impl* mp = impl.get();
    t.progress = [mp](WireHeartbeat& hb) {  // on the client's thread: a seqlock snapshot
      ProgressTracker::Snapshot s = mp->progress->snapshot();
      hb.step = s.step >= 0 ? s.step : s.last_step;
      hb.in_section_ns = (mp->clock->monotonicNow() - s.started).count();
      std::string name = s.depth > 0 ? mp->progress->sectionName(s.section) : std::string("between-steps");
      std::strncpy(hb.section, name.c_str(), sizeof(hb.section) - 1);
    };
    t.on_abort = [mp](const WireAbort& a) { mp->onAbortOrder(a); };
    auto client = TelemetryClient::start(t);
    if (!client) return client.status();
    impl->telemetry = std::move(*client);
    impl->logger.logger->info("telemetry to the coordinator at {}", c.coordinator);
  }
  // Last of the things that can fail: a failed create leaves no handlers (and no flag) behind
  // for a later Supervisor to be refused.
  if (c.handle_signals) {
    impl->owns_signals = stop_signals::install();
    if (!impl->owns_signals) {
      impl->logger.logger->warn("another Supervisor in this process owns the SIGTERM/SIGINT handlers");
    }
  }
  if (c.watchdog_enabled) impl->watchdog->start();
  return std::unique_ptr<Supervisor>(new Supervisor(std::move(impl)));
}

Supervisor::Supervisor(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

Supervisor::~Supervisor() { close(); }

void Supervisor::close(bool failed) {
  if (impl_->closed.exchange(true)) return;
  if (failed && impl_->telemetry) {
    MutexLock lock(impl_->abort_mu);
    const double wait_s = std::min(1.0, impl_->config.abort_grace_s);
    if (impl_->abort_cv.waitFor(impl_->abort_mu, std::chrono::duration<double>(wait_s), [&] {
          impl_->abort_mu.assertHeld();
          return impl_->abort_ordered;
        })) {
      // The abort path owns the exit now: it ends the process within abort_grace_s (its
      // watchdog deadline enforces that). Only a test's exit hook returns from it.
      impl_->abort_cv.waitFor(impl_->abort_mu, std::chrono::duration<double>(impl_->config.abort_grace_s + 1),
                               [&] { impl_->abort_mu.assertHeld(); return impl_->abort_finished; });
    }
  }
  // Failed and not ordered to abort: an error of the training code itself. Say so, so that the
  // job ends with failed_rank (no host is blamed) instead of waiting for a dead-rank verdict.
  if (failed && impl_->telemetry) impl_->telemetry->stopFailed();
  if (impl_->checkpointer) {
    // Flush a pending persist: the newest checkpoint is the one a restart will want.
    Status s = impl_->checkpointer->waitIdle(fromSeconds(impl_->config.checkpoint.commit_timeout_s));
    if (!s.isOk()) impl_->logger.logger->error("last checkpoint did not complete: {}", s.message());
    impl_->checkpointer.reset();
  }
  if (impl_->snapshots) {
    Status s = impl_->snapshots->waitIdle(fromSeconds(impl_->config.checkpoint.commit_timeout_s));
    if (!s.isOk()) impl_->logger.logger->warn("last snapshot did not complete: {}", s.message());
    impl_->snapshots.reset();
  }
  impl_->watchdog->stop();
  if (impl_->telemetry) impl_->telemetry->stop();
  impl_->onTick();  // a stop request the watchdog had no tick left to report
  auto snap = impl_->progress->snapshot();
  auto steps = impl_->progress->stats(kStepSection);
  impl_->logger.logger->info("supervisor closed after step {} ({} steps timed)", snap.last_step, steps.count);
  impl_->events->write("supervisor_stop", {{"last_step", snap.last_step}, {"steps_timed", steps.count}});
  if (impl_->owns_signals) stop_signals::uninstall();
  impl_->logger.logger->flush();
}

Supervisor::Scope Supervisor::step(int64_t step) {
  if (impl_->training_tid.load(std::memory_order_relaxed) == 0) impl_->training_tid.store(currentTid());
  if (!impl_->first_step_seen) {
    // Once per process: when training (re)started, for recovery-time reports.
    impl_->first_step_seen = true;
    impl_->events->write("first_step", {{"step", step}});
  }
  impl_->progress->enter(kStepSection, step, impl_->clock->monotonicNow());
  return Scope(this);
}

SectionId Supervisor::sectionId(std::string_view name) {
  auto id = impl_->progress->intern(name);
  if (!id) throw std::logic_error("trainsup: " + id.status().message());
  return *id;
}

Supervisor::Scope Supervisor::section(std::string_view name) { return section(sectionId(name)); }

Supervisor::Scope Supervisor::section(SectionId id) {
  if (impl_->training_tid.load(std::memory_order_relaxed) == 0) impl_->training_tid.store(currentTid());
  impl_->progress->enter(id, -1, impl_->clock->monotonicNow());
  return Scope(this);
}

void Supervisor::exitSection() { impl_->progress->exit(impl_->clock->monotonicNow()); }

bool Supervisor::stopRequested() const {
  // Across ranks: once they agreed to stop, every rank stops after that step, also one that was
  // not signalled itself (SIGTERM reached another host only).
  if (impl_->stop_agreed.load()) return true;
  if (!impl_->owns_signals || stop_signals::requestedBy() == 0) return false;
  // Signalled: at once with one rank; across ranks when they agree (above), or, for a loop that
  // never reaches a checkpoint decision point, once kStopAgreementFallbackS have passed.
  return !impl_->stop_needs_agreement.load() ||
         stop_signals::requestedForNs() >= static_cast<int64_t>(kStopAgreementFallbackS * 1e9);
}
int Supervisor::stopSignal() const { return impl_->owns_signals ? stop_signals::requestedBy() : 0; }

void Supervisor::addAbortCallback(std::string name, std::function<void(const StallReport&)> callback) {
  MutexLock lock(impl_->callbacks_mu);
  impl_->callbacks.emplace_back(std::move(name), std::move(callback));
}

void Supervisor::addStackDumpHook(std::string name, std::function<std::string()> dump) {
  MutexLock lock(impl_->callbacks_mu);
  impl_->dump_hooks.emplace_back(std::move(name), std::move(dump));
}

void Supervisor::log(LogLevel level, std::string_view message) {
  auto& l = *impl_->logger.logger;
  switch (level) {
    case LogLevel::kTrace: l.trace("{}", message); break;
    case LogLevel::kDebug: l.debug("{}", message); break;
    case LogLevel::kInfo: l.info("{}", message); break;
    case LogLevel::kWarn: l.warn("{}", message); break;
    case LogLevel::kError: l.error("{}", message); break;
  }
}

void Supervisor::event(std::string_view name, const EventFields& fields) { impl_->events->write(name, fields); }


const Config& Supervisor::config() const { return impl_->config; }
const Identity& Supervisor::identity() const { return impl_->config.identity; }
const std::string& Supervisor::logFilePath() const { return impl_->log_path; }
const std::string& Supervisor::eventLogPath() const { return impl_->event_path; }
ProgressTracker& Supervisor::progress() { return *impl_->progress; }

Budget Supervisor::budgetFor(std::string_view section) { return impl_->watchdog->budgetFor(sectionId(section)); }

}  // namespace trainsup
