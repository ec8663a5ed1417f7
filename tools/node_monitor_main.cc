// trainsup_node_monitor: runs one host's node monitor by itself — for test harnesses and manual
// runs before the launcher (issue #6) starts one per host. Ranks on this host set
// TRAINSUP_COORDINATOR=unix:<socket>. Prints one JSON line when listening, then runs until stdin
// closes or SIGTERM/SIGINT, and prints its counters as a last JSON line.
//
//   trainsup_node_monitor --socket /run/trainsup/job.sock --coordinator 10.0.0.1:29600 --token <32 hex>
#include <signal.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <thread>

#include "trainsup/config.h"
#include "wait_for_end.h"
#include "trainsup/exit_codes.h"
#include "trainsup/node_monitor.h"

int main(int argc, char** argv) {
  CLI::App app{"trainsup node monitor: relays this host's rank telemetry to the job coordinator"};
  std::string token_hex, coordinator;
  trainsup::NodeMonitorOptions o;
  app.add_option("--socket", o.socket_path, "Unix socket path the ranks connect to")->required();
  app.add_option("--coordinator", coordinator, "host:port of the job coordinator")->required();
  app.add_option("--token", token_hex, "job token, 32 hex digits (TRAINSUP_JOB_TOKEN)")->required();
  app.add_option("--forward-interval-s", o.forward_interval_s, "batching interval");
  app.add_option("--queue-capacity", o.queue_capacity, "collective records kept while the coordinator is away");
  CLI11_PARSE(app, argc, argv);
  auto token = trainsup::parseJobToken(token_hex);
  if (!token) {
    std::fprintf(stderr, "trainsup_node_monitor: --token: %s\n", token.status().message().c_str());
    return trainsup::kExitBadConfig;
  }
  size_t colon = coordinator.rfind(':');
  if (colon == std::string::npos || colon == 0 || colon + 1 == coordinator.size() ||
      coordinator.find_first_not_of("0123456789", colon + 1) != std::string::npos) {
    std::fprintf(stderr, "trainsup_node_monitor: --coordinator '%s' is not host:port\n", coordinator.c_str());
    return trainsup::kExitBadConfig;
  }
  o.coordinator_host = coordinator.substr(0, colon);
  o.coordinator_port = static_cast<uint16_t>(std::stoi(coordinator.substr(colon + 1)));
  auto m = trainsup::NodeMonitor::start(o, *token);
  if (!m) {
    std::fprintf(stderr, "trainsup_node_monitor: %s\n", m.status().message().c_str());
    return trainsup::kExitBadConfig;
  }
  std::printf("%s\n", nlohmann::json({{"event", "listening"}, {"socket", o.socket_path}}).dump().c_str());
  std::fflush(stdout);
  trainsup::tools::waitForEnd();
  (*m)->stop();
  auto c = (*m)->counters();
  std::printf("%s\n", nlohmann::json({{"event", "counters"},
                                      {"local_connections", c.local_connections},
                                      {"records_in", c.records_in},
                                      {"records_forwarded", c.records_forwarded},
                                      {"records_dropped", c.records_dropped},
                                      {"dropped_frames", c.dropped_frames},
                                      {"coordinator_connects", c.coordinator_connects},
                                      {"aborts_relayed", c.aborts_relayed}})
                          .dump()
                          .c_str());
  return 0;
}
