// trainsup/detector.h — names the hung or slow rank from the rhythm of the collectives.
//
// Pure logic (no threads, no network, no clock of its own): the job coordinator feeds it the
// telemetry of every rank, stamped with the coordinator's clock on arrival, and calls
// evaluate(now) periodically. Collectives are matched per process group (issue 20): each rank
// claims its membership of a group (onGroup: its rank in it, the group's size, its description,
// e.g. a DeviceMesh dimension "mesh_tp"), and the detector assembles the members from the
// claims. A collective is (group, per-group seq); a point-to-point op is (group, sender,
// receiver, per-channel seq), whose two members are the sender and the receiver. Group 0 is the
// implicit group of all ranks (no claims needed). A record of a group nobody claimed, or from a
// rank that is not its member, is counted and dropped. It follows Alibaba's C4D:
// - hung collective: collective `seq` of a group was entered by some members and has not
//   completed within its budget (a multiple of a high percentile of that op's past durations,
//   with a floor and a warm-up allowance). Members that never entered it are the culprits —
//   unless such a member is itself waiting in another open collective (of any group) that some
//   of its members never entered: then the chain is followed to its root, the rank that is in
//   no collective (rank 0 waits in dp for rank 2, rank 2 in tp for rank 3: rank 3), and the
//   verdict names the root with the group, op and seq it never entered, and the chain. A chain
//   that closes on itself through collectives only (ranks that entered different collectives and
//   wait for each other) is a desync; one that closes through a point-to-point op ends at the
//   rank that issued it (an irecv posted early does not block its rank). If every member entered
//   and some completed, the ones that did not are; if every rank entered and none completed,
//   the fault is in communication: say so, name the participants. When every rank entered,
//   the verdict waits network_grace_s more: a network that drops out for a few seconds and
//   comes back (a link flap, a switch reconverging) holds the collective on every rank, or on
//   the rank still waiting for the last packets, until TCP's next retransmission, which backs
//   off (0.2, 0.6, 1.4, 3.0, 6.2 s after the loss): a partition that heals within the budget
//   is over by then and names nobody.
// - slow link: the launcher tells the detector which hosts report a slow network (their agents'
//   round trips to the rendezvous store, trainsup/launch/liveness.py). Packets lost or delayed there
//   hold collectives on healthy hosts too, and the rank left waiting is usually not the one on
//   the slow host. While any host is slow, a collective over its budget is first reported as a
//   straggler naming the slow host(s), and named hung only once open slow_link_multiplier x its
//   budget; a rank on a slow host gets the same multiple of the silence timeout. A slow host is
//   a straggler, not a dead one; a real hang is still named, later. A collective open while a
//   host was slow keeps that allowance after the link recovers: the stream it waits on is
//   still in TCP's backed-off retransmission (seen: held 0.75 s past the recovery).
// - late telemetry: heartbeats carry the rank's send time. Per rank the detector keeps the
//   smallest (arrival - send) seen, which absorbs the hosts' clock offset; what a heartbeat
//   takes above it is its transit delay. A rank whose last three heartbeats took
//   transit_lag_s or more (median), while the ranks of other hosts heard in the last second
//   took under half that, is lagging: its link is delaying its packets (a lossy link holds a
//   stream in TCP retransmission, which backs off to seconds). A rank that lagged within three
//   silence timeouts before it went silent gets slow_link_multiplier x the silence timeout,
//   like a rank on a host that reported its slow link: on a 30% lossy link the stream can
//   stall for 5 s before the agent's three slow round trips are measured. Delays on the
//   coordinator's side (its host starved of CPU) delay every host alike and mark nobody; one
//   host's ranks alone (nothing to compare with) are never marked.
// - desync: at the same (group, seq), members entered different ops, or the same op with
//   different sizes (allreduce, broadcast, reduce, allgather, reduce_scatter, barrier, send and
//   recv must agree): reported once every member entered it or it has been open for the hang
//   floor, naming the minority (all differing ranks when there is no majority) with both ops —
//   Flight Recorder's mismatch analysis, live. A program's error: no host is at fault.
// - a rank whose own watchdog reports a stall while it waits in an open collective that some
//   member never entered is not the culprit: the chain from it is resolved and its root named
//   at once (hung_rank), before any step budget can make a waiting rank look guilty.
// - silent rank: no telemetry for heartbeat_timeout_s (SIGSTOP, a frozen host), or its
//   connection closed (SIGKILL, a crash).
// - stalled rank: the rank's own watchdog reported a section over its budget.
// - stopped rank: any of the above about ranks that all said they were asked to stop (SIGTERM,
//   SIGINT) is reported as stopped_rank instead: their peers wait on them, they go silent or
//   exit because they are leaving on purpose, not because their host is broken.
// - straggler: no clock sync needed. In a synchronous collective the last rank to arrive waits
//   least, so per collective lateness(r) = max wait - wait(r), waits measured on each rank's
//   own clock. A rank that is the latest in most collectives of `straggler_windows` consecutive
//   windows, by a margin above straggler_min_fraction of the job's median collective wait, is a
//   straggler. A slowdown shared by all ranks shifts every wait alike and names nobody. Scored
//   over the collectives of groups of all ranks.
// Each verdict is reported once. Not thread-safe: one caller (the coordinator's loop).
#pragma once

