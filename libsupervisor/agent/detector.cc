#include "trainsup/detector.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <set>
#include <tuple>

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
    case VerdictKind::kDesync: return "desync";
  }
  return "?";
}

Detector::Detector(std::vector<RankInfo> ranks, DetectorOptions options)
    : ranks_(std::move(ranks)),
      options_(options),
      world_(static_cast<int>(ranks_.size())),
      last_seen_ns_(world_, -1),
      progress_(world_),
      transit_(world_),
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
                       const std::string& op, uint64_t group) const {
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
  if (group != 0) v.group = groupName(group);
  v.evidence = std::move(evidence);
  return v;
}

std::string Detector::groupName(uint64_t group) const {
  if (group == 0) return "world";
  auto it = groups_.find(group);
  if (it != groups_.end() && !it->second.desc.empty()) return it->second.desc;
  char buf[32];
  std::snprintf(buf, sizeof(buf), "group %016llx", static_cast<unsigned long long>(group));
  return buf;
}

std::string Detector::describe(const OpKey& key, const Pending& p) const {
  std::string s = std::string(collectiveOpName(p.op)) + " #" + std::to_string(key.seq);
  if (key.src >= 0) s += " (rank " + std::to_string(key.src) + " -> " + std::to_string(key.dst) + ")";
  return s + " of group '" + groupName(key.group) + "'";
}

void Detector::onGroup(int rank, uint64_t group, int group_rank, int group_size, const std::string& desc) {
  if (rank < 0 || rank >= world_ || group == 0 || group_size <= 0 || group_size > world_ || group_rank < 0 ||
      group_rank >= group_size) {
    ++counters_.bad_claims;
    return;
  }
  Group& g = groups_[group];
  if (g.size == 0) {
    g.size = group_size;
    g.desc = desc;
    g.members.assign(group_size, -1);
  }
  const int holder = g.members[group_rank];
  auto known = g.group_rank_of.find(rank);
  if (g.size != group_size || (holder >= 0 && holder != rank) ||
      (known != g.group_rank_of.end() && known->second != group_rank)) {
    ++counters_.bad_claims;  // contradicts the claims already made: keep those
    return;
  }
  g.members[group_rank] = rank;
  g.group_rank_of[rank] = group_rank;
  if (g.desc.empty()) g.desc = desc;
}

Detector::Group* Detector::findGroup(uint64_t group) {
  auto it = groups_.find(group);
  return it == groups_.end() ? nullptr : &it->second;
}

bool Detector::locate(int rank, uint64_t group, uint64_t seq, int peer, CollectiveOp op, OpKey* key, int* slot,
                      Group** g) {
  key->group = group;
  key->seq = seq;
  *g = nullptr;
  if (isPointToPoint(op)) {
    if (peer < 0 || peer >= world_ || peer == rank || (group != 0 && findGroup(group) == nullptr)) return false;
    key->src = op == CollectiveOp::kSend ? rank : peer;
    key->dst = op == CollectiveOp::kSend ? peer : rank;
    *slot = op == CollectiveOp::kSend ? 0 : 1;
  } else if (group == 0) {
    *slot = rank;
  } else {
    *g = findGroup(group);
    if (*g == nullptr) return false;
    auto it = (*g)->group_rank_of.find(rank);
    if (it == (*g)->group_rank_of.end()) return false;
    *slot = it->second;
  }
  return true;
}

Detector::Pending* Detector::pendingFor(int rank, uint64_t group, uint64_t seq, int peer, CollectiveOp op, int* slot) {
  OpKey key;
  Group* g = nullptr;
  if (!locate(rank, group, seq, peer, op, &key, slot, &g)) {
    ++counters_.unknown_group;
    return nullptr;
  }
  Pending& p = pending_[key];
  if (p.entered.empty()) {  // new: its members, once (not per record: a group may hold every rank)
    if (key.src >= 0) {
      p.members = {key.src, key.dst};
    } else if (g != nullptr) {
      p.members = g->members;
    } else {
      p.members.resize(world_);
      for (int r = 0; r < world_; ++r) p.members[r] = r;
    }
    const size_t n = p.members.size();
    p.entered.assign(n, false);
    p.wait_ns.assign(n, -1);
    p.ops.assign(n, CollectiveOp::kOther);
    p.bytes_of.assign(n, 0);
    p.slow_hosts = slow_hosts_;
  }
  return &p;
}

