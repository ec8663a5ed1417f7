// Reading settings from the environment. Each variable is read by exactly one line of
// Config::fromEnvironment(); docs/configuration.md lists them in the same order.
#include "trainsup/config.h"

#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <charconv>
#include <climits>
#include <cstdint>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <utility>

namespace trainsup {
namespace {

std::string quote(std::string_view v) { return "'" + std::string(v) + "'"; }

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t' || s.back() == '\n')) s.remove_suffix(1);
  return s;
}

Result<int64_t> parseInteger(std::string_view what, std::string_view text, int64_t min, int64_t max) {
  std::string_view t = trim(text);
  int64_t v = 0;
  auto [end, ec] = std::from_chars(t.data(), t.data() + t.size(), v);
  if (t.empty() || ec != std::errc() || end != t.data() + t.size()) {
    return Status::invalidArgument(std::string(what) + "=" + quote(text) + " is not an integer");
  }
  if (v < min || v > max) {
    return Status::invalidArgument(std::string(what) + "=" + quote(text) + " is out of range [" +
                                   std::to_string(min) + ", " + std::to_string(max) + "]");
  }
  return v;
}

// Seconds and factors: finite, and > 0 unless allow_zero.
Result<double> parseNumber(std::string_view what, std::string_view text, bool allow_zero) {
  std::string_view t = trim(text);
  double v = 0;
  auto [end, ec] = std::from_chars(t.data(), t.data() + t.size(), v);
  if (t.empty() || ec != std::errc() || end != t.data() + t.size() || !std::isfinite(v)) {
    return Status::invalidArgument(std::string(what) + "=" + quote(text) + " is not a number");
  }
  if (v < 0 || (v == 0 && !allow_zero)) {
    return Status::invalidArgument(std::string(what) + "=" + quote(text) + " must be " +
                                   (allow_zero ? "zero or positive" : "positive"));
  }
  return v;
}

Result<bool> parseBool(std::string_view what, std::string_view text) {
  std::string t(trim(text));
  for (auto& c : t) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  if (t == "1" || t == "true" || t == "yes" || t == "on") return true;
  if (t == "0" || t == "false" || t == "no" || t == "off") return false;
  return Status::invalidArgument(std::string(what) + "=" + quote(text) +
                                 " is not a boolean (1|0|true|false|yes|no|on|off)");
}

// Applies each present variable in turn; the first failure is kept and the rest skipped.
class EnvReader {
 public:
  explicit EnvReader(const Environment& env) : env_(env) {}
  const Status& status() const { return status_; }

  void integer(const char* var, int& out, int64_t min, int64_t max = INT_MAX) {
    apply(var, [&](const std::string& v) {
      auto r = parseInteger(var, v, min, max);
      if (r) out = static_cast<int>(*r);
      return r.status();
    });
  }
  void number(const char* var, double& out, bool allow_zero = false) {
    apply(var, [&](const std::string& v) {
      auto r = parseNumber(var, v, allow_zero);
      if (r) out = *r;
      return r.status();
    });
  }
  void boolean(const char* var, bool& out) {
    apply(var, [&](const std::string& v) {
      auto r = parseBool(var, v);
      if (r) out = *r;
      return r.status();
    });
  }
  void text(const char* var, std::string& out) {
    apply(var, [&](const std::string& v) {
      out = v;
      return Status::ok();
    });
  }
  template <class F>
  void apply(const char* var, F&& f) {
    if (!status_.isOk()) return;
    if (auto v = env_.get(var)) status_ = f(*v);
  }

 private:
  const Environment& env_;
  Status status_;
};

Result<LogLevel> parseLogLevel(std::string_view what, std::string_view text) {
  std::string_view t = trim(text);
  if (t == "trace") return LogLevel::kTrace;
  if (t == "debug") return LogLevel::kDebug;
  if (t == "info") return LogLevel::kInfo;
  if (t == "warn" || t == "warning") return LogLevel::kWarn;
  if (t == "error") return LogLevel::kError;
  return Status::invalidArgument(std::string(what) + "=" + quote(text) +
                                 " is not one of trace|debug|info|warn|error");
}

Result<StallAction> parseStallAction(std::string_view what, std::string_view text) {
  std::string_view t = trim(text);
  if (t == "exit") return StallAction::kExit;
  if (t == "warn") return StallAction::kWarn;
  return Status::invalidArgument(std::string(what) + "=" + quote(text) + " is not one of exit|warn");
}

// Host names end up in file names: keep them to a safe alphabet.
bool isSafeName(std::string_view s) {
  if (s.empty() || s == "." || s == "..") return false;
  for (char c : s) {
    bool ok = std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_' || c == '.';
    if (!ok) return false;
  }
  return true;
}

}  // namespace

