// The detector judging per process group (issue 20): a 2 x 2 DeviceMesh of 4 ranks on 4 hosts
// (tp groups {0,1} and {2,3}, dp groups {0,2} and {1,3}) and a pipeline's point-to-point
// channels. Time is a number, not a clock.
#include "trainsup/detector.h"

#include <gtest/gtest.h>

#include <map>
#include <random>

namespace trainsup {
namespace {

constexpr int64_t kMs = 1'000'000;
constexpr int64_t kS = 1'000'000'000;

std::vector<RankInfo> fourRanks() {
  std::vector<RankInfo> r;
  for (int i = 0; i < 4; ++i) r.push_back({i, 0, "host-" + std::string(1, static_cast<char>('a' + i)), ""});
  return r;
}

// Evaluates every 100 ms from `from` to `until`, every rank heart-beating, until a verdict comes.
std::vector<Verdict> untilVerdict(Detector& det, int64_t from, int64_t until) {
  std::vector<Verdict> seen;
  for (int64_t t = from; t <= until && seen.empty(); t += 100 * kMs) {
    for (int r = 0; r < 4; ++r) det.onHeartbeat(r, t);
    seen = det.evaluate(t);
  }
  return seen;
}

constexpr uint64_t kTp0 = 100, kTp1 = 101, kDp0 = 200, kDp1 = 201;

struct Mesh {
  Detector det;
  int64_t now = 0;
  std::map<uint64_t, uint64_t> seq;  // group -> collectives so far
  std::map<std::pair<int, int>, uint64_t> sends, recvs;
  explicit Mesh(DetectorOptions o = options()) : det(fourRanks(), o) {
    // Each rank claims its place in its tp and dp group, as TelemetryClients do on connecting.
    det.onGroup(0, kTp0, 0, 2, "mesh_tp");
    det.onGroup(1, kTp0, 1, 2, "mesh_tp");
    det.onGroup(2, kTp1, 0, 2, "mesh_tp");
    det.onGroup(3, kTp1, 1, 2, "mesh_tp");
    det.onGroup(0, kDp0, 0, 2, "mesh_dp");
    det.onGroup(2, kDp0, 1, 2, "mesh_dp");
    det.onGroup(1, kDp1, 0, 2, "mesh_dp");
    det.onGroup(3, kDp1, 1, 2, "mesh_dp");
  }
  static DetectorOptions options() {
    DetectorOptions o;
    o.warmup_collectives = 5;
    o.warmup_budget_s = 5;
    return o;
  }
  static uint64_t tpOf(int r) { return r < 2 ? kTp0 : kTp1; }
  static uint64_t dpOf(int r) { return r % 2 == 0 ? kDp0 : kDp1; }
  static std::vector<int> members(uint64_t g) {
    if (g == kTp0) return {0, 1};
    if (g == kTp1) return {2, 3};
    if (g == kDp0) return {0, 2};
    return {1, 3};
  }
  void beat(int64_t t) {
    for (int r = 0; r < 4; ++r) det.onHeartbeat(r, t);
  }
  // One collective of group g, every member entering at start + compute[r] and leaving when
  // the last has arrived.
  void collective(uint64_t g, CollectiveOp op, const std::map<int, int64_t>& compute, int64_t start) {
    const uint64_t s = ++seq[g];
    int64_t last = 0;
    for (auto [r, c] : compute) last = std::max(last, c);
    for (auto [r, c] : compute) det.onEnter(r, g, s, -1, op, 4096, start + c);
    for (auto [r, c] : compute) det.onExit(r, g, s, -1, op, last - c + 2 * kMs, start + last + 2 * kMs);
  }
  void p2p(int from, int to, int64_t start, int64_t wait) {
    const uint64_t s = ++sends[{from, to}];
    ++recvs[{from, to}];
    det.onEnter(to, kTp0, s, from, CollectiveOp::kRecv, 4096, start);
    det.onEnter(from, kTp0, s, to, CollectiveOp::kSend, 4096, start + wait);
    det.onExit(from, kTp0, s, to, CollectiveOp::kSend, 1 * kMs, start + wait + kMs);
    det.onExit(to, kTp0, s, from, CollectiveOp::kRecv, wait + kMs, start + wait + kMs);
  }
  // A healthy FSDP x TP step: tp all-reduces in both tp groups, then dp reduce-scatters.
  std::vector<Verdict> step(std::mt19937* rng = nullptr) {
    std::uniform_real_distribution<double> jitter(0.7, 1.3);
    auto c = [&](int64_t ns) { return rng ? static_cast<int64_t>(static_cast<double>(ns) * jitter(*rng)) : ns; };
    for (uint64_t g : {kTp0, kTp1}) {
      auto m = members(g);
      collective(g, CollectiveOp::kAllreduce, {{m[0], c(20 * kMs)}, {m[1], c(20 * kMs)}}, now);
    }
    now += 40 * kMs;
    for (uint64_t g : {kDp0, kDp1}) {
      auto m = members(g);
      collective(g, CollectiveOp::kReduceScatter, {{m[0], c(10 * kMs)}, {m[1], c(10 * kMs)}}, now);
    }
    now += 30 * kMs;
    beat(now);
    return det.evaluate(now);
  }
};

TEST(GroupDetectorTest, HealthyJitteryMeshAndPipelineGiveNoVerdict) {
  Mesh mesh;
  std::mt19937 rng(5);
  std::uniform_real_distribution<double> jitter(0.7, 1.3);
  for (int i = 0; i < 500; ++i) {
    auto v = mesh.step(&rng);
    // A pipeline channel between ranks 0 and 1: the receive is posted early and waits for the
    // sender's compute.
    mesh.p2p(0, 1, mesh.now, static_cast<int64_t>(30 * kMs * jitter(rng)));
    mesh.now += 40 * kMs;
    ASSERT_TRUE(v.empty()) << "step " << i << ": " << verdictKindName(v[0].kind) << " " << v[0].evidence;
  }
  EXPECT_EQ(mesh.det.counters().unknown_group, 0u);
  EXPECT_EQ(mesh.det.counters().bad_claims, 0u);
}

// Rank 3 is alive and heart-beating but never enters the tp all-reduce that rank 2 waits in:
// named with its group's mesh dimension, the op and the per-group number.
TEST(GroupDetectorTest, ARankThatNeverEntersATpCollectiveIsNamedWithTheGroup) {
  Mesh mesh;
  for (int i = 0; i < 20; ++i) ASSERT_TRUE(mesh.step().empty());
  const int64_t t0 = mesh.now;
  const uint64_t s = mesh.seq[kTp1] + 1;
  mesh.det.onEnter(2, kTp1, s, -1, CollectiveOp::kAllreduce, 4096, t0);
  mesh.det.onProgress(3, 21, "forward", 2 * kS, t0 + 2 * kS);
  std::vector<Verdict> seen;
  for (int64_t t = t0; t <= t0 + 10 * kS && seen.empty(); t += 100 * kMs) {
    mesh.beat(t);
    seen = mesh.det.evaluate(t);
    if (t - t0 < 5 * kS) ASSERT_TRUE(seen.empty()) << "before the budget: " << seen[0].evidence;
  }
  ASSERT_EQ(seen.size(), 1u);
  EXPECT_EQ(seen[0].kind, VerdictKind::kHungRank);
  EXPECT_EQ(seen[0].ranks, std::vector<int>{3});
  EXPECT_EQ(seen[0].hosts, std::vector<std::string>{"host-d"});
  EXPECT_EQ(seen[0].group, "mesh_tp");
  EXPECT_EQ(seen[0].op, "allreduce");
  EXPECT_EQ(seen[0].seq, s);
  EXPECT_EQ(seen[0].section, "forward");
}

// Rank 0 waits in a dp collective for rank 2; rank 2 waits in a tp collective for rank 3, which
// is in no collective. The chain resolves to its root, never to a rank that is only waiting,
// whichever collective is older.
TEST(GroupDetectorTest, AChainOfWaitsResolvesToItsRoot) {
  for (bool dp_first : {true, false}) {
    Mesh mesh;
    for (int i = 0; i < 20; ++i) ASSERT_TRUE(mesh.step().empty());
    const int64_t t0 = mesh.now;
    const uint64_t dp = mesh.seq[kDp0] + 1, tp = mesh.seq[kTp1] + 1;
    mesh.det.onEnter(0, kDp0, dp, -1, CollectiveOp::kReduceScatter, 4096, dp_first ? t0 : t0 + kS);
    mesh.det.onEnter(2, kTp1, tp, -1, CollectiveOp::kAllreduce, 4096, dp_first ? t0 + kS : t0);
    std::vector<Verdict> seen = untilVerdict(mesh.det, t0, t0 + 10 * kS);
    ASSERT_EQ(seen.size(), 1u);
    EXPECT_EQ(seen[0].kind, VerdictKind::kHungRank) << seen[0].evidence;
    EXPECT_EQ(seen[0].ranks, std::vector<int>{3}) << seen[0].evidence;
    EXPECT_EQ(seen[0].group, "mesh_tp") << seen[0].evidence;
    EXPECT_EQ(seen[0].seq, tp);
    EXPECT_EQ(seen[0].op, "allreduce");
    // Nothing more about the waiting ranks afterwards.
    for (int64_t t = t0 + 10 * kS; t <= t0 + 20 * kS; t += 500 * kMs) {
      mesh.beat(t);
      auto more = mesh.det.evaluate(t);
      ASSERT_TRUE(more.empty()) << more[0].evidence;
    }
  }
}

// Healthy rank 0 waits in a dp collective (for rank 2, which waits in tp for rank 3) until its
// own step budget fires: its stall report resolves the chain at once and names rank 3, never
// rank 0 (the trial of issue 20 quarantined rank 0's healthy host).
TEST(GroupDetectorTest, AWaitingRankOverItsStepBudgetNamesTheRootNotItself) {
  Mesh mesh;
  for (int i = 0; i < 20; ++i) ASSERT_TRUE(mesh.step().empty());
  const int64_t t0 = mesh.now;
  mesh.det.onEnter(0, kDp0, mesh.seq[kDp0] + 1, -1, CollectiveOp::kReduceScatter, 4096, t0);
  mesh.det.onEnter(2, kTp1, mesh.seq[kTp1] + 1, -1, CollectiveOp::kAllreduce, 4096, t0);
  mesh.beat(t0 + 2 * kS);
  ASSERT_TRUE(mesh.det.evaluate(t0 + 2 * kS).empty());
  mesh.det.onRankStalled(0, "backward", 21, t0 + 3 * kS);
  auto seen = mesh.det.evaluate(t0 + 3 * kS);
  ASSERT_EQ(seen.size(), 1u);
  EXPECT_EQ(seen[0].kind, VerdictKind::kHungRank) << seen[0].evidence;
  EXPECT_EQ(seen[0].ranks, std::vector<int>{3}) << seen[0].evidence;
  EXPECT_NE(seen[0].evidence.find("rank 0 reports section 'backward'"), std::string::npos) << seen[0].evidence;
  // A rank stalled outside any collective is still itself the culprit.
  Mesh other;
  other.det.onRankStalled(1, "forward", 3, 0);
  auto v = other.det.evaluate(0);
  ASSERT_EQ(v.size(), 1u);
  EXPECT_EQ(v[0].kind, VerdictKind::kStalledRank);
  EXPECT_EQ(v[0].ranks, std::vector<int>{1});
}

// A rank that issues collectives in the wrong order: at the same per-group number its peers
// entered an all-reduce and it a broadcast. Reported as a desync with both ops, as soon as every
// member entered (no need to wait for a budget), naming the minority.
TEST(GroupDetectorTest, DifferentOpsAtTheSameSeqAreADesyncWithBothOps) {
  Detector det(fourRanks(), Mesh::options());
  for (int r = 0; r < 4; ++r) det.onGroup(r, 7, r, 4, "default_pg");
  for (uint64_t s = 1; s <= 10; ++s) {
    for (int r = 0; r < 4; ++r) det.onEnter(r, 7, s, -1, CollectiveOp::kAllreduce, 4096, s * kS);
    for (int r = 0; r < 4; ++r) det.onExit(r, 7, s, -1, CollectiveOp::kAllreduce, kMs, s * kS + kMs);
  }
  ASSERT_TRUE(det.evaluate(11 * kS).empty());
  for (int r : {0, 1, 2}) det.onEnter(r, 7, 11, -1, CollectiveOp::kAllreduce, 4096, 11 * kS);
  EXPECT_TRUE(det.evaluate(11 * kS).empty()) << "not every member has entered yet";
  det.onEnter(3, 7, 11, -1, CollectiveOp::kBroadcast, 4096, 11 * kS + 10 * kMs);
  auto v = det.evaluate(11 * kS + 20 * kMs);
  ASSERT_EQ(v.size(), 1u);
  EXPECT_EQ(v[0].kind, VerdictKind::kDesync);
  EXPECT_EQ(v[0].ranks, std::vector<int>{3});
  EXPECT_EQ(v[0].op, "allreduce 4096 B");
  EXPECT_EQ(v[0].other_op, "broadcast 4096 B");
  EXPECT_EQ(v[0].group, "default_pg");
  EXPECT_EQ(v[0].seq, 11u);
  auto beat = [&](int64_t t) {
    for (int r = 0; r < 4; ++r) det.onHeartbeat(r, t);
  };
  for (int64_t t = 12 * kS; t <= 30 * kS; t += kS) {
    beat(t);
    auto later = det.evaluate(t);
    ASSERT_TRUE(later.empty()) << "reported once, and no hang verdict for it later: " << later[0].evidence;
  }
  // The same op with a different size is a desync too.
  det.onEnter(0, 7, 12, -1, CollectiveOp::kAllreduce, 4096, 31 * kS);
  det.onEnter(1, 7, 12, -1, CollectiveOp::kAllreduce, 8192, 31 * kS);
  beat(31 * kS + 6 * kS);
  auto w = det.evaluate(31 * kS + 6 * kS);  // not all entered: reported after the hang floor
  ASSERT_FALSE(w.empty());
  EXPECT_EQ(w[0].kind, VerdictKind::kDesync) << w[0].evidence;
  EXPECT_EQ(w[0].ranks, (std::vector<int>{0, 1})) << "no majority: every differing rank is named";
}

// Collectives issued in different orders across groups: rank 0 waits in tp for rank 1 while
// rank 1 waits in dp... closing the chain on itself through collectives: a desync.
TEST(GroupDetectorTest, RanksWaitingForEachOtherInDifferentGroupsAreADesync) {
  Detector det(fourRanks(), Mesh::options());
  // Two groups both holding ranks 0 and 1 (a flattened dp_tp group and the tp group).
  for (int r = 0; r < 2; ++r) {
    det.onGroup(r, 50, r, 2, "mesh_tp");
    det.onGroup(r, 60, r, 2, "mesh_dp_tp");
  }
  det.onEnter(0, 50, 1, -1, CollectiveOp::kAllreduce, 4096, 0);
  det.onEnter(1, 60, 1, -1, CollectiveOp::kAllgather, 4096, 0);
  std::vector<Verdict> seen = untilVerdict(det, 0, 10 * kS);
  ASSERT_EQ(seen.size(), 1u);
  EXPECT_EQ(seen[0].kind, VerdictKind::kDesync) << seen[0].evidence;
  EXPECT_EQ(seen[0].ranks, (std::vector<int>{0, 1})) << seen[0].evidence;
}

// A pipeline: rank 1 waits in a receive from rank 0, which is stopped before its send. Named by
// the channel. And a receive posted early by the culprit does not turn the chain into a cycle:
// rank 2 waits in tp for rank 3; rank 3 had posted an irecv from rank 2 and is stuck computing.
TEST(GroupDetectorTest, APipelineReceiveNamesTheSenderAndAnEarlyIrecvDoesNotMakeACycle) {
  Mesh mesh;
  for (int i = 0; i < 20; ++i) {
    ASSERT_TRUE(mesh.step().empty());
    mesh.p2p(0, 1, mesh.now, 10 * kMs);
    mesh.now += 20 * kMs;
  }
  const int64_t t0 = mesh.now;
  const uint64_t s = ++mesh.sends[{0, 1}];
  mesh.det.onEnter(1, kTp0, s, 0, CollectiveOp::kRecv, 4096, t0);
  std::vector<Verdict> seen = untilVerdict(mesh.det, t0, t0 + 10 * kS);
  ASSERT_EQ(seen.size(), 1u);
  EXPECT_EQ(seen[0].kind, VerdictKind::kHungRank) << seen[0].evidence;
  EXPECT_EQ(seen[0].ranks, std::vector<int>{0}) << seen[0].evidence;
  EXPECT_EQ(seen[0].op, "recv");

  Mesh early;
  for (int i = 0; i < 20; ++i) ASSERT_TRUE(early.step().empty());
  const int64_t t1 = early.now;
  early.det.onEnter(3, kTp1, 1, 2, CollectiveOp::kRecv, 4096, t1);  // irecv posted early by rank 3
  early.det.onEnter(2, kTp1, early.seq[kTp1] + 1, -1, CollectiveOp::kAllreduce, 4096, t1 + kMs);
  seen = untilVerdict(early.det, t1, t1 + 10 * kS);
  ASSERT_EQ(seen.size(), 1u);
  EXPECT_EQ(seen[0].kind, VerdictKind::kHungRank) << seen[0].evidence;
  EXPECT_EQ(seen[0].ranks, std::vector<int>{3}) << seen[0].evidence;
}

// Telemetry that names a group nobody claimed, or comes from a non-member, is counted and
// dropped; claims that contradict the known members too. Never a crash, never a verdict.
TEST(GroupDetectorTest, UnknownGroupsAndContradictingClaimsAreCountedAndDropped) {
  Mesh mesh;
  mesh.det.onEnter(0, 999, 1, -1, CollectiveOp::kAllreduce, 4096, 0);     // nobody claimed 999
  mesh.det.onEnter(0, kTp1, 1, -1, CollectiveOp::kAllreduce, 4096, 0);    // rank 0 is not in tp1
  mesh.det.onEnter(0, 999, 1, 1, CollectiveOp::kSend, 4096, 0);           // P2P on an unknown group
  mesh.det.onEnter(0, kTp0, 1, 17, CollectiveOp::kSend, 4096, 0);         // peer out of range
  mesh.det.onExit(0, 999, 1, -1, CollectiveOp::kAllreduce, kMs, kMs);
  EXPECT_EQ(mesh.det.counters().unknown_group, 4u);
  mesh.det.onGroup(3, kTp0, 1, 2, "mesh_tp");   // rank 1 holds that place
  mesh.det.onGroup(0, kTp0, 0, 3, "mesh_tp");   // size differs
  mesh.det.onGroup(0, 5, 4, 2, "x");            // rank in group out of range
  mesh.det.onGroup(9, 5, 0, 2, "x");            // no such rank
  EXPECT_EQ(mesh.det.counters().bad_claims, 4u);
  for (int64_t t = 0; t <= 20 * kS; t += kS) {
    mesh.beat(t);
    auto v = mesh.det.evaluate(t);
    ASSERT_TRUE(v.empty()) << v[0].evidence;
  }
}

// The network holds collective #41 on rank 0 (every rank entered it, the others completed it);
// the others enter #42, which rank 0 cannot reach. #42 is only stuck behind #41: nobody is named
// until #41's own budget and the network's grace have passed, and then rank 0 as stuck inside
// #41, not as never having entered #42. (The lossy-link scenario named healthy host-a from #42.)
TEST(GroupDetectorTest, ACollectiveStuckBehindOneHeldByTheNetworkIsNotJudgedOnItsOwn) {
  for (bool slow_link : {false, true}) {
    Detector det(fourRanks(), Mesh::options());
    for (int r = 0; r < 4; ++r) det.onGroup(r, 7, r, 4, "default_pg");
    int64_t t = 0;
    for (uint64_t s = 1; s <= 40; ++s, t += 100 * kMs) {
      for (int r = 0; r < 4; ++r) det.onEnter(r, 7, s, -1, CollectiveOp::kAllreduce, 4096, t);
      for (int r = 0; r < 4; ++r) det.onExit(r, 7, s, -1, CollectiveOp::kAllreduce, kMs, t + kMs);
    }
    if (slow_link) det.setSlowHosts({"host-b"});
    const int64_t t0 = t;
    for (int r = 0; r < 4; ++r) det.onEnter(r, 7, 41, -1, CollectiveOp::kAllreduce, 4096, t0);
    for (int r : {1, 2, 3}) det.onExit(r, 7, 41, -1, CollectiveOp::kAllreduce, kMs, t0 + kMs);
    for (int r : {1, 2, 3}) det.onEnter(r, 7, 42, -1, CollectiveOp::kAllreduce, 4096, t0 + 50 * kMs);
    std::vector<Verdict> seen;
    for (int64_t now = t0; now <= t0 + 7900 * kMs; now += 100 * kMs) {
      for (int r = 0; r < 4; ++r) det.onHeartbeat(r, now);
      for (auto& v : det.evaluate(now)) seen.push_back(v);
    }
    for (const auto& v : seen) {
      EXPECT_EQ(v.kind, VerdictKind::kStraggler) << "before #41's budget + grace: " << v.evidence;
      EXPECT_EQ(v.seq, 41u) << v.evidence;
    }
    if (slow_link) continue;  // held 6 x longer; the slow-link tests cover what follows
    for (int64_t now = t0 + 8 * kS; now <= t0 + 9 * kS && seen.empty(); now += 100 * kMs) {
      for (int r = 0; r < 4; ++r) det.onHeartbeat(r, now);
      seen = det.evaluate(now);
    }
    ASSERT_EQ(seen.size(), 1u);
    EXPECT_EQ(seen[0].kind, VerdictKind::kHungRank) << seen[0].evidence;
    EXPECT_EQ(seen[0].ranks, std::vector<int>{0}) << seen[0].evidence;
    EXPECT_EQ(seen[0].seq, 41u) << "stuck inside #41, not absent from #42: " << seen[0].evidence;
  }
}

}  // namespace
}  // namespace trainsup