#include <array>
#include <cstdint>
#include <deque>
#include <map>
#include <string>
#include <vector>

#include "trainsup/collective_tracker.h"
#include "trainsup/export.h"
#include "trainsup/status.h"

namespace trainsup {

struct RankInfo {
  int rank = 0;
  int local_rank = 0;
  std::string host;
  std::string gpu;  // "index:uuid" where known
};

struct DetectorOptions {
  double hang_floor_s = 5.0;          // no collective budget is below this
  double hang_multiplier = 10.0;      // budget = multiplier x p99 of the op's recent durations
  double network_grace_s = 3.0;       // a collective every rank entered is named this long after its budget
  double slow_link_multiplier = 6.0;  // budgets and silence timeout x this while a host's link is slow
  int warmup_collectives = 20;        // per op kind, before learned budgets apply
  double warmup_budget_s = 120.0;     // budget during the warm-up
  double heartbeat_timeout_s = 5.0;   // telemetry silence that makes a rank "silent"
  double transit_lag_s = 0.15;        // heartbeat transit delay that marks a rank's link as lagging
  int straggler_window = 50;          // completed collectives per window
  int straggler_windows = 3;          // consecutive windows a rank must be the latest in
  double straggler_share = 0.6;       // ...in at least this share of the window's collectives
  double straggler_min_fraction = 0.1;  // mean lateness >= this x the job's median wait
  // Fixed budgets that replace the learned ones, by op kind (index: CollectiveOp); 0 = learn.
  std::array<double, kCollectiveOpCount> op_budget_s{};
};
// Parses "allreduce=30,broadcast=120" into options.op_budget_s; the error names the entry.
TRAINSUP_EXPORT Status parseOpBudgets(const std::string& text, DetectorOptions& options);
// What a hello says of a rank, merged into what was known: an empty host or GPU keeps the old.
TRAINSUP_EXPORT void mergeRankInfo(RankInfo& known, const RankInfo& hello);

enum class VerdictKind {
  kHungRank, kCommunicationFault, kSilentRank, kDeadRank, kStalledRank, kStraggler,
  kFailedRank,   // the rank ended with an error it reported itself (the program's, not the host's)
  kStoppedRank,  // a hang, silence, death or stall of ranks that were all asked to stop (SIGTERM:
                 // a scheduler taking the node back): they are leaving on purpose, no host fault
  kDesync,       // members of a group issued different collectives at the same seq: the program's fault
};
TRAINSUP_EXPORT const char* verdictKindName(VerdictKind kind);

struct Verdict {
  VerdictKind kind = VerdictKind::kHungRank;
  std::vector<int> ranks;          // the culprits (or the participants, for a communication fault)
  std::vector<std::string> hosts;  // their hosts, same order
  std::vector<int> local_ranks;    // their local ranks, same order
  std::vector<std::string> gpus;   // their GPUs ("index:uuid", empty when unknown), same order
  uint64_t seq = 0;                // the collective (per-group seq), where one is involved
  std::string op;
  std::string group;               // its group: description (mesh dimension) or "group <id>"
  std::string other_op;            // desync: what the culprits entered instead ("broadcast 4096 B")
  std::string evidence;            // human-readable: what was seen, against which budget
  std::string section;             // the first culprit's section, where known (e.g. "forward")
  int64_t step = -1;               // ...and its step
  // How long before the verdict the fault showed, where the evidence says (-1: unknown): a dead
  // or silent rank's last sign of life, a hung collective's first entry. `trainsup report` and
  // the metrics take verdict time - onset_s as the fault's time when no fault marker exists.
  double onset_s = -1;
};

// What a detector knows now, for operators (the agent's /status and /metrics, `trainsup
// status`): Detector::snapshot(). Plain values, copied out: safe to hand to another thread.
struct DetectorSnapshot {
  struct Rank {
    int rank = 0;
    std::string host;
    int64_t step = -1;      // at its last progress report (-1: none yet)
    std::string section;    // innermost section then
    double step_s = -1;     // its recent seconds per step, over >= 1 s of progress reports (-1: not yet)
    double silent_s = -1;   // since it was last heard from (-1: never heard from)
    bool dead = false;      // its connection closed before it finished
    bool finished = false;
  };
  struct Open {
    std::string what;          // "allreduce #157 of group 'default_pg'"
    uint64_t bytes = 0;
    double age_s = 0;          // since its first member entered
    int members = 0, entered = 0;
    std::vector<int> missing;  // global ranks that have not entered it (at most 32; -1 never listed)
  };
  std::vector<Rank> ranks;   // by rank
  std::vector<Open> oldest;  // the oldest open collectives, oldest first
  size_t open = 0;           // open collectives in all
};

class TRAINSUP_EXPORT Detector {
 public:
  Detector(std::vector<RankInfo> ranks, DetectorOptions options = {});

