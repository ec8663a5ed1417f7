// Valid inputs for the fuzz targets, made with the library's own writers: libFuzzer's starting
// corpus (scripts/fuzz.sh writes them out) and the replay test's first inputs.
#pragma once

#include <cstring>
#include <string>
#include <vector>

#include "mem_file_system.h"
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
  for (int i = 0; i < 3; ++i) c.collectives.push_back({i, 40u + i, 1, 4096, 1000 + i, i == 2 ? 0 : 2000 + i});
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
  MemFileSystem fs;
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
  const std::string manifest = fs.files[dir + "/" + kManifestName];
  const std::string shard = fs.files[dir + "/" + shardFileName(0, 1)];
  std::vector<std::string> seeds;
  for (char flags : {0, 1}) {
    std::string s(1, flags);
    uint32_t n = static_cast<uint32_t>(manifest.size());
    s.append(reinterpret_cast<const char*>(&n), 4);
    seeds.push_back(s + manifest + shard);
  }
  return seeds;
}

}  // namespace trainsup::fuzz
