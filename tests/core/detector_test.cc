// The detector on synthetic telemetry from 4 ranks on 4 hosts; time is a number, not a clock.
#include "trainsup/detector.h"

#include <gtest/gtest.h>

#include <limits>
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

// Simulates synchronous steps: each rank computes for compute_ns[r], then all-reduces; the
// collective ends when the last rank arrives, so wait(r) = last arrival - arrival(r) + comm.
struct Job {
  Detector det;
  int64_t now = 0;
  uint64_t seq = 0;
  explicit Job(DetectorOptions o = {}) : det(fourRanks(), o) {}
  std::vector<Verdict> step(const std::vector<int64_t>& compute_ns, int64_t comm_ns = 2 * kMs) {
    ++seq;
    int64_t start = now;
    int64_t last = 0;
    for (int r = 0; r < 4; ++r) last = std::max(last, compute_ns[r]);
    for (int r = 0; r < 4; ++r) det.onEnter(r, seq, CollectiveOp::kAllreduce, 4096, start + compute_ns[r]);
    for (int r = 0; r < 4; ++r) det.onExit(r, seq, last - compute_ns[r] + comm_ns, start + last + comm_ns);
    now = start + last + comm_ns;
    return det.evaluate(now);
  }
};

std::vector<int64_t> even(int64_t ns) { return {ns, ns, ns, ns}; }

TEST(DetectorTest, SnapshotGivesStepRatesAndTheOldestOpenCollectiveWithWhoIsMissing) {
  // What `trainsup status` and /metrics show: each rank's seconds per step, and who has not
  // entered the oldest open collective.
  Detector det(fourRanks());
  const int64_t t0 = 100 * kS;
  for (int r = 0; r < 4; ++r) {
    det.onHeartbeat(r, t0);
    det.onProgress(r, 100, "forward", 0, t0);
  }
  // 2 s later: ranks 0-2 made 80 steps (25 ms a step), rank 3 only 20 (100 ms a step).
  for (int r = 0; r < 4; ++r) det.onProgress(r, r == 3 ? 120 : 180, "backward", 0, t0 + 2 * kS);
  det.onEnter(0, 7, CollectiveOp::kAllreduce, 4096, t0 + 2 * kS);
  det.onEnter(1, 7, CollectiveOp::kAllreduce, 4096, t0 + 2100 * kMs);
  det.onEnter(2, 8, CollectiveOp::kBroadcast, 64, t0 + 2200 * kMs);  // newer, not the oldest
  DetectorSnapshot s = det.snapshot(t0 + 3 * kS, 1);
  ASSERT_EQ(s.ranks.size(), 4u);
  EXPECT_NEAR(s.ranks[0].step_s, 0.025, 1e-9);
  EXPECT_NEAR(s.ranks[3].step_s, 0.100, 1e-9);
  EXPECT_EQ(s.ranks[3].host, "host-d");
  EXPECT_EQ(s.ranks[3].step, 120);
  EXPECT_EQ(s.ranks[3].section, "backward");
  EXPECT_NEAR(s.ranks[1].silent_s, 0.9, 1e-9);  // last heard from when it entered #7
  EXPECT_EQ(s.open, 2u);
  ASSERT_EQ(s.oldest.size(), 1u);
  EXPECT_EQ(s.oldest[0].what, "allreduce #7 of group 'world'");
  EXPECT_NEAR(s.oldest[0].age_s, 1.0, 1e-9);
  EXPECT_EQ(s.oldest[0].entered, 2);
  EXPECT_EQ(s.oldest[0].members, 4);
  EXPECT_EQ(s.oldest[0].missing, (std::vector<int>{2, 3}));
  // Under a second of reports measures nothing yet.
  Detector fresh(fourRanks());
  fresh.onProgress(0, 1, "forward", 0, t0);
  fresh.onProgress(0, 30, "forward", 0, t0 + 500 * kMs);
  EXPECT_EQ(fresh.snapshot(t0 + kS).ranks[0].step_s, -1);
}

