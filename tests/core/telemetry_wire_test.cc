// The telemetry wire format: round trips, byte-by-byte streaming, and property tests that
// random and mutated input never crashes the decoder, never yields a message without the
// token, and never makes it buffer more than one maximal frame.
#include "telemetry/telemetry_wire.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>
#include <random>

namespace trainsup {
namespace {

JobToken token(uint8_t seed) {
  JobToken t;
  for (size_t i = 0; i < t.size(); ++i) t[i] = static_cast<uint8_t>(seed * 31 + i);
  return t;
}

WireMessage sample(std::mt19937& rng) {
  WireMessage m;
  const WireType kinds[] = {WireType::kCollectives, WireType::kHeartbeat, WireType::kStall, WireType::kHello,
                            WireType::kGone, WireType::kGroup};
  m.type = kinds[rng() % 6];
  int n = 1 + static_cast<int>(rng() % 20);
  for (int i = 0; i < n; ++i) {
    if (m.type == WireType::kCollectives) {
      m.collectives.push_back({static_cast<int32_t>(rng() % 4096), rng(), rng(), static_cast<int32_t>(rng() % 4096) - 1,
                               static_cast<uint8_t>(rng() % 12), rng(),
                               static_cast<int64_t>(rng()), static_cast<int64_t>(rng())});
    } else if (m.type == WireType::kHeartbeat) {
      WireHeartbeat hb;
      hb.rank = static_cast<int32_t>(rng() % 4096);
      hb.step = static_cast<int64_t>(rng());
      hb.sent_ns = static_cast<int64_t>(rng());
      hb.in_section_ns = static_cast<int64_t>(rng());
      std::snprintf(hb.section, sizeof(hb.section), "sec-%u", static_cast<unsigned>(rng() % 100));
      m.heartbeats.push_back(hb);
    } else if (m.type == WireType::kHello) {
      WireHello h;
      h.rank = static_cast<int32_t>(rng() % 4096);
      h.local_rank = static_cast<int32_t>(rng() % 8);
      std::snprintf(h.host, sizeof(h.host), "node-%u.cluster", static_cast<unsigned>(rng() % 1000));
      std::snprintf(h.gpu, sizeof(h.gpu), "%u:GPU-%08x", static_cast<unsigned>(rng() % 8), static_cast<unsigned>(rng()));
      m.hellos.push_back(h);
    } else if (m.type == WireType::kGone) {
      m.gones.push_back({static_cast<int32_t>(rng() % 4096), static_cast<int32_t>(rng() % 3)});
    } else if (m.type == WireType::kGroup) {
      WireGroup g;
      g.rank = static_cast<int32_t>(rng() % 4096);
      g.group = (static_cast<uint64_t>(rng()) << 32) | rng();
      g.group_size = 1 + static_cast<int32_t>(rng() % 64);
      g.group_rank = static_cast<int32_t>(rng() % static_cast<uint32_t>(g.group_size));
      std::snprintf(g.desc, sizeof(g.desc), "mesh_%u", static_cast<unsigned>(rng() % 100));
      m.groups.push_back(g);
    } else {
      WireStall s;
      s.rank = static_cast<int32_t>(rng() % 4096);
      s.step = rng();
      std::snprintf(s.section, sizeof(s.section), "section-%u", static_cast<unsigned>(rng() % 100));
      m.stalls.push_back(s);
    }
  }
  return m;
}


TEST(TelemetryWireTest, RoundTripWholeAndByteByByte) {
  std::mt19937 rng(1);
  for (int i = 0; i < 200; ++i) {
    WireMessage m = sample(rng);
    std::string frame = encodeFrame(m, token(7));
    FrameDecoder whole(token(7));
    auto got = whole.feed(reinterpret_cast<const uint8_t*>(frame.data()), frame.size());
    ASSERT_EQ(got.size(), 1u);
    EXPECT_TRUE(sameMessage(got[0], m));
    FrameDecoder trickle(token(7));
    std::vector<WireMessage> out;
    for (char c : frame) {
      auto part = trickle.feed(reinterpret_cast<const uint8_t*>(&c), 1);
      out.insert(out.end(), part.begin(), part.end());
    }
    ASSERT_EQ(out.size(), 1u);
    EXPECT_TRUE(sameMessage(out[0], m));
    EXPECT_EQ(trickle.buffered(), 0u);
  }
}

TEST(TelemetryWireTest, AFrameWithoutTheTokenIsRefused) {
  std::mt19937 rng(2);
  WireMessage m = sample(rng);
  std::string forged = encodeFrame(m, token(8));  // another job, or someone guessing
  std::string real = encodeFrame(m, token(7));
  FrameDecoder d(token(7));
  std::string stream = forged + real;
  auto got = d.feed(reinterpret_cast<const uint8_t*>(stream.data()), stream.size());
  ASSERT_EQ(got.size(), 1u) << "only the authenticated frame";
  EXPECT_EQ(d.counters().bad_token, 1u);
}

TEST(TelemetryWireTest, OversizedAndMalformedFramesAreCountedAndDropped) {
  std::mt19937 rng(3);
  std::string good = encodeFrame(sample(rng), token(7));
  std::string huge = good;
  uint32_t len = kMaxPayload + 1;
  std::memcpy(&huge[8], &len, 4);
  std::string odd = good;
  uint32_t bad = 7;  // not a whole number of records
  std::memcpy(&odd[8], &bad, 4);
  std::string stream = huge + odd + "garbage" + good;
  FrameDecoder d(token(7));
  auto got = d.feed(reinterpret_cast<const uint8_t*>(stream.data()), stream.size());
  EXPECT_EQ(d.counters().oversized, 1u);
  EXPECT_EQ(d.counters().bad_length, 1u);
  ASSERT_GE(got.size(), 1u);  // the good frame at the end is found again
  EXPECT_EQ(d.buffered(), 0u);
}

// Property: whatever bytes arrive, the decoder neither crashes nor accepts a frame without the
// token, and its buffer stays bounded by one maximal frame.
TEST(TelemetryWireTest, RandomAndMutatedStreamsAreHarmless) {
  std::mt19937 rng(4);
  FrameDecoder d(token(7));
  FrameDecoder only_forged(token(7));  // sees the same stream minus the frames with the token
  size_t accepted = 0, with_token = 0, forged = 0, forged_accepted = 0;
  for (int round = 0; round < 3000; ++round) {
    std::string chunk;
    bool has_token = false;
    switch (rng() % 3) {
      case 0:  // random bytes
        chunk.resize(rng() % 256);
        for (auto& c : chunk) c = static_cast<char>(rng());
        break;
      case 1: {  // a valid frame with one byte changed
        chunk = encodeFrame(sample(rng), token(7));
        chunk[rng() % chunk.size()] ^= static_cast<char>(1 + rng() % 255);
        has_token = true;
        ++with_token;
        break;
      }
      default:  // a forged frame
        chunk = encodeFrame(sample(rng), token(9));
        ++forged;
    }
    auto got = d.feed(reinterpret_cast<const uint8_t*>(chunk.data()), chunk.size());
    accepted += got.size();
    ASSERT_LE(d.buffered(), 28u + kMaxPayload);
    if (!has_token) {
      forged_accepted += only_forged.feed(reinterpret_cast<const uint8_t*>(chunk.data()), chunk.size()).size();
      ASSERT_LE(only_forged.buffered(), 28u + kMaxPayload);
    }
  }
  // Forged frames never decode; mutations inside a payload still may (the token authenticates,
  // it does not checksum), so at most the frames that carried the token are accepted.
  EXPECT_EQ(forged_accepted, 0u);
  EXPECT_GT(only_forged.counters().bad_token, forged / 2);
  EXPECT_GT(accepted, 0u);
  EXPECT_LE(accepted, with_token);
}

}  // namespace
}  // namespace trainsup
