#include "trainsup/detector.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>

namespace trainsup {
namespace {

constexpr size_t kRecentWaits = 200;

std::string fmtMultiplier(double m) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%g", m);
  return buf;
}

std::string fmtS(int64_t ns) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.3f s", static_cast<double>(ns) / 1e9);
  return buf;
}

std::string listRanks(const std::vector<int>& ranks) {
  std::string s;
  for (int r : ranks) s += (s.empty() ? "" : ",") + std::to_string(r);
  return s;
}

}  // namespace

const char* verdictKindName(VerdictKind kind) {
  switch (kind) {
    case VerdictKind::kHungRank: return "hung_rank";
    case VerdictKind::kCommunicationFault: return "communication_fault";
    case VerdictKind::kSilentRank: return "silent_rank";
    case VerdictKind::kDeadRank: return "dead_rank";
    case VerdictKind::kStalledRank: return "stalled_rank";
    case VerdictKind::kStraggler: return "straggler";
    case VerdictKind::kFailedRank: return "failed_rank";
    case VerdictKind::kStoppedRank: return "stopped_rank";
  }
  return "?";
}

Detector::Detector(std::vector<RankInfo> ranks, DetectorOptions options)
    : ranks_(std::move(ranks)),
      options_(options),
      world_(static_cast<int>(ranks_.size())),
      last_seen_ns_(world_, -1),
      progress_(world_),
      silent_reported_(world_, false),
      dead_(world_, false),
      dead_reported_(world_, false),
      finished_(world_, false),
      expected_only_(world_, false),
      stopping_since_ns_(world_, -1),
      recent_waits_(kCollectiveOpCount),
      completed_by_op_(kCollectiveOpCount, 0),
      latest_count_(world_, 0),
      lateness_sum_ns_(world_, 0),
      streak_(world_, 0),
      straggler_reported_(world_, false) {}

Verdict Detector::make(VerdictKind kind, std::vector<int> ranks, std::string evidence, uint64_t seq,
                       const std::string& op) const {
  Verdict v;
  v.kind = kind;
  for (int r : ranks) {
    const bool known = r >= 0 && r < world_;
    v.hosts.push_back(known ? ranks_[r].host : "?");
    v.local_ranks.push_back(known ? ranks_[r].local_rank : -1);
    v.gpus.push_back(known ? ranks_[r].gpu : "");
  }
  if (!ranks.empty() && ranks.front() >= 0 && ranks.front() < world_ && progress_[ranks.front()].at_ns >= 0) {
    v.section = progress_[ranks.front()].section;
    v.step = progress_[ranks.front()].step;
  }
  v.ranks = std::move(ranks);
  v.seq = seq;
  v.op = op;
  v.evidence = std::move(evidence);
  return v;
}

void Detector::onHeartbeat(int rank, int64_t now_ns) {
  if (rank < 0 || rank >= world_) return;
  last_seen_ns_[rank] = now_ns;
  expected_only_[rank] = false;
  silent_reported_[rank] = false;
}

void Detector::onDisconnect(int rank, int64_t now_ns) {
  if (rank < 0 || rank >= world_ || finished_[rank]) return;
  dead_[rank] = true;
  last_seen_ns_[rank] = now_ns;
}

void Detector::onProgress(int rank, int64_t step, const std::string& section, int64_t in_section_ns,
                          int64_t now_ns) {
  if (rank < 0 || rank >= world_ || section.empty()) return;
  progress_[rank] = {step, section, in_section_ns, now_ns};
}

// "; rank 2 was in section 'forward' (step 60) for 5.2 s at its last heartbeat", or "".
std::string Detector::whereIs(int rank) const {
  const Progress& p = progress_[rank];
  if (p.at_ns < 0) return "";
  return "; rank " + std::to_string(rank) + " was in section '" + p.section + "' (step " + std::to_string(p.step) +
         ") for " + fmtS(p.in_section_ns) + " at its last heartbeat";
}

