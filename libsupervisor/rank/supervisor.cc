#include "trainsup/supervisor.h"

#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <future>
#include <thread>
#include <condition_variable>
#include <mutex>
#include <spdlog/spdlog.h>
#include <vector>

#include "base/logging.h"
#include "trainsup/collective_tracker.h"
#include "rank/stop_signals.h"
#include "rank/supervisor_testing.h"
#include "device/gpu.h"
#include "trainsup/mutex.h"
#include "trainsup/nccl.h"
#include "rank/stack_dump.h"
#include "telemetry/telemetry_client.h"
#include "trainsup/version.h"

namespace trainsup {

namespace {
// A stop request across ranks that no checkpoint decision point confirmed takes effect after
// this long anyway (decision points come about every 5 s; Slurm kills 30 s after its SIGTERM).
constexpr double kStopAgreementFallbackS = 20.0;
}  // namespace

struct Supervisor::Impl {
  // Set in create(), then read-only.
  Config config;
  SupervisorTestOptions options;
  Clock* clock = nullptr;
  std::string log_path;
  std::string event_path;
  RankLogger logger;
  std::unique_ptr<EventLog> events;
  std::unique_ptr<ProgressTracker> progress;
  std::unique_ptr<Watchdog> watchdog;
  bool owns_signals = false;
  int emergency_fd = -1;  // the rank log, opened at start for last words

  std::atomic<int> training_tid{0};  // the thread that called step()/section() first
  bool first_step_seen = false;      // training thread only
  std::unique_ptr<Checkpointer> checkpointer;  // training thread only
  // With checkpoints across ranks, a stop request takes effect when the ranks agreed on it (the
  // same step everywhere); these mirror the checkpointer's state for stopRequested() callers.
  std::atomic<bool> stop_needs_agreement{false};
  std::atomic<bool> stop_agreed{false};
  std::unique_ptr<TelemetryClient> telemetry;  // set in create(); null when off
  std::atomic<bool> closed{false};
  int seen_stop_signal = 0;  // watchdog thread only (close() after the watchdog stopped)

  Mutex callbacks_mu;
  std::vector<std::pair<std::string, std::function<void(const StallReport&)>>> callbacks
      TRAINSUP_GUARDED_BY(callbacks_mu);
  std::vector<std::pair<std::string, std::function<std::string()>>> dump_hooks TRAINSUP_GUARDED_BY(callbacks_mu);

