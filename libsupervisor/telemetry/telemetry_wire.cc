#include "telemetry/telemetry_wire.h"

#include <algorithm>
#include <cstring>

namespace trainsup {
namespace {

constexpr uint8_t kMagic[4] = {'T', 'S', 'U', 'T'};
constexpr uint16_t kVersion = 2;
constexpr size_t kHeader = 4 + 2 + 2 + 4 + 16;
// Fixed record sizes on the wire (packed, little-endian).
constexpr size_t kCollectiveSize = 4 + 8 + 8 + 4 + 1 + 8 + 8 + 8;
constexpr size_t kHeartbeatSize = 4 + 8 + 8 + 8 + 32;
constexpr size_t kStallSize = 4 + 8 + 32;
constexpr size_t kAbortSize = 4 + 24 + 64;
constexpr size_t kHelloSize = 4 + 4 + 64 + 64;
constexpr size_t kGoneSize = 4 + 4;
constexpr size_t kGroupSize = 4 + 8 + 4 + 4 + 32;
static_assert(kRecordsPerFrame * kHelloSize + kHeader < kMaxPayload, "a frame of the largest records must fit");

// Copies a NUL-padded text field and guarantees its termination.
template <size_t N>
void getText(const uint8_t*& q, char (&dst)[N]) {
  std::memcpy(dst, q, N);
  dst[N - 1] = '\0';
  q += N;
}

template <class T>
void put(std::string& out, T v) {
  char b[sizeof(T)];
  std::memcpy(b, &v, sizeof(T));
  out.append(b, sizeof(T));
}
template <class T>
T get(const uint8_t*& p) {
  T v;
  std::memcpy(&v, p, sizeof(T));
  p += sizeof(T);
  return v;
}

size_t recordSize(WireType t) {
  switch (t) {
    case WireType::kCollectives: return kCollectiveSize;
    case WireType::kHeartbeat: return kHeartbeatSize;
    case WireType::kStall: return kStallSize;
    case WireType::kAbort: return kAbortSize;
    case WireType::kHello: return kHelloSize;
    case WireType::kGone: return kGoneSize;
    case WireType::kGroup: return kGroupSize;
  }
  return 0;
}

// Constant-time comparison: the token is a secret.
bool sameToken(const uint8_t* a, const JobToken& b) {
  uint8_t diff = 0;
  for (size_t i = 0; i < b.size(); ++i) diff |= static_cast<uint8_t>(a[i] ^ b[i]);
  return diff == 0;
}

}  // namespace

std::string encodeFrame(const WireMessage& m, const JobToken& token) {
  std::string payload;
  switch (m.type) {
    case WireType::kCollectives:
      for (const auto& c : m.collectives) {
        put(payload, c.rank);
        put(payload, c.group);
        put(payload, c.seq);
        put(payload, c.peer);
        put(payload, c.op);
        put(payload, c.bytes);
        put(payload, c.enter_ns);
        put(payload, c.exit_ns);
      }
      break;
    case WireType::kHeartbeat:
      for (const auto& h : m.heartbeats) {
        put(payload, h.rank);
        put(payload, h.step);
        put(payload, h.sent_ns);
        put(payload, h.in_section_ns);
        payload.append(h.section, sizeof(h.section));
      }
      break;
    case WireType::kStall:
      for (const auto& s : m.stalls) {
        put(payload, s.rank);
        put(payload, s.step);
        payload.append(s.section, sizeof(s.section));
      }
      break;
    case WireType::kAbort:
      for (const auto& a : m.aborts) {
        put(payload, a.culprit_rank);
        payload.append(a.kind, sizeof(a.kind));
        payload.append(a.host, sizeof(a.host));
      }
      break;
    case WireType::kHello:
      for (const auto& h : m.hellos) {
        put(payload, h.rank);
        put(payload, h.local_rank);
        payload.append(h.host, sizeof(h.host));
        payload.append(h.gpu, sizeof(h.gpu));
      }
      break;
    case WireType::kGone:
      for (const auto& g : m.gones) {
        put(payload, g.rank);
        put(payload, g.reason);
      }
      break;
    case WireType::kGroup:
      for (const auto& g : m.groups) {
        put(payload, g.rank);
        put(payload, g.group);
        put(payload, g.group_rank);
        put(payload, g.group_size);
        payload.append(g.desc, sizeof(g.desc));
      }
      break;
  }
  std::string out(reinterpret_cast<const char*>(kMagic), 4);
  put(out, kVersion);
  put(out, static_cast<uint16_t>(m.type));
  put(out, static_cast<uint32_t>(payload.size()));
  out.append(reinterpret_cast<const char*>(token.data()), token.size());
  out += payload;
  return out;
}

std::vector<WireMessage> FrameDecoder::feed(const uint8_t* data, size_t n) {
  std::vector<WireMessage> out;
  buffer_.insert(buffer_.end(), data, data + n);
  size_t pos = 0;
  while (buffer_.size() - pos >= kHeader) {
    const uint8_t* h = buffer_.data() + pos;
    if (std::memcmp(h, kMagic, 4) != 0) {
      // Not at a frame: skip to the next possible magic.
      ++counters_.bad_magic_bytes;
      ++pos;
      continue;
    }
    const uint8_t* p = h + 4;
    uint16_t version = get<uint16_t>(p);
    uint16_t type = get<uint16_t>(p);
    uint32_t length = get<uint32_t>(p);
    const uint8_t* token = p;
    if (version != kVersion) {
      ++counters_.bad_version;
      pos += 4;  // resynchronize after this magic
      continue;
    }
    if (length > kMaxPayload) {
      ++counters_.oversized;
      pos += 4;
      continue;
    }
    size_t rs = type >= 1 && type <= 7 ? recordSize(static_cast<WireType>(type)) : 0;
    if (rs == 0) {
      ++counters_.bad_type;
      pos += 4;
      continue;
    }
    if (length % rs != 0) {
      ++counters_.bad_length;
      pos += 4;
      continue;
    }
    if (buffer_.size() - pos < kHeader + length) break;  // wait for the rest
    const uint8_t* payload = h + kHeader;
    if (!sameToken(token, token_)) {
      ++counters_.bad_token;
      pos += kHeader + length;  // a whole, well-formed frame from someone without the token
      continue;
    }
    WireMessage m;
    m.type = static_cast<WireType>(type);
    const uint8_t* q = payload;
    for (uint32_t i = 0; i < length / rs; ++i) {
      if (m.type == WireType::kCollectives) {
        WireCollective c;
        c.rank = get<int32_t>(q);
        c.group = get<uint64_t>(q);
        c.seq = get<uint64_t>(q);
        c.peer = get<int32_t>(q);
        c.op = get<uint8_t>(q);
        c.bytes = get<uint64_t>(q);
        c.enter_ns = get<int64_t>(q);
        c.exit_ns = get<int64_t>(q);
        m.collectives.push_back(c);
      } else if (m.type == WireType::kHeartbeat) {
        WireHeartbeat hb;
        hb.rank = get<int32_t>(q);
        hb.step = get<int64_t>(q);
        hb.sent_ns = get<int64_t>(q);
        hb.in_section_ns = get<int64_t>(q);
        getText(q, hb.section);
        m.heartbeats.push_back(hb);
      } else if (m.type == WireType::kAbort) {
        WireAbort a;
        a.culprit_rank = get<int32_t>(q);
        std::memcpy(a.kind, q, sizeof(a.kind));
        a.kind[sizeof(a.kind) - 1] = '\0';
        q += sizeof(a.kind);
        std::memcpy(a.host, q, sizeof(a.host));
        a.host[sizeof(a.host) - 1] = '\0';
        q += sizeof(a.host);
        m.aborts.push_back(a);
      } else if (m.type == WireType::kHello) {
        WireHello hello;
        hello.rank = get<int32_t>(q);
        hello.local_rank = get<int32_t>(q);
        getText(q, hello.host);
        getText(q, hello.gpu);
        m.hellos.push_back(hello);
      } else if (m.type == WireType::kGroup) {
        WireGroup g;
        g.rank = get<int32_t>(q);
        g.group = get<uint64_t>(q);
        g.group_rank = get<int32_t>(q);
        g.group_size = get<int32_t>(q);
        getText(q, g.desc);
        m.groups.push_back(g);
      } else if (m.type == WireType::kGone) {
        WireGone g;
        g.rank = get<int32_t>(q);
        g.reason = get<int32_t>(q);
        m.gones.push_back(g);
      } else {
        WireStall s;
        s.rank = get<int32_t>(q);
        s.step = get<int64_t>(q);
        std::memcpy(s.section, q, sizeof(s.section));
        s.section[sizeof(s.section) - 1] = '\0';
        q += sizeof(s.section);
        m.stalls.push_back(s);
      }
    }
    ++counters_.frames;
    out.push_back(std::move(m));
    pos += kHeader + length;
  }
  buffer_.erase(buffer_.begin(), buffer_.begin() + static_cast<std::ptrdiff_t>(pos));
  return out;
}

namespace {

bool sameText(const char* a, const char* b, size_t n) { return std::strncmp(a, b, n) == 0; }

}  // namespace

bool sameMessage(const WireMessage& a, const WireMessage& b) {
  auto same = [](const auto& xs, const auto& ys, auto eq) {
    if (xs.size() != ys.size()) return false;
    for (size_t i = 0; i < xs.size(); ++i) {
      if (!eq(xs[i], ys[i])) return false;
    }
    return true;
  };
  return a.type == b.type &&
         same(a.collectives, b.collectives, [](const WireCollective& x, const WireCollective& y) {
           return x.rank == y.rank && x.group == y.group && x.seq == y.seq && x.peer == y.peer && x.op == y.op && x.bytes == y.bytes &&
                  x.enter_ns == y.enter_ns && x.exit_ns == y.exit_ns;
         }) &&
         same(a.heartbeats, b.heartbeats, [](const WireHeartbeat& x, const WireHeartbeat& y) {
           return x.rank == y.rank && x.step == y.step && x.sent_ns == y.sent_ns && x.in_section_ns == y.in_section_ns &&
                  sameText(x.section, y.section, sizeof(x.section));
         }) &&
         same(a.stalls, b.stalls, [](const WireStall& x, const WireStall& y) {
           return x.rank == y.rank && x.step == y.step && sameText(x.section, y.section, sizeof(x.section));
         }) &&
         same(a.aborts, b.aborts, [](const WireAbort& x, const WireAbort& y) {
           return x.culprit_rank == y.culprit_rank && sameText(x.kind, y.kind, sizeof(x.kind)) &&
                  sameText(x.host, y.host, sizeof(x.host));
         }) &&
         same(a.hellos, b.hellos, [](const WireHello& x, const WireHello& y) {
           return x.rank == y.rank && x.local_rank == y.local_rank && sameText(x.host, y.host, sizeof(x.host)) &&
                  sameText(x.gpu, y.gpu, sizeof(x.gpu));
         }) &&
         same(a.gones, b.gones, [](const WireGone& x, const WireGone& y) {
           return x.rank == y.rank && x.reason == y.reason;
         }) &&
         same(a.groups, b.groups, [](const WireGroup& x, const WireGroup& y) {
           return x.rank == y.rank && x.group == y.group && x.group_rank == y.group_rank &&
                  x.group_size == y.group_size && sameText(x.desc, y.desc, sizeof(x.desc));
         });
}

}  // namespace trainsup