void Detector::expectRanks(int64_t now_ns, double within_s, const std::vector<int>& ranks) {
  const int64_t shift = static_cast<int64_t>((within_s - options_.heartbeat_timeout_s) * 1e9);
  for (int r : ranks) {
    if (r < 0 || r >= world_ || last_seen_ns_[r] >= 0 || expected_only_[r]) continue;
    last_seen_ns_[r] = now_ns + shift;  // silent once `within_s` has passed
    expected_only_[r] = true;
  }
}

void Detector::onFailed(int rank) {
  if (rank < 0 || rank >= world_ || finished_[rank]) return;
  finished_[rank] = true;
  queued_.push_back(make(VerdictKind::kFailedRank, {rank},
                         "rank " + std::to_string(rank) + " reported that it is ending with an error of its own" +
                             whereIs(rank)));
}

void Detector::onStopping(int rank, int64_t now_ns) {
  if (rank < 0 || rank >= world_ || stopping_since_ns_[rank] >= 0) return;
  stopping_since_ns_[rank] = now_ns;
}

void Detector::onFinished(int rank) {
  if (rank < 0 || rank >= world_) return;
  finished_[rank] = true;
}

Status parseOpBudgets(const std::string& text, DetectorOptions& options) {
  size_t pos = 0;
  while (pos < text.size()) {
    size_t end = text.find(',', pos);
    if (end == std::string::npos) end = text.size();
    std::string item = text.substr(pos, end - pos);
    pos = end + 1;
    if (item.find_first_not_of(" ") == std::string::npos) continue;
    size_t eq = item.find('=');
    std::string name = item.substr(0, eq == std::string::npos ? item.size() : eq);
    name.erase(0, name.find_first_not_of(' '));
    name.erase(name.find_last_not_of(' ') + 1);
    int op = -1;
    for (int k = 0; k < kCollectiveOpCount; ++k) {
      if (name == collectiveOpName(static_cast<CollectiveOp>(k))) op = k;
    }
    if (op < 0) return Status::invalidArgument("collective budget '" + item + "': unknown op '" + name + "'");
    char* rest = nullptr;
    const std::string value = eq == std::string::npos ? "" : item.substr(eq + 1);
    double s = std::strtod(value.c_str(), &rest);
    if (value.empty() || rest == value.c_str() || *rest != '\0' || !(s > 0) || !std::isfinite(s)) {
      return Status::invalidArgument("collective budget '" + item + "': '" + value + "' is not a positive number of seconds");
    }
    options.op_budget_s[op] = s;
  }
  return Status::ok();
}

void mergeRankInfo(RankInfo& known, const RankInfo& hello) {
  known.local_rank = hello.local_rank;
  if (!hello.host.empty()) known.host = hello.host;  // what the rank does not know, keep
  if (!hello.gpu.empty()) known.gpu = hello.gpu;
}

void Detector::setRankInfo(const RankInfo& info) {
  if (info.rank < 0 || info.rank >= world_) return;
  mergeRankInfo(ranks_[info.rank], info);
}

void Detector::setSlowHosts(std::vector<std::string> hosts) { slow_hosts_ = std::move(hosts); }

bool Detector::onSlowHost(int rank) const {
  return rank >= 0 && rank < world_ &&
         std::find(slow_hosts_.begin(), slow_hosts_.end(), ranks_[rank].host) != slow_hosts_.end();
}

void Detector::onRankStalled(int rank, const std::string& section, int64_t step, int64_t now_ns) {
  if (rank < 0 || rank >= world_) return;
  onHeartbeat(rank, now_ns);
  Verdict v = make(VerdictKind::kStalledRank, {rank},
                   "rank " + std::to_string(rank) + " reports section '" + section + "' (step " +
                       std::to_string(step) + ") over its budget, outside any collective");
  v.section = section;
  v.step = step;
  queued_.push_back(std::move(v));
}

