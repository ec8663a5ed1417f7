// trainsup/coordinator.h — the job coordinator: receives every rank's telemetry over TCP
// (Boost.Asio), feeds the Detector, and reports verdicts (issue #5; the first cut).
//
// Contract: start() binds `bind_address:port` (loopback and an ephemeral port by default, so
// another job or user on the host cannot reach it unless configured), and runs one I/O thread.
// Frames must carry the job token (trainsup/job_token.h); anything else is counted and
// dropped, and a peer's garbage never reaches the detector. Each connection's ranks are the
// ranks its records name; when a connection closes, those ranks are reported to the detector
// as disconnected (a crashed rank). Every evaluate_interval_s the detector is evaluated on the
// coordinator's own monotonic clock and each new verdict goes to `on_verdict`, on the I/O
// thread; also at once when a rank's connection closes, and when a silence timeout or a
// collective's budget expires between two ticks (Detector::nextDeadlineNs), so that a timeout
// is judged when it runs out, not up to a tick later. After the first verdict that the job cannot outlive (any kind but straggler) every
// connected rank is sent an abort frame naming the culprit (abort_on_verdict), and so is every
// connection accepted after it (a rank still starting when the verdict came); a straggler is
// reported and the job goes on. Ranks and node monitors say who they are in hello records, and
// a rank's departure (a WireGone record, or its connection closing) is a dead rank unless it
// said goodbye. The connection that last said hello for a rank is the only one that speaks for
// it: that rank's records on other connections (replayed frames, a stale connection) are
// dropped and counted, and only that connection's closing is the rank's departure. The token
// is the authentication: a peer that has it can still impersonate a rank with a hello. Garbage
// bytes, malformed frames and failed accepts are counted; none stops the coordinator. Once the abort order went out, later verdicts (ranks leaving because of it,
// collectives left open) are consequences: counted, not reported. A node monitor that says its
// ranks moved (kGoneMoved: its agent follows a coordinator elected since, a takeover) deposes this
// one: from then on it reports and orders nothing (deposed_verdicts counts what it found).
// stop() is idempotent and joins the thread; the destructor calls it.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "trainsup/detector.h"
#include "trainsup/export.h"
#include "trainsup/job_token.h"
#include "trainsup/status.h"

namespace trainsup {

struct CoordinatorOptions {
  std::string bind_address = "127.0.0.1";
  uint16_t port = 0;  // 0: pick a free port (see Coordinator::port())
  double evaluate_interval_s = 0.1;
  bool abort_on_verdict = true;  // tell every connected rank to abort after the first fatal verdict
  // > 0: a coordinator taking over a running job; every rank given a host in start()'s rank
  // table (its predecessor had heard from it) and not heard from within this many seconds of
  // start is a silent rank (Detector::expectRanks).
  double expect_ranks_within_s = 0;
  // How often the I/O thread copies the detector's state for snapshot() (O(ranks) each time).
  double snapshot_interval_s = 1.0;
};

class TRAINSUP_EXPORT Coordinator {
 public:
  using OnVerdict = std::function<void(const Verdict&)>;
  static Result<std::unique_ptr<Coordinator>> start(std::vector<RankInfo> ranks, const JobToken& token,
                                                    CoordinatorOptions options, DetectorOptions detector,
                                                    OnVerdict on_verdict);
  ~Coordinator();
  Coordinator(const Coordinator&) = delete;
  Coordinator& operator=(const Coordinator&) = delete;

  uint16_t port() const;
  void stop();
  // The hosts whose links are slow now (Detector::setSlowHosts), from any thread; applied on
  // the coordinator's I/O thread before its next evaluation.
  void setSlowHosts(std::vector<std::string> hosts);

  struct Counters {
    uint64_t connections = 0, frames = 0, records = 0, dropped_frames = 0, verdicts = 0;
    uint64_t consequences = 0;  // verdicts after the abort order: counted, not reported
    uint64_t garbage_bytes = 0;        // bytes skipped looking for a frame's start (not a frame)
    uint64_t conflicting_records = 0;  // records of a rank that said hello on another connection
    uint64_t accept_errors = 0;        // failed accepts (e.g. out of descriptors), retried
    uint64_t deposed_verdicts = 0;     // verdicts after a node monitor moved to a new coordinator:
                                       // counted, not reported (this one was replaced)
    uint64_t unknown_group_records = 0;  // collective records naming a group nobody claimed: dropped
    uint64_t bad_group_claims = 0;       // group claims contradicting the known members: dropped
  };
  Counters counters() const;
  // What the coordinator knows of every rank (from start() and the hellos since), for a
  // successor to start from. Thread-safe.
  std::vector<RankInfo> knownRanks() const;
  // The detector's state (Detector::snapshot) as of the last copy, at most snapshot_interval_s
  // old (empty before the first). Thread-safe.
  DetectorSnapshot snapshot() const;

  struct Impl;  // implementation detail (libsupervisor/agent/coordinator.cc)

 private:
  explicit Coordinator(std::unique_ptr<Impl> impl);
  std::shared_ptr<Impl> impl_;
};

}  // namespace trainsup