TEST(DetectorTest, RankThatNeverEntersIsNamedWithItsHostAfterTheBudget) {
  Job job;
  for (int i = 0; i < 40; ++i) ASSERT_TRUE(job.step(even(100 * kMs)).empty());
  bool learned = false;
  int64_t budget = job.det.budgetNs(CollectiveOp::kAllreduce, &learned);
  EXPECT_TRUE(learned);
  EXPECT_EQ(budget, 5 * kS);  // floor: 10 x 2 ms is far below it
  // Ranks 0, 1, 3 enter collective 41; rank 2 never does (and keeps sending heartbeats).
  for (int r : {0, 1, 3}) job.det.onEnter(r, 41, CollectiveOp::kAllreduce, 4096, job.now + 100 * kMs);
  // Heartbeats come from each rank's telemetry thread, so they go on while a rank waits in
  // the collective (and while rank 2 is stuck elsewhere).
  auto beat = [&](int64_t t) {
    for (int r = 0; r < 4; ++r) job.det.onHeartbeat(r, t);
  };
  for (int64_t t = job.now; t < job.now + 5 * kS; t += 500 * kMs) {
    beat(t);
    EXPECT_TRUE(job.det.evaluate(t).empty()) << "before the budget";
  }
  beat(job.now + 5200 * kMs);
  // Rank 2's heartbeats say where its training loop is.
  job.det.onProgress(2, 41, "forward", 5100 * kMs, job.now + 5200 * kMs);
  auto v = job.det.evaluate(job.now + 5200 * kMs);
  ASSERT_EQ(v.size(), 1u);
  EXPECT_EQ(v[0].kind, VerdictKind::kHungRank);
  EXPECT_EQ(v[0].ranks, std::vector<int>{2});
  EXPECT_EQ(v[0].hosts, std::vector<std::string>{"host-c"});
  EXPECT_EQ(v[0].seq, 41u);
  EXPECT_NE(v[0].evidence.find("never entered"), std::string::npos) << v[0].evidence;
  EXPECT_NE(v[0].evidence.find("was in section 'forward' (step 41) for 5.1"), std::string::npos) << v[0].evidence;
  EXPECT_EQ(v[0].section, "forward");
  EXPECT_EQ(v[0].local_ranks, std::vector<int>{0});
  EXPECT_EQ(v[0].step, 41);
  // The fault showed when the others entered (the culprit should have too): 5.1 s before.
  EXPECT_NEAR(v[0].onset_s, 5.1, 1e-9);
  EXPECT_TRUE(job.det.evaluate(job.now + 6 * kS).empty()) << "reported once";
}

TEST(DetectorTest, AllEnteredNoneCompletedIsACommunicationFault) {
  Job job;
  for (int i = 0; i < 30; ++i) job.step(even(50 * kMs));
  for (int r = 0; r < 4; ++r) job.det.onEnter(r, 31, CollectiveOp::kAllreduce, 4096, job.now);
  for (int r = 0; r < 4; ++r) job.det.onHeartbeat(r, job.now + 5 * kS);
  // Over the 5 s budget, but the network gets network_grace_s (3 s) to come back.
  EXPECT_TRUE(job.det.evaluate(job.now + 5100 * kMs).empty());
  for (int r = 0; r < 4; ++r) job.det.onHeartbeat(r, job.now + 8 * kS);
  EXPECT_TRUE(job.det.evaluate(job.now + 7900 * kMs).empty());
  auto v = job.det.evaluate(job.now + 8100 * kMs);
  ASSERT_EQ(v.size(), 1u);
  EXPECT_EQ(v[0].kind, VerdictKind::kCommunicationFault);
  EXPECT_EQ(v[0].ranks, (std::vector<int>{0, 1, 2, 3}));
  EXPECT_NE(v[0].evidence.find("communication"), std::string::npos);
  EXPECT_NE(v[0].evidence.find("the 3.000 s more given to the network"), std::string::npos) << v[0].evidence;
}

// A partition that heals: every rank entered, none completed for 6.2 s (TCP's retransmission
// backoff after a 4 s cut), then all completed. Nobody is named, and the job's next
// collectives are judged as before.
TEST(DetectorTest, ACollectiveHeldByANetworkThatComesBackNamesNobody) {
  Job job;
  // 200 collectives of history: one slow one then moves the learned p99 budget no more than
  // the 1% it is (with 30, it would be the p99 and the budget 10 x 6.2 s).
  for (int i = 0; i < 200; ++i) job.step(even(50 * kMs));
  const int64_t start = job.now;
  const uint64_t seq = 201;
  for (int r = 0; r < 4; ++r) job.det.onEnter(r, seq, CollectiveOp::kAllreduce, 4096, start);
  for (int64_t t = 500 * kMs; t <= 6 * kS; t += 500 * kMs) {
    for (int r = 0; r < 4; ++r) job.det.onHeartbeat(r, start + t);
    EXPECT_TRUE(job.det.evaluate(start + t).empty()) << "at " << t / kMs << " ms";
  }
  for (int r = 0; r < 4; ++r) job.det.onExit(r, seq, 6200 * kMs, start + 6200 * kMs);
  EXPECT_TRUE(job.det.evaluate(start + 9 * kS).empty());
  // A real fault afterwards is still named at its budget plus the confirmation.
  for (int r = 0; r < 4; ++r) job.det.onEnter(r, seq + 1, CollectiveOp::kAllreduce, 4096, start + 9 * kS);
  for (int r = 0; r < 4; ++r) job.det.onHeartbeat(r, start + 17 * kS);
  auto v = job.det.evaluate(start + 17100 * kMs);
  ASSERT_EQ(v.size(), 1u);
  EXPECT_EQ(v[0].kind, VerdictKind::kCommunicationFault);
  EXPECT_EQ(v[0].seq, seq + 1);
}

