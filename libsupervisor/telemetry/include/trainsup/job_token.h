// trainsup/job_token.h — the job's shared secret for telemetry frames.
//
// Contract: 16 bytes, drawn by the job's first agent and shared through its rendezvous store;
// every telemetry frame carries it, and a node monitor or coordinator drops frames whose token
// differs (the frame format itself is internal: telemetry/telemetry_wire.h). Plain data.
#pragma once

#include <array>
#include <cstdint>

namespace trainsup {

using JobToken = std::array<uint8_t, 16>;

}  // namespace trainsup
