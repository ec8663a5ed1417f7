// trainsup/config.h — every setting of a supervised rank, and where it comes from.
//
// Contract: Config::fromEnvironment() reads TRAINSUP_* variables and torchrun's variables
// (RANK, LOCAL_RANK, WORLD_SIZE, ...) over the defaults below; code may then change fields
// (code wins over the environment), and Supervisor::create() validates the result. A bad
// value — not a number, negative, out of range, an unknown enum word — is an InvalidArgument
// Status whose message names the variable (or field) and the value; nothing is half-applied.
// docs/configuration.md is the reference table for every variable read here.
// Config is a plain value: copy it freely; it holds no resources.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>
#include <string_view>

#include "trainsup/export.h"
#include "trainsup/status.h"

namespace trainsup {

enum class LogLevel { kTrace, kDebug, kInfo, kWarn, kError };
// What the watchdog does when a section runs past its budget.
enum class StallAction {
  kExit,  // log, dump stacks, event, abort callbacks, then exit with kExitStall (default)
  kWarn,  // log, dump stacks and event once per stalled section, keep running (for debugging)
};

TRAINSUP_EXPORT const char* logLevelName(LogLevel level);
TRAINSUP_EXPORT const char* stallActionName(StallAction action);

// Who this process is. Filled from torchrun's variables where present, else single-process
// defaults. host is the OS host name unless TRAINSUP_NODE_NAME overrides it.
struct Identity {
  int rank = 0;              // RANK
  int local_rank = 0;        // LOCAL_RANK
  int world_size = 1;        // WORLD_SIZE
  int local_world_size = 1;  // LOCAL_WORLD_SIZE
  int group_rank = 0;        // GROUP_RANK (the node's index in the rendezvous)
  std::string master_addr;   // MASTER_ADDR
  int master_port = 0;       // MASTER_PORT
  std::string run_id;        // TORCHELASTIC_RUN_ID
  int restart_count = 0;     // TORCHELASTIC_RESTART_COUNT
  std::string host;          // TRAINSUP_NODE_NAME, else gethostname(); empty = gethostname()
  std::string job_id = "local";  // TRAINSUP_JOB_ID, else TORCHELASTIC_RUN_ID, else SLURM_JOB_ID
};

// How section budgets are learned. A section without an explicit budget gets
// `warmup_s` for its first `warmup_count` completions (start-up, compilation and cache
// warming are slow and are not learned from); after that its budget is
// max(floor_s, multiplier x the largest duration observed after the warm-up).
struct BudgetPolicy {
  double multiplier = 5.0;      // TRAINSUP_BUDGET_MULTIPLIER
  double floor_s = 10.0;        // TRAINSUP_BUDGET_FLOOR_S
  int warmup_count = 3;         // TRAINSUP_BUDGET_WARMUP_COUNT
  double warmup_s = 900.0;      // TRAINSUP_BUDGET_WARMUP_S
  double warn_fraction = 0.5;   // TRAINSUP_WARN_FRACTION: warn once at this fraction of a budget
};

// Checkpoint settings (trainsup/checkpointer.h).
enum class BusyPolicy {
  kSkip,  // a checkpoint due while the previous one still persists is skipped (and recorded)
  kWait,  // ...or the training thread waits for the previous persist to finish
};
TRAINSUP_EXPORT const char* busyPolicyName(BusyPolicy policy);
enum class SnapshotMode {
  kBlocking,    // save() returns once the state is copied to staging memory (safe by default)
  kOverlapped,  // save() returns at once; the copy runs beside the next forward/backward and
                // the training thread calls awaitSnapshot() before it next modifies the state
};
TRAINSUP_EXPORT const char* snapshotModeName(SnapshotMode mode);

struct CheckpointOptions {
  std::string dir = "checkpoints";          // TRAINSUP_CHECKPOINT_DIR
  double interval_s = 600;                  // TRAINSUP_CHECKPOINT_INTERVAL_S (0 = off)
  int64_t every_steps = 0;                  // TRAINSUP_CHECKPOINT_EVERY_STEPS (0 = off)
  int keep = 3;                             // TRAINSUP_CHECKPOINT_KEEP (>= 1)
  BusyPolicy busy_policy = BusyPolicy::kSkip;  // TRAINSUP_CHECKPOINT_BUSY_POLICY
  SnapshotMode snapshot = SnapshotMode::kBlocking;  // TRAINSUP_CHECKPOINT_SNAPSHOT
  // Every rank saves the same state (data parallel, e.g. DDP): a checkpoint of N ranks then
  // restores on any number of ranks, rank r reading shard r % N.  TRAINSUP_CHECKPOINT_REPLICATED
  bool replicated = false;
  // How Python states are written (C++ trainers always write trainsup's own shards):
  // "native" trainsup's shards; "dcp" torch.distributed.checkpoint files with trainsup's shards
  // beside them (reshards to any world size); "auto" dcp when the state holds DTensors (FSDP2,
  // TP), native otherwise.  TRAINSUP_CHECKPOINT_FORMAT
  std::string format = "auto";
  double commit_timeout_s = 600;            // TRAINSUP_CHECKPOINT_COMMIT_TIMEOUT_S
  double mtbf_s = 0;                        // TRAINSUP_MTBF_S (0 = unknown)
  int sync_steps = 10;                      // TRAINSUP_CHECKPOINT_SYNC_STEPS: initial decision spacing