TEST(DetectorTest, AllEnteredSomeCompletedNamesTheRanksStuckInside) {
  Job job;
  for (int i = 0; i < 30; ++i) job.step(even(50 * kMs));
  for (int r = 0; r < 4; ++r) job.det.onEnter(r, 31, CollectiveOp::kAllreduce, 4096, job.now);
  for (int r : {0, 1, 3}) job.det.onExit(r, 31, 1 * kMs, job.now + 1 * kMs);  // rank 2 stopped inside
  for (int r = 0; r < 4; ++r) job.det.onHeartbeat(r, job.now + 8 * kS);
  // Every rank entered: the last packets to rank 2 may still come (network_grace_s, 3 s).
  EXPECT_TRUE(job.det.evaluate(job.now + 7900 * kMs).empty());
  auto v = job.det.evaluate(job.now + 8100 * kMs);
  ASSERT_EQ(v.size(), 1u);
  EXPECT_EQ(v[0].kind, VerdictKind::kHungRank) << v[0].evidence;
  EXPECT_EQ(v[0].ranks, std::vector<int>{2});
  EXPECT_NE(v[0].evidence.find("3 completed it"), std::string::npos) << v[0].evidence;
}

TEST(DetectorTest, ACoordinatorThatTookOverExpectsEveryRank) {
  Detector det(fourRanks());
  det.expectRanks(0, 3.0, {0, 1, 2});  // took over at t=0; these must show up within 3 s (3 may be starting)
  for (int r : {0, 1, 3}) det.onHeartbeat(r, 2 * kS);
  EXPECT_TRUE(det.evaluate(2900 * kMs).empty());
  for (int r : {0, 1, 3}) det.onHeartbeat(r, 3 * kS);
  auto v = det.evaluate(3100 * kMs);
  ASSERT_EQ(v.size(), 1u);
  EXPECT_EQ(v[0].kind, VerdictKind::kSilentRank);
  EXPECT_EQ(v[0].ranks, std::vector<int>{2});
  EXPECT_EQ(v[0].hosts, std::vector<std::string>{"host-c"});
  EXPECT_NE(v[0].evidence.find("since this coordinator took over"), std::string::npos) << v[0].evidence;
}

TEST(DetectorTest, FixedBudgetsByOpReplaceLearnedOnesAndBadTextNamesTheEntry) {
  DetectorOptions o;
  ASSERT_TRUE(parseOpBudgets("allreduce=30, broadcast=0.5", o).isOk());
  Detector det(fourRanks(), o);
  bool learned = true;
  EXPECT_EQ(det.budgetNs(CollectiveOp::kAllreduce, &learned), 30 * kS);
  EXPECT_FALSE(learned);
  EXPECT_EQ(det.budgetNs(CollectiveOp::kBroadcast), 500 * kMs);
  Status bad = parseOpBudgets("allreduce=30,alltoall=x", o);
  EXPECT_FALSE(bad.isOk());
  EXPECT_NE(bad.message().find("'alltoall=x'"), std::string::npos) << bad.message();
  EXPECT_NE(parseOpBudgets("sendrecv=5", o).message().find("unknown op 'sendrecv'"), std::string::npos);
}