void Detector::onEnter(int rank, uint64_t seq, CollectiveOp op, uint64_t bytes, int64_t now_ns) {
  if (rank < 0 || rank >= world_) return;
  onHeartbeat(rank, now_ns);
  Pending& p = pending_[seq];
  if (p.entered.empty()) {
    p.op = op;
    p.bytes = bytes;
    p.first_enter_ns = now_ns;
    p.entered.assign(world_, false);
    p.wait_ns.assign(world_, -1);
  }
  if (!p.entered[rank]) {
    p.entered[rank] = true;
    ++p.entered_count;
  }
}

void Detector::onExit(int rank, uint64_t seq, int64_t wait_ns, int64_t now_ns) {
  if (rank < 0 || rank >= world_) return;
  onHeartbeat(rank, now_ns);
  auto it = pending_.find(seq);
  if (it == pending_.end()) return;
  Pending& p = it->second;
  if (p.wait_ns[rank] < 0) {
    p.wait_ns[rank] = std::max<int64_t>(0, wait_ns);
    ++p.exited_count;
  }
  if (p.exited_count == world_) {
    complete(seq, p);
    pending_.erase(it);
  }
}

// A collective every rank finished: learn its duration, and score lateness for stragglers.
void Detector::complete(uint64_t, Pending& p) {
  const auto op = static_cast<size_t>(p.op);
  int64_t max_wait = *std::max_element(p.wait_ns.begin(), p.wait_ns.end());
  auto& recent = recent_waits_[op];
  recent.push_back(max_wait);
  if (recent.size() > kRecentWaits) recent.pop_front();
  ++completed_by_op_[op];

  int latest = 0;
  for (int r = 0; r < world_; ++r) {
    int64_t lateness = max_wait - p.wait_ns[r];
    lateness_sum_ns_[r] += static_cast<double>(lateness);
    if (p.wait_ns[r] < p.wait_ns[latest]) latest = r;
  }
  ++latest_count_[latest];
  window_waits_.push_back(max_wait);
  if (++window_fill_ < options_.straggler_window) return;

  // Close the window.
  std::vector<int64_t> waits = window_waits_;
  std::nth_element(waits.begin(), waits.begin() + waits.size() / 2, waits.end());
  const double median_wait = static_cast<double>(waits[waits.size() / 2]);
  for (int r = 0; r < world_; ++r) {
    double share = static_cast<double>(latest_count_[r]) / window_fill_;
    double mean_lateness = lateness_sum_ns_[r] / window_fill_;
    bool late = world_ > 1 && share >= options_.straggler_share &&
                mean_lateness >= options_.straggler_min_fraction * std::max(median_wait, 1e6);
    streak_[r] = late ? streak_[r] + 1 : 0;
    if (late && streak_[r] >= options_.straggler_windows && !straggler_reported_[r]) {
      straggler_reported_[r] = true;
      char buf[256];
      std::snprintf(buf, sizeof(buf),
                    "rank %d arrived last in %.0f%% of the last %d collectives for %d windows; mean lateness %.1f ms "
                    "(the job's median collective wait is %.1f ms)",
                    r, share * 100, window_fill_, streak_[r], mean_lateness / 1e6, median_wait / 1e6);
      queued_.push_back(make(VerdictKind::kStraggler, {r}, buf));
    }
  }
  std::fill(latest_count_.begin(), latest_count_.end(), 0);
  std::fill(lateness_sum_ns_.begin(), lateness_sum_ns_.end(), 0.0);
  window_waits_.clear();
  window_fill_ = 0;
}

int64_t Detector::budgetNs(CollectiveOp op, bool* learned) const {
  const auto i = static_cast<size_t>(op);
  if (options_.op_budget_s[i] > 0) {
    if (learned != nullptr) *learned = false;
    return static_cast<int64_t>(options_.op_budget_s[i] * 1e9);
  }
  const int64_t floor_ns = static_cast<int64_t>(options_.hang_floor_s * 1e9);
  if (completed_by_op_[i] < options_.warmup_collectives) {
    if (learned != nullptr) *learned = false;
    return std::max(floor_ns, static_cast<int64_t>(options_.warmup_budget_s * 1e9));
  }
  std::vector<int64_t> w(recent_waits_[i].begin(), recent_waits_[i].end());
  size_t k = std::min(w.size() - 1, static_cast<size_t>(std::ceil(0.99 * static_cast<double>(w.size()))) - 1);
  std::nth_element(w.begin(), w.begin() + k, w.end());
  if (learned != nullptr) *learned = true;
  return std::max(floor_ns, static_cast<int64_t>(options_.hang_multiplier * static_cast<double>(w[k])));
}