  // Rank `rank` is member `group_rank` of `group_size` of `group` (desc: "mesh_tp", may be empty).
  void onGroup(int rank, uint64_t group, int group_rank, int group_size, const std::string& desc);
  // The `seq`-th op of `group` (point-to-point: of the channel to or from `peer`).
  void onEnter(int rank, uint64_t group, uint64_t seq, int peer, CollectiveOp op, uint64_t bytes, int64_t now_ns);
  // `wait_ns`: exit - enter on the rank's own clock.
  void onExit(int rank, uint64_t group, uint64_t seq, int peer, CollectiveOp op, int64_t wait_ns, int64_t now_ns);
  // The implicit group of all ranks (group 0).
  void onEnter(int rank, uint64_t seq, CollectiveOp op, uint64_t bytes, int64_t now_ns) {
    onEnter(rank, 0, seq, -1, op, bytes, now_ns);
  }
  void onExit(int rank, uint64_t seq, int64_t wait_ns, int64_t now_ns) {
    onExit(rank, 0, seq, -1, CollectiveOp::kOther, wait_ns, now_ns);
  }
  struct Counters {
    uint64_t unknown_group = 0;  // records naming a group nobody claimed, or from a non-member
    uint64_t bad_claims = 0;     // group claims that contradict what is known, or out of range
  };
  const Counters& counters() const { return counters_; }
  void onHeartbeat(int rank, int64_t now_ns);
  // A heartbeat that says when the rank sent it (its own monotonic clock): as onHeartbeat,
  // and its transit delay is measured (see "late telemetry" above).
  void onHeartbeat(int rank, int64_t now_ns, int64_t sent_ns);
  // When `rank` was last found lagging (coordinator clock), or -1.
  int64_t laggingAtNs(int rank) const { return rank >= 0 && rank < world_ ? transit_[rank].lagging_ns : -1; }
  // Where the rank's training loop was at its last heartbeat (innermost section, step, time in
  // it); verdicts about the rank quote it.
  void onProgress(int rank, int64_t step, const std::string& section, int64_t in_section_ns, int64_t now_ns);
  // Every rank's state and the `max_open` oldest open collectives, as of `now_ns`.
  // O(ranks + open collectives): callers take it at their own pace (the coordinator: once a second).
  DetectorSnapshot snapshot(int64_t now_ns, size_t max_open = 5) const;
  void onDisconnect(int rank, int64_t now_ns);
  // Each of `ranks` not heard from yet is expected within `within_s` of now: after that it is a
  // silent rank. For a coordinator that takes over a running job: the ranks its predecessor
  // had heard from exist and must show up again.
  void expectRanks(int64_t now_ns, double within_s, const std::vector<int>& ranks);
  // The rank said goodbye (a normal end): no verdict about its silence or departure follows.
  void onFinished(int rank);
  // The rank is ending with an error of its own (an exception in the training code): a
  // failed_rank verdict, not a dead one, and nothing about its departure afterwards.
  void onFailed(int rank);
  // The rank was asked to stop (SIGTERM/SIGINT) and will leave: later verdicts naming only
  // stopping ranks become stopped_rank.
  void onStopping(int rank, int64_t now_ns);
  void onRankStalled(int rank, const std::string& section, int64_t step, int64_t now_ns);
  // A rank's hello: its host, local rank and GPU, for the verdicts (out-of-range ranks ignored;
  // an empty host or GPU keeps what was known).
  void setRankInfo(const RankInfo& info);
  // The hosts whose links are slow now (replaces the previous list; empty: none).
  void setSlowHosts(std::vector<std::string> hosts);