TEST(DetectorTest, SilentAndDeadRanks) {
  Job job;
  for (int i = 0; i < 5; ++i) job.step(even(10 * kMs));
  int64_t t0 = job.now;
  for (int r : {0, 1, 2}) job.det.onHeartbeat(r, t0 + 4 * kS);
  EXPECT_TRUE(job.det.evaluate(t0 + 4 * kS).empty());
  for (int r : {0, 1, 2}) job.det.onHeartbeat(r, t0 + 5100 * kMs);
  auto v = job.det.evaluate(t0 + 5100 * kMs);  // rank 3 silent for 5.1 s (SIGSTOP)
  ASSERT_EQ(v.size(), 1u);
  EXPECT_EQ(v[0].kind, VerdictKind::kSilentRank);
  EXPECT_EQ(v[0].hosts, std::vector<std::string>{"host-d"});
  // Its last sign of life: the last step's collective exit, t0 (what the report counts from).
  EXPECT_NEAR(v[0].onset_s, 5.1, 1e-9);
  job.det.onDisconnect(1, t0 + 5200 * kMs);  // SIGKILL: the connection closes, named at once
  for (int r : {0, 2}) job.det.onHeartbeat(r, t0 + 5200 * kMs);
  v = job.det.evaluate(t0 + 5250 * kMs);
  ASSERT_EQ(v.size(), 1u);
  EXPECT_EQ(v[0].kind, VerdictKind::kDeadRank);
  EXPECT_EQ(v[0].ranks, std::vector<int>{1});
  EXPECT_NEAR(v[0].onset_s, 0.05, 1e-9);  // it closed 50 ms before this evaluation
}

TEST(DetectorTest, RanksAskedToStopAreLeavingNotBroken) {
  // Rank 2 got SIGTERM (its node is being taken back): it saves and leaves while the others
  // wait for it in the next all-reduce. That is stopped_rank, not a hung rank on host-c.
  Job job;
  for (int i = 0; i < 40; ++i) ASSERT_TRUE(job.step(even(100 * kMs)).empty());
  const int64_t t0 = job.now;
  job.det.onStopping(2, t0);
  for (int r : {0, 1, 3}) job.det.onEnter(r, 41, CollectiveOp::kAllreduce, 4096, t0 + 100 * kMs);
  for (int r = 0; r < 4; ++r) job.det.onHeartbeat(r, t0 + 5200 * kMs);
  auto v = job.det.evaluate(t0 + 5200 * kMs);
  ASSERT_EQ(v.size(), 1u);
  EXPECT_EQ(v[0].kind, VerdictKind::kStoppedRank);
  EXPECT_EQ(verdictKindName(v[0].kind), std::string("stopped_rank"));
  EXPECT_EQ(v[0].ranks, std::vector<int>{2});
  EXPECT_EQ(v[0].hosts, std::vector<std::string>{"host-c"});
  EXPECT_NE(v[0].evidence.find("asked to stop (SIGTERM/SIGINT) 5.2"), std::string::npos) << v[0].evidence;
  EXPECT_NE(v[0].evidence.find("hung_rank: "), std::string::npos) << v[0].evidence;
  // Its exit afterwards (the process is gone, no goodbye: killed after the grace) is the same.
  job.det.onDisconnect(2, t0 + 6 * kS);
  v = job.det.evaluate(t0 + 6 * kS);
  ASSERT_EQ(v.size(), 1u);
  EXPECT_EQ(v[0].kind, VerdictKind::kStoppedRank);
  // A rank that was not asked to stop is still a fault when it goes silent.
  for (int r : {0, 1}) job.det.onHeartbeat(r, t0 + 11 * kS);
  v = job.det.evaluate(t0 + 11 * kS);
  ASSERT_EQ(v.size(), 1u);
  EXPECT_EQ(v[0].kind, VerdictKind::kSilentRank);
  EXPECT_EQ(v[0].ranks, std::vector<int>{3});
}

TEST(DetectorTest, AVerdictNamingStoppingAndOtherRanksStaysAFault) {
  Job job;
  for (int i = 0; i < 40; ++i) ASSERT_TRUE(job.step(even(100 * kMs)).empty());
  const int64_t t0 = job.now;
  job.det.onStopping(2, t0);
  for (int r : {0, 1}) job.det.onEnter(r, 41, CollectiveOp::kAllreduce, 4096, t0 + 100 * kMs);
  for (int r = 0; r < 4; ++r) job.det.onHeartbeat(r, t0 + 5200 * kMs);
  auto v = job.det.evaluate(t0 + 5200 * kMs);
  ASSERT_EQ(v.size(), 1u);
  EXPECT_EQ(v[0].kind, VerdictKind::kHungRank);  // rank 3 never entered and was not asked to stop
  EXPECT_EQ(v[0].ranks, (std::vector<int>{2, 3}));
}

TEST(DetectorTest, OwnWatchdogReportNamesTheSection) {
  Job job;
  job.det.onRankStalled(2, "data", 17, 0);
  auto v = job.det.evaluate(1);
  ASSERT_EQ(v.size(), 1u);
  EXPECT_EQ(v[0].kind, VerdictKind::kStalledRank);
  EXPECT_NE(v[0].evidence.find("'data' (step 17)"), std::string::npos);
}

