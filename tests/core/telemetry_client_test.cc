// Ranks (threads with their own trackers) report through TelemetryClients to a Coordinator
// over loopback: a rank that does not enter a collective is named after the budget; a rank
// whose client goes away is named at once.
#include "telemetry/telemetry_client.h"

#include <gtest/gtest.h>
#include <sys/resource.h>

#include <boost/asio.hpp>
#include <future>
#include <map>
#include <mutex>
#include <thread>

#include "trainsup/coordinator.h"
#include "verdict_sink.h"

namespace trainsup {
namespace {

JobToken jobToken() {
  JobToken t;
  t.fill(0x5A);
  return t;
}

using Sink = testing::VerdictSink;

std::unique_ptr<Coordinator> coordinator(Sink& sink, int world) {
  std::vector<RankInfo> ranks;
  for (int r = 0; r < world; ++r) ranks.push_back({r, 0, "node-" + std::to_string(r), ""});
  DetectorOptions d;
  d.hang_floor_s = 0.5;
  d.warmup_collectives = 5;
  d.warmup_budget_s = 0.5;
  d.heartbeat_timeout_s = 30;
  auto c = Coordinator::start(ranks, jobToken(), {}, d, sink.callback());
  if (!c) throw std::runtime_error(c.status().toString());
  return std::move(*c);
}

std::unique_ptr<TelemetryClient> client(uint16_t port, int rank, CollectiveTracker& t) {
  TelemetryClientOptions o;
  o.port = port;
  o.token = jobToken();
  o.rank = rank;
  o.interval_s = 0.02;
  auto c = TelemetryClient::start(o, t);
  if (!c) throw std::runtime_error(c.status().toString());
  return std::move(*c);
}

TEST(TelemetryClientTest, ARankThatNeverEntersIsNamedAfterTheBudget) {
  constexpr int kWorld = 3;
  Sink sink;
  auto coord = coordinator(sink, kWorld);
  std::vector<CollectiveTracker> trackers(kWorld);
  std::vector<std::unique_ptr<TelemetryClient>> clients;
  for (int r = 0; r < kWorld; ++r) clients.push_back(client(coord->port(), r, trackers[r]));
  // 20 healthy collectives on every rank, then ranks 0 and 1 enter #21 and rank 2 never does.
  for (int i = 0; i < 20; ++i) {
    for (int r = 0; r < kWorld; ++r) trackers[r].end(trackers[r].begin(CollectiveOp::kAllreduce, 1024), true);
  }
  trackers[0].begin(CollectiveOp::kAllreduce, 1024);
  trackers[1].begin(CollectiveOp::kAllreduce, 1024);
  auto t0 = std::chrono::steady_clock::now();
  auto fut = sink.first.get_future();
  ASSERT_EQ(fut.wait_for(std::chrono::seconds(20)), std::future_status::ready);
  Verdict v = fut.get();
  EXPECT_EQ(v.kind, VerdictKind::kHungRank) << v.evidence;
  EXPECT_EQ(v.ranks, std::vector<int>{2});
  EXPECT_EQ(v.hosts, std::vector<std::string>{"node-2"});
  EXPECT_EQ(v.seq, 21u);
  EXPECT_GE(std::chrono::steady_clock::now() - t0, std::chrono::milliseconds(400));
  for (auto& c : clients) c->stop();
  coord->stop();
  EXPECT_GT(clients[0]->counters().records_sent, 20u);
  EXPECT_EQ(clients[0]->counters().records_dropped, 0u);
}

// A pipeline's point-to-point ops are matched per channel, never against the collectives:
// stage 1 receives and sends twice as often as the first and last stages, which once numbered
// every later collective differently on each rank and named healthy ranks as never having
// entered one (issue 19, defect 1). With per-channel numbers (issue 20), the k-th send from 0
// to 1 meets 1's k-th receive from 0, and the real hang at the end is named with the job's own
// collective number, even though rank 1 also waits in a receive that rank 0 never sends
// because rank 0 waits in that collective for rank 2: the chain resolves to its root.
TEST(TelemetryClientTest, PointToPointOpsAreMatchedPerChannelAndChainToTheRoot) {
  constexpr int kWorld = 3, kSteps = 30;
  Sink sink;
  auto coord = coordinator(sink, kWorld);
  std::vector<CollectiveTracker> trackers(kWorld);
  std::vector<std::unique_ptr<TelemetryClient>> clients;
  for (int r = 0; r < kWorld; ++r) clients.push_back(client(coord->port(), r, trackers[r]));
  std::map<std::pair<int, int>, uint64_t> sent, received;  // channel (from, to) -> ops so far
  auto send = [&](int from, int to) {
    trackers[from].end(trackers[from].begin(CollectiveOp::kSend, 4096, 0, ++sent[{from, to}], to), true);
  };
  auto recv = [&](int to, int from) {
    trackers[to].end(trackers[to].begin(CollectiveOp::kRecv, 4096, 0, ++received[{from, to}], from), true);
  };
  for (int step = 0; step < kSteps; ++step) {
    for (int mb = 0; mb < 2; ++mb) {  // two micro-batches forward
      send(0, 1);
      recv(1, 0);
      send(1, 2);
      recv(2, 1);
    }
    for (int r = 0; r < kWorld; ++r) trackers[r].end(trackers[r].begin(CollectiveOp::kAllreduce, 1024), true);
  }
  // Rank 1 waits for the next micro-batch, which rank 0 sends only after the all-reduce.
  trackers[1].begin(CollectiveOp::kRecv, 4096, 0, ++received[{0, 1}], 0);
  EXPECT_EQ(trackers[1].stats().pending(), 1u);
  EXPECT_EQ(trackers[1].stats().last_seq, 5u * kSteps + 1);
  EXPECT_EQ(trackers[1].stats().last_world_seq, static_cast<uint64_t>(kSteps));
  // The real fault: rank 2 never enters the next all-reduce.
  trackers[0].begin(CollectiveOp::kAllreduce, 1024);
  trackers[1].begin(CollectiveOp::kAllreduce, 1024);
  auto fut = sink.first.get_future();
  ASSERT_EQ(fut.wait_for(std::chrono::seconds(20)), std::future_status::ready);
  Verdict v = fut.get();
  EXPECT_EQ(v.kind, VerdictKind::kHungRank) << v.evidence;
  EXPECT_EQ(v.ranks, std::vector<int>{2}) << v.evidence;
  EXPECT_EQ(v.seq, static_cast<uint64_t>(kSteps + 1)) << v.evidence;
  EXPECT_EQ(v.op, "allreduce");
  for (auto& c : clients) c->stop();
  coord->stop();
  EXPECT_EQ(coord->counters().unknown_group_records, 0u);
}

// Waits (bounded by `deadline`) until `c` has sent at least `frames` frames.
bool sentFrames(TelemetryClient& c, uint64_t frames, std::chrono::steady_clock::time_point deadline) {
  while (c.counters().frames_sent < frames && std::chrono::steady_clock::now() < deadline) std::this_thread::yield();
  return c.counters().frames_sent >= frames;
}

// Two ranks report; rank 1's process then dies (its connection closes without a goodbye),
// after it was asked to stop if `asked_to_stop`. Returns the coordinator's first verdict.
Verdict verdictWhenRankOneGoesAway(bool asked_to_stop) {
  Sink sink;
  auto coord = coordinator(sink, 2);
  CollectiveTracker a, b;
  auto ca = client(coord->port(), 0, a);
  auto cb = client(coord->port(), 1, b);
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  EXPECT_TRUE(sentFrames(*ca, 1, deadline) && sentFrames(*cb, 1, deadline)) << "both connected and heard from";
  if (asked_to_stop) {
    // SIGTERM on rank 1's node: its supervisor says so. The notice goes out in the client's
    // next round (notice + heartbeat) at the latest; the round under way sends one heartbeat:
    // three more frames mean the notice is out.
    const uint64_t before = cb->counters().frames_sent;
    cb->reportStopping();
    cb->reportStopping();  // idempotent
    EXPECT_TRUE(sentFrames(*cb, before + 3, deadline));
  }
  cb->dropConnection();
  auto fut = sink.first.get_future();
  Verdict v;
  if (fut.wait_for(std::chrono::seconds(10)) == std::future_status::ready) {
    v = fut.get();
  } else {
    ADD_FAILURE() << "no verdict within 10 s";
  }
  ca->stop();
  coord->stop();
  return v;
}

TEST(TelemetryClientTest, AClientThatGoesAwayIsADeadRank) {
  Verdict v = verdictWhenRankOneGoesAway(false);
  EXPECT_EQ(v.kind, VerdictKind::kDeadRank);
  EXPECT_EQ(v.ranks, std::vector<int>{1});
}

TEST(TelemetryClientTest, ARankAskedToStopThatGoesAwayIsAStoppedRankNotADeadOne) {
  Verdict v = verdictWhenRankOneGoesAway(true);
  EXPECT_EQ(v.kind, VerdictKind::kStoppedRank) << v.evidence;
  EXPECT_EQ(v.ranks, std::vector<int>{1});
  EXPECT_NE(v.evidence.find("dead_rank"), std::string::npos) << v.evidence;
}

// A client of rank `rank` that hands its first abort order (if `order`) to that promise.
TelemetryClientOptions abortingClient(uint16_t port, int rank, std::promise<WireAbort>* order) {
  TelemetryClientOptions o;
  o.port = port;
  o.token = jobToken();
  o.rank = rank;
  o.interval_s = 0.02;
  if (order) {
    auto once = std::make_shared<std::once_flag>();
    o.on_abort = [order, once](const WireAbort& a) { std::call_once(*once, [&] { order->set_value(a); }); };
  }
  return o;
}

TEST(TelemetryClientTest, TheOtherRanksAreOrderedToAbortNamingTheCulprit) {
  Sink sink;
  auto coord = coordinator(sink, 3);
  std::vector<CollectiveTracker> trackers(3);
  std::vector<std::promise<WireAbort>> orders(2);
  std::vector<std::unique_ptr<TelemetryClient>> clients;
  for (int r = 0; r < 3; ++r) {
    clients.push_back(
        TelemetryClient::start(abortingClient(coord->port(), r, r < 2 ? &orders[r] : nullptr), trackers[r]).value());
  }
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  for (int r = 0; r < 3; ++r) {  // all connected: the order reaches the connections there are
    while (clients[r]->counters().frames_sent == 0 && std::chrono::steady_clock::now() < deadline) std::this_thread::yield();
  }
  clients[2]->dropConnection();  // rank 2 dies
  for (int r = 0; r < 2; ++r) {
    auto fut = orders[r].get_future();
    ASSERT_EQ(fut.wait_for(std::chrono::seconds(10)), std::future_status::ready) << "rank " << r;
    WireAbort a = fut.get();
    EXPECT_EQ(a.culprit_rank, 2);
    EXPECT_STREQ(a.host, "node-2");
    EXPECT_STREQ(a.kind, "dead_rank");
  }
  for (int r = 0; r < 2; ++r) clients[r]->stop();
  coord->stop();
}

// A rank still starting when the verdict came (its first connection comes after the order)
// is told too: the round is over, and nobody would answer its collectives.
TEST(TelemetryClientTest, ARankThatConnectsAfterTheAbortOrderIsToldToo) {
  Sink sink;
  auto coord = coordinator(sink, 3);
  std::vector<CollectiveTracker> trackers(3);
  std::vector<std::promise<WireAbort>> orders(2);
  auto options = [&](int r) { return abortingClient(coord->port(), r, r < 2 ? &orders[r] : nullptr); };
  auto c0 = TelemetryClient::start(options(0), trackers[0]).value();
  auto c2 = TelemetryClient::start(options(2), trackers[2]).value();
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while ((c0->counters().frames_sent == 0 || c2->counters().frames_sent == 0) &&
         std::chrono::steady_clock::now() < deadline) {
    std::this_thread::yield();
  }
  c2->dropConnection();  // rank 2 dies before rank 1 ever connected
  auto first = orders[0].get_future();
  ASSERT_EQ(first.wait_for(std::chrono::seconds(10)), std::future_status::ready);
  EXPECT_EQ(first.get().culprit_rank, 2);
  auto c1 = TelemetryClient::start(options(1), trackers[1]).value();
  auto late = orders[1].get_future();
  ASSERT_EQ(late.wait_for(std::chrono::seconds(10)), std::future_status::ready);
  WireAbort a = late.get();
  EXPECT_EQ(a.culprit_rank, 2);
  EXPECT_STREQ(a.host, "node-2");
  EXPECT_EQ(coord->counters().verdicts, 1u);
  c0->stop();
  c1->stop();
  coord->stop();
}

double processCpuSeconds() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_utime.tv_sec + u.ru_stime.tv_sec) +
         static_cast<double>(u.ru_utime.tv_usec + u.ru_stime.tv_usec) / 1e6;
}