  std::vector<Verdict> evaluate(int64_t now_ns);
  // The earliest time after `after_ns` (an evaluation's time) at which evaluate() may find a
  // rank silent or a collective over its budget, as things stand (INT64_MAX: none). Callers
  // that evaluate on a tick evaluate then too, so that a timeout is judged when it expires, not
  // up to a tick later. A budget already past (waiting out the network grace or a slow link's
  // multiple) is not a deadline here: the tick meets those.
  int64_t nextDeadlineNs(int64_t after_ns) const;

  // The budget of an op kind now, in ns, and whether it is learned.
  int64_t budgetNs(CollectiveOp op, bool* learned = nullptr) const;

 private:
  struct Group {
    std::string desc;
    int size = 0;
    std::vector<int> members;                  // by group rank; -1: not claimed yet
    std::map<int, int> group_rank_of;          // global rank -> group rank
  };
  // A collective: (group, -1, -1, seq). A point-to-point op: (group, sender, receiver, seq).
  struct OpKey {
    uint64_t group = 0;
    int src = -1, dst = -1;
    uint64_t seq = 0;
    bool operator<(const OpKey& o) const {
      if (group != o.group) return group < o.group;
      if (src != o.src) return src < o.src;
      if (dst != o.dst) return dst < o.dst;
      return seq < o.seq;
    }
  };
  struct Pending {
    CollectiveOp op = CollectiveOp::kOther;
    uint64_t bytes = 0;
    int64_t first_enter_ns = 0;
    std::vector<int> members;      // global ranks by slot (-1: a member not claimed yet)
    std::vector<int64_t> wait_ns;  // -1: not exited
    std::vector<bool> entered;
    std::vector<CollectiveOp> ops;      // what each slot entered
    std::vector<uint64_t> bytes_of;
    int entered_count = 0, exited_count = 0;
    bool mismatch = false;       // slots entered different ops or sizes
    bool reported = false;
    bool slow_reported = false;  // reported as held by a slow link (a straggler verdict)
    // The hosts reported slow while it was open: the allowance stays with the op until it
    // completes, as TCP's backed-off retransmissions outlast the link's recovery.
    std::vector<std::string> slow_hosts;
  };
  Group* findGroup(uint64_t group);
  // The key of a record and the rank's slot in it (and its group, for a subgroup's collective);
  // false when the record names no known group, a bad peer, or comes from a non-member.
  bool locate(int rank, uint64_t group, uint64_t seq, int peer, CollectiveOp op, OpKey* key, int* slot, Group** g);
  // The pending entry of a record, created on first sight; nullptr (counted) when locate() fails.
  Pending* pendingFor(int rank, uint64_t group, uint64_t seq, int peer, CollectiveOp op, int* slot);
  std::string describe(const OpKey& key, const Pending& p) const;  // "allreduce #5 of group 'mesh_tp'"
  std::string groupName(uint64_t group) const;
  // The open ops `rank` entered and has not exited, oldest first.
  std::vector<std::pair<OpKey, Pending*>> waitingIn(int rank);
  struct Chain {
    std::vector<int> roots;          // the ranks at the end of the chain(s)
    OpKey key;                       // the op the (first) root never entered
    Pending* at = nullptr;
    std::string path;                // "rank 0 waits in ... for rank 2; ..."
    std::vector<int> cycle;          // non-empty: the chain closed on itself through collectives
    std::vector<Pending*> links;     // every op followed (reported with the verdict)
    bool judged = false;             // it reaches an op judged already: the same fault, said once
    Pending* inside = nullptr;       // a root waits inside an op every member entered: judged on its own
  };
  // Follows `missing` (members that never entered `key`) to the ranks they wait for.
  Chain resolve(const OpKey& key, Pending& p, const std::vector<int>& missing);
  void desyncVerdicts(int64_t now_ns, std::vector<Verdict>& out);
  bool onSlowHost(int rank) const;
  bool onHostIn(int rank, const std::vector<std::string>& hosts) const;
  void complete(Pending& p);
  Verdict make(VerdictKind kind, std::vector<int> ranks, std::string evidence, uint64_t seq = 0,
               const std::string& op = "", uint64_t group = 0) const;

