// The coordinator over real loopback TCP: ranks (as threads) send token-authenticated
// telemetry; a rank that stops, or whose connection closes, is named with its host.
#include "telemetry/telemetry_wire.h"
#include "trainsup/coordinator.h"
#include "verdict_sink.h"

#include <gtest/gtest.h>

#include <boost/asio.hpp>
#include <future>
#include <mutex>
#include <thread>

namespace trainsup {
namespace {

namespace asio = boost::asio;
using asio::ip::tcp;

JobToken jobToken() {
  JobToken t;
  for (size_t i = 0; i < t.size(); ++i) t[i] = static_cast<uint8_t>(0xA0 + i);
  return t;
}

std::vector<RankInfo> ranks(int n) {
  std::vector<RankInfo> r;
  for (int i = 0; i < n; ++i) r.push_back({i, 0, "node-" + std::to_string(i), ""});
  return r;
}

using Verdicts = testing::VerdictSink;

void send(tcp::socket& s, const WireMessage& m, const JobToken& token) {
  std::string frame = encodeFrame(m, token);
  asio::write(s, asio::buffer(frame));
}

WireMessage heartbeat(int rank) {
  WireMessage m;
  m.type = WireType::kHeartbeat;
  WireHeartbeat hb;
  hb.rank = rank;
  hb.step = 1;
  m.heartbeats.push_back(hb);
  return m;
}

TEST(CoordinatorTest, AClosedConnectionNamesTheRankAndHostAtOnce) {
  Verdicts v;
  DetectorOptions d;
  d.heartbeat_timeout_s = 30;
  CoordinatorOptions o;
  o.evaluate_interval_s = 30;  // judged as it closes, not at a tick
  auto c = Coordinator::start(ranks(2), jobToken(), o, d, v.callback());
  ASSERT_TRUE(c.isOk()) << c.status().toString();
  asio::io_context io;
  tcp::socket a(io), b(io);
  a.connect({asio::ip::make_address("127.0.0.1"), (*c)->port()});
  b.connect({asio::ip::make_address("127.0.0.1"), (*c)->port()});
  send(a, heartbeat(0), jobToken());
  send(b, heartbeat(1), jobToken());
  // Wait (bounded) until both heartbeats arrived, then "kill" rank 1.
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while ((*c)->counters().records < 2 && std::chrono::steady_clock::now() < deadline) std::this_thread::yield();
  auto t0 = std::chrono::steady_clock::now();
  b.close();
  auto fut = v.first.get_future();
  ASSERT_EQ(fut.wait_for(std::chrono::seconds(10)), std::future_status::ready);
  Verdict got = fut.get();
  EXPECT_EQ(got.kind, VerdictKind::kDeadRank);
  EXPECT_EQ(got.ranks, std::vector<int>{1});
  EXPECT_EQ(got.hosts, std::vector<std::string>{"node-1"});
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(2));
  (*c)->stop();
}

// A silence is judged when its timeout expires, not at the next evaluation tick: here the tick
// is 30 s and the timeout 1 s; the silent rank is named about a second after it was last heard.
TEST(CoordinatorTest, ASilenceIsJudgedWhenItsTimeoutExpiresNotAtTheNextTick) {
  Verdicts v;
  DetectorOptions d;
  d.heartbeat_timeout_s = 1;
  CoordinatorOptions o;
  o.evaluate_interval_s = 30;
  auto c = Coordinator::start(ranks(2), jobToken(), o, d, v.callback());
  ASSERT_TRUE(c.isOk()) << c.status().toString();
  asio::io_context io;
  tcp::socket a(io);
  a.connect({asio::ip::make_address("127.0.0.1"), (*c)->port()});
  auto t0 = std::chrono::steady_clock::now();
  send(a, heartbeat(0), jobToken());
  send(a, heartbeat(1), jobToken());
  auto fut = v.first.get_future();
  ASSERT_EQ(fut.wait_for(std::chrono::seconds(10)), std::future_status::ready) << "judged at the 30 s tick only";
  Verdict got = fut.get();
  EXPECT_EQ(got.kind, VerdictKind::kSilentRank) << got.evidence;
  EXPECT_GE(std::chrono::steady_clock::now() - t0, std::chrono::seconds(1));
  a.close();
  (*c)->stop();
}

TEST(CoordinatorTest, UnauthenticatedFramesNeverReachTheDetector) {
  Verdicts v;
  auto c = Coordinator::start(ranks(2), jobToken(), {}, {}, v.callback());
  ASSERT_TRUE(c.isOk());
  asio::io_context io;
  tcp::socket s(io);
  s.connect({asio::ip::make_address("127.0.0.1"), (*c)->port()});
  JobToken wrong = jobToken();
  wrong[0] ^= 1;
  // A forged stall report would name rank 1; it must be dropped.
  WireMessage m;
  m.type = WireType::kStall;
  WireStall st;
  st.rank = 1;
  std::snprintf(st.section, sizeof(st.section), "forged");
  m.stalls.push_back(st);
  send(s, m, wrong);
  send(s, heartbeat(0), jobToken());  // then a real one, to know the forged one was processed
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while ((*c)->counters().records < 1 && std::chrono::steady_clock::now() < deadline) std::this_thread::yield();
  EXPECT_EQ((*c)->counters().dropped_frames, 1u);
  EXPECT_EQ((*c)->counters().records, 1u);
  s.close();
  (*c)->stop();
  std::lock_guard<std::mutex> lock(v.mu);
  for (const auto& x : v.all) EXPECT_NE(x.kind, VerdictKind::kStalledRank) << x.evidence;
}

TEST(CoordinatorTest, ListensOnLoopbackByDefaultAndStopsTwice) {
  auto c = Coordinator::start(ranks(1), jobToken(), {}, {}, nullptr);
  ASSERT_TRUE(c.isOk());
  EXPECT_GT((*c)->port(), 0);
  (*c)->stop();
  (*c)->stop();
  CoordinatorOptions bad;
  bad.bind_address = "not-an-address";
  auto d = Coordinator::start(ranks(1), jobToken(), bad, {}, nullptr);
  ASSERT_FALSE(d.isOk());
  EXPECT_NE(d.status().message().find("not-an-address"), std::string::npos);
}

}  // namespace
}  // namespace trainsup