std::vector<Verdict> Detector::evaluate(int64_t now_ns) {
  std::vector<Verdict> out;
  // Crashed ranks (connection gone) first, in the order they went: when one rank dies its peers
  // often die of it moments later, and the first to go is the culprit.
  std::vector<int> newly_dead;
  for (int r = 0; r < world_; ++r) {
    if (dead_[r] && !dead_reported_[r]) newly_dead.push_back(r);
  }
  std::stable_sort(newly_dead.begin(), newly_dead.end(), [&](int a, int b) { return last_seen_ns_[a] < last_seen_ns_[b]; });
  for (int r : newly_dead) {
    dead_reported_[r] = true;
    bool first = !any_dead_reported_;
    any_dead_reported_ = true;
    out.push_back(make(VerdictKind::kDeadRank, {r},
                       "rank " + std::to_string(r) + "'s telemetry connection closed" +
                           (first ? " (the first rank to go)" : " (after another rank went: likely a consequence)") +
                           whereIs(r)));
  }
  // Silent ranks.
  const int64_t base_silence = static_cast<int64_t>(options_.heartbeat_timeout_s * 1e9);
  for (int r = 0; r < world_; ++r) {
    if (dead_[r] || finished_[r] || silent_reported_[r] || (last_seen_ns_[r] < 0 && !expected_only_[r])) continue;
    // Telemetry from a host with a slow link arrives late, not never.
    const int64_t silence =
        onSlowHost(r) ? static_cast<int64_t>(static_cast<double>(base_silence) * options_.slow_link_multiplier)
                      : base_silence;
    if (now_ns - last_seen_ns_[r] > silence) {
      silent_reported_[r] = true;
      out.push_back(make(VerdictKind::kSilentRank, {r},
                         expected_only_[r]
                             ? "no telemetry from rank " + std::to_string(r) +
                                   " since this coordinator took over the job"
                             : "no telemetry from rank " + std::to_string(r) + " for " +
                                   fmtS(now_ns - last_seen_ns_[r]) + " (timeout " + fmtS(silence) + ")" +
                                   whereIs(r)));
    }
  }
  // Own-watchdog reports and straggler findings, as they came.
  for (auto& v : queued_) out.push_back(std::move(v));
  queued_.clear();
  // Hung collectives: the oldest open one over its budget.
  for (auto& [seq, p] : pending_) {
    if (p.reported) continue;
    bool learned = false;
    int64_t budget = budgetNs(p.op, &learned);
    int64_t open_for = now_ns - p.first_enter_ns;
    if (open_for <= budget) continue;
    std::vector<int> missing, unfinished;
    for (int r = 0; r < world_; ++r) {
      if (!p.entered[r]) missing.push_back(r);
      else if (p.wait_ns[r] < 0) unfinished.push_back(r);
    }
    // A slow link explains a collective that every rank entered (one is left waiting for the
    // link's packets), or one that only ranks on slow hosts have not entered (their news is
    // late). A rank on a healthy host that never entered is named as always.
    bool link_explains = !slow_hosts_.empty();
    for (int r : missing) link_explains = link_explains && onSlowHost(r);
    std::vector<int> slow_ranks;
    std::string slow_list;
    if (link_explains) {
      for (int r = 0; r < world_; ++r) {
        if (onSlowHost(r)) slow_ranks.push_back(r);
      }
      for (const auto& h : slow_hosts_) slow_list += (slow_list.empty() ? "" : ",") + h;
      // A slow link holds collectives everywhere: say so once, name a hang only much later.
      const int64_t extended = static_cast<int64_t>(static_cast<double>(budget) * options_.slow_link_multiplier);
      if (!p.slow_reported) {
        p.slow_reported = true;
        out.push_back(make(VerdictKind::kStraggler, slow_ranks,
                           std::string(collectiveOpName(p.op)) + " seq " + std::to_string(seq) + " open for " +
                               fmtS(open_for) + ", over its budget " + fmtS(budget) + ", while host(s) " + slow_list +
                               " report a slow link: slow, not hung (named hung only if still open after " +
                               fmtS(extended) + ")",
                           seq, collectiveOpName(p.op)));
      }
      budget = extended;
      if (open_for <= budget) break;  // later collectives are behind this one
    }
    const int64_t confirm_ns = static_cast<int64_t>(options_.network_grace_s * 1e9);
    if (missing.empty() && open_for <= budget + confirm_ns) break;  // every rank entered: the network may recover
    p.reported = true;
    std::string what = std::string(collectiveOpName(p.op)) + " seq " + std::to_string(seq) + " (" +
                       std::to_string(p.bytes) + " bytes) open for " + fmtS(open_for) + ", budget " + fmtS(budget) +
                       (learned ? " (learned)" : " (warm-up)");
    if (!slow_ranks.empty()) {
      // Held this long by a link its own host calls slow: that host is the fault, whichever
      // rank was left waiting (usually one on a healthy host, for the packets it lost).
      out.push_back(make(VerdictKind::kHungRank, slow_ranks,
                         what + " (" + fmtMultiplier(options_.slow_link_multiplier) +
                             " x the usual, for the slow link of host(s) " + slow_list +
                             "): too slow for the job to go on (waiting: rank(s) " +
                             listRanks(missing.empty() ? unfinished : missing) + ")",
                         seq, collectiveOpName(p.op)));
      break;
    }
    if (!missing.empty()) {
      out.push_back(make(VerdictKind::kHungRank, missing,
                         what + ": rank(s) " + listRanks(missing) + " never entered it; " +
                             std::to_string(p.entered_count) + " of " + std::to_string(world_) + " did" +
                             whereIs(missing.front()),
                         seq, collectiveOpName(p.op)));
    } else if (p.exited_count > 0) {
      // The others got through: the collective works, these ranks are stuck inside it.
      out.push_back(make(VerdictKind::kHungRank, unfinished,
                         what + ": every rank entered it and " + std::to_string(p.exited_count) +
                             " completed it; rank(s) " + listRanks(unfinished) + " did not, " + fmtS(confirm_ns) +
                             " past the budget" + whereIs(unfinished.front()),
                         seq, collectiveOpName(p.op)));
    } else {
      out.push_back(make(VerdictKind::kCommunicationFault, unfinished,
                         what + ": every rank entered it, rank(s) " + listRanks(unfinished) +
                             " did not complete it within the budget and the " + fmtS(confirm_ns) +
                             " more given to the network to recover: the fault is in communication between them",
                         seq, collectiveOpName(p.op)));
    }
    break;  // later collectives are stuck behind this one
  }
  // Ranks that were asked to stop are leaving on purpose: what their departure causes is not a
  // fault of their hosts.
  for (Verdict& v : out) {
    if (v.kind == VerdictKind::kStraggler || v.kind == VerdictKind::kFailedRank || v.ranks.empty()) continue;
    bool all_stopping = true;
    int64_t since = now_ns;
    for (int r : v.ranks) {
      if (r < 0 || r >= world_ || stopping_since_ns_[r] < 0) {
        all_stopping = false;
        break;
      }
      since = std::min(since, stopping_since_ns_[r]);
    }
    if (!all_stopping) continue;
    v.evidence = "rank(s) " + listRanks(v.ranks) + " were asked to stop (SIGTERM/SIGINT) " + fmtS(now_ns - since) +
                 " ago and are leaving on purpose (" + verdictKindName(v.kind) + ": " + v.evidence + ")";
    v.kind = VerdictKind::kStoppedRank;
  }
  return out;
}

}  // namespace trainsup
