// Fuzz target: the telemetry frame decoder (telemetry/telemetry_wire.h), which every coordinator
// and node monitor runs on bytes from any peer that can reach its port.
//
// Input: byte 0 picks the chunk size the stream is fed in (1..64 bytes, as a socket may split
// it); the rest is the stream. Invariants: the decoder never buffers more than one frame's
// worth, every message it yields has at most kRecordsPerFrame records of its type only, and
// re-encoding a yielded message and decoding it again gives the same message.
#include "fuzz_entry.h"
#include "telemetry/telemetry_wire.h"

namespace {

using namespace trainsup;

constexpr JobToken kToken = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16};

size_t records(const WireMessage& m) {
  return m.collectives.size() + m.heartbeats.size() + m.stalls.size() + m.aborts.size() + m.hellos.size() +
         m.gones.size();
}


}  // namespace

TRAINSUP_FUZZ_ENTRY(trainsupFuzzTelemetryFrame) {
  if (size == 0) return 0;
  const size_t chunk = (data[0] % 64) + 1;
  FrameDecoder decoder(kToken);
  for (size_t off = 1; off < size; off += chunk) {
    const size_t n = std::min(chunk, size - off);
    for (const WireMessage& m : decoder.feed(data + off, n)) {
      TRAINSUP_FUZZ_CHECK(records(m) <= kRecordsPerFrame);
      size_t of_type = 0;
      switch (m.type) {
        case WireType::kCollectives: of_type = m.collectives.size(); break;
        case WireType::kHeartbeat: of_type = m.heartbeats.size(); break;
        case WireType::kStall: of_type = m.stalls.size(); break;
        case WireType::kAbort: of_type = m.aborts.size(); break;
        case WireType::kHello: of_type = m.hellos.size(); break;
        case WireType::kGone: of_type = m.gones.size(); break;
      }
      TRAINSUP_FUZZ_CHECK(of_type == records(m));
      const std::string again = encodeFrame(m, kToken);
      FrameDecoder check(kToken);
      auto decoded = check.feed(reinterpret_cast<const uint8_t*>(again.data()), again.size());
      TRAINSUP_FUZZ_CHECK(decoded.size() == 1 && sameMessage(m, decoded[0]));
    }
    // Never more than a header and the largest payload waiting for their end.
    TRAINSUP_FUZZ_CHECK(decoder.buffered() <= 28 + kMaxPayload);
  }
  return 0;
}