Result<JobTokenBytes> parseJobToken(const std::string& hex) {
  if (hex.size() != 32) return Status::invalidArgument("job token must be 32 hex digits");
  JobTokenBytes t{};
  for (size_t i = 0; i < 16; ++i) {
    unsigned v = 0;
    if (std::sscanf(hex.c_str() + 2 * i, "%2x", &v) != 1) return Status::invalidArgument("job token is not hex");
    t[i] = static_cast<uint8_t>(v);
  }
  return t;
}

Result<CoordinatorAddress> parseCoordinatorAddress(const std::string& text) {
  auto bad = [&](const std::string& why) {
    return Status::invalidArgument("coordinator (TRAINSUP_COORDINATOR)=\"" + text + "\" " + why);
  };
  CoordinatorAddress a;
  if (text.rfind("unix:", 0) == 0) {
    if (text.size() == 5) return bad("names no socket path after unix:");
    a.unix_path = text.substr(5);
    return a;
  }
  const size_t colon = text.rfind(':');
  if (colon == std::string::npos || colon == 0 || colon + 1 == text.size()) {
    return bad("is not host:port or unix:<path>");
  }
  const std::string port = text.substr(colon + 1);
  if (port.find_first_not_of("0123456789") != std::string::npos) return bad("has a port that is not a number");
  // At most 5 digits before converting: no overflow, whatever the length.
  if (port.size() > 5 || std::stoul(port) < 1 || std::stoul(port) > 65535) return bad("has a port outside 1..65535");
  a.host = text.substr(0, colon);
  a.port = static_cast<uint16_t>(std::stoul(port));
  return a;
}

std::string osHostName() {
  char buf[HOST_NAME_MAX + 1] = {};
  if (gethostname(buf, sizeof(buf) - 1) != 0 || buf[0] == '\0') return "unknown-host";
  return buf;
}

const char* logLevelName(LogLevel level) {
  switch (level) {
    case LogLevel::kTrace: return "trace";
    case LogLevel::kDebug: return "debug";
    case LogLevel::kInfo: return "info";
    case LogLevel::kWarn: return "warn";
    case LogLevel::kError: return "error";
  }
  return "info";
}

const char* busyPolicyName(BusyPolicy policy) { return policy == BusyPolicy::kWait ? "wait" : "skip"; }
const char* snapshotModeName(SnapshotMode mode) { return mode == SnapshotMode::kOverlapped ? "overlapped" : "blocking"; }

const char* stallActionName(StallAction action) {
  return action == StallAction::kWarn ? "warn" : "exit";
}

Environment Environment::process() {
  return Environment([](const std::string& name) -> std::optional<std::string> {
    const char* v = std::getenv(name.c_str());
    if (v == nullptr || *v == '\0') return std::nullopt;
    return std::string(v);
  });
}

Environment Environment::fromMap(std::map<std::string, std::string> vars) {
  return Environment([vars = std::move(vars)](const std::string& name) -> std::optional<std::string> {
    auto it = vars.find(name);
    if (it == vars.end() || it->second.empty()) return std::nullopt;
    return it->second;
  });
}

std::optional<std::string> Environment::get(const std::string& name) const { return lookup_(name); }

Result<std::map<std::string, double>> parseSectionBudgets(std::string_view text, std::string_view what) {
  std::map<std::string, double> out;
  std::string_view rest = text;
  while (!rest.empty()) {
    size_t comma = rest.find(',');
    std::string_view item = trim(rest.substr(0, comma));
    rest = comma == std::string_view::npos ? std::string_view() : rest.substr(comma + 1);
    if (item.empty()) continue;
    size_t eq = item.find('=');
    std::string_view name = eq == std::string_view::npos ? item : trim(item.substr(0, eq));
    if (eq == std::string_view::npos || name.empty()) {
      return Status::invalidArgument(std::string(what) + "=" + quote(text) + ": entry " + quote(item) +
                                     " is not name=seconds");
    }
    auto seconds = parseNumber(std::string(what) + "[" + std::string(name) + "]", item.substr(eq + 1), false);
    if (!seconds) return seconds.status();
    out[std::string(name)] = *seconds;
  }
  return out;
}