void Detector::onHeartbeat(int rank, int64_t now_ns) {
  if (rank < 0 || rank >= world_) return;
  last_seen_ns_[rank] = now_ns;
  expected_only_[rank] = false;
  silent_reported_[rank] = false;
}

void Detector::onHeartbeat(int rank, int64_t now_ns, int64_t sent_ns) {
  onHeartbeat(rank, now_ns);
  if (rank < 0 || rank >= world_ || sent_ns <= 0) return;
  Transit& t = transit_[rank];
  const int64_t transit = now_ns - sent_ns;  // the hosts' clock offset included
  if (t.base_at_ns < 0) {
    t.base_ns = transit;
  } else {
    // Creep up by 10 ppm of the time passed: two hosts' clocks drift apart by a few ppm, and a
    // base that could only fall would turn that drift into lag over days.
    t.base_ns = std::min(t.base_ns + (now_ns - t.base_at_ns) / 100000, transit);
  }
  t.base_at_ns = now_ns;
  t.excess_ns[t.count % 3] = transit - t.base_ns;
  ++t.count;
  if (t.count < 3) return;
  int64_t e[3] = {t.excess_ns[0], t.excess_ns[1], t.excess_ns[2]};
  std::sort(e, e + 3);
  const auto lag = static_cast<int64_t>(options_.transit_lag_s * 1e9);
  if (e[1] < lag) return;
  // Compare with the other hosts' ranks heard in the last second: if they are late as well,
  // the delay is on this side (the coordinator's host busy), and marks nobody.
  std::vector<int64_t> others;
  for (int r = 0; r < world_; ++r) {
    const Transit& o = transit_[r];
    if (r == rank || o.count == 0 || ranks_[r].host == ranks_[rank].host || dead_[r] || finished_[r]) continue;
    if (now_ns - last_seen_ns_[r] > 1000000000) continue;
    others.push_back(o.excess_ns[(o.count - 1) % 3]);
  }
  if (others.empty()) return;
  std::nth_element(others.begin(), others.begin() + others.size() / 2, others.end());
  if (others[others.size() / 2] < lag / 2) t.lagging_ns = now_ns;
}

bool Detector::laggedBeforeSilence(int rank) const {
  const int64_t at = transit_[rank].lagging_ns;
  const auto window = static_cast<int64_t>(3 * options_.heartbeat_timeout_s * 1e9);
  return at >= 0 && last_seen_ns_[rank] - at <= window;
}

bool Detector::silenceWatched(int r) const {
  return !(dead_[r] || finished_[r] || silent_reported_[r] || (last_seen_ns_[r] < 0 && !expected_only_[r]));
}

int64_t Detector::silenceNs(int r, bool* lagged) const {
  const int64_t base = static_cast<int64_t>(options_.heartbeat_timeout_s * 1e9);
  // Telemetry from a host with a slow link arrives late, not never; so does that of a rank
  // whose heartbeats lagged in transit shortly before it went quiet.
  const bool slow = onSlowHost(r);
  const bool lag = !slow && !expected_only_[r] && laggedBeforeSilence(r);
  if (lagged != nullptr) *lagged = lag;
  return slow || lag ? static_cast<int64_t>(static_cast<double>(base) * options_.slow_link_multiplier) : base;
}

int64_t Detector::nextDeadlineNs(int64_t after_ns) const {
  int64_t next = std::numeric_limits<int64_t>::max();
  auto consider = [&](int64_t at) {
    if (at > after_ns) next = std::min(next, at);  // one already past waits on more than its timeout
  };
  for (int r = 0; r < world_; ++r) {
    if (silenceWatched(r)) consider(last_seen_ns_[r] + silenceNs(r, nullptr) + 1);  // evaluate: '>'
  }
  std::array<int64_t, kCollectiveOpCount> budget;
  budget.fill(-1);
  for (const auto& [key, p] : pending_) {
    if (p.reported || p.entered_count == 0) continue;
    auto& b = budget[static_cast<size_t>(p.op)];
    if (b < 0) b = budgetNs(p.op);
    consider(p.first_enter_ns + b + 1);
  }
  return next;
}