  std::vector<RankInfo> ranks_;
  const DetectorOptions options_;
  const int world_;
  std::map<uint64_t, Group> groups_;
  std::map<OpKey, Pending> pending_;  // open collectives
  Counters counters_;
  std::vector<int64_t> last_seen_ns_;
  struct Progress {
    int64_t step = -1;
    std::string section;
    int64_t in_section_ns = 0;
    int64_t at_ns = -1;  // when it was reported (coordinator clock)
    // Seconds per step: measured from rate_step at rate_at_ns to a later report >= 1 s on.
    int64_t rate_step = -1, rate_at_ns = -1;
    double step_s = -1;
  };
  std::vector<Progress> progress_;
  struct Transit {
    int64_t base_ns = 0;        // smallest (arrival - send) seen, creeping up by 10 ppm of time
    int64_t base_at_ns = -1;    // when base_ns was last updated (-1: no timed heartbeat yet)
    int64_t excess_ns[3] = {0, 0, 0};  // the last three transit delays above the base
    int count = 0;              // timed heartbeats seen (the ring's fill)
    int64_t lagging_ns = -1;    // when it was last found lagging
  };
  std::vector<Transit> transit_;
  bool silenceWatched(int rank) const;  // a rank whose silence can still make it silent_rank
  int64_t silenceNs(int rank, bool* lagged) const;  // its silence timeout now
  bool laggedBeforeSilence(int rank) const;  // lagging within 3 silence timeouts before it was last heard
  std::string whereIs(int rank) const;
  std::vector<bool> silent_reported_, dead_, dead_reported_, finished_;
  std::vector<std::string> slow_hosts_;
  std::vector<bool> expected_only_;  // last_seen_ns_ is an expectation, not a sighting
  std::vector<int64_t> stopping_since_ns_;  // -1: not asked to stop
  bool any_dead_reported_ = false;
  std::vector<Verdict> queued_;  // found between evaluate() calls, reported by the next one
  // Learned budgets: recent max-over-ranks waits per op kind.
  std::vector<std::deque<int64_t>> recent_waits_;
  std::vector<int64_t> completed_by_op_;
  // Straggler windows.
  std::vector<int> latest_count_;
  std::vector<double> lateness_sum_ns_;
  std::vector<int64_t> window_waits_;
  int window_fill_ = 0;
  std::vector<int> streak_;
  std::vector<bool> straggler_reported_;
};

}  // namespace trainsup
