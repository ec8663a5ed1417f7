// How many ranks one coordinator core keeps up with. Simulated node monitors (8 ranks each)
// send, over loopback TCP, what a rank sends through its node monitor, in one of two modes:
// - world: 10 collective records per second (synchronized collectives, every rank in each) and
//   1 heartbeat per second;
// - mesh (issue 20): the record rate of a tensor-parallel job on a DeviceMesh: each node is one
//   tp group of 8, the ranks with the same local index across nodes form a dp group; per rank
//   per second 40 tp all-reduce records and 10 dp reduce-scatter records, each matched in its
//   own group, plus 1 heartbeat; every rank first claims its place in both groups.
// The coordinator runs its real decode + detector path on its one I/O thread.
//
// Two phases, each in real time for `seconds`:
//   1. `ranks` simulated ranks: the coordinator must process every record sent (it keeps up)
//      and raise no verdict; its CPU time (process CPU minus this program's own threads) over
//      the wall time is its load.
//   2. the extrapolated capacity ranks x (1 / load), capped at 4x `ranks`, run again to check
//      that it keeps up there too; the figure reported is the largest rank count that kept up
//      with the coordinator's load at most one core.
// Final line: {"bench":"coordinator", "coordinator_ranks_per_core": ..., ...}
//
//   trainsup_bench_coordinator [ranks=16384] [seconds=5] [world|mesh]
#include <pthread.h>
#include <sys/resource.h>
#include <time.h>

#include <algorithm>
#include <atomic>
#include <boost/asio.hpp>
#include <chrono>
#include <cstdio>
#include <random>
#include <string>
#include <thread>

#include "telemetry/telemetry_wire.h"
#include "trainsup/coordinator.h"