TEST(DetectorTest, LearnedBudgetsLetASlowButHealthyOpPass) {
  Job job;
  // All-reduces that legitimately take 2 s (big buckets on a slow network).
  for (int i = 0; i < 30; ++i) ASSERT_TRUE(job.step(even(10 * kMs), 2 * kS).empty());
  EXPECT_EQ(job.det.budgetNs(CollectiveOp::kAllreduce), 20 * kS);
  for (int r = 0; r < 4; ++r) job.det.onEnter(r, 31, CollectiveOp::kAllreduce, 4096, job.now);
  for (int r = 0; r < 4; ++r) job.det.onHeartbeat(r, job.now + 6 * kS);
  EXPECT_TRUE(job.det.evaluate(job.now + 6 * kS).empty());
}

TEST(DetectorTest, APersistentlySlowRankIsAStraggler) {
  Job job;
  std::mt19937 rng(7);
  std::uniform_real_distribution<double> jitter(0.95, 1.05);
  std::vector<Verdict> found;
  int steps = 0;
  while (found.empty() && steps < 1000) {
    std::vector<int64_t> c(4);
    for (int r = 0; r < 4; ++r) c[r] = static_cast<int64_t>(100 * kMs * jitter(rng) * (r == 1 ? 1.5 : 1.0));
    found = job.step(c);
    ++steps;
  }
  ASSERT_EQ(found.size(), 1u);
  EXPECT_EQ(found[0].kind, VerdictKind::kStraggler);
  EXPECT_EQ(found[0].ranks, std::vector<int>{1});
  EXPECT_EQ(found[0].hosts, std::vector<std::string>{"host-b"});
  EXPECT_EQ(steps, 150) << "three windows of 50";
}

TEST(DetectorTest, NoVerdictWhenAllSlowDownTogetherOrUnderThirtyPercentJitter) {
  Job job;
  std::mt19937 rng(11);
  std::uniform_real_distribution<double> jitter(0.7, 1.3);
  for (int i = 0; i < 2000; ++i) {
    double load = i < 1000 ? 1.0 : 2.5;  // the whole job slows down (load variation)
    std::vector<int64_t> c(4);
    for (int r = 0; r < 4; ++r) c[r] = static_cast<int64_t>(100 * kMs * load * jitter(rng));
    auto v = job.step(c);
    ASSERT_TRUE(v.empty()) << "step " << i << ": " << verdictKindName(v[0].kind) << " " << v[0].evidence;
  }
}

// host-b's link is slow (its agent says so). Rank 0 on host-a is left waiting inside an
// all-reduce that rank 1 finished: without the slow link that names host-a hung. With it, the
// job hears once that the collective is held by host-b's link (a straggler verdict naming
// host-b), a late completion names nobody, and a collective that never completes names host-b
// hung after 6 x its budget (and the network grace). host-b's ranks get 6 x the silence
// timeout.
TEST(DetectorTest, ASlowLinkMakesAStragglerOfItsHostAndDelaysHangVerdicts) {
  Job job;
  for (int i = 0; i < 200; ++i) job.step(even(50 * kMs));
  job.det.setSlowHosts({"host-b"});
  int64_t t0 = job.now;
  uint64_t seq = 201;
  for (int r = 0; r < 4; ++r) job.det.onEnter(r, seq, CollectiveOp::kAllreduce, 4096, t0);
  for (int r : {1, 2, 3}) job.det.onExit(r, seq, 1 * kMs, t0 + 1 * kMs);  // rank 0 still inside
  std::vector<Verdict> seen;
  for (int64_t t = 500 * kMs; t <= 12 * kS; t += 500 * kMs) {
    for (int r : {0, 2, 3}) job.det.onHeartbeat(r, t0 + t);  // host-b's telemetry is late
    for (auto& v : job.det.evaluate(t0 + t)) seen.push_back(v);
  }
  ASSERT_EQ(seen.size(), 1u);
  EXPECT_EQ(seen[0].kind, VerdictKind::kStraggler);
  EXPECT_EQ(seen[0].hosts, std::vector<std::string>{"host-b"});
  EXPECT_NE(seen[0].evidence.find("slow link"), std::string::npos) << seen[0].evidence;
  job.det.onExit(0, seq, 12 * kS, t0 + 12 * kS);  // it completes after all
  job.det.onHeartbeat(1, t0 + 12 * kS);
  EXPECT_TRUE(job.det.evaluate(t0 + 12 * kS).empty());

  // The next one never completes: named hung at 6 x 5 s, plus the 3 s network grace.
  t0 += 12 * kS;
  for (int r = 0; r < 4; ++r) job.det.onEnter(r, seq + 1, CollectiveOp::kAllreduce, 4096, t0);
  for (int r : {1, 2, 3}) job.det.onExit(r, seq + 1, 1 * kMs, t0 + 1 * kMs);
  seen.clear();
  for (int64_t t = 1 * kS; t <= 34 * kS; t += 1 * kS) {
    for (int r = 0; r < 4; ++r) job.det.onHeartbeat(r, t0 + t);
    for (auto& v : job.det.evaluate(t0 + t)) seen.push_back(v);
    if (t == 32 * kS) {
      ASSERT_EQ(seen.size(), 1u);
      EXPECT_EQ(seen[0].kind, VerdictKind::kStraggler);
    }
  }
  ASSERT_EQ(seen.size(), 2u);
  // Held that long, the slow link is the fault: host-b is named, not rank 0 that waits for it.
  EXPECT_EQ(seen[1].kind, VerdictKind::kHungRank);
  EXPECT_EQ(seen[1].hosts, std::vector<std::string>{"host-b"});
  EXPECT_NE(seen[1].evidence.find("slow link of host(s) host-b"), std::string::npos) << seen[1].evidence;
  EXPECT_NE(seen[1].evidence.find("waiting: rank(s) 0"), std::string::npos) << seen[1].evidence;

  // Once the link is fine again, the normal budget and silence apply.
  job.det.setSlowHosts({});
  Job fresh;
  for (int i = 0; i < 200; ++i) fresh.step(even(50 * kMs));
  fresh.det.setSlowHosts({"host-b"});
  for (int r : {0, 2, 3}) fresh.det.onHeartbeat(r, fresh.now + 20 * kS);
  EXPECT_TRUE(fresh.det.evaluate(fresh.now + 20 * kS).empty()) << "host-b's ranks: 6 x 5 s of silence allowed";
  fresh.det.setSlowHosts({});
  auto v = fresh.det.evaluate(fresh.now + 20 * kS);
  ASSERT_EQ(v.size(), 1u);
  EXPECT_EQ(v[0].kind, VerdictKind::kSilentRank);
  EXPECT_EQ(v[0].hosts, std::vector<std::string>{"host-b"});
}