void Detector::onDisconnect(int rank, int64_t now_ns) {
  if (rank < 0 || rank >= world_ || finished_[rank]) return;
  dead_[rank] = true;
  last_seen_ns_[rank] = now_ns;
}

void Detector::onProgress(int rank, int64_t step, const std::string& section, int64_t in_section_ns,
                          int64_t now_ns) {
  if (rank < 0 || rank >= world_ || section.empty()) return;
  Progress& p = progress_[rank];
  p.step = step;
  p.section = section;
  p.in_section_ns = in_section_ns;
  p.at_ns = now_ns;
  if (p.rate_step < 0 || step < p.rate_step) {  // first report, or a restart of the count
    p.rate_step = step;
    p.rate_at_ns = now_ns;
  } else if (step > p.rate_step && now_ns - p.rate_at_ns >= 1000000000) {
    p.step_s = static_cast<double>(now_ns - p.rate_at_ns) / 1e9 / static_cast<double>(step - p.rate_step);
    p.rate_step = step;
    p.rate_at_ns = now_ns;
  }
}

DetectorSnapshot Detector::snapshot(int64_t now_ns, size_t max_open) const {
  DetectorSnapshot out;
  out.ranks.reserve(world_);
  for (int r = 0; r < world_; ++r) {
    DetectorSnapshot::Rank x;
    x.rank = r;
    x.host = ranks_[r].host;
    const Progress& p = progress_[r];
    x.step = p.step;
    x.section = p.section;
    x.step_s = p.step_s;
    if (last_seen_ns_[r] >= 0 && !expected_only_[r]) x.silent_s = static_cast<double>(now_ns - last_seen_ns_[r]) / 1e9;
    x.dead = dead_[r];
    x.finished = finished_[r];
    out.ranks.push_back(std::move(x));
  }
  out.open = pending_.size();
  std::vector<std::pair<int64_t, const std::pair<const OpKey, Pending>*>> by_age;
  by_age.reserve(pending_.size());
  for (const auto& kv : pending_) by_age.emplace_back(kv.second.first_enter_ns, &kv);
  const size_t n = std::min(max_open, by_age.size());
  std::partial_sort(by_age.begin(), by_age.begin() + static_cast<std::ptrdiff_t>(n), by_age.end(),
                    [](const auto& a, const auto& b) { return a.first < b.first; });
  for (size_t i = 0; i < n; ++i) {
    const OpKey& key = by_age[i].second->first;
    const Pending& p = by_age[i].second->second;
    DetectorSnapshot::Open o;
    o.what = describe(key, p);
    o.bytes = p.bytes;
    o.age_s = static_cast<double>(now_ns - p.first_enter_ns) / 1e9;
    o.members = static_cast<int>(p.members.size());
    o.entered = p.entered_count;
    for (size_t slot = 0; slot < p.members.size() && o.missing.size() < 32; ++slot) {
      if (!p.entered[slot] && p.members[slot] >= 0) o.missing.push_back(p.members[slot]);
    }
    out.oldest.push_back(std::move(o));
  }
  return out;
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

void Detector::setSlowHosts(std::vector<std::string> hosts) {
  slow_hosts_ = std::move(hosts);
  if (slow_hosts_.empty()) return;
  for (auto& [key, p] : pending_) {  // the ops open now are held by these links too
    for (const auto& h : slow_hosts_) {
      if (std::find(p.slow_hosts.begin(), p.slow_hosts.end(), h) == p.slow_hosts.end()) p.slow_hosts.push_back(h);
    }
  }
}

bool Detector::onHostIn(int rank, const std::vector<std::string>& hosts) const {
  return rank >= 0 && rank < world_ && std::find(hosts.begin(), hosts.end(), ranks_[rank].host) != hosts.end();
}

bool Detector::onSlowHost(int rank) const { return onHostIn(rank, slow_hosts_); }

void Detector::onRankStalled(int rank, const std::string& section, int64_t step, int64_t now_ns) {
  if (rank < 0 || rank >= world_) return;
  onHeartbeat(rank, now_ns);
  // A rank over its step budget while it waits in a collective: the one it waits for is the
  // fault, not the waiting rank (issue 20: a healthy rank waiting in dp outlasted its budget and
  // its host was quarantined).
  for (auto& [key, p] : waitingIn(rank)) {
    std::vector<int> missing;
    for (size_t i = 0; i < p->members.size(); ++i) {
      if (!p->entered[i]) missing.push_back(p->members[i]);
    }
    if (missing.empty()) return;  // inside a collective every member entered: judged by its budget
    if (p->reported) return;      // judged already
    OpKey k = key;
    Chain c = resolve(k, *p, missing);
    if (c.inside != nullptr && c.cycle.empty()) return;  // ends inside a collective all entered: judged by its budget
    for (Pending* link : c.links) link->reported = true;
    if (c.judged) return;  // the chain ends in a fault named already
    const std::string why = "rank " + std::to_string(rank) + " reports section '" + section + "' (step " +
                            std::to_string(step) + ") over its budget while it waits in " + describe(k, *p);
    if (!c.cycle.empty()) {
      queued_.push_back(make(VerdictKind::kDesync, c.cycle,
                             why + ": ranks " + listRanks(c.cycle) +
                                 " wait for each other in different collectives (issued in different orders): " + c.path,
                             k.seq, collectiveOpName(p->op), k.group));
      return;
    }
    std::vector<int> named;
    for (int r : c.roots) {
      if (r >= 0) named.push_back(r);
    }
    std::string evidence = why + ": " +
                           (c.at == p ? "rank(s) " + listRanks(named) + " never entered it" : c.path) + " (" +
                           describe(c.key, *c.at) + ": " + std::to_string(c.at->entered_count) + " of " +
                           std::to_string(c.at->members.size()) + " entered)";
    if (!named.empty()) evidence += whereIs(named.front());
    queued_.push_back(make(VerdictKind::kHungRank, named, evidence, c.key.seq, collectiveOpName(c.at->op), c.key.group));
    return;
  }
  Verdict v = make(VerdictKind::kStalledRank, {rank},
                   "rank " + std::to_string(rank) + " reports section '" + section + "' (step " +
                       std::to_string(step) + ") over its budget, outside any collective");
  v.section = section;
  v.step = step;
  queued_.push_back(std::move(v));
}

namespace {

// Ops whose size every participant gives the same.
bool sizesMustAgree(CollectiveOp op) {
  switch (op) {
    case CollectiveOp::kAllreduce: case CollectiveOp::kBroadcast: case CollectiveOp::kReduce:
    case CollectiveOp::kAllgather: case CollectiveOp::kReduceScatter: case CollectiveOp::kBarrier:
    case CollectiveOp::kSend: case CollectiveOp::kRecv:
      return true;
    default:
      return false;
  }
}

std::string opText(CollectiveOp op, uint64_t bytes) {
  return std::string(collectiveOpName(op)) + " " + std::to_string(bytes) + " B";
}

}  // namespace

void Detector::onEnter(int rank, uint64_t group, uint64_t seq, int peer, CollectiveOp op, uint64_t bytes,
                       int64_t now_ns) {
  if (rank < 0 || rank >= world_) return;
  onHeartbeat(rank, now_ns);
  int slot = 0;
  Pending* p = pendingFor(rank, group, seq, peer, op, &slot);
  if (p == nullptr || slot < 0 || static_cast<size_t>(slot) >= p->entered.size()) return;
  if (p->entered_count == 0) {
    p->op = op;
    p->bytes = bytes;
    p->first_enter_ns = now_ns;
  }
  if (!p->entered[slot]) {
    p->entered[slot] = true;
    ++p->entered_count;
    p->ops[slot] = op;
    p->bytes_of[slot] = bytes;
    const bool p2p = isPointToPoint(op) && isPointToPoint(p->op);
    if ((op != p->op && !p2p) || (sizesMustAgree(op) && sizesMustAgree(p->op) && bytes != p->bytes)) {
      p->mismatch = true;
    }
  }
}

void Detector::onExit(int rank, uint64_t group, uint64_t seq, int peer, CollectiveOp op, int64_t wait_ns,
                      int64_t now_ns) {
  if (rank < 0 || rank >= world_) return;
  onHeartbeat(rank, now_ns);
  OpKey key;
  int slot = 0;
  Group* g = nullptr;
  if (!locate(rank, group, seq, peer, op, &key, &slot, &g)) return;
  auto it = pending_.find(key);
  if (it == pending_.end()) return;
  Pending& p = it->second;
  if (slot < 0 || static_cast<size_t>(slot) >= p.wait_ns.size()) return;
  if (p.wait_ns[slot] < 0) {
    p.wait_ns[slot] = std::max<int64_t>(0, wait_ns);
    ++p.exited_count;
  }
  if (p.exited_count == static_cast<int>(p.members.size())) {
    complete(p);
    pending_.erase(it);
  }
}

// A collective every member finished: learn its duration, and score lateness for stragglers.
void Detector::complete(Pending& p) {
  const auto op = static_cast<size_t>(p.op);
  int64_t max_wait = *std::max_element(p.wait_ns.begin(), p.wait_ns.end());
  auto& recent = recent_waits_[op];
  recent.push_back(max_wait);
  if (recent.size() > kRecentWaits) recent.pop_front();
  ++completed_by_op_[op];
  // Straggler windows: over collectives of all ranks (a subgroup's lateness says nothing of
  // the ranks outside it).
  if (static_cast<int>(p.members.size()) != world_ || isPointToPoint(p.op)) return;

  int latest = 0;
  for (int i = 0; i < world_; ++i) {
    const int r = p.members[i];
    if (r < 0) return;
    int64_t lateness = max_wait - p.wait_ns[i];
    lateness_sum_ns_[r] += static_cast<double>(lateness);
    if (p.wait_ns[i] < p.wait_ns[latest]) latest = i;
  }
  ++latest_count_[p.members[latest]];
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

std::vector<std::pair<Detector::OpKey, Detector::Pending*>> Detector::waitingIn(int rank) {
  std::vector<std::pair<OpKey, Pending*>> in;
  for (auto& [key, p] : pending_) {
    for (size_t i = 0; i < p.members.size(); ++i) {
      if (p.members[i] == rank && p.entered[i] && p.wait_ns[i] < 0) in.emplace_back(key, &p);
    }
  }
  std::stable_sort(in.begin(), in.end(),
                   [](const auto& x, const auto& y) { return x.second->first_enter_ns < y.second->first_enter_ns; });
  return in;
}

// Breadth-first from the members that never entered `key`: a member that waits in another open
// op is followed to the members that op lacks, until ranks that wait in nothing (the roots).
Detector::Chain Detector::resolve(const OpKey& key, Pending& p, const std::vector<int>& missing) {
  Chain c;
  c.key = key;
  c.at = &p;
  c.links.push_back(&p);
  std::vector<int> frontier = missing;
  std::vector<int> visited;  // ranks whose waits were followed
  std::map<int, int> came_from;  // rank -> the rank that waits for it
  for (int depth = 0; depth < world_ && !frontier.empty(); ++depth) {
    std::vector<int> next;
    for (int r : frontier) {
      if (r < 0) {  // a member that has not claimed its place yet: it cannot be followed
        c.roots.push_back(r);
        continue;
      }
      if (std::find(visited.begin(), visited.end(), r) != visited.end()) continue;
      visited.push_back(r);
      auto waits = waitingIn(r);
      // The oldest open op the rank waits in that lacks members; an op every member entered
      // holds the rank for reasons inside it (judged on its own).
      const std::pair<OpKey, Pending*>* follow = nullptr;
      for (const auto& w : waits) {
        if (w.second->entered_count < static_cast<int>(w.second->members.size())) {
          follow = &w;
          break;
        }
      }
      if (follow == nullptr) {
        c.roots.push_back(r);
        // Inside a collective every member entered (held by the network, a slow link, or stuck
        // inside): that collective's own judgement (network grace, slow link) decides.
        if (!waits.empty() && c.inside == nullptr) c.inside = waits.front().second;
        continue;
      }
      const Pending& q = *follow->second;
      std::vector<int> lacks;
      for (size_t i = 0; i < q.members.size(); ++i) {
        if (!q.entered[i]) lacks.push_back(q.members[i]);
      }
      // Closing on a rank already followed: through a point-to-point op (an irecv posted early
      // does not block its rank) the chain ends here; through collectives, the ranks wait for
      // each other.
      bool closes = false;
      for (int m : lacks) closes = closes || std::find(visited.begin(), visited.end(), m) != visited.end();
      if (closes) {
        if (isPointToPoint(q.op)) {
          c.roots.push_back(r);
          continue;
        }
        c.cycle = visited;
        std::sort(c.cycle.begin(), c.cycle.end());
        c.judged = c.judged || (q.reported && follow->second != &p);
        c.path += (c.path.empty() ? "" : "; ") + std::string("rank ") + std::to_string(r) + " waits in " +
                  describe(follow->first, q) + " for rank(s) " + listRanks(lacks);
        return c;
      }
      c.path += (c.path.empty() ? "" : "; ") + std::string("rank ") + std::to_string(r) + " waits in " +
                describe(follow->first, q) + " for rank(s) " + listRanks(lacks);
      c.judged = c.judged || (q.reported && follow->second != &p);
      c.links.push_back(follow->second);
      c.key = follow->first;
      c.at = follow->second;
      for (int m : lacks) next.push_back(m);
    }
    frontier = std::move(next);
  }
  std::sort(c.roots.begin(), c.roots.end());
  c.roots.erase(std::unique(c.roots.begin(), c.roots.end()), c.roots.end());
  if (c.at != &p) {
    std::string roots;
    for (int r : c.roots) roots += (roots.empty() ? "" : ",") + std::to_string(r);
    c.path = "rank(s) " + listRanks(missing) + " never entered it; " + c.path + "; rank(s) " + roots +
             " wait in no collective: the root";
  }
  return c;
}

// Members that entered different ops (or sizes) at the same seq: once all entered, or once it
// has been open for the hang floor.
void Detector::desyncVerdicts(int64_t now_ns, std::vector<Verdict>& out) {
  const int64_t floor_ns = static_cast<int64_t>(options_.hang_floor_s * 1e9);
  for (auto& [key, p] : pending_) {
    if (!p.mismatch || p.reported) continue;
    if (p.entered_count < static_cast<int>(p.members.size()) && now_ns - p.first_enter_ns <= floor_ns) continue;
    p.reported = true;
    // Group the entrants by what they entered; the largest group is the program's intent.
    std::vector<std::pair<std::string, std::vector<int>>> kinds;
    for (size_t i = 0; i < p.members.size(); ++i) {
      if (!p.entered[i]) continue;
      const bool sized = sizesMustAgree(p.ops[i]);
      std::string what = sized ? opText(p.ops[i], p.bytes_of[i]) : collectiveOpName(p.ops[i]);
      auto it = std::find_if(kinds.begin(), kinds.end(), [&](const auto& k) { return k.first == what; });
      if (it == kinds.end()) kinds.push_back({what, {}}), it = kinds.end() - 1;
      it->second.push_back(p.members[i]);
    }
    std::stable_sort(kinds.begin(), kinds.end(),
                     [](const auto& x, const auto& y) { return x.second.size() > y.second.size(); });
    const bool majority = kinds.size() > 1 && kinds[0].second.size() > kinds[1].second.size();
    std::vector<int> culprits;
    std::string entered;
    for (size_t k = 0; k < kinds.size(); ++k) {
      entered += (entered.empty() ? "" : "; ") + std::string("rank(s) ") + listRanks(kinds[k].second) + " entered " +
                 kinds[k].first;
      if (k > 0 || !majority) culprits.insert(culprits.end(), kinds[k].second.begin(), kinds[k].second.end());
    }
    std::sort(culprits.begin(), culprits.end());
    std::string where = "#" + std::to_string(key.seq) + " of group '" + groupName(key.group) + "'";
    if (key.src >= 0) where = "#" + std::to_string(key.seq) + " of the channel rank " + std::to_string(key.src) +
                              " -> " + std::to_string(key.dst) + " of group '" + groupName(key.group) + "'";
    Verdict v = make(VerdictKind::kDesync, culprits,
                     "collective " + where + ": " + entered +
                         (majority ? "" : " (no majority: every differing rank is named)") +
                         ": the program issued different collectives on different ranks",
                     key.seq, kinds[0].first, key.group);
    v.other_op = kinds.size() > 1 ? kinds[1].first : "";
    out.push_back(std::move(v));
  }
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
    out.back().onset_s = static_cast<double>(now_ns - last_seen_ns_[r]) / 1e9;  // since it closed
  }
  // Silent ranks.
  for (int r = 0; r < world_; ++r) {
    if (!silenceWatched(r)) continue;
    bool lagged = false;
    const int64_t silence = silenceNs(r, &lagged);
    if (now_ns - last_seen_ns_[r] > silence) {
      silent_reported_[r] = true;
      out.push_back(make(VerdictKind::kSilentRank, {r},
                         expected_only_[r]
                             ? "no telemetry from rank " + std::to_string(r) +
                                   " since this coordinator took over the job"
                             : "no telemetry from rank " + std::to_string(r) + " for " +
                                   fmtS(now_ns - last_seen_ns_[r]) + " (timeout " + fmtS(silence) +
                                   (lagged ? ": its heartbeats were delayed in transit before it went quiet" : "") + ")" +
                                   whereIs(r)));
      if (!expected_only_[r]) out.back().onset_s = static_cast<double>(now_ns - last_seen_ns_[r]) / 1e9;
    }
  }
  // Own-watchdog reports and straggler findings, as they came.
  for (auto& v : queued_) out.push_back(std::move(v));
  queued_.clear();
  desyncVerdicts(now_ns, out);
  // Hung collectives: the oldest open one over its budget, of any group.
  std::vector<std::pair<OpKey, Pending*>> open;
  open.reserve(pending_.size());
  for (auto& [key, p] : pending_) {
    if (p.reported || p.entered_count == 0) continue;
    if (key.src < 0 && key.group != 0) {  // members whose claims came after the op was opened
      if (Group* g = findGroup(key.group)) {
        for (size_t i = 0; i < p.members.size() && i < g->members.size(); ++i) {
          if (p.members[i] < 0) p.members[i] = g->members[i];
        }
      }
    }
    open.emplace_back(key, &p);
  }
  std::stable_sort(open.begin(), open.end(),
                   [](const auto& x, const auto& y) { return x.second->first_enter_ns < y.second->first_enter_ns; });
  // A stream (a group's collectives, or one point-to-point channel) whose op is held over its
  // budget for the network or a slow link: its later ops are stuck behind that one, not hung.
  std::set<std::tuple<uint64_t, int, int>> held;
  for (auto& [key, pp] : open) {
    Pending& p = *pp;
    if (p.reported) continue;  // reported as a link of an earlier chain in this pass
    const auto stream = std::make_tuple(key.group, key.src, key.dst);
    if (held.count(stream) != 0) continue;
    bool learned = false;
    int64_t budget = budgetNs(p.op, &learned);
    int64_t open_for = now_ns - p.first_enter_ns;
    if (open_for <= budget) continue;
    std::vector<int> missing, unfinished;
    for (size_t i = 0; i < p.members.size(); ++i) {
      if (!p.entered[i]) missing.push_back(p.members[i]);
      else if (p.wait_ns[i] < 0) unfinished.push_back(p.members[i]);
    }
    // A slow link explains a collective that every rank entered (one is left waiting for the
    // link's packets), or one that only ranks on slow hosts have not entered (their news is
    // late). A rank on a healthy host that never entered is named as always.
    bool link_explains = !p.slow_hosts.empty();
    for (int r : missing) link_explains = link_explains && onHostIn(r, p.slow_hosts);
    std::vector<int> slow_ranks;
    std::string slow_list;
    if (link_explains) {
      for (int r = 0; r < world_; ++r) {
        if (onHostIn(r, p.slow_hosts)) slow_ranks.push_back(r);
      }
      for (const auto& h : p.slow_hosts) slow_list += (slow_list.empty() ? "" : ",") + h;
      // A slow link holds collectives everywhere: say so once, name a hang only much later.
      const int64_t extended = static_cast<int64_t>(static_cast<double>(budget) * options_.slow_link_multiplier);
      if (!p.slow_reported) {
        p.slow_reported = true;
        out.push_back(make(VerdictKind::kStraggler, slow_ranks,
                           describe(key, p) + " open for " + fmtS(open_for) + ", over its budget " + fmtS(budget) +
                               ", while host(s) " + slow_list + " report a slow link: slow, not hung (named hung only if still open after " +
                               fmtS(extended) + ")",
                           key.seq, collectiveOpName(p.op), key.group));
      }
      budget = extended;
      if (open_for <= budget) {
        held.insert(stream);
        continue;
      }
    }
    const int64_t confirm_ns = static_cast<int64_t>(options_.network_grace_s * 1e9);
    if (missing.empty() && open_for <= budget + confirm_ns) {  // every rank entered: the network may recover
      held.insert(stream);
      continue;
    }
    Chain c;  // where the members that never entered it are (followed once per op and pass)
    if (!missing.empty() && slow_ranks.empty()) {
      c = resolve(key, p, missing);
      if (c.inside != nullptr && c.cycle.empty()) {
        // The ranks it waits for are inside a collective every member entered: that one is
        // judged on its own (with the network's grace), this one is only stuck behind it.
        held.insert(stream);
        continue;
      }
    }
    p.reported = true;
    std::string what = describe(key, p) + " (" + std::to_string(p.bytes) + " bytes) open for " + fmtS(open_for) +
                       ", budget " + fmtS(budget) + (learned ? " (learned)" : " (warm-up)");
    if (!slow_ranks.empty()) {
      // Held this long by a link its own host calls slow: that host is the fault, whichever
      // rank was left waiting (usually one on a healthy host, for the packets it lost).
      out.push_back(make(VerdictKind::kHungRank, slow_ranks,
                         what + " (" + fmtMultiplier(options_.slow_link_multiplier) +
                             " x the usual, for the slow link of host(s) " + slow_list +
                             "): too slow for the job to go on (waiting: rank(s) " +
                             listRanks(missing.empty() ? unfinished : missing) + ")",
                         key.seq, collectiveOpName(p.op), key.group));
      out.back().onset_s = static_cast<double>(open_for) / 1e9;
      break;
    }
    if (!missing.empty()) {  // slow_ranks is empty here: `c` is resolved
      for (Pending* link : c.links) link->reported = true;
      if (c.judged) continue;  // the chain ends in a fault named already
      if (!c.cycle.empty()) {
        Verdict v = make(VerdictKind::kDesync, c.cycle,
                         what + ": ranks " + listRanks(c.cycle) +
                             " wait for each other in different collectives (issued in different orders): " + c.path,
                         key.seq, collectiveOpName(p.op), key.group);
        out.push_back(std::move(v));
        break;
      }
      const Pending& at = *c.at;
      int entered = at.entered_count;
      std::string evidence =
          c.at == &p ? what + ": rank(s) " + listRanks(c.roots) + " never entered it; " + std::to_string(entered) +
                           " of " + std::to_string(at.members.size()) + " did"
                     : what + ": " + c.path + " (" + describe(c.key, at) + ": " + std::to_string(entered) + " of " +
                           std::to_string(at.members.size()) + " entered)";
      std::vector<int> named;
      for (int r : c.roots) {
        if (r >= 0) named.push_back(r);
      }
      if (named.size() < c.roots.size()) evidence += "; member(s) of the group not yet known by rank";
      if (!named.empty()) evidence += whereIs(named.front());
      out.push_back(make(VerdictKind::kHungRank, named, evidence, c.key.seq, collectiveOpName(at.op), c.key.group));
      out.back().onset_s = static_cast<double>(open_for) / 1e9;
    } else if (p.exited_count > 0) {
      // The others got through: the collective works, these ranks are stuck inside it.
      out.push_back(make(VerdictKind::kHungRank, unfinished,
                         what + ": every rank entered it and " + std::to_string(p.exited_count) +
                             " completed it; rank(s) " + listRanks(unfinished) + " did not, " + fmtS(confirm_ns) +
                             " past the budget" + whereIs(unfinished.front()),
                         key.seq, collectiveOpName(p.op), key.group));
      out.back().onset_s = static_cast<double>(open_for) / 1e9;
    } else {
      out.push_back(make(VerdictKind::kCommunicationFault, unfinished,
                         what + ": every rank entered it, rank(s) " + listRanks(unfinished) +
                             " did not complete it within the budget and the " + fmtS(confirm_ns) +
                             " more given to the network to recover: the fault is in communication between them",
                         key.seq, collectiveOpName(p.op), key.group));
      out.back().onset_s = static_cast<double>(open_for) / 1e9;
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