Result<Config> Config::fromEnvironment(const Environment& env) {
  Config c;
  Identity& id = c.identity;
  EnvReader r(env);
  // torchrun's variables.
  r.integer("RANK", id.rank, 0);
  r.integer("LOCAL_RANK", id.local_rank, 0);
  r.integer("WORLD_SIZE", id.world_size, 1);
  r.integer("LOCAL_WORLD_SIZE", id.local_world_size, 1);
  r.integer("GROUP_RANK", id.group_rank, 0);
  r.text("MASTER_ADDR", id.master_addr);
  r.integer("MASTER_PORT", id.master_port, 0, 65535);
  r.text("TORCHELASTIC_RUN_ID", id.run_id);
  r.integer("TORCHELASTIC_RESTART_COUNT", id.restart_count, 0);
  // trainsup.run's rendezvous round: the same on every rank of an attempt, where torchrun's
  // count is per agent (a spare that joins later starts at 0). It wins when set.
  r.integer("TRAINSUP_RESTART_COUNT", id.restart_count, 0);
  // Ours.
  id.host = osHostName();
  r.text("TRAINSUP_NODE_NAME", id.host);
  id.job_id = "local";
  if (auto v = env.get("SLURM_JOB_ID")) id.job_id = *v;
  if (!id.run_id.empty()) id.job_id = id.run_id;
  r.text("TRAINSUP_JOB_ID", id.job_id);
  r.text("TRAINSUP_LOG_DIR", c.log_dir);
  r.apply("TRAINSUP_LOG_LEVEL", [&](const std::string& v) {
    auto l = parseLogLevel("TRAINSUP_LOG_LEVEL", v);
    if (l) c.log_level = *l;
    return l.status();
  });
  r.boolean("TRAINSUP_LOG_STDERR", c.log_to_stderr);
  r.boolean("TRAINSUP_WATCHDOG", c.watchdog_enabled);
  r.number("TRAINSUP_WATCHDOG_INTERVAL_S", c.watchdog_interval_s);
  r.number("TRAINSUP_WATCHDOG_HEARTBEAT_TIMEOUT_S", c.heartbeat_timeout_s);
  r.number("TRAINSUP_ABORT_GRACE_S", c.abort_grace_s);
  r.apply("TRAINSUP_STALL_ACTION", [&](const std::string& v) {
    auto a = parseStallAction("TRAINSUP_STALL_ACTION", v);
    if (a) c.stall_action = *a;
    return a.status();
  });
  r.number("TRAINSUP_BUDGET_MULTIPLIER", c.budgets.multiplier);
  r.number("TRAINSUP_BUDGET_FLOOR_S", c.budgets.floor_s);
  r.integer("TRAINSUP_BUDGET_WARMUP_COUNT", c.budgets.warmup_count, 0);
  r.number("TRAINSUP_BUDGET_WARMUP_S", c.budgets.warmup_s);
  r.number("TRAINSUP_WARN_FRACTION", c.budgets.warn_fraction);
  r.apply("TRAINSUP_SECTION_BUDGETS", [&](const std::string& v) {
    auto b = parseSectionBudgets(v, "TRAINSUP_SECTION_BUDGETS");
    if (b) c.section_budgets_s = *b;
    return b.status();
  });
  r.boolean("TRAINSUP_HANDLE_SIGNALS", c.handle_signals);
  CheckpointOptions& ck = c.checkpoint;
  r.text("TRAINSUP_CHECKPOINT_DIR", ck.dir);
  r.number("TRAINSUP_CHECKPOINT_INTERVAL_S", ck.interval_s, /*allow_zero=*/true);
  r.apply("TRAINSUP_CHECKPOINT_EVERY_STEPS", [&](const std::string& v) {
    auto n = parseInteger("TRAINSUP_CHECKPOINT_EVERY_STEPS", v, 0, INT64_MAX);
    if (n) ck.every_steps = *n;
    return n.status();
  });
  r.integer("TRAINSUP_CHECKPOINT_KEEP", ck.keep, 1);
  r.apply("TRAINSUP_CHECKPOINT_BUSY_POLICY", [&](const std::string& v) -> Status {
    std::string_view t = trim(v);
    if (t == "skip") ck.busy_policy = BusyPolicy::kSkip;
    else if (t == "wait") ck.busy_policy = BusyPolicy::kWait;
    else return Status::invalidArgument("TRAINSUP_CHECKPOINT_BUSY_POLICY=" + quote(v) + " is not one of skip|wait");
    return Status::ok();
  });
  r.apply("TRAINSUP_CHECKPOINT_SNAPSHOT", [&](const std::string& v) -> Status {
    std::string_view t = trim(v);
    if (t == "blocking") ck.snapshot = SnapshotMode::kBlocking;
    else if (t == "overlapped") ck.snapshot = SnapshotMode::kOverlapped;
    else return Status::invalidArgument("TRAINSUP_CHECKPOINT_SNAPSHOT=" + quote(v) + " is not one of blocking|overlapped");
    return Status::ok();
  });
  r.apply("TRAINSUP_CHECKPOINT_FORMAT", [&](const std::string& v) -> Status {
    std::string_view t = trim(v);
    if (t != "auto" && t != "native" && t != "dcp") {
      return Status::invalidArgument("TRAINSUP_CHECKPOINT_FORMAT=" + quote(v) + " is not one of auto|native|dcp");
    }
    ck.format = std::string(t);
    return Status::ok();
  });
  r.boolean("TRAINSUP_CHECKPOINT_REPLICATED", ck.replicated);
  r.number("TRAINSUP_CHECKPOINT_COMMIT_TIMEOUT_S", ck.commit_timeout_s);
  r.number("TRAINSUP_MTBF_S", ck.mtbf_s, /*allow_zero=*/true);
  r.integer("TRAINSUP_CHECKPOINT_SYNC_STEPS", ck.sync_steps, 1);
  SnapshotOptions& sn = c.snapshot;
  r.apply("TRAINSUP_SNAPSHOT_EVERY_STEPS", [&](const std::string& v) {
    auto n = parseInteger("TRAINSUP_SNAPSHOT_EVERY_STEPS", v, 0, INT64_MAX);
    if (n) sn.every_steps = *n;
    return n.status();
  });
  r.number("TRAINSUP_SNAPSHOT_INTERVAL_S", sn.interval_s, /*allow_zero=*/true);
  r.text("TRAINSUP_SNAPSHOT_DIR", sn.dir);
  r.text("TRAINSUP_SNAPSHOT_AGENT", sn.agent);
  r.text("TRAINSUP_SNAPSHOT_TOKEN", sn.token);
  r.integer("TRAINSUP_SNAPSHOT_REPLICAS", sn.replicas, 0, 1);
  r.text("TRAINSUP_COORDINATOR", c.coordinator);
  r.text("TRAINSUP_JOB_TOKEN", c.job_token);
  if (!r.status().isOk()) return r.status();
  if (Status s = c.validate(); !s.isOk()) return s;
  return c;
}

