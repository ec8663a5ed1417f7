// trainsup/supervisor.h — the facade a training loop talks to.
//
// Usage (C++ trainer):
//   auto config = trainsup::Config::fromEnvironment();          // TRAINSUP_*, RANK, ...
//   if (!config) { std::cerr << config.status().toString() << "\n"; return trainsup::kExitBadConfig; }
//   auto sup = trainsup::Supervisor::create(*config);
//   if (!sup) { ...same... }
//   for (int64_t s = 0; s < steps && !(*sup)->stopRequested(); ++s) {
//     auto scope = (*sup)->step(s);   // the watchdog times this step against its budget
//     ...forward, backward, optimizer...
//   }
//
// Contract:
// - create() validates the config, opens the rank's log `<log_dir>/<job>-<host>-r<rank>.log`
//   and event log `...-r<rank>.events.jsonl`, installs the SIGTERM/SIGINT handlers (unless
//   handle_signals is false) and starts the watchdog. It fails with a Status naming the bad
//   setting or the path it could not open; nothing is left running after a failure.
// - step(), section() and the Scope they return belong to one thread, the training loop; they
//   cost well under a microsecond and never lock or allocate (section(name) looks the name up;
//   keep the SectionId from sectionId() in hot loops). Scopes nest; end them in LIFO order.
// - On a stall the watchdog thread logs the section, elapsed time and budget, dumps every
//   thread's stack into the rank log, writes "stall" and "stack_dump" events, runs the abort
//   callbacks (in registration order, each guarded against exceptions), writes "exit" and ends
//   the process with kExitStall. The heartbeat monitor bounds all of that by abort_grace_s:
//   past it, the process ends with kExitStall anyway (also if close() runs meanwhile).
//   With StallAction::kWarn it only logs and dumps, once per stalled section.
// - stopRequested() turns true after SIGTERM or SIGINT; a second signal of the same kind, 2 s
//   or more after the first, kills the process the default way (one sooner is the same request
//   delivered twice: a scheduler signals every process of the job and torchrun forwards it).
//   With checkpoints across ranks (checkpointer() with world size > 1) the ranks first agree,
//   at a checkpoint decision point (maybeCheckpoint/checkpoint, about every 5 s), so that every
//   rank's stopRequested() turns true after one and the same step — also on ranks that were not
//   signalled — and their stop checkpoints are one checkpoint; a loop that never reaches a
//   decision point sees it 20 s after the signal anyway. SIGUSR1/SIGUSR2 are never touched. With telemetry, the
//   watchdog's next tick also tells the coordinator that this rank is leaving on purpose, so
//   that its peers' wait on it is a stopped_rank verdict, not a fault of its host.
// - Any thread may call stopRequested(), log(), event(), addAbortCallback(), budgetFor().
// - close() (also run by the destructor) stops the watchdog, writes "supervisor_stop", restores
//   the signal handlers and flushes the logs. Idempotent.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <string_view>

#include "trainsup/checkpointer.h"
#include "trainsup/clock.h"
#include "trainsup/commit_channel.h"
#include "trainsup/config.h"
#include "trainsup/event_log.h"
#include "trainsup/exit_codes.h"
#include "trainsup/export.h"
#include "trainsup/progress.h"
#include "trainsup/status.h"
#include "trainsup/watchdog.h"

namespace trainsup {

struct SupervisorTestOptions;  // test hooks: rank/supervisor_testing.h (internal)

class TRAINSUP_EXPORT Supervisor {
 public:
  static Result<std::unique_ptr<Supervisor>> create(Config config);
  ~Supervisor();
  Supervisor(const Supervisor&) = delete;
  Supervisor& operator=(const Supervisor&) = delete;

  // RAII progress marker. Move-only; end() closes it early; the destructor closes it otherwise.
  class [[nodiscard]] Scope {
   public:
    Scope(Scope&& other) noexcept : sup_(other.sup_) { other.sup_ = nullptr; }
    Scope& operator=(Scope&&) = delete;
    Scope(const Scope&) = delete;
    ~Scope() { end(); }
    void end() {
      if (sup_ != nullptr) {
        Supervisor* s = sup_;
        sup_ = nullptr;
        s->exitSection();
      }
    }

   private:
    friend class Supervisor;
    explicit Scope(Supervisor* sup) : sup_(sup) {}
    Supervisor* sup_;
  };

  Scope step(int64_t step);
  // Names are free-form ("setup", "eval", "checkpoint", "data", ...); at most 64 distinct ones.
  // An invalid name is a bug in the caller (logic_error).
  Scope section(std::string_view name);
  Scope section(SectionId id);
  SectionId sectionId(std::string_view name);

  bool stopRequested() const;
  int stopSignal() const;  // the signal that asked, or 0

  void addAbortCallback(std::string name, std::function<void(const StallReport&)> callback);
  // Extra stack dumps (the Python bindings add every Python thread's stack) written into the
  // rank log after the native one on a stall. `dump` runs on the watchdog thread while the
  // training thread may be stuck: it must not need the GIL or any lock that thread may hold.
  void addStackDumpHook(std::string name, std::function<std::string()> dump);

