// Cost of one Supervisor::step() scope with the watchdog thread running, measured side by
// side with the same loop without the scope, interleaved over several rounds so that machine
// noise hits both alike. Prints a table, then one JSON line:
//   {"bench":"step_overhead","step_overhead_ns":...,"empty_loop_ns":...,"step_loop_ns":...,...}
// Target (issue #2): step_overhead_ns < 1000.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <string>
#include <unistd.h>
#include <vector>

#include "trainsup/supervisor.h"

namespace {

// Work the loop does either way, so the compiler cannot delete the empty loop.
inline void body(uint64_t& acc, int64_t i) {
  acc = acc * 6364136223846793005ULL + static_cast<uint64_t>(i);
  asm volatile("" : "+r"(acc));
}

double nsPerIter(std::chrono::steady_clock::duration d, int64_t n) {
  return std::chrono::duration<double, std::nano>(d).count() / static_cast<double>(n);
}

}  // namespace

int main(int argc, char** argv) {
  const int64_t iters = argc > 1 ? std::atoll(argv[1]) : 2'000'000;
  const int rounds = 7;
  std::string dir = (std::filesystem::temp_directory_path() / ("trainsup_bench_" + std::to_string(getpid()))).string();
  trainsup::Config config;
  config.log_dir = dir;
  config.log_to_stderr = false;
  config.identity.host = "bench";
  auto sup = trainsup::Supervisor::create(config);
  if (!sup) {
    std::fprintf(stderr, "%s\n", sup.status().toString().c_str());
    return 1;
  }
  trainsup::Supervisor& s = **sup;
  uint64_t acc = 1;
  std::vector<double> empty_ns, step_ns, overhead;
  for (int r = 0; r < rounds; ++r) {
    auto t0 = std::chrono::steady_clock::now();
    for (int64_t i = 0; i < iters; ++i) body(acc, i);
    auto t1 = std::chrono::steady_clock::now();
    for (int64_t i = 0; i < iters; ++i) {
      auto scope = s.step(i);
      body(acc, i);
    }
    auto t2 = std::chrono::steady_clock::now();
    empty_ns.push_back(nsPerIter(t1 - t0, iters));
    step_ns.push_back(nsPerIter(t2 - t1, iters));
    overhead.push_back(step_ns.back() - empty_ns.back());
    std::printf("round %d: empty %.2f ns/iter, with step scope %.2f ns/iter, overhead %.2f ns\n", r, empty_ns.back(),
                step_ns.back(), overhead.back());
  }
  auto median = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
  };
  bool watchdog_alive = s.progress().stats(trainsup::kStepSection).count == iters * rounds;
  s.close();
  std::filesystem::remove_all(dir);
  std::printf("{\"bench\":\"step_overhead\",\"step_overhead_ns\":%.2f,\"empty_loop_ns\":%.2f,\"step_loop_ns\":%.2f,"
              "\"iterations\":%lld,\"rounds\":%d,\"steps_counted\":%s,\"checksum\":%llu}\n",
              median(overhead), median(empty_ns), median(step_ns), static_cast<long long>(iters), rounds,
              watchdog_alive ? "true" : "false", static_cast<unsigned long long>(acc % 1000));
  return 0;
}
