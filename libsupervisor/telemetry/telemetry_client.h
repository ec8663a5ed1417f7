// telemetry/telemetry_client.h — a rank's telemetry to the job coordinator (issue #5, first cut).
//
// Contract: one background thread. Every `interval_s` it sends a heartbeat and every collective
// record of the CollectiveTracker that is new (its enter) or newly completed (its exit), plus
// queued stall reports, in token-authenticated frames over TCP. It never blocks the training
// loop: records wait in a bounded queue (`queue_capacity`; when the coordinator is slow or gone
// the oldest are dropped and counted) and the connection is re-established every `interval_s`
// until stop(). Abort orders from the coordinator are read as they arrive (the thread polls
// the connection between sends) and handed to on_abort. Each (re)connection starts with a hello (rank, local rank, host, GPU). stop() sends
// what is pending and a goodbye (a normal end, so that no verdict follows), is idempotent and
// joins the thread; the destructor calls it. The coordinator is `host:port` over TCP or, with
// `unix_path`, the node monitor of this host (trainsup/node_monitor.h).
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "trainsup/collective_tracker.h"
#include "trainsup/export.h"
#include "trainsup/status.h"
#include "telemetry/telemetry_wire.h"

namespace trainsup {

struct TelemetryClientOptions {
  std::string host = "127.0.0.1";
  uint16_t port = 0;
  std::string unix_path;  // set: connect to a node monitor's Unix socket instead of host:port
  JobToken token{};
  int rank = 0;
  // Sent in a hello record on every (re)connection, so that verdicts can name them.
  int local_rank = 0;
  std::string node_name;  // the host
  std::string gpu;        // "index:uuid", empty when unknown
  // Where the training loop is, for each heartbeat (called on the client's thread; must be
  // safe there, e.g. a ProgressTracker snapshot). Unset: heartbeats carry no section.
  std::function<void(WireHeartbeat&)> progress;
  double interval_s = 0.2;
  size_t queue_capacity = 16384;
  // Called (on the client's thread) when the coordinator orders the job to abort.
  std::function<void(const WireAbort&)> on_abort;
};

class TRAINSUP_EXPORT TelemetryClient {
 public:
  static Result<std::unique_ptr<TelemetryClient>> start(TelemetryClientOptions options,
                                                        CollectiveTracker& tracker = CollectiveTracker::global());
  ~TelemetryClient();
  TelemetryClient(const TelemetryClient&) = delete;
  TelemetryClient& operator=(const TelemetryClient&) = delete;

  // Queues a stall report (this rank's watchdog found a section over its budget).
  void reportStall(const std::string& section, int64_t step);
  void stop();
  // Tells the coordinator that this rank was asked to stop (SIGTERM/SIGINT: a scheduler taking
  // the node back) and is leaving on purpose, so that its peers waiting on it in a collective,
  // its silence or its exit are reported as stopped_rank, not as a fault of its host. Sent at
  // once and again on every reconnection. Idempotent; any thread.
  void reportStopping();
  // Stops like stop(), saying that this rank is ending with an error of its own (an exception
  // in the training code), so the coordinator reports failed_rank, not a dead rank.
  void stopFailed();
  // Stops without a goodbye and closes the connection: what a crash looks like to the
  // coordinator (for tests and harnesses). Idempotent; stop() afterwards does nothing.
  void dropConnection();

  struct Counters {
    uint64_t frames_sent = 0, records_sent = 0, records_dropped = 0, connects = 0, send_errors = 0;
  };
  Counters counters() const;

  struct Impl;

 private:
  explicit TelemetryClient(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace trainsup