// Between sends the client waits on its connection for abort orders. A peer that closed the
// connection leaves the socket readable for ever: the client must stop waiting on it until its
// next send (which finds out), not spin on it. Over a second with the peer gone, the process
// uses a small fraction of the CPU a spinning thread would (a whole second of it).
TEST(TelemetryClientTest, APeerThatClosedTheConnectionDoesNotMakeTheClientSpin) {
  namespace asio = boost::asio;
  asio::io_context io;
  asio::ip::tcp::acceptor acceptor(io, {asio::ip::make_address("127.0.0.1"), 0});
  CollectiveTracker t;
  TelemetryClientOptions o;
  o.port = acceptor.local_endpoint().port();
  o.token = jobToken();
  o.interval_s = 2;  // no send, and so no reconnect, during the measurement (the first comes after 2 s)
  auto c = TelemetryClient::start(o, t);
  ASSERT_TRUE(c.isOk());
  {
    asio::ip::tcp::socket peer(io);
    acceptor.accept(peer);
    auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while ((*c)->counters().frames_sent == 0 && std::chrono::steady_clock::now() < deadline) std::this_thread::yield();
    ASSERT_GT((*c)->counters().frames_sent, 0u);
  }  // closed
  const double cpu0 = processCpuSeconds();
  std::this_thread::sleep_for(std::chrono::seconds(1));  // measuring idle CPU over a second, not synchronising
  const double used = processCpuSeconds() - cpu0;
  EXPECT_LT(used, 0.3) << "the client thread spun on the closed connection";
  (*c)->stop();
}

TEST(TelemetryClientTest, WithoutACoordinatorRecordsAreBoundedAndCounted) {
  CollectiveTracker t;
  TelemetryClientOptions o;
  o.port = 1;  // nothing listens there
  o.token = jobToken();
  o.interval_s = 0.01;
  o.queue_capacity = 100;
  auto c = TelemetryClient::start(o, t);
  ASSERT_TRUE(c.isOk());
  for (int i = 0; i < 1000; ++i) t.end(t.begin(CollectiveOp::kAllreduce, 8), true);
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while ((*c)->counters().records_dropped < 900 && std::chrono::steady_clock::now() < deadline) std::this_thread::yield();
  EXPECT_GE((*c)->counters().records_dropped, 900u);
  EXPECT_EQ((*c)->counters().frames_sent, 0u);
  (*c)->stop();
}

}  // namespace
}  // namespace trainsup