  // The memory tier (docs/snapshots.md): a Checkpointer whose `dir` is host-local shared memory
  // (tmpfs) that the launcher agent owns, and whose shards the agent copies to a peer host's
  // agent before they count. Set by Supervisor from SnapshotOptions, not read from the
  // environment under these names.
  bool memory_tier = false;
  std::string agent;        // "host:port" of this host's agent (its snapshot service)
  std::string agent_token;  // 32 hex digits the agents check on every request
  int replicas = 1;         // peer copies a shard needs before it counts (0 or 1)
};

// In-memory snapshots (issue 22), on a schedule of their own. trainsup-run sets dir, agent and
// token for its workers; the user sets the schedule. Off unless a schedule and a dir are set.
struct SnapshotOptions {
  int64_t every_steps = 0;  // TRAINSUP_SNAPSHOT_EVERY_STEPS (0 = off)
  double interval_s = 0;    // TRAINSUP_SNAPSHOT_INTERVAL_S (0 = off)
  std::string dir;          // TRAINSUP_SNAPSHOT_DIR: this host's snapshot memory (tmpfs), per host
  std::string agent;        // TRAINSUP_SNAPSHOT_AGENT: "host:port" of this host's agent
  std::string token;        // TRAINSUP_SNAPSHOT_TOKEN: the agents' token (32 hex digits)
  int replicas = 1;         // TRAINSUP_SNAPSHOT_REPLICAS: peer copies required (0 or 1)
  bool enabled() const { return (every_steps > 0 || interval_s > 0) && !dir.empty(); }
};

// Where settings come from: the process environment, or a map in tests.
class TRAINSUP_EXPORT Environment {
 public:
  using Lookup = std::function<std::optional<std::string>(const std::string&)>;
  explicit Environment(Lookup lookup) : lookup_(std::move(lookup)) {}
  static Environment process();  // getenv(); unset and empty both mean "absent"
  static Environment fromMap(std::map<std::string, std::string> vars);
  std::optional<std::string> get(const std::string& name) const;

 private:
  Lookup lookup_;
};

struct TRAINSUP_EXPORT Config {
  Identity identity;

  // Logs: `<log_dir>/<job_id>-<host>-r<rank>.log` and `...-r<rank>.events.jsonl`.
  std::string log_dir = "trainsup-logs";  // TRAINSUP_LOG_DIR
  LogLevel log_level = LogLevel::kInfo;   // TRAINSUP_LOG_LEVEL
  bool log_to_stderr = true;              // TRAINSUP_LOG_STDERR

  // Watchdog.
  bool watchdog_enabled = true;              // TRAINSUP_WATCHDOG
  double watchdog_interval_s = 0.2;          // TRAINSUP_WATCHDOG_INTERVAL_S: how often budgets are checked
  double heartbeat_timeout_s = 30.0;         // TRAINSUP_WATCHDOG_HEARTBEAT_TIMEOUT_S
  double abort_grace_s = 10.0;               // TRAINSUP_ABORT_GRACE_S: dump + abort callbacks must end by then
  StallAction stall_action = StallAction::kExit;  // TRAINSUP_STALL_ACTION
  BudgetPolicy budgets;
  // Explicit budgets in seconds by section name; TRAINSUP_SECTION_BUDGETS="step=2,eval=600".
  std::map<std::string, double> section_budgets_s;

  CheckpointOptions checkpoint;
  SnapshotOptions snapshot;

  // Telemetry to the job coordinator (issue #5). Empty: off.
  std::string coordinator;  // TRAINSUP_COORDINATOR: "host:port"
  std::string job_token;    // TRAINSUP_JOB_TOKEN: 32 hex digits, shared by the job's ranks

  // SIGTERM/SIGINT set a "stop requested" flag instead of killing the process.
  bool handle_signals = true;  // TRAINSUP_HANDLE_SIGNALS

  // Reads the environment over the defaults. Fails on the first bad value.
  static Result<Config> fromEnvironment(const Environment& env = Environment::process());
  // Every variable fromEnvironment() reads, in the order it reads them: the one list of a rank's
  // settings (the Python module's keyword settings are made from it).
  static std::vector<std::string> variableNames();
  // Checks cross-field rules (rank < world_size, positive intervals, ...).
  Status validate() const;
};

// The 16 bytes of a TRAINSUP_JOB_TOKEN (32 hex digits).
using JobTokenBytes = std::array<uint8_t, 16>;
TRAINSUP_EXPORT Result<JobTokenBytes> parseJobToken(const std::string& hex);

// Where a rank's telemetry goes (TRAINSUP_COORDINATOR): "unix:<path>" (the host's node monitor)
// or "host:port" (a coordinator; port 1..65535). The one parser of that setting: Config::validate
// and the Supervisor both use it. InvalidArgument naming the setting and the value otherwise.
struct CoordinatorAddress {
  std::string unix_path;  // set for "unix:<path>"
  std::string host;       // else host and port
  uint16_t port = 0;
};
TRAINSUP_EXPORT Result<CoordinatorAddress> parseCoordinatorAddress(const std::string& text);

// The OS host name (gethostname), or "unknown-host".
TRAINSUP_EXPORT std::string osHostName();

// Parses "name=seconds,name=seconds". `what` names the source in error messages.
TRAINSUP_EXPORT Result<std::map<std::string, double>> parseSectionBudgets(std::string_view text,
                                                                          std::string_view what);

}  // namespace trainsup
