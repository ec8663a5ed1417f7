// trainsup_coordinator: runs a job coordinator by itself — for test harnesses and manual runs
// before the launcher (issue #6) elects one. Prints one JSON line when listening and one per
// verdict on stdout, and runs until stdin closes or SIGTERM/SIGINT.
//
//   trainsup_coordinator --world 4 --token <32 hex> [--port 0] [--hosts a,b,c,d]
//                        [--hang-floor-s 5] [--heartbeat-timeout-s 5]
#include <signal.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>

#include "trainsup/config.h"
#include "wait_for_end.h"
#include "trainsup/coordinator.h"
#include "trainsup/exit_codes.h"

int main(int argc, char** argv) {
  CLI::App app{"trainsup job coordinator: telemetry in, verdicts out (JSON lines)"};
  int world = 1;
  std::string token_hex, hosts_csv, bind = "127.0.0.1";
  int port = 0;
  trainsup::DetectorOptions d;
  app.add_option("--world", world, "number of ranks")->required()->check(CLI::PositiveNumber);
  app.add_option("--token", token_hex, "job token, 32 hex digits (TRAINSUP_JOB_TOKEN of the ranks)")->required();
  app.add_option("--port", port, "TCP port (0: any free one, printed)")->check(CLI::Range(0, 65535));
  app.add_option("--bind", bind, "address to listen on");
  app.add_option("--hosts", hosts_csv, "host of each rank, comma-separated, in rank order");
  app.add_option("--hang-floor-s", d.hang_floor_s, "smallest collective budget");
  app.add_option("--heartbeat-timeout-s", d.heartbeat_timeout_s, "telemetry silence that names a rank");
  app.add_option("--network-grace-s", d.network_grace_s,
                 "how long past its budget a collective every rank entered waits for the network")
      ->check(CLI::NonNegativeNumber);
  std::string op_budgets;
  app.add_option("--collective-budgets", op_budgets, "fixed budgets by op, e.g. allreduce=30,broadcast=120");
  CLI11_PARSE(app, argc, argv);
  if (trainsup::Status s = trainsup::parseOpBudgets(op_budgets, d); !s.isOk()) {
    std::fprintf(stderr, "trainsup_coordinator: --collective-budgets: %s\n", s.message().c_str());
    return trainsup::kExitBadConfig;
  }
  auto token = trainsup::parseJobToken(token_hex);
  if (!token) {
    std::fprintf(stderr, "trainsup_coordinator: --token: %s\n", token.status().message().c_str());
    return trainsup::kExitBadConfig;
  }
  std::vector<trainsup::RankInfo> ranks;
  std::stringstream ss(hosts_csv);
  for (int r = 0; r < world; ++r) {
    std::string host;
    if (!std::getline(ss, host, ',')) host = "rank" + std::to_string(r);
    ranks.push_back({r, 0, host, ""});
  }
  trainsup::CoordinatorOptions o;
  o.bind_address = bind;
  o.port = static_cast<uint16_t>(port);
  auto c = trainsup::Coordinator::start(ranks, *token, o, d, [](const trainsup::Verdict& v) {
    nlohmann::json j = {{"event", "verdict"}, {"kind", trainsup::verdictKindName(v.kind)}, {"ranks", v.ranks},
                        {"hosts", v.hosts}, {"local_ranks", v.local_ranks}, {"gpus", v.gpus}, {"seq", v.seq}, {"op", v.op}, {"group", v.group}, {"other_op", v.other_op}, {"section", v.section}, {"step", v.step},
                        {"evidence", v.evidence}};
    std::printf("%s\n", j.dump().c_str());
    std::fflush(stdout);
  });
  if (!c) {
    std::fprintf(stderr, "trainsup_coordinator: %s\n", c.status().message().c_str());
    return 1;
  }
  std::printf("%s\n", nlohmann::json({{"event", "listening"}, {"port", (*c)->port()}}).dump().c_str());
  std::fflush(stdout);
  trainsup::tools::waitForEnd();
  (*c)->stop();
  // What it received, for whoever reads its output (tests, operators): the last line.
  const auto k = (*c)->counters();
  std::printf("%s\n", nlohmann::json({{"event", "stopped"},
                                      {"connections", k.connections},
                                      {"frames", k.frames},
                                      {"records", k.records},
                                      {"dropped_frames", k.dropped_frames},
                                      {"verdicts", k.verdicts},
                                      {"unknown_group_records", k.unknown_group_records},
                                      {"bad_group_claims", k.bad_group_claims}})
                          .dump()
                          .c_str());
  std::fflush(stdout);
  return 0;
}
