// The fuzz targets (fuzz/*_fuzz.cc) in the normal build: every seed, every crash the fuzzer
// ever found (fuzz/regressions/<target>/, one file per input), and a few thousand
// deterministic mutations of the seeds go through each target's entry point. A broken
// invariant aborts the test binary. scripts/fuzz.sh does the real fuzzing, with libFuzzer.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <iterator>

#include "../../fuzz/seeds.h"

extern "C" int trainsupFuzzTelemetryFrame(const uint8_t* data, size_t size);
extern "C" int trainsupFuzzCheckpoint(const uint8_t* data, size_t size);

namespace trainsup {
namespace {

using Entry = int (*)(const uint8_t*, size_t);

// TRAINSUP_FUZZ_LAST_INPUT=path: each input is written there first, so that the one a broken
// invariant aborted on can be kept as a regression (fuzz/regressions/<target>/).
int run(Entry entry, const std::string& input) {
  if (const char* keep = std::getenv("TRAINSUP_FUZZ_LAST_INPUT")) std::ofstream(keep, std::ios::binary) << input;
  return entry(reinterpret_cast<const uint8_t*>(input.data()), input.size());
}

// Bit flips, byte overwrites, truncations, insertions and duplications, from a fixed seed.
std::string mutate(std::string s, uint64_t& x) {
  auto next = [&x] { return x = x * 6364136223846793005ull + 1442695040888963407ull; };
  const int edits = 1 + static_cast<int>(next() >> 61);
  for (int e = 0; e < edits && !s.empty(); ++e) {
    const size_t at = (next() >> 16) % s.size();
    switch ((next() >> 40) % 5) {
      case 0: s[at] = static_cast<char>(s[at] ^ (1 << ((next() >> 50) % 8))); break;
      case 1: s[at] = static_cast<char>(next() >> 56); break;
      case 2: s.resize(at); break;
      case 3: s.insert(at, std::string(1 + (next() >> 60), static_cast<char>(next() >> 56))); break;
      case 4: s.insert(at, s.substr(at, (next() >> 48) % 64)); break;
    }
  }
  return s;
}

std::vector<std::string> regressions(const std::string& target) {
  std::vector<std::string> out;
  const std::filesystem::path dir = std::filesystem::path(TRAINSUP_FUZZ_DIR) / "regressions" / target;
  if (!std::filesystem::exists(dir)) return out;
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    if (!e.is_regular_file() || e.path().filename() == "README.md") continue;
    std::ifstream in(e.path(), std::ios::binary);
    out.emplace_back(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  return out;
}

void replay(Entry entry, const std::string& target, const std::vector<std::string>& seeds) {
  ASSERT_FALSE(seeds.empty());
  for (const auto& s : seeds) EXPECT_EQ(run(entry, s), 0);
  for (const auto& r : regressions(target)) EXPECT_EQ(run(entry, r), 0);
  uint64_t x = 42;
  for (int i = 0; i < 2000; ++i) run(entry, mutate(seeds[i % seeds.size()], x));
}

TEST(FuzzReplayTest, TelemetryFrameDecoder) {
  replay(trainsupFuzzTelemetryFrame, "telemetry_frame", fuzz::telemetryFrameSeeds());
}

// The seeds are what they claim: a checkpoint that restores (so mutations start from the
// parsers' accepting paths, not from an early rejection).
TEST(FuzzReplayTest, TheCheckpointSeedRestores) {
  const std::string seed = fuzz::checkpointSeeds().at(0);
  uint32_t m = 0;
  std::memcpy(&m, seed.data() + 1, 4);
  testing::MemFileSystem fs;
  const std::string step_dir = "/ckpt/" + checkpointDirName(7);
  fs.setFile(step_dir + "/" + kManifestName, seed.substr(5, m));
  fs.setFile(step_dir + "/" + shardFileName(0, 1), seed.substr(5 + m));
  CheckpointOptions options;
  options.dir = "/ckpt";
  Identity id;
  auto c = Checkpointer::create(options, id, fs, Clock::real(), nullptr, Checkpointer::Hooks{});
  ASSERT_TRUE(c.isOk()) << c.status().toString();
  int tensors = 0;
  auto r = (*c)->restore([&](const Manifest&, const ShardReader& shard) {
    tensors = static_cast<int>(shard.info().tensors.size());
    return Status::ok();
  });
  ASSERT_TRUE(r.isOk()) << r.status().toString();
  EXPECT_EQ(r->value_or(-1), 7);
  EXPECT_EQ(tensors, 2);
}

TEST(FuzzReplayTest, CheckpointManifestAndShardIndex) {
  replay(trainsupFuzzCheckpoint, "checkpoint", fuzz::checkpointSeeds());
}

}  // namespace
}  // namespace trainsup