  void onTick();
  void onWarn(const StallReport& r);
  void onStall(const StallReport& r);
  // Stall deferrals while waiting in a collective (watchdog thread only).
  // 6: the coordinator names a hang held by a slow link at 6 x the collective's budget (plus a
  // 3 s grace), and a collective's budget is at most a step's (the step holds it).
  static constexpr int kStallDeferrals = 6;
  std::string deferred_section;
  int64_t deferred_step = -1;
  int stall_deferrals = 0;
  void dumpStacks(std::chrono::milliseconds timeout);
  // Half of the abort grace period (0.1 to 5 s) for a stack dump; the rest is for the abort
  // callbacks.
  std::chrono::milliseconds dumpTimeout() const {
    return std::chrono::milliseconds(static_cast<int64_t>(std::min(5.0, std::max(0.1, config.abort_grace_s / 2)) * 1000));
  }
  void onUnresponsive(Nanos silent);
  void onAbortDeadline();
  void onAbortOrder(const WireAbort& a);
  void runAbortCallbacks(const StallReport& r);
  void emergency(const std::string& message, int code);
  void terminate(int code);
  // The coordinator's abort order arrived (close(failed) waits for it briefly).
  Mutex abort_mu;
  CondVar abort_cv;
  bool abort_ordered TRAINSUP_GUARDED_BY(abort_mu) = false;
  bool abort_finished TRAINSUP_GUARDED_BY(abort_mu) = false;  // the abort path returned (test exit hooks only)
  ~Impl() {
    if (emergency_fd >= 0) ::close(emergency_fd);
  }
};

namespace {

std::string seconds(Nanos d) { return fmt::format("{:.3f}", toSeconds(d)); }

int currentTid() { return static_cast<int>(syscall(SYS_gettid)); }

}  // namespace

void Supervisor::Impl::terminate(int code) {
  if (options.exit_process) {
    options.exit_process(code);
  } else {
    _exit(code);
  }
}

// Last words when the normal logger may be the thing that is stuck: raw write() calls only,
// stderr first (guarded against a full pipe), then the rank log through a descriptor opened at
// start-up, from a helper thread given 100 ms, because the log may sit on a hung file system.
void Supervisor::Impl::emergency(const std::string& message, int code) {
  auto line = std::make_shared<std::string>("[trainsup host=" + config.identity.host +
                                            " rank=" + std::to_string(config.identity.rank) + "] " + message + "\n");
  pollfd p{2, POLLOUT, 0};
  if (line->size() <= PIPE_BUF && ::poll(&p, 1, 100) == 1 && (p.revents & POLLOUT)) {
    ssize_t ignored = ::write(2, line->data(), line->size());
    (void)ignored;
  }
  if (emergency_fd >= 0) {
    auto written = std::make_shared<std::promise<void>>();
    auto done = written->get_future();
    std::thread([fd = emergency_fd, line, written] {
      ssize_t ignored = ::write(fd, line->data(), line->size());
      (void)ignored;
      written->set_value();
    }).detach();
    done.wait_for(std::chrono::milliseconds(100));
  }
  terminate(code);
}

// Registered abort callbacks, in order, each guarded and recorded (stall exit and abort order).
void Supervisor::Impl::runAbortCallbacks(const StallReport& r) {
  // NCCL first: a rank blocked in a collective gets its error at once, and no kernel is left
  // pending when the process exits.
  if (registeredNcclCommunicators() > 0) {
    NcclAbortResult n = abortNcclCommunicators();
    logger.logger->error("aborted {} NCCL communicator(s){}", n.aborted,
                         n.failed > 0 ? fmt::format("; {} failed: {}", n.failed, n.first_error.message()) : "");
    events->write("nccl_abort", {{"aborted", n.aborted}, {"failed", n.failed}, {"error", n.first_error.message()}});
  }
  std::vector<std::pair<std::string, std::function<void(const StallReport&)>>> cbs;
  {
    MutexLock lock(callbacks_mu);
    cbs = callbacks;
  }
  for (auto& [name, cb] : cbs) {
    std::string error;
    try {
      cb(r);
    } catch (const std::exception& e) {
      error = e.what();
    } catch (...) {
      error = "unknown exception";
    }
    if (!error.empty()) logger.logger->error("abort callback '{}' threw: {}", name, error);
    events->write("abort_callback", {{"name", name}, {"ok", error.empty()}, {"error", error}});
  }
}

void Supervisor::Impl::onTick() {
  int sig = stop_signals::requestedBy();
  if (sig == 0 || sig == seen_stop_signal) return;
  seen_stop_signal = sig;
  const char* name = sig == SIGTERM ? "SIGTERM" : sig == SIGINT ? "SIGINT" : "signal";
  logger.logger->warn("stop requested by {}; the training loop should stop at the next step boundary", name);
  events->write("stop_requested", {{"signal", name}, {"last_step", progress->snapshot().last_step}});
  // Peers will wait on this rank while it saves and leaves: the coordinator must not blame its host.
  if (telemetry) telemetry->reportStopping();
}

void Supervisor::Impl::onWarn(const StallReport& r) {
  logger.logger->warn("section '{}' (step {}) has run {} s, over {:.0f}% of its {} budget of {} s", r.section, r.step,
                      seconds(r.elapsed), config.budgets.warn_fraction * 100, budgetKindName(r.budget.kind),
                      seconds(r.budget.limit));
  events->write("section_slow", {{"section", r.section},
                                 {"step", r.step},
                                 {"elapsed_s", toSeconds(r.elapsed)},
                                 {"budget_s", toSeconds(r.budget.limit)},
                                 {"budget_kind", budgetKindName(r.budget.kind)}});
}

// Every thread's native stack, then the extra dumps (Python), into the rank log and an event.
void Supervisor::Impl::dumpStacks(std::chrono::milliseconds timeout) {
  auto& log = *logger.logger;
  StackDump dump = dumpAllThreadStacks(timeout);
  int training = training_tid.load();
  for (ThreadStack& t : dump.threads) {
    if (t.tid == training) t.name += " [training loop]";
  }
  for (const std::string& line : formatStackDump(dump)) log.error("{}", line);
  std::vector<std::pair<std::string, std::function<std::string()>>> hooks;
  {
    MutexLock lock(callbacks_mu);
    hooks = dump_hooks;
  }
  std::string extra;
  for (auto& [name, hook] : hooks) {
    std::string text;
    try {
      text = hook();
    } catch (const std::exception& e) {
      text = std::string("(dump failed: ") + e.what() + ")";
    }
    log.error("{} stacks:", name);
    size_t pos = 0;
    while (pos < text.size()) {
      size_t end = text.find('\n', pos);
      if (end == std::string::npos) end = text.size();
      if (end > pos) log.error("  {}", text.substr(pos, end - pos));
      pos = end + 1;
    }
    extra += (extra.empty() ? "" : ",") + name;
  }
  events->write("stack_dump", {{"threads", static_cast<int64_t>(dump.threads.size())},
                               {"answered", dump.answered},
                               {"training_tid", training},
                               {"extra_dumps", extra},
                               {"log_file", log_path}});
}

void Supervisor::Impl::onStall(const StallReport& r) {
  const bool exiting = config.stall_action == StallAction::kExit;
  const Nanos start = clock->monotonicNow();
  // Waiting in a collective under a job coordinator: whether this rank or a peer (or the
  // network between them) is at fault is the coordinator's call, made with every rank in view,
  // and it may hold it while a host reports a slow link. Exiting here would name this healthy
  // host (its rank "died"). Wait for the coordinator's order up to kStallDeferrals more
  // budgets; past them the coordinator is taken to be gone, and the stall ends the process.
  // (The agent also orders its ranks to abort once the round's verdict is published.)
  {
    MutexLock lock(abort_mu);
    if (abort_ordered) return;  // the coordinator's order is being carried out: it owns the exit
  }
  const uint64_t waiting = CollectiveTracker::global().stats().pending();
  const bool same = r.section == deferred_section && r.step == deferred_step;
  if (exiting && telemetry && waiting > 0 && (!same || stall_deferrals < kStallDeferrals)) {
    stall_deferrals = same ? stall_deferrals + 1 : 1;
    deferred_section = r.section;
    deferred_step = r.step;
    watchdog->deferStall(start + r.budget.limit);
    logger.logger->warn("section '{}' (step {}) is over its {} s budget ({} s) while waiting in {} collective(s): the "
                        "job coordinator judges collectives; waiting one more budget for its verdict ({} of {})",
                        r.section, r.step, seconds(r.budget.limit), seconds(r.elapsed), waiting, stall_deferrals,
                        kStallDeferrals);
    events->write("stall_deferred", {{"section", r.section},
                                     {"step", r.step},
                                     {"elapsed_s", toSeconds(r.elapsed)},
                                     {"budget_s", toSeconds(r.budget.limit)},
                                     {"collectives_waiting", static_cast<int64_t>(waiting)},
                                     {"deferral", stall_deferrals}});
    return;
  }
  // The dump (and, when exiting, the abort callbacks) keep this thread busy: the monitor then
  // watches this deadline instead of the heartbeat, in warn mode too.
  watchdog->setAbortDeadline(start + fromSeconds(config.abort_grace_s));
  auto& log = *logger.logger;
  log.error("STALL: section '{}' (step {}) made no progress for {} s; its {} budget is {} s. {}", r.section, r.step,
            seconds(r.elapsed), budgetKindName(r.budget.kind), seconds(r.budget.limit),
            exiting ? fmt::format("Dumping stacks, running abort callbacks, then exiting with code {} ({}).",
                                  kExitStall, exitCodeName(kExitStall))
                    : std::string("Dumping stacks; stall_action=warn keeps the process running."));
  if (telemetry) telemetry->reportStall(r.section, r.step);  // the coordinator hears it first
  events->write("stall", {{"section", r.section},
                          {"step", r.step},
                          {"depth", r.depth},
                          {"elapsed_s", toSeconds(r.elapsed)},
                          {"budget_s", toSeconds(r.budget.limit)},
                          {"budget_kind", budgetKindName(r.budget.kind)},
                          {"action", stallActionName(config.stall_action)}});
  dumpStacks(dumpTimeout());
  log.flush();
  if (!exiting) {
    watchdog->clearAbortDeadline();
    return;
  }

  runAbortCallbacks(r);
  Nanos took = clock->monotonicNow() - start;
  log.error("exiting with code {} ({}) {} s after the stall was detected", kExitStall, exitCodeName(kExitStall),
            seconds(took));
  events->write("exit", {{"code", kExitStall}, {"reason", exitCodeName(kExitStall)}, {"abort_s", toSeconds(took)}});
  log.flush();
  terminate(kExitStall);
  // Only a test's exit hook returns here: the abort path is over, so is its deadline.
  watchdog->clearAbortDeadline();
}

// The coordinator's order to abort: bounded like a stall (the monitor enforces abort_grace_s),
// abort callbacks run (e.g. NCCL communicator abort), then the process ends with kExitAborted.
void Supervisor::Impl::onAbortOrder(const WireAbort& a) {
  {
    MutexLock lock(abort_mu);
    // One order is acted on: the agent repeats the coordinator's when the job's verdict is
    // published, in case the coordinator could not reach this rank.
    if (abort_ordered) return;
    abort_ordered = true;
  }
  abort_cv.notifyAll();
  watchdog->setAbortDeadline(clock->monotonicNow() + fromSeconds(config.abort_grace_s));
  auto& log = *logger.logger;
  log.error("ABORT ordered by the job coordinator: verdict {} on rank {} (host {}); exiting with code {} ({})", a.kind,
            a.culprit_rank, a.host, kExitAborted, exitCodeName(kExitAborted));
  events->write("abort_ordered", {{"verdict", std::string(a.kind)}, {"culprit_rank", a.culprit_rank},
                                  {"culprit_host", std::string(a.host)}});
  if (a.culprit_rank == config.identity.rank) {
    // Named as the culprit and still able to hear: show where this rank is stuck.
    log.error("this rank is the culprit named by the verdict; dumping stacks");
    dumpStacks(dumpTimeout());
  }
  StallReport r;
  r.section = "abort";
  r.step = progress->snapshot().last_step;
  runAbortCallbacks(r);
  events->write("exit", {{"code", kExitAborted}, {"reason", exitCodeName(kExitAborted)}});
  log.flush();
  terminate(kExitAborted);
  {
    MutexLock lock(abort_mu);
    abort_finished = true;
  }
  abort_cv.notifyAll();
}

void Supervisor::Impl::onUnresponsive(Nanos silent) {
  emergency(fmt::format("FATAL: the trainsup watchdog thread has not run for {} s (heartbeat timeout {} s); "
                        "exiting with code {} ({})",
                        seconds(silent), config.heartbeat_timeout_s, kExitWatchdogUnresponsive,
                        exitCodeName(kExitWatchdogUnresponsive)),
            kExitWatchdogUnresponsive);
}

void Supervisor::Impl::onAbortDeadline() {
  // Exiting for a stall anyway: say so with the stall's code. In warn mode the process was meant
  // to live on, so a dump that never ends means the watchdog itself is stuck.
  const int code = config.stall_action == StallAction::kExit ? kExitStall : kExitWatchdogUnresponsive;
  emergency(fmt::format("FATAL: stall handling (stack dump, abort callbacks) did not finish within "
                        "abort_grace_s={} s; exiting with code {} ({})",
                        config.abort_grace_s, code, exitCodeName(code)),
            code);
}

Result<std::unique_ptr<Supervisor>> SupervisorTesting::create(Config config, SupervisorTestOptions hooks) {
  return Supervisor::create(std::move(config), hooks);
}

Result<std::unique_ptr<Supervisor>> Supervisor::create(Config config) {
  return create(std::move(config), SupervisorTestOptions{});
}

Result<std::unique_ptr<Supervisor>> Supervisor::create(Config config, const SupervisorTestOptions& test_hooks) {
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

const Config& Supervisor::config() const { return impl_->config; }
const Identity& Supervisor::identity() const { return impl_->config.identity; }
const std::string& Supervisor::logFilePath() const { return impl_->log_path; }
const std::string& Supervisor::eventLogPath() const { return impl_->event_path; }
ProgressTracker& Supervisor::progress() { return *impl_->progress; }

Budget Supervisor::budgetFor(std::string_view section) { return impl_->watchdog->budgetFor(sectionId(section)); }

}  // namespace trainsup
