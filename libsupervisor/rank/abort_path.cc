// The escalation path of a supervised rank (trainsup/supervisor.h): warnings, stalls, the
// coordinator's abort order and an unresponsive watchdog each end in a bounded sequence:
// stack dumps, events, abort callbacks (NCCL communicator abort), then the process exit.
#include "rank/supervisor_impl.h"

namespace trainsup {

using namespace supervisor_internal;

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

}  // namespace trainsup
