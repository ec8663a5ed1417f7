// telemetry/telemetry_wire.h (internal) — the wire format between ranks, node monitors and the job
// coordinator (issue #5): length-prefixed frames, each authenticated by the job's token.
//
// Frame (little-endian): magic "TSUT" (4) | version u16 (=2; 1 had no groups) | type u16 | payload length u32 |
// token (16 bytes, taken from the job's c10d store) | payload. Payloads are fixed-layout
// records (below), several per frame. FrameDecoder consumes a byte stream (a TCP or Unix socket)
// and yields whole messages; it never trusts a length: a frame over kMaxPayload, an unknown
// type or version, a payload that is not a whole number of records, or a wrong token is
// counted and dropped, and the stream resynchronizes on the next magic. Nothing in here
// allocates more than kMaxPayload per frame or throws on bad input. Not thread-safe per object.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "trainsup/collective_tracker.h"
#include "trainsup/export.h"
#include "trainsup/job_token.h"

namespace trainsup {

enum class WireType : uint16_t {
  kCollectives = 1, kHeartbeat = 2, kStall = 3, kAbort = 4, kHello = 5, kGone = 6, kGroup = 7,
};

// One collective record of one rank (enter and, when known, exit): the `seq`-th op of `group`
// (or, for point-to-point ops, of the channel to or from `peer`; collective_tracker.h).
struct WireCollective {
  int32_t rank = 0;
  uint64_t group = 0;
  uint64_t seq = 0;
  int32_t peer = -1;       // the other side's global rank for send/recv
  uint8_t op = 0;          // CollectiveOp
  uint64_t bytes = 0;
  int64_t enter_ns = 0;    // the rank's own clock
  int64_t exit_ns = 0;     // 0: still open
};

// Proof of life, with where the rank is: the innermost open section of its training loop and
// for how long it has been there (so that a verdict can say what a silent or absent rank was
// doing).
struct WireHeartbeat {
  int32_t rank = 0;
  int64_t step = -1;
  int64_t sent_ns = 0;
  int64_t in_section_ns = 0;
  char section[32] = {};   // NUL-padded; empty when unknown
};

struct WireStall {
  int32_t rank = 0;
  int64_t step = -1;
  char section[32] = {};   // NUL-padded
};

// Coordinator -> ranks: a verdict was reached; abort the job now.
struct WireAbort {
  int32_t culprit_rank = -1;
  char kind[24] = {};   // verdictKindName(), NUL-padded
  char host[64] = {};   // the culprit's host, NUL-padded
};

// Rank -> coordinator, on every (re)connection: who the rank is, so that a verdict can name its
// host and GPU (and a coordinator that took over learns them again from the node monitors).
struct WireHello {
  int32_t rank = 0;
  int32_t local_rank = 0;
  char host[64] = {};   // NUL-padded
  char gpu[64] = {};    // "index:uuid", NUL-padded; empty when unknown
};

// Rank -> coordinator on a normal end (kGoneFinished) or an error of its own (kGoneFailed), and
// when it was asked to stop (kGoneStopping: still there, leaving on purpose); node monitor ->
// coordinator when a local rank's connection closed without a goodbye (kGoneClosed: it died),
// and to the coordinator it leaves when its agent points it at a new one (kGoneMoved: a
// takeover; the old coordinator has been replaced and must judge nobody from now on).
inline constexpr int32_t kGoneClosed = 0;    // the rank's connection closed without a goodbye
inline constexpr int32_t kGoneFinished = 1;  // the rank said goodbye: a normal end
inline constexpr int32_t kGoneFailed = 2;    // the rank is ending with an error of its own
inline constexpr int32_t kGoneStopping = 3;  // the rank was asked to stop (SIGTERM/SIGINT) and will leave
inline constexpr int32_t kGoneMoved = 4;     // the rank's telemetry goes to another coordinator now
struct WireGone {
  int32_t rank = 0;
  int32_t reason = kGoneClosed;
};

// Rank -> coordinator, on every connection and when a group is created: the rank is member
// `group_rank` of `group_size` of group `group` ("mesh_tp", ...). The coordinator assembles each
// group's members from its members' claims.
struct WireGroup {
  int32_t rank = 0;
  uint64_t group = 0;
  int32_t group_rank = 0;
  int32_t group_size = 0;
  char desc[32] = {};   // NUL-padded
};

struct WireMessage {
  WireType type = WireType::kHeartbeat;
  std::vector<WireCollective> collectives;
  std::vector<WireHeartbeat> heartbeats;
  std::vector<WireStall> stalls;
  std::vector<WireAbort> aborts;
  std::vector<WireHello> hellos;
  std::vector<WireGone> gones;
  std::vector<WireGroup> groups;
};

inline constexpr uint32_t kMaxPayload = 1u << 20;
// Senders split long queues into frames of at most this many records (all under kMaxPayload).
inline constexpr size_t kRecordsPerFrame = 4096;

TRAINSUP_EXPORT std::string encodeFrame(const WireMessage& message, const JobToken& token);
// Whether two messages carry the same records, field by field (the NUL-padded texts compared
// up to their padding): what a frame decoded from encodeFrame(m) must be to m.
TRAINSUP_EXPORT bool sameMessage(const WireMessage& a, const WireMessage& b);

class TRAINSUP_EXPORT FrameDecoder {
 public:
  explicit FrameDecoder(const JobToken& token) : token_(token) {}
  // Appends bytes from the stream and returns the messages completed by them.
  std::vector<WireMessage> feed(const uint8_t* data, size_t n);
  struct Counters {
    uint64_t frames = 0, bad_magic_bytes = 0, oversized = 0, bad_version = 0, bad_type = 0, bad_length = 0,
             bad_token = 0;
  };
  const Counters& counters() const { return counters_; }
  size_t buffered() const { return buffer_.size(); }

 private:
  JobToken token_;
  std::vector<uint8_t> buffer_;
  Counters counters_;
};

}  // namespace trainsup
