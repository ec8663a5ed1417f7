// Fuzz target: what restore() reads from disk — a checkpoint's MANIFEST.json and a shard's
// header, index and footer (trainsup/checkpoint_format.h) — through the whole restore path of
// the Checkpointer, over an in-memory file system.
//
// Input: byte 0 = flags (bit 0: recompute the checksums after the bytes were mutated, so that
// the parsers behind them are reached; the checksums otherwise stop almost every mutation;
// bit 1: the next 20 bytes are the digits of the step directory's name, instead of step 7's);
// bytes 1..4 = the manifest's length M (little-endian, capped by the input); M bytes of
// manifest; the rest is the shard of rank 0 of 1 in step 7. Invariants: a directory name
// parses to the step it names or to nothing (never a wrapped number); every index entry that
// opens is exactly its shape's bytes (computed without overflow); nothing crashes or
// reads out of bounds (ASan), restore() either hands over step 7 as rank 0 of 1 — whose
// tensors read back checksum-clean or fail as Corruption — or skips it with a reason; it never fails for damaged bytes
// (a bad checkpoint is skipped, not an error), only when step 7 was written by another world
// size, which it must name.
#include <nlohmann/json.hpp>
#include <xxhash.h>

#include <cstring>
#include <vector>

#include "fuzz_entry.h"
#include "base/mem_file_system.h"
#include "trainsup/checkpoint_format.h"
#include "trainsup/checkpointer.h"

namespace {

using namespace trainsup;

void put64(std::string& s, size_t at, uint64_t v) { std::memcpy(&s[at], &v, 8); }
uint64_t get64(const std::string& s, size_t at) {
  uint64_t v;
  std::memcpy(&v, &s[at], 8);
  return v;
}

std::string fixManifest(const std::string& text) {
  nlohmann::json j = nlohmann::json::parse(text, nullptr, false);
  if (j.is_discarded() || !j.is_object()) return text;
  j.erase("checksum");
  const std::string canonical = j.dump();
  char hex[17];
  std::snprintf(hex, sizeof(hex), "%016llx", static_cast<unsigned long long>(XXH3_64bits(canonical.data(), canonical.size())));
  j["checksum"] = hex;
  return j.dump(2) + "\n";
}

void fixShard(std::string& s) {
  constexpr size_t kHeader = 40, kFooter = 48;
  if (s.size() < kHeader + kFooter) return;
  const size_t f = s.size() - kFooter;
  const uint64_t index_off = get64(s, f), index_len = get64(s, f + 8);
  if (index_off <= f && index_len <= f - index_off) put64(s, f + 16, XXH3_64bits(s.data() + index_off, index_len));
  put64(s, f + 24, XXH3_64bits(s.data(), kHeader));
  put64(s, f + 40, XXH3_64bits(s.data() + f, 40));
}

}  // namespace

TRAINSUP_FUZZ_ENTRY(trainsupFuzzCheckpoint) {
  if (size < 5) return 0;
  const bool fix = data[0] & 1;
  std::string step_name = checkpointDirName(7);
  if ((data[0] & 2) && size >= 25) {
    step_name = "step-" + std::string(reinterpret_cast<const char*>(data + 1), 20);
    data += 20;
    size -= 20;
    std::string why;
    auto parsed = parseCheckpointDirName(step_name, &why);
    TRAINSUP_FUZZ_CHECK(!parsed || (*parsed >= 0 && checkpointDirName(*parsed) == step_name));
    TRAINSUP_FUZZ_CHECK(parsed || why.empty() || why.find(step_name) != std::string::npos);
  }
  uint32_t m = 0;
  std::memcpy(&m, data + 1, 4);
  m = static_cast<uint32_t>(std::min<size_t>(m, size - 5));
  std::string manifest(reinterpret_cast<const char*>(data + 5), m);
  std::string shard(reinterpret_cast<const char*>(data + 5 + m), size - 5 - m);
  if (fix) {
    manifest = fixManifest(manifest);
    fixShard(shard);
  }
  testing::MemFileSystem fs;
  const std::string step_dir = "/ckpt/" + step_name;
  fs.setFile(step_dir + "/" + kManifestName, manifest);
  fs.setFile(step_dir + "/" + shardFileName(0, 1), shard);

  CheckpointOptions options;
  options.dir = "/ckpt";
  options.interval_s = 0;
  Identity id;
  id.world_size = 1;
  id.job_id = "fuzz";
  auto c = Checkpointer::create(options, id, fs, Clock::real(), nullptr, Checkpointer::Hooks{});
  TRAINSUP_FUZZ_CHECK(c.isOk());
  std::vector<char> buf;
  auto restored = (*c)->restore([&](const Manifest& man, const ShardReader& reader) -> Status {
    TRAINSUP_FUZZ_CHECK(man.step == 7 && man.world_size == 1);
    for (const TensorEntry& e : reader.info().tensors) {
      unsigned __int128 bytes = dtypeSize(e.meta.dtype);
      for (int64_t d : e.meta.shape) {
        TRAINSUP_FUZZ_CHECK(d >= 0);
        bytes = d == 0 || bytes <= (~static_cast<unsigned __int128>(0)) / static_cast<uint64_t>(d) ? bytes * static_cast<uint64_t>(d) : ~static_cast<unsigned __int128>(0);
      }
      TRAINSUP_FUZZ_CHECK(bytes == e.length);
      if (e.length > (16u << 20)) return Status::invalidArgument("fuzz: tensor larger than 16 MiB");
      buf.resize(e.length);
      // Tensor data is checksummed as it is read: damage shows here, as Corruption, and the
      // loader hands it back so that restore() skips the checkpoint.
      Status s = reader.read(e, buf.data(), buf.size());
      TRAINSUP_FUZZ_CHECK(s.isOk() || s.code() == StatusCode::kCorruption);
      if (!s.isOk()) return s;
    }
    return Status::ok();
  });
  // restore() fails only for our callback's refusal; when the only checkpoint was written by
  // another world size (a configuration error it must name); or when a load was begun and
  // failed (damaged tensor data) and nothing older loaded after it (the state may be partly
  // overwritten: Unavailable, saying so). Never for other damage: that checkpoint is skipped.
  const std::string why = restored.isOk() ? "" : restored.status().message();
  TRAINSUP_FUZZ_CHECK(restored.isOk() || why.find("fuzz:") != std::string::npos ||
                      why.find("written by world size") != std::string::npos ||
                      (restored.status().code() == StatusCode::kUnavailable &&
                       why.find("partly loaded") != std::string::npos));
  if (restored.isOk() && restored->has_value()) TRAINSUP_FUZZ_CHECK(**restored == 7);
  return 0;
}