  void log(LogLevel level, std::string_view message);
  void event(std::string_view name, const EventFields& fields = {});

  // --- Checkpoints (trainsup/checkpointer.h), all collective, training thread only ---
  // Creates the Checkpointer on first use. A job of several ranks passes its c10d store as
  // `channel` (trainsup/torch_state.h adapts it); one rank needs none. Later calls return the
  // same Checkpointer and ignore `channel`. With in-memory snapshots configured
  // (TRAINSUP_SNAPSHOT_EVERY_STEPS or _INTERVAL_S, and TRAINSUP_SNAPSHOT_DIR, which trainsup-run
  // sets), it also creates the memory tier (docs/snapshots.md): a second Checkpointer over this
  // host's snapshot memory, on its own schedule, whose shards count only once a peer host's
  // agent holds a verified copy.
  Result<Checkpointer*> checkpointer(std::shared_ptr<CommitChannel> channel = nullptr);
  // Save if due / save now. The snapshot is timed as section "checkpoint". The learned section
  // budgets travel in the checkpoint's metadata ("trainsup.budgets"), so a restarted job starts
  // calibrated. A background persist failure of an earlier save is returned here once (and was
  // logged and recorded when it happened), after this call's own save was carried out, so that
  // every rank takes the same decisions. Requires checkpointer() to have succeeded.
  // maybeCheckpoint() also takes an in-memory snapshot when one is due: `collect` then finds
  // "trainsup.tier" = "memory" in the metadata map it is handed. A failed snapshot is an event
  // ("snapshot_failed") and a log line, never this call's error.
  Result<Checkpointer::Outcome> maybeCheckpoint(int64_t step, const Checkpointer::Collect& collect);
  Result<Checkpointer::Outcome> checkpoint(int64_t step, const Checkpointer::Collect& collect);
  // As the two above (now: checkpoint(), else maybeCheckpoint()), but an earlier save's
  // background persist failure is handed back in *earlier (once; Status::ok() when there was
  // none) instead of as this call's error: the Result is this call's own save only. For callers
  // that report a failed persist without stopping (the Python module warns), including one that
  // ended while this call waited for it (busy policy "wait").
  Result<Checkpointer::Outcome> save(int64_t step, const Checkpointer::Collect& collect, bool now, Status* earlier);
  // With TRAINSUP_CHECKPOINT_SNAPSHOT=overlapped: call before the state is next modified
  // (before the optimizer step); waits for the snapshot copy (timed as section "checkpoint").
  // OK at once when no snapshot is outstanding or checkpoints are not set up.
  Status awaitSnapshot();
  // Whether an overlapped snapshot of either tier (disk checkpoint or in-memory snapshot) is
  // still copying the buffers its collect callback returned: keep them alive until
  // awaitSnapshot(). Training thread.
  bool snapshotOutstanding() const;
  // Restores the newest valid checkpoint (timed as section "restore"); nullopt when none.
  // With snapshots: the newest snapshot every rank can get (from this host's memory, else a
  // peer's copy), unless the disk holds a newer checkpoint; when no snapshot can be restored,
  // the disk's newest, with a "snapshot_restore_fallback" event saying why.
  Result<std::optional<int64_t>> restore(const Checkpointer::Load& load);

  const Config& config() const;
  const Identity& identity() const;
  const std::string& logFilePath() const;
  const std::string& eventLogPath() const;
  Budget budgetFor(std::string_view section);
  ProgressTracker& progress();

  // Ends supervision: flushes a pending checkpoint persist, stops the watchdog, says goodbye to
  // the coordinator (a normal end raises no verdict) and flushes the logs. Idempotent.
  // `failed`: the training loop is ending with an error. Then the goodbye says so (the
  // coordinator reports failed_rank, which blames the program, not the host), and with a
  // coordinator close() first waits up to
  // 1 s (at most abort_grace_s) for an abort order the error may be a consequence of (a peer
  // that exited on the order breaks this rank's collectives before its own order arrives);
  // when one comes, the process exits with the abort code (94) as ordered.
  void close(bool failed = false);

 private:
  friend struct SupervisorTesting;
  struct Impl;
  static Result<std::unique_ptr<Supervisor>> create(Config config, const SupervisorTestOptions& hooks);
  explicit Supervisor(std::unique_ptr<Impl> impl);
  void exitSection();
  Result<Checkpointer::Outcome> saveCheckpoint(int64_t step, const Checkpointer::Collect& collect, bool now);
  Result<Checkpointer::Outcome> saveCheckpointNow(int64_t step, const Checkpointer::Collect& collect, bool now);
  Result<int64_t> newestDiskStep(int64_t call);
  std::unique_ptr<Impl> impl_;
};

// Makes std::terminate say where it happened: the terminating thread's id, name and native
// stack go to stderr (raw writes) before the handler that was installed before runs (the
// default prints "terminate called ..." and aborts). A joinable std::thread destroyed, an
// exception escaping a noexcept function, a thread ended by the interpreter's finalization
// inside a destructor: all end with that one line and nothing else otherwise. Called by
// Supervisor::create and when the Python module loads; idempotent; any thread.
TRAINSUP_EXPORT void installTerminateReporter();

}  // namespace trainsup
