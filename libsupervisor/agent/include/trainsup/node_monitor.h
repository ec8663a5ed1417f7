// trainsup/node_monitor.h — one per host: relays the telemetry of the host's ranks (Unix domain
// socket) to the job coordinator (TCP), and the coordinator's abort order back to them.
//
// Contract: start() creates the socket at `socket_path` (replacing a stale one; mode 0600, so
// only the job's user can connect) and runs one Boost.Asio I/O thread. Ranks connect with
// TelemetryClient (TRAINSUP_COORDINATOR=unix:<path>). Frames must carry the job token; anything
// else is counted and dropped. Records are batched every `forward_interval_s`: stall reports,
// hellos and departures first, then collective records in arrival order, then the newest
// heartbeat of each rank (older ones add nothing). While the coordinator is slow or away, at
// most `queue_capacity` collective records wait; the oldest are dropped and counted, so memory
// stays bounded and a rank never blocks. The connection to the coordinator is re-established
// every `forward_interval_s` (each attempt bounded by `connect_timeout_s`); after connecting,
// the hellos of every local rank are sent again, so a coordinator that took over learns them.
// setCoordinator() points the monitor at another coordinator (takeover); the one it leaves is
// first told that each local rank moved (kGoneMoved), so that it judges nobody from then on
// instead of taking the departures for deaths. When a local rank's
// connection closes, a departure record (WireGone) is forwarded for each rank it spoke for,
// unless the rank said goodbye itself (a normal exit). Abort frames from the coordinator are
// relayed to every local rank. stop() is idempotent and joins the thread; the destructor
// calls it and removes the socket file.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "trainsup/export.h"
#include "trainsup/job_token.h"
#include "trainsup/status.h"

namespace trainsup {

struct NodeMonitorOptions {
  std::string socket_path;                 // required
  std::string coordinator_host = "127.0.0.1";
  uint16_t coordinator_port = 0;           // 0: no coordinator yet (see setCoordinator)
  double forward_interval_s = 0.05;
  double connect_timeout_s = 2.0;
  size_t queue_capacity = size_t{1} << 16;  // collective records waiting for the coordinator
};

class TRAINSUP_EXPORT NodeMonitor {
 public:
  static Result<std::unique_ptr<NodeMonitor>> start(NodeMonitorOptions options, const JobToken& token);
  ~NodeMonitor();
  NodeMonitor(const NodeMonitor&) = delete;
  NodeMonitor& operator=(const NodeMonitor&) = delete;

  // Forward to this coordinator from now on (thread-safe).
  void setCoordinator(const std::string& host, uint16_t port);
  const std::string& socketPath() const;
  // Sends an abort order to every rank connected here, as if from the coordinator (thread-safe):
  // for this host's agent, when the job's verdict is published but no coordinator can give the
  // order (the coordinator's host was the one lost). Counted in aborts_relayed.
  void abortLocalRanks(int32_t culprit_rank, const std::string& kind, const std::string& host);
  void stop();

  struct Counters {
    uint64_t local_connections = 0, frames_in = 0, records_in = 0, dropped_frames = 0;
    uint64_t records_forwarded = 0, records_dropped = 0, coordinator_connects = 0, aborts_relayed = 0;
    uint64_t garbage_bytes = 0;  // bytes skipped looking for a frame's start
    uint64_t accept_errors = 0;  // failed accepts (e.g. out of descriptors), retried
    bool coordinator_connected = false;
  };
  Counters counters() const;

  struct Impl;  // implementation detail (libsupervisor/agent/node_monitor.cc)

 private:
  NodeMonitor() = default;
  std::shared_ptr<Impl> impl_;
};

}  // namespace trainsup