namespace {

namespace asio = boost::asio;
using asio::ip::tcp;
using Clock = std::chrono::steady_clock;
constexpr int kRanksPerNode = 8;

double cpuSeconds(clockid_t id) {
  timespec ts{};
  clock_gettime(id, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) / 1e9;
}
double threadCpu() { return cpuSeconds(CLOCK_THREAD_CPUTIME_ID); }

trainsup::JobToken token() {
  trainsup::JobToken t;
  t.fill(0x77);
  return t;
}

struct Phase {
  int ranks = 0;
  double wall_s = 0, coordinator_cpu_s = 0, load = 0;
  uint64_t sent = 0, processed = 0, verdicts = 0;
  bool kept_up = false;
};

Phase run(int ranks, double seconds, bool mesh) {
  Phase out;
  out.ranks = ranks;
  std::vector<trainsup::RankInfo> infos;
  for (int r = 0; r < ranks; ++r) infos.push_back({r, r % kRanksPerNode, "node-" + std::to_string(r / kRanksPerNode), ""});
  std::atomic<uint64_t> verdicts{0};
  trainsup::DetectorOptions d;
  auto coord = trainsup::Coordinator::start(infos, token(), {}, d, [&](const trainsup::Verdict& v) {
    if (verdicts.fetch_add(1) < 3) std::fprintf(stderr, "  unexpected verdict: %s\n", v.evidence.c_str());
  });
  if (!coord) {
    std::fprintf(stderr, "coordinator: %s\n", coord.status().toString().c_str());
    std::exit(1);
  }
  // This program's threads: main (idle, waiting) and the generator; the rest of the process
  // CPU time is the coordinator's I/O thread.
  const double main_cpu0 = threadCpu();
  double gen_cpu = 0;
  uint64_t sent = 0;
  const double proc0 = cpuSeconds(CLOCK_PROCESS_CPUTIME_ID);
  const auto t0 = Clock::now();
  std::thread gen([&] {
    const double start_cpu = threadCpu();
    asio::io_context io;
    const int nodes = (ranks + kRanksPerNode - 1) / kRanksPerNode;
    std::vector<tcp::socket> sockets;
    for (int n = 0; n < nodes; ++n) {
      sockets.emplace_back(io);
      sockets.back().connect({asio::ip::make_address("127.0.0.1"), (*coord)->port()});
    }
    std::mt19937 rng(1);
    const auto tick = std::chrono::milliseconds(100);  // 10 collectives per second per rank
    uint64_t seq = 0;
    constexpr int kTpPerTick = 4;  // mesh: 40 tp records per rank per second, plus 10 dp ones
    const uint64_t kTpGroup = 1'000'000, kDpGroup = 2'000'000;
    if (mesh) {  // each rank's claims, as a TelemetryClient sends them on connecting
      for (int n = 0; n < nodes; ++n) {
        trainsup::WireMessage m;
        m.type = trainsup::WireType::kGroup;
        for (int r = n * kRanksPerNode; r < std::min(ranks, (n + 1) * kRanksPerNode); ++r) {
          trainsup::WireGroup tp{r, kTpGroup + static_cast<uint64_t>(n), r % kRanksPerNode, kRanksPerNode, "mesh_tp"};
          trainsup::WireGroup dp{r, kDpGroup + static_cast<uint64_t>(r % kRanksPerNode), n, nodes, "mesh_dp"};
          m.groups.push_back(tp);
          m.groups.push_back(dp);
        }
        asio::write(sockets[n], asio::buffer(trainsup::encodeFrame(m, token())));
        sent += m.groups.size();
      }
    }
    int64_t clock_ns = 1'000'000'000;
    auto next = Clock::now();
    const int ticks = static_cast<int>(seconds * 10);
    for (int k = 0; k < ticks; ++k) {
      ++seq;
      clock_ns += 100'000'000;
      for (int n = 0; n < nodes; ++n) {
        std::string batch;
        trainsup::WireMessage m;
        m.type = trainsup::WireType::kCollectives;
        for (int r = n * kRanksPerNode; r < std::min(ranks, (n + 1) * kRanksPerNode); ++r) {
          int64_t wait = 1'000'000 + static_cast<int64_t>(rng() % 3'000'000);  // 1-4 ms, no one always last
          if (!mesh) {
            m.collectives.push_back({r, 0, seq, -1, static_cast<uint8_t>(trainsup::CollectiveOp::kAllreduce),
                                     1 << 20, clock_ns, clock_ns + wait});
            continue;
          }
          for (int i = 0; i < kTpPerTick; ++i) {
            m.collectives.push_back({r, kTpGroup + static_cast<uint64_t>(n), (seq - 1) * kTpPerTick + i + 1, -1,
                                     static_cast<uint8_t>(trainsup::CollectiveOp::kAllreduce), 1 << 16, clock_ns,
                                     clock_ns + wait / 8});
          }
          m.collectives.push_back({r, kDpGroup + static_cast<uint64_t>(r % kRanksPerNode), seq, -1,
                                   static_cast<uint8_t>(trainsup::CollectiveOp::kReduceScatter), 1 << 20, clock_ns,
                                   clock_ns + wait});
        }
        batch += trainsup::encodeFrame(m, token());
        if (k % 10 == n % 10) {  // each rank's heartbeat once a second, spread over the ticks
          trainsup::WireMessage hb;
          hb.type = trainsup::WireType::kHeartbeat;
          for (int r = n * kRanksPerNode; r < std::min(ranks, (n + 1) * kRanksPerNode); ++r) {
            trainsup::WireHeartbeat h;
            h.rank = r;
            h.step = static_cast<int64_t>(seq);
            h.sent_ns = clock_ns;
            hb.heartbeats.push_back(h);
          }
          batch += trainsup::encodeFrame(hb, token());
          sent += hb.heartbeats.size();
        }
        asio::write(sockets[n], asio::buffer(batch));
        sent += m.collectives.size();
      }
      next += tick;
      std::this_thread::sleep_until(next);  // pacing the offered load, not synchronization
    }
    gen_cpu = threadCpu() - start_cpu;
    // Keep the connections open until the coordinator has read everything.
    auto deadline = Clock::now() + std::chrono::seconds(10);
    while ((*coord)->counters().records < sent && Clock::now() < deadline) std::this_thread::yield();
    out.processed = (*coord)->counters().records;
    out.verdicts = verdicts.load();
    (*coord)->stop();  // before the sockets close: a closing node would be a verdict
  });
  gen.join();
  out.wall_s = std::chrono::duration<double>(Clock::now() - t0).count();
  const double proc = cpuSeconds(CLOCK_PROCESS_CPUTIME_ID) - proc0;
  out.coordinator_cpu_s = std::max(0.0, proc - gen_cpu - (threadCpu() - main_cpu0));
  out.sent = sent;
  out.load = out.coordinator_cpu_s / (seconds);
  out.kept_up = out.processed == out.sent && out.verdicts == 0;
  std::printf("  %6d ranks: %llu records sent, %llu processed, coordinator CPU %.2f s over %.1f s (load %.3f of a core)%s\n",
              ranks, static_cast<unsigned long long>(out.sent), static_cast<unsigned long long>(out.processed),
              out.coordinator_cpu_s, seconds, out.load, out.kept_up ? "" : "  DID NOT KEEP UP");
  std::fflush(stdout);
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  const int ranks = argc > 1 ? std::atoi(argv[1]) : 16384;
  const double seconds = argc > 2 ? std::atof(argv[2]) : 5.0;
  const bool mesh = argc > 3 && std::string(argv[3]) == "mesh";
  rlimit lim{};
  getrlimit(RLIMIT_NOFILE, &lim);
  lim.rlim_cur = lim.rlim_max;
  setrlimit(RLIMIT_NOFILE, &lim);
  std::printf("coordinator benchmark (%s): %d ranks/node, %s + 1 heartbeat per rank per second\n",
              mesh ? "mesh" : "world", kRanksPerNode,
              mesh ? "40 tp (groups of 8) + 10 dp collective records" : "10 collective records");
  Phase first = run(ranks, seconds, mesh);
  int best = first.kept_up && first.load <= 1.0 ? ranks : 0;
  double load_at_best = first.load;
  if (first.kept_up && first.load > 0) {
    int target = static_cast<int>(std::min(4.0 * ranks, ranks / first.load));
    target -= target % kRanksPerNode;
    if (target > ranks && static_cast<rlim_t>(target / kRanksPerNode + 64) < lim.rlim_cur) {
      Phase second = run(target, seconds, mesh);
      if (second.kept_up && second.load <= 1.0) {
        best = target;
        load_at_best = second.load;
      }
    }
  }
  std::printf("{\"bench\":\"coordinator\",\"mode\":\"%s\",\"coordinator_ranks_per_core\":%d,\"load_at_that_size\":%.3f,"
              "\"ranks_tested\":%d,\"load_at_ranks_tested\":%.3f,\"records_per_rank_per_s\":%d,\"kept_up\":%s}\n",
              mesh ? "mesh" : "world", best, load_at_best, ranks, first.load, mesh ? 51 : 11,
              first.kept_up ? "true" : "false");
  return best >= ranks ? 0 : 1;
}
