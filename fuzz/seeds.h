// Valid inputs for the fuzz targets, made with the library's own writers: libFuzzer's starting
// corpus (scripts/fuzz.sh writes them out) and the replay test's first inputs.
#pragma once

#include <xxhash.h>

#include <cstring>
#include <string>
#include <vector>

#include "base/mem_file_system.h"
#include "trainsup/checkpoint_format.h"
#include "trainsup/checkpointer.h"
#include "telemetry/telemetry_wire.h"

namespace trainsup::fuzz {

inline std::vector<std::string> telemetryFrameSeeds() {
  const JobToken token = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16};
  std::vector<std::string> seeds;
  auto add = [&](const WireMessage& m, char chunk) { seeds.push_back(std::string(1, chunk) + encodeFrame(m, token)); };
  WireMessage c;
  c.type = WireType::kCollectives;
  for (int i = 0; i < 3; ++i) c.collectives.push_back({i, 0, 40u + i, -1, 1, 4096, 1000 + i, i == 2 ? 0 : 2000 + i});
  add(c, 63);
  WireMessage h;
  h.type = WireType::kHeartbeat;
  WireHeartbeat hb;
  hb.rank = 3;
  hb.step = 12;
  hb.sent_ns = 99;
  std::strcpy(hb.section, "forward");
  h.heartbeats.push_back(hb);
  add(h, 5);
  WireMessage hello;
  hello.type = WireType::kHello;
  WireHello he;
  he.rank = 1;
  std::strcpy(he.host, "host-a");
  std::strcpy(he.gpu, "0:GPU-0000");
  hello.hellos.push_back(he);
  add(hello, 0);
  WireMessage g;
  g.type = WireType::kGone;
  g.gones.push_back({2, kGoneStopping});
  add(g, 17);
  WireMessage a;
  a.type = WireType::kAbort;
  WireAbort ab;
  ab.culprit_rank = 1;
  std::strcpy(ab.kind, "hung_rank");
  a.aborts.push_back(ab);
  WireMessage s;
  s.type = WireType::kStall;
  WireStall st;
  st.rank = 0;
  std::strcpy(st.section, "step");
  s.stalls.push_back(st);
  // Several frames in one stream.
  seeds.push_back(std::string(1, 31) + encodeFrame(a, token) + encodeFrame(s, token) + encodeFrame(c, token));
  return seeds;
}

// Byte 0 flags, u32 manifest length, manifest, shard (checkpoint_fuzz.cc).
inline std::vector<std::string> checkpointSeeds() {
  testing::MemFileSystem fs;
  const std::string dir = "/seed";
  std::vector<float> w(64);
  for (size_t i = 0; i < w.size(); ++i) w[i] = static_cast<float>(i) * 0.5f;
  std::string blob = "rng state bytes";
  std::vector<BufferRef> tensors = {
      {{"model.weight", DType::kFloat32, {8, 8}}, w.data(), w.size() * 4},
      {{"__skeleton__", DType::kBytes, {static_cast<int64_t>(blob.size())}}, blob.data(), blob.size()}};
  ShardInfo info;
  if (!writeShard(fs, dir, 0, 1, 7, tensors, &info).isOk()) return {};
  Manifest m;
  m.step = 7;
  m.world_size = 1;
  m.job_id = "fuzz";
  m.library_version = "seed";
  m.shards.push_back({0, shardFileName(0, 1), info.file_size, info.index_xxh3});
  m.metadata["step"] = "7";
  if (!writeManifest(fs, dir, m).isOk()) return {};
  const std::string manifest = fs.file(dir + "/" + kManifestName).value_or("");
  const std::string shard = fs.file(dir + "/" + shardFileName(0, 1)).value_or("");
  std::vector<std::string> seeds;
  auto add = [&](char flags, const std::string& digits, const std::string& man, const std::string& sh) {
    std::string s(1, flags);
    s += digits;
    uint32_t n = static_cast<uint32_t>(man.size());
    s.append(reinterpret_cast<const char*>(&n), 4);
    seeds.push_back(s + man + sh);
  };
  for (char flags : {0, 1}) add(flags, "", manifest, shard);
  // Hostile cases (issue 19): a step directory named beyond the largest step (2^64 + 7 once
  // wrapped to step 7), and an index entry whose bytes overflow 64 bits (2^61 float64
  // elements, length 0), in a shard whose checksums and manifest are all consistent.
  add(2, "18446744073709551623", manifest, shard);
  add(2, "00000000000000000007", manifest, shard);
  uint64_t index_off = 0, index_len = 0;
  const size_t footer = shard.size() - 48;
  std::memcpy(&index_off, &shard[footer], 8);
  std::memcpy(&index_len, &shard[footer + 8], 8);
  std::string index = shard.substr(index_off, index_len);
  const std::string from = "\"dtype\":\"bytes\",\"length\":" + std::to_string(blob.size());
  const std::string shape = "\"shape\":[" + std::to_string(blob.size()) + "]";
  if (index.find(from) == std::string::npos || index.find(shape) == std::string::npos) return seeds;
  index.replace(index.find(from), from.size(), "\"dtype\":\"float64\",\"length\":0");
  index.replace(index.find(shape), shape.size(), "\"shape\":[2305843009213693952]");
  std::string tail = shard.substr(footer);
  const uint64_t len = index.size(), index_hash = XXH3_64bits(index.data(), index.size());
  std::memcpy(&tail[8], &len, 8);
  std::memcpy(&tail[16], &index_hash, 8);
  const uint64_t footer_hash = XXH3_64bits(tail.data(), 40);
  std::memcpy(&tail[40], &footer_hash, 8);
  const std::string hostile = shard.substr(0, index_off) + index + tail;
  m.shards[0].size = hostile.size();
  m.shards[0].xxh3 = index_hash;
  if (!writeManifest(fs, dir, m).isOk()) return seeds;
  add(0, "", fs.file(dir + "/" + kManifestName).value_or(""), hostile);
  return seeds;
}

}  // namespace trainsup::fuzz