// CI saw it: an allreduce opened just before host-b's agent reported its slow link; the link
// recovered 7.1 s later, and the allreduce, still held 0.75 s on by TCP's backed-off
// retransmissions, was named hung at budget + network grace (8 s) as if the link had never been
// slow. The allowance belongs to the op: it keeps 6 x its budget after the recovery. An op
// opened after the recovery has the normal budget again.
TEST(DetectorTest, ACollectiveOpenWhileALinkWasSlowKeepsItsAllowanceAfterTheLinkRecovers) {
  Job job;
  for (int i = 0; i < 200; ++i) job.step(even(50 * kMs));
  int64_t t0 = job.now;
  const uint64_t seq = 201;
  for (int r = 0; r < 4; ++r) job.det.onEnter(r, seq, CollectiveOp::kAllreduce, 4096, t0);
  for (int r : {1, 2, 3}) job.det.onExit(r, seq, 1 * kMs, t0 + 1 * kMs);  // rank 0 waits for host-b's packets
  std::vector<Verdict> seen;
  for (int64_t t = 100 * kMs; t <= 9 * kS; t += 100 * kMs) {
    if (t == 200 * kMs) job.det.setSlowHosts({"host-b"});  // reported after the op opened
    if (t == 7100 * kMs) job.det.setSlowHosts({});          // recovered; the op is still open
    for (int r = 0; r < 4; ++r) job.det.onHeartbeat(r, t0 + t);
    for (auto& v : job.det.evaluate(t0 + t)) seen.push_back(v);
  }
  ASSERT_EQ(seen.size(), 1u) << seen.back().evidence;
  EXPECT_EQ(seen[0].kind, VerdictKind::kStraggler);
  EXPECT_EQ(seen[0].hosts, std::vector<std::string>{"host-b"});
  job.det.onExit(0, seq, 9 * kS, t0 + 9 * kS);
  EXPECT_TRUE(job.det.evaluate(t0 + 9 * kS).empty());

  // The next one opens with the link fine and never completes: hung at 5 s + the 3 s grace.
  t0 += 9 * kS;
  for (int r = 0; r < 4; ++r) job.det.onEnter(r, seq + 1, CollectiveOp::kAllreduce, 4096, t0);
  for (int r : {1, 2, 3}) job.det.onExit(r, seq + 1, 1 * kMs, t0 + 1 * kMs);
  seen.clear();
  int64_t named_at = -1;
  for (int64_t t = 100 * kMs; t <= 10 * kS && named_at < 0; t += 100 * kMs) {
    for (int r = 0; r < 4; ++r) job.det.onHeartbeat(r, t0 + t);
    for (auto& v : job.det.evaluate(t0 + t)) {
      seen.push_back(v);
      named_at = t;
    }
  }
  ASSERT_EQ(seen.size(), 1u);
  EXPECT_EQ(seen[0].kind, VerdictKind::kHungRank);
  EXPECT_GT(named_at, 8 * kS);
  EXPECT_LE(named_at, 8200 * kMs);
}