std::vector<std::string> Config::variableNames() {
  std::vector<std::string> names;
  Environment recording([&names](const std::string& name) -> std::optional<std::string> {
    if (std::find(names.begin(), names.end(), name) == names.end()) names.push_back(name);
    return std::nullopt;
  });
  (void)fromEnvironment(recording);  // the defaults: only the names read matter here
  return names;
}

Status Config::validate() const {
  const Identity& id = identity;
  auto bad = [](std::string m) { return Status::invalidArgument(std::move(m)); };
  if (id.world_size < 1) return bad("world_size (WORLD_SIZE)=" + std::to_string(id.world_size) + " must be >= 1");
  if (id.rank < 0 || id.rank >= id.world_size) {
    return bad("rank (RANK)=" + std::to_string(id.rank) + " must be in [0, WORLD_SIZE=" +
               std::to_string(id.world_size) + ")");
  }
  if (id.local_world_size < 1) {
    return bad("local_world_size (LOCAL_WORLD_SIZE)=" + std::to_string(id.local_world_size) + " must be >= 1");
  }
  if (id.local_rank < 0 || id.local_rank >= id.local_world_size) {
    return bad("local_rank (LOCAL_RANK)=" + std::to_string(id.local_rank) + " must be in [0, LOCAL_WORLD_SIZE=" +
               std::to_string(id.local_world_size) + ")");
  }
  if (!isSafeName(id.host)) {
    return bad("host (TRAINSUP_NODE_NAME or the OS host name)=" + quote(id.host) +
               " must be non-empty and use only letters, digits, '-', '_' and '.'");
  }
  if (!isSafeName(id.job_id)) {
    return bad("job_id (TRAINSUP_JOB_ID, TORCHELASTIC_RUN_ID or SLURM_JOB_ID)=" + quote(id.job_id) +
               " must be non-empty and use only letters, digits, '-', '_' and '.'");
  }
  if (log_dir.empty()) return bad("log_dir (TRAINSUP_LOG_DIR) must not be empty");
  auto positive = [&](const char* name, double v) -> Status {
    if (!(v > 0) || !std::isfinite(v)) return bad(std::string(name) + "=" + std::to_string(v) + " must be positive");
    return Status::ok();
  };
  for (auto [name, v] : {std::pair{"watchdog_interval_s (TRAINSUP_WATCHDOG_INTERVAL_S)", watchdog_interval_s},
                         std::pair{"heartbeat_timeout_s (TRAINSUP_WATCHDOG_HEARTBEAT_TIMEOUT_S)", heartbeat_timeout_s},
                         std::pair{"abort_grace_s (TRAINSUP_ABORT_GRACE_S)", abort_grace_s},
                         std::pair{"budgets.multiplier (TRAINSUP_BUDGET_MULTIPLIER)", budgets.multiplier},
                         std::pair{"budgets.floor_s (TRAINSUP_BUDGET_FLOOR_S)", budgets.floor_s},
                         std::pair{"budgets.warmup_s (TRAINSUP_BUDGET_WARMUP_S)", budgets.warmup_s}}) {
    if (Status s = positive(name, v); !s.isOk()) return s;
  }
  if (budgets.warmup_count < 0) {
    return bad("budgets.warmup_count (TRAINSUP_BUDGET_WARMUP_COUNT)=" + std::to_string(budgets.warmup_count) +
               " must be >= 0");
  }
  if (!(budgets.warn_fraction > 0 && budgets.warn_fraction <= 1)) {
    return bad("budgets.warn_fraction (TRAINSUP_WARN_FRACTION)=" + std::to_string(budgets.warn_fraction) +
               " must be in (0, 1]");
  }
  if (budgets.multiplier < 1) {
    return bad("budgets.multiplier (TRAINSUP_BUDGET_MULTIPLIER)=" + std::to_string(budgets.multiplier) +
               " must be >= 1");
  }
  if (heartbeat_timeout_s <= watchdog_interval_s) {
    return bad("heartbeat_timeout_s (TRAINSUP_WATCHDOG_HEARTBEAT_TIMEOUT_S)=" + std::to_string(heartbeat_timeout_s) +
               " must exceed watchdog_interval_s=" + std::to_string(watchdog_interval_s));
  }
  if (!coordinator.empty()) {
    if (auto address = parseCoordinatorAddress(coordinator); !address) return address.status();
    if (job_token.size() != 32 || job_token.find_first_not_of("0123456789abcdefABCDEF") != std::string::npos) {
      return bad("job_token (TRAINSUP_JOB_TOKEN) must be 32 hex digits when TRAINSUP_COORDINATOR is set");
    }
  }
  if (checkpoint.dir.empty()) return bad("checkpoint.dir (TRAINSUP_CHECKPOINT_DIR) must not be empty");
  if (checkpoint.keep < 1) return bad("checkpoint.keep (TRAINSUP_CHECKPOINT_KEEP)=" + std::to_string(checkpoint.keep) + " must be >= 1");
  if (!(checkpoint.interval_s >= 0) || checkpoint.every_steps < 0 || !(checkpoint.mtbf_s >= 0) ||
      !(checkpoint.commit_timeout_s > 0) || checkpoint.sync_steps < 1) {
    return bad("checkpoint settings: interval_s, every_steps and mtbf_s must be >= 0, commit_timeout_s > 0, sync_steps >= 1");
  }
  if (!(snapshot.interval_s >= 0) || snapshot.every_steps < 0) {
    return bad("snapshot settings: TRAINSUP_SNAPSHOT_EVERY_STEPS and TRAINSUP_SNAPSHOT_INTERVAL_S must be >= 0");
  }
  if (snapshot.enabled() && snapshot.replicas > 0 && snapshot.agent.empty() && identity.world_size > 1) {
    return bad("snapshots of a job of several ranks need this host's agent (TRAINSUP_SNAPSHOT_AGENT, set by "
               "trainsup-run) to copy them to a peer host; set TRAINSUP_SNAPSHOT_REPLICAS=0 to keep them on "
               "this host only");
  }
  for (const auto& [name, seconds] : section_budgets_s) {
    if (name.empty() || !(seconds > 0) || !std::isfinite(seconds)) {
      return bad("section_budgets_s (TRAINSUP_SECTION_BUDGETS): entry " + quote(name) + "=" +
                 std::to_string(seconds) + " needs a name and a positive number of seconds");
    }
  }
  return Status::ok();
}

}  // namespace trainsup
