// Hostile input on every socket: the coordinator (TCP) and a node monitor (Unix socket) are
// flooded from many connections with garbage, oversized and malformed frames, frames under a
// wrong token, half frames, and (coordinator) replays of a good rank's real frames, while two
// good ranks keep reporting. Neither stops, neither reaches a verdict about the good ranks,
// both count what they dropped, memory stays bounded, and a real fault afterwards is still
// named with its host at once.
#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <boost/asio.hpp>
#include <chrono>
#include <fstream>
#include <random>
#include <thread>

#include "trainsup/coordinator.h"
#include "telemetry/telemetry_wire.h"
#include "trainsup/node_monitor.h"
#include "../test_util.h"
#include "verdict_sink.h"

namespace trainsup {
namespace {

namespace asio = boost::asio;
using asio::ip::tcp;
using asio::local::stream_protocol;
using std::chrono::milliseconds;
using std::chrono::seconds;
using SteadyClock = std::chrono::steady_clock;

JobToken jobToken() {
  JobToken t;
  for (size_t i = 0; i < t.size(); ++i) t[i] = static_cast<uint8_t>(0x30 + i);
  return t;
}

// What thousands of closed connections may add to resident memory: their buffers (64 KiB each)
// must be freed. ThreadSanitizer's shadow memory grows with any allocation, so more there.
#if defined(__SANITIZE_THREAD__)
constexpr size_t kMemorySlack = 128u << 20;
#else
constexpr size_t kMemorySlack = 48u << 20;
#endif

// Resident memory of this process, in bytes.
size_t rssBytes() {
  std::ifstream statm("/proc/self/statm");
  size_t pages = 0, resident = 0;
  statm >> pages >> resident;
  return resident * static_cast<size_t>(sysconf(_SC_PAGESIZE));
}

WireMessage hello(int rank) {
  WireMessage m;
  m.type = WireType::kHello;
  WireHello h;
  h.rank = rank;
  std::snprintf(h.host, sizeof(h.host), "good-%d", rank);
  m.hellos.push_back(h);
  return m;
}

WireMessage heartbeat(int rank) {
  WireMessage m;
  m.type = WireType::kHeartbeat;
  WireHeartbeat hb;
  hb.rank = rank;
  hb.step = 3;
  m.heartbeats.push_back(hb);
  return m;
}

WireMessage collective(int rank, uint64_t seq) {
  WireMessage m;
  m.type = WireType::kCollectives;
  m.collectives.push_back({rank, 0, seq, -1, 1, 4096, 1000, 1500});
  return m;
}

// Everything a hostile or broken peer sends; `replay` is a real frame of good rank 0.
std::vector<std::string> hostilePayloads(std::mt19937_64& rng, const std::string& replay) {
  JobToken wrong = jobToken();
  wrong[5] ^= 0x40;
  std::vector<std::string> p;
  std::string garbage(4096, '\0');
  for (auto& c : garbage) c = static_cast<char>(rng());
  p.push_back(garbage);
  std::string oversized = encodeFrame(heartbeat(0), jobToken());
  const uint32_t huge = 0xFFFFFFF0u;
  std::memcpy(&oversized[8], &huge, 4);  // payload length field
  p.push_back(oversized);
  WireMessage forged;
  forged.type = WireType::kStall;
  WireStall st;
  st.rank = 1;
  std::snprintf(st.section, sizeof(st.section), "forged");
  forged.stalls.push_back(st);
  p.push_back(encodeFrame(forged, wrong));
  WireMessage gone;
  gone.type = WireType::kGone;
  gone.gones.push_back({0, kGoneClosed});
  p.push_back(encodeFrame(gone, wrong));
  std::string bad_version = encodeFrame(heartbeat(1), jobToken());
  bad_version[4] = 9;
  p.push_back(bad_version);
  std::string bad_type = encodeFrame(heartbeat(1), jobToken());
  bad_type[6] = 77;
  p.push_back(bad_type);
  std::string half = encodeFrame(collective(0, 5), jobToken());
  p.push_back(half.substr(0, half.size() / 2));
  p.push_back(replay);
  return p;
}

// Two good ranks reporting every 10 ms over their own connections until stopped.
template <class Socket>
struct GoodRanks {
  std::atomic<bool> stop[2] = {false, false};
  std::vector<std::unique_ptr<Socket>> sockets;
  std::vector<std::thread> threads;
  void start(asio::io_context& io, const std::function<void(Socket&)>& connect) {
    for (int r = 0; r < 2; ++r) {
      sockets.push_back(std::make_unique<Socket>(io));
      connect(*sockets.back());
      asio::write(*sockets.back(), asio::buffer(encodeFrame(hello(r), jobToken())));
    }
    for (int r = 0; r < 2; ++r) {
      threads.emplace_back([this, r] {
        for (uint64_t seq = 1; !stop[r]; ++seq) {
          std::string frames = encodeFrame(heartbeat(r), jobToken()) + encodeFrame(collective(r, seq), jobToken());
          boost::system::error_code ec;
          asio::write(*sockets[r], asio::buffer(frames), ec);
          if (ec) return;
          std::this_thread::sleep_for(milliseconds(10));  // the ranks' reporting period
        }
      });
    }
  }
  // Rank r stops reporting (its thread ends) and its connection closes, as when it crashes.
  void kill(int r) {
    stop[r] = true;
    if (threads[r].joinable()) threads[r].join();
    sockets[r]->close();
  }
  void join() {
    for (int r = 0; r < 2; ++r) {
      stop[r] = true;
      if (threads[r].joinable()) threads[r].join();
    }
  }
};

// `threads` attackers, each opening connection after connection for `duration`, sending one
// hostile payload and closing; every 8th connection is left open (slow or stuck peers).
template <class Socket>
uint64_t flood(const std::function<void(Socket&)>& connect, const std::vector<std::string>& payloads, int threads,
               std::chrono::milliseconds duration, std::vector<std::unique_ptr<Socket>>& kept, asio::io_context& io) {
  std::atomic<uint64_t> made{0};
  std::mutex kept_mu;
  std::vector<std::thread> ts;
  const auto end = SteadyClock::now() + duration;
  for (int t = 0; t < threads; ++t) {
    ts.emplace_back([&, t] {
      for (uint64_t i = t; SteadyClock::now() < end; i += threads) {
        auto s = std::make_unique<Socket>(io);
        try {
          connect(*s);
        } catch (const std::exception&) {
          continue;  // out of descriptors on our side: the server must outlive this too
        }
        boost::system::error_code ec;
        asio::write(*s, asio::buffer(payloads[i % payloads.size()]), ec);
        ++made;
        if (i % 8 == 0) {
          std::lock_guard<std::mutex> lock(kept_mu);
          if (kept.size() < 64) kept.push_back(std::move(s));
        }
      }
    });
  }
  for (auto& t : ts) t.join();
  return made;
}

TEST(HostileInputTest, TheCoordinatorOutlivesAFloodAndStillNamesARealFault) {
  testing::VerdictSink verdicts;
  DetectorOptions d;
  d.heartbeat_timeout_s = 2;
  std::vector<RankInfo> table = {{0, 0, "good-0", ""}, {1, 0, "good-1", ""}};
  auto c = Coordinator::start(table, jobToken(), {}, d, verdicts.callback());
  ASSERT_TRUE(c.isOk()) << c.status().toString();
  const tcp::endpoint at(asio::ip::make_address("127.0.0.1"), (*c)->port());
  std::function<void(tcp::socket&)> connect = [at](tcp::socket& s) { s.connect(at); };
  asio::io_context io;
  GoodRanks<tcp::socket> good;
  good.start(io, connect);
  std::mt19937_64 rng(7);
  const std::string replay = encodeFrame(heartbeat(0), jobToken()) + encodeFrame(collective(0, 2), jobToken());
  const auto payloads = hostilePayloads(rng, replay);
  const size_t rss_before = rssBytes();
  std::vector<std::unique_ptr<tcp::socket>> kept;
  const auto counted_before = (*c)->counters();
  const uint64_t made = flood<tcp::socket>(connect, payloads, 16, milliseconds(1500), kept, io);
  const size_t rss_after = rssBytes();
  // The good ranks were heard all along: their records keep arriving after the flood (they
  // report every 10 ms), and every hostile connection was accepted: those still in the listen
  // backlog when the flood ends are accepted soon after (a loaded machine, ThreadSanitizer).
  const uint64_t records = (*c)->counters().records;
  EXPECT_TRUE(testing::waitUntil([&] { return (*c)->counters().records > records; }, seconds(5)))
      << "the good ranks are no longer heard";
  EXPECT_TRUE(testing::waitUntil(
      [&] { return (*c)->counters().connections - counted_before.connections >= made; }, seconds(10)))
      << "accepted " << (*c)->counters().connections - counted_before.connections << " of " << made
      << " hostile connections";
  auto n = (*c)->counters();
  std::cout << "[measure] coordinator flood: " << made << " hostile connections in 1.5 s; dropped frames "
            << n.dropped_frames << ", garbage bytes " << n.garbage_bytes << ", conflicting (replayed) records "
            << n.conflicting_records << ", accept errors " << n.accept_errors << "; resident memory "
            << (static_cast<double>(rss_after) - static_cast<double>(rss_before)) / (1 << 20) << " MiB more\n";
  EXPECT_GT(made, 500u);
  EXPECT_GT(n.dropped_frames, 0u);
  EXPECT_GT(n.garbage_bytes, 0u);
  EXPECT_GT(n.conflicting_records, 0u);
  // Closed connections release their buffers (64 KiB each): thousands of them must not add up.
  EXPECT_LT(rss_after, rss_before + kMemorySlack) << "memory grew with the number of connections";
  {
    std::lock_guard<std::mutex> lock(verdicts.mu);
    for (const auto& v : verdicts.all) ADD_FAILURE() << "verdict during the flood: " << v.evidence;
  }
  // Now a real fault: good rank 1's connection closes. Named at once, with its host.
  good.kill(1);
  const auto t0 = SteadyClock::now();
  auto first = verdicts.first.get_future();
  ASSERT_EQ(first.wait_for(seconds(5)), std::future_status::ready);
  Verdict v = first.get();
  EXPECT_EQ(v.kind, VerdictKind::kDeadRank);
  EXPECT_EQ(v.ranks, std::vector<int>{1});
  EXPECT_EQ(v.hosts, std::vector<std::string>{"good-1"});
  EXPECT_LT(SteadyClock::now() - t0, seconds(2));
  good.join();
  (*c)->stop();
}

TEST(HostileInputTest, ANodeMonitorOutlivesAFloodOnItsSocket) {
  const std::string path = "/tmp/trainsup_hostile_" + std::to_string(getpid()) + ".sock";
  NodeMonitorOptions o;
  o.socket_path = path;
  o.forward_interval_s = 0.01;
  auto m = NodeMonitor::start(o, jobToken());
  ASSERT_TRUE(m.isOk()) << m.status().toString();
  std::function<void(stream_protocol::socket&)> connect = [path](stream_protocol::socket& s) {
    s.connect(stream_protocol::endpoint(path));
  };
  asio::io_context io;
  GoodRanks<stream_protocol::socket> good;
  good.start(io, connect);
  std::mt19937_64 rng(11);
  auto payloads = hostilePayloads(rng, encodeFrame(heartbeat(0), jobToken()));
  payloads.pop_back();  // the socket is the job user's own (mode 0600): no replaying stranger
  const size_t rss_before = rssBytes();
  std::vector<std::unique_ptr<stream_protocol::socket>> kept;
  const uint64_t made = flood<stream_protocol::socket>(connect, payloads, 16, milliseconds(1500), kept, io);
  const size_t rss_after = rssBytes();
  const uint64_t records = (*m)->counters().records_in;
  EXPECT_TRUE(testing::waitUntil([&] { return (*m)->counters().records_in > records; }, seconds(5)))
      << "the good ranks are no longer heard";
  auto n = (*m)->counters();
  std::cout << "[measure] node monitor flood: " << made << " hostile connections in 1.5 s; dropped frames "
            << n.dropped_frames << ", garbage bytes " << n.garbage_bytes << ", accept errors " << n.accept_errors
            << "; resident memory " << (static_cast<double>(rss_after) - static_cast<double>(rss_before)) / (1 << 20)
            << " MiB more\n";
  EXPECT_GT(made, 500u);
  EXPECT_GT(n.dropped_frames, 0u);
  EXPECT_GT(n.garbage_bytes, 0u);
  EXPECT_LT(rss_after, rss_before + kMemorySlack) << "memory grew with the number of connections";
  good.join();
  (*m)->stop();
}

}  // namespace
}  // namespace trainsup