// A slow link does not cover for another host: rank 2 on healthy host-c never enters the
// collective (a deadlock in its own code) while host-b's link is slow. host-c is named at the
// usual budget, not host-b at 6 x it.
TEST(DetectorTest, ASlowLinkDoesNotHideARankOnAHealthyHostThatNeverEntered) {
  Job job;
  for (int i = 0; i < 200; ++i) job.step(even(50 * kMs));
  job.det.setSlowHosts({"host-b"});
  const int64_t t0 = job.now;
  for (int r : {0, 1, 3}) job.det.onEnter(r, 201, CollectiveOp::kAllreduce, 4096, t0);
  for (int r = 0; r < 4; ++r) job.det.onHeartbeat(r, t0 + 5 * kS);
  auto v = job.det.evaluate(t0 + 5100 * kMs);
  ASSERT_EQ(v.size(), 1u);
  EXPECT_EQ(v[0].kind, VerdictKind::kHungRank);
  EXPECT_EQ(v[0].hosts, std::vector<std::string>{"host-c"});
  EXPECT_NE(v[0].evidence.find("never entered"), std::string::npos) << v[0].evidence;
}

// Heartbeats every 200 ms from 4 hosts whose clocks are offset from the coordinator's by
// different amounts (offset[r]); transit(r) is added to each heartbeat's flight. Returns the
// time after the last round.
int64_t beat(Detector& det, int64_t from, int rounds, const std::vector<int64_t>& transit,
             const std::vector<bool>& sending = {true, true, true, true}) {
  const std::vector<int64_t> offset = {0, 7 * kS, -3 * kS, 123 * kMs};
  int64_t t = from;
  for (int i = 0; i < rounds; ++i) {
    t += 200 * kMs;
    for (int r = 0; r < 4; ++r) {
      if (sending[r]) det.onHeartbeat(r, t + transit[r], t + offset[r]);
    }
  }
  return t;
}

// A 30% lossy link holds host-b's telemetry stream in TCP retransmission: its heartbeats come
// in 300 ms late, then not at all for more than the 5 s silence timeout (CI saw host-b named
// silent_rank 1.5 s before its agent could report the slow link). Late, not gone: the silence
// timeout is 6 x 5 s for it. A rank whose heartbeats were on time goes silent at 5 s.
TEST(DetectorTest, ARankWhoseHeartbeatsLaggedInTransitGetsTheSlowLinkSilenceTimeout) {
  Detector det(fourRanks());
  int64_t t = beat(det, 100 * kS, 20, {1 * kMs, 1 * kMs, 1 * kMs, 1 * kMs});
  EXPECT_EQ(det.laggingAtNs(1), -1);
  t = beat(det, t, 3, {1 * kMs, 300 * kMs, 1 * kMs, 1 * kMs});
  EXPECT_GE(det.laggingAtNs(1), 0) << "three heartbeats 300 ms late while the others were on time";
  EXPECT_EQ(det.laggingAtNs(0), -1);
  const int64_t quiet_from = t;
  // host-b silent from here on; host-d's rank 3 stops too, having been on time.
  t = beat(det, t, 40, {1 * kMs, 0, 1 * kMs, 1 * kMs}, {true, false, true, false});
  ASSERT_GT(t - quiet_from, 5 * kS);
  auto v = det.evaluate(t);
  ASSERT_EQ(v.size(), 1u);
  EXPECT_EQ(v[0].kind, VerdictKind::kSilentRank);
  EXPECT_EQ(v[0].hosts, std::vector<std::string>{"host-d"});
  // ...and host-b's rank once 30 s have passed, saying why it waited that long.
  t = beat(det, t, 130, {1 * kMs, 0, 1 * kMs, 0}, {true, false, true, false});
  ASSERT_GT(t - quiet_from, 30 * kS);
  v = det.evaluate(t);
  ASSERT_EQ(v.size(), 1u);
  EXPECT_EQ(v[0].kind, VerdictKind::kSilentRank);
  EXPECT_EQ(v[0].hosts, std::vector<std::string>{"host-b"});
  EXPECT_NE(v[0].evidence.find("delayed in transit"), std::string::npos) << v[0].evidence;
}

// When every host's heartbeats come in late, the delay is the coordinator's (its host short of
// CPU): nobody is marked, and a rank that then goes quiet is named at the usual 5 s.
TEST(DetectorTest, HeartbeatsLateFromEveryHostMarkNobody) {
  Detector det(fourRanks());
  int64_t t = beat(det, 100 * kS, 20, {1 * kMs, 1 * kMs, 1 * kMs, 1 * kMs});
  t = beat(det, t, 5, {400 * kMs, 450 * kMs, 420 * kMs, 400 * kMs});
  for (int r = 0; r < 4; ++r) EXPECT_EQ(det.laggingAtNs(r), -1) << r;
  // A lag that came and went more than 3 timeouts before the silence does not count either.
  Detector old(fourRanks());
  t = beat(old, 100 * kS, 20, {1 * kMs, 1 * kMs, 1 * kMs, 1 * kMs});
  t = beat(old, t, 3, {1 * kMs, 300 * kMs, 1 * kMs, 1 * kMs});
  ASSERT_GE(old.laggingAtNs(1), 0);
  t = beat(old, t, 100, {1 * kMs, 1 * kMs, 1 * kMs, 1 * kMs});  // 20 s on time
  const int64_t quiet_from = t;
  t = beat(old, t, 27, {1 * kMs, 0, 1 * kMs, 1 * kMs}, {true, false, true, true});
  auto v = old.evaluate(t);
  ASSERT_GT(t - quiet_from, 5 * kS);
  ASSERT_EQ(v.size(), 1u);
  EXPECT_EQ(v[0].hosts, std::vector<std::string>{"host-b"});
  EXPECT_EQ(v[0].evidence.find("delayed in transit"), std::string::npos) << v[0].evidence;
}

// The next deadline a coordinator evaluates at: the earliest silence timeout or collective
// budget still to come after the evaluation's time.
TEST(DetectorTest, NextDeadlineIsTheEarliestSilenceOrBudgetStillToCome) {
  DetectorOptions o;
  o.op_budget_s[static_cast<size_t>(CollectiveOp::kAllreduce)] = 2;  // fixed budgets: 2 s
  o.op_budget_s[static_cast<size_t>(CollectiveOp::kBroadcast)] = 60;
  Detector det(fourRanks(), o);
  EXPECT_EQ(det.nextDeadlineNs(0), std::numeric_limits<int64_t>::max()) << "nobody heard from: nothing to time";
  const int64_t t0 = 100 * kS;
  for (int r = 0; r < 4; ++r) det.onHeartbeat(r, t0 + r * kMs);
  EXPECT_EQ(det.nextDeadlineNs(t0), t0 + 5 * kS + 1);  // rank 0's silence, strictly over 5 s
  det.onEnter(0, 1, CollectiveOp::kAllreduce, 64, t0 + 1 * kS);  // its budget ends at t0 + 3 s
  EXPECT_EQ(det.nextDeadlineNs(t0 + 1 * kS), t0 + 3 * kS + 1);
  // Past it (the verdict may wait on the network grace): not a deadline; rank 1's silence is.
  EXPECT_EQ(det.nextDeadlineNs(t0 + 4 * kS), t0 + 5 * kS + 1 * kMs + 1);
  // A slow host's ranks get 6 x the silence; the others still come first.
  det.setSlowHosts({"host-b"});
  EXPECT_EQ(det.nextDeadlineNs(t0 + 4 * kS), t0 + 5 * kS + 2 * kMs + 1);
  // Once the others are judged, host-b's longer timeout and rank 0's broadcast are left.
  for (int r : {0, 2, 3}) det.onHeartbeat(r, t0 + 20 * kS);
  det.onEnter(0, 2, CollectiveOp::kBroadcast, 64, t0 + 20 * kS);  // budget 60 s: t0 + 80 s
  det.evaluate(t0 + 20 * kS);
  EXPECT_EQ(det.nextDeadlineNs(t0 + 20 * kS), t0 + 25 * kS + 1) << "ranks 2 and 3 heard at t0 + 20 s";
  for (int r : {0, 2, 3}) det.onHeartbeat(r, t0 + 200 * kS);
  int silent = 0;
  for (const auto& x : det.evaluate(t0 + 200 * kS)) silent += x.kind == VerdictKind::kSilentRank;
  EXPECT_EQ(silent, 1) << "host-b's rank, after 30 s";
  EXPECT_EQ(det.nextDeadlineNs(t0 + 200 * kS), t0 + 205 * kS + 1);
}

}  // namespace
}  // namespace trainsup
