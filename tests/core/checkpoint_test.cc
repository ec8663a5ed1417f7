// Checkpoints: format round trip, every kind of damage skipped with its reason, disk errors
// failing one save only, kill -9 of the writer at each point of a persist, retention, busy
// policy, and several ranks (as threads) committing and restoring through one channel.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstring>
#include <fstream>
#include <future>
#include <thread>

#include <xxhash.h>

#include "checkpoint_test_util.h"
#include "trainsup/checkpointer.h"
#include "base/manual_clock.h"

namespace trainsup {
namespace {

using testing::Events;
using testing::FaultyFileSystem;
using testing::freshDir;
using testing::State;
using std::chrono::seconds;

CheckpointOptions opts(const std::string& dir, int keep = 3) {
  CheckpointOptions o;
  o.dir = dir;
  o.interval_s = 0;  // explicit saves only unless a test says otherwise
  o.keep = keep;
  o.commit_timeout_s = 20;
  return o;
}

Identity rankIdentity(int rank, int world) {
  Identity id;
  id.rank = rank;
  id.world_size = world;
  id.host = "h" + std::to_string(rank);
  id.job_id = "ckpt";
  return id;
}

std::unique_ptr<Checkpointer> make(const CheckpointOptions& o, FileSystem& fs, Events& ev, Clock& clock = Clock::real(),
                                   Identity id = rankIdentity(0, 1), std::shared_ptr<CommitChannel> ch = nullptr) {
  auto c = Checkpointer::create(o, id, fs, clock, std::move(ch), ev.hooks());
  if (!c) throw std::runtime_error(c.status().toString());
  return std::move(*c);
}

void saveAndCommit(Checkpointer& c, const State& s, int64_t step) {
  auto r = c.save(step, s.collect(step));
  ASSERT_TRUE(r.isOk()) << r.status().toString();
  ASSERT_EQ(*r, Checkpointer::Outcome::kStarted);
  Status w = c.waitIdle(seconds(30));
  ASSERT_TRUE(w.isOk()) << w.toString();
}

std::optional<int64_t> restoreInto(Checkpointer& c, State& s) {
  auto r = c.restore(s.load());
  if (!r) throw std::runtime_error(r.status().toString());
  return *r;
}

void flipByte(const std::string& path, uint64_t offset) {
  std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
  f.seekg(static_cast<std::streamoff>(offset));
  char c = 0;
  f.read(&c, 1);
  c = static_cast<char>(c ^ 0x40);
  f.seekp(static_cast<std::streamoff>(offset));
  f.write(&c, 1);
}

TEST(CheckpointFormatTest, ShardAndManifestRoundTripBitwise) {
  std::string dir = freshDir("format");
  State s(7);
  ShardInfo info;
  ASSERT_TRUE(writeShard(FileSystem::posix(), dir, 2, 4, 99, s.refs(), &info).isOk());
  EXPECT_EQ(info.tensors.size(), 3u);
  EXPECT_FALSE(std::filesystem::exists(dir + "/.shard-r00002-of-00004.tsc.tmp"));
  auto reader = ShardReader::open(FileSystem::posix(), dir + "/" + shardFileName(2, 4));
  ASSERT_TRUE(reader.isOk()) << reader.status().toString();
  EXPECT_EQ((*reader)->info().rank, 2);
  EXPECT_EQ((*reader)->info().step, 99);
  EXPECT_EQ((*reader)->info().index_xxh3, info.index_xxh3);
  const TensorEntry* w = (*reader)->find("model.weight");
  ASSERT_NE(w, nullptr);
  EXPECT_EQ(w->meta.dtype, DType::kFloat32);
  EXPECT_EQ(w->meta.shape, std::vector<int64_t>{4096});
  EXPECT_EQ(w->offset % 64, 0u);
  State back(0);
  ASSERT_TRUE(s.load()(Manifest{}, **reader).isOk());
  ASSERT_TRUE(back.load()(Manifest{}, **reader).isOk());
  EXPECT_TRUE(back == s);
  EXPECT_TRUE((*reader)->verifyAll().isOk());

  Manifest m;
  m.step = 99;
  m.world_size = 1;
  m.job_id = "j";
  m.shards = {{0, shardFileName(0, 1), 123, 0xdeadbeefcafef00dULL}};
  m.metadata = {{"epoch", "3"}};
  ASSERT_TRUE(writeManifest(FileSystem::posix(), dir, m).isOk());
  auto rm = readManifest(FileSystem::posix(), dir);
  ASSERT_TRUE(rm.isOk()) << rm.status().toString();
  EXPECT_EQ(rm->shards[0].xxh3, 0xdeadbeefcafef00dULL);
  EXPECT_EQ(rm->metadata.at("epoch"), "3");
  // Any edit of the manifest breaks its checksum.
  std::string text;
  {
    std::ifstream in(dir + "/MANIFEST.json");
    text.assign(std::istreambuf_iterator<char>(in), {});
  }
  text.replace(text.find("\"3\""), 3, "\"4\"");
  std::ofstream(dir + "/MANIFEST.json") << text;
  auto bad = readManifest(FileSystem::posix(), dir);
  ASSERT_FALSE(bad.isOk());
  EXPECT_NE(bad.status().message().find("checksum mismatch"), std::string::npos);
}

TEST(CheckpointFormatTest, BadBuffersAreRejected) {
  std::string dir = freshDir("badbuf");
  float x[4] = {};
  std::vector<BufferRef> dup = {{{"a", DType::kFloat32, {4}}, x, 16}, {{"a", DType::kFloat32, {4}}, x, 16}};
  EXPECT_EQ(writeShard(FileSystem::posix(), dir, 0, 1, 1, dup, nullptr).code(), StatusCode::kInvalidArgument);
  std::vector<BufferRef> wrong = {{{"a", DType::kFloat32, {5}}, x, 16}};
  EXPECT_EQ(writeShard(FileSystem::posix(), dir, 0, 1, 1, wrong, nullptr).code(), StatusCode::kInvalidArgument);
}

// A shape whose element count fits in 64 bits but whose bytes do not: 2^61 float64 elements
// are 2^64 bytes, which wrapped to 0 and matched an empty buffer (issue 19, defect 11).
TEST(CheckpointFormatTest, AShapeWhoseBytesOverflowIsRejectedNotWrapped) {
  std::string dir = freshDir("overflow");
  std::vector<BufferRef> huge = {{{"a", DType::kFloat64, {int64_t{1} << 61}}, nullptr, 0}};
  Status s = writeShard(FileSystem::posix(), dir, 0, 1, 1, huge, nullptr);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.toString();
  EXPECT_NE(s.message().find("'a'"), std::string::npos) << s.message();
  // The same entry in a shard's index, as a damaged or hostile file would carry it.
  float x[4] = {1, 2, 3, 4};
  ShardInfo info;
  ASSERT_TRUE(writeShard(FileSystem::posix(), dir, 0, 1, 1, {{{"a", DType::kFloat32, {4}}, x, 16}}, &info).isOk());
  const std::string path = dir + "/" + shardFileName(0, 1);
  std::string bytes;
  {
    std::ifstream in(path, std::ios::binary);
    bytes.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  // Rewrite the index with shape [2^61] of float64 and length 0, then fix the footer's checksums.
  uint64_t index_off, index_len;
  const size_t footer = bytes.size() - 48;
  std::memcpy(&index_off, &bytes[footer], 8);
  std::memcpy(&index_len, &bytes[footer + 8], 8);
  std::string index = bytes.substr(index_off, index_len);
  const std::string from = "\"dtype\":\"float32\",\"length\":16";
  ASSERT_NE(index.find(from), std::string::npos) << index;
  index.replace(index.find(from), from.size(), "\"dtype\":\"float64\",\"length\":0");
  const std::string shape = "\"shape\":[4]";
  ASSERT_NE(index.find(shape), std::string::npos) << index;
  index.replace(index.find(shape), shape.size(), "\"shape\":[2305843009213693952]");
  std::string rebuilt = bytes.substr(0, index_off) + index;
  const uint64_t new_len = index.size();
  std::string tail = bytes.substr(footer);
  std::memcpy(&tail[8], &new_len, 8);
  const uint64_t index_hash = XXH3_64bits(index.data(), index.size());
  std::memcpy(&tail[16], &index_hash, 8);
  const uint64_t footer_hash = XXH3_64bits(tail.data(), 40);
  std::memcpy(&tail[40], &footer_hash, 8);
  rebuilt += tail;
  std::ofstream(path, std::ios::binary | std::ios::trunc) << rebuilt;
  auto reader = ShardReader::open(FileSystem::posix(), path);
  ASSERT_FALSE(reader.isOk()) << "an index entry of 2^64 bytes was taken as " << (*reader)->info().tensors[0].length;
  EXPECT_EQ(reader.status().code(), StatusCode::kCorruption);
  EXPECT_NE(reader.status().message().find("index entry 'a' does not fit the file"), std::string::npos)
      << reader.status().message();
}

TEST(CheckpointFormatTest, DirectoryNamesBeyondTheLargestStepAreNotCheckpoints) {
  EXPECT_EQ(parseCheckpointDirName(checkpointDirName(INT64_MAX)), INT64_MAX);
  EXPECT_EQ(parseCheckpointDirName("step-00000000000000000042"), 42);
  for (const char* name : {"step-09223372036854775808", "step-99999999999999999999", "step-18446744073709551621"}) {
    std::string why;
    EXPECT_EQ(parseCheckpointDirName(name, &why), std::nullopt) << name;  // 2^64 + 5 once read as step 5
    EXPECT_NE(why.find(name), std::string::npos) << why;
    EXPECT_NE(why.find("beyond the largest"), std::string::npos) << why;
  }
  std::string why;
  EXPECT_EQ(parseCheckpointDirName("step-0000000000000000004x", &why), std::nullopt);
  EXPECT_TRUE(why.empty()) << "not a checkpoint's name at all: nothing to explain";
  // Restore passes over such a directory with a reason, and takes the real checkpoint.
  std::string dir = freshDir("bigname");
  Events ev;
  auto c = make(opts(dir), FileSystem::posix(), ev);
  State s(5);
  saveAndCommit(*c, s, 5);
  std::filesystem::create_directories(dir + "/step-18446744073709551621");  // would read as step 5
  std::filesystem::copy(c->stepDir(5), dir + "/step-18446744073709551621",
                        std::filesystem::copy_options::recursive | std::filesystem::copy_options::overwrite_existing);
  State got(0);
  auto step = restoreInto(*c, got);
  ASSERT_EQ(step, 5);
  EXPECT_TRUE(got == s);
  auto reasons = ev.reasons("checkpoint_skipped");
  ASSERT_EQ(reasons.size(), 1u);
  EXPECT_NE(reasons[0].find("'step-18446744073709551621' names a step beyond"), std::string::npos) << reasons[0];
  auto newest = newestValidCheckpoint(FileSystem::posix(), dir);
  ASSERT_TRUE(newest.isOk());
  EXPECT_EQ(newest->step, 5);
  ASSERT_EQ(newest->skipped.size(), 1u);
  EXPECT_NE(newest->skipped[0].find("beyond the largest"), std::string::npos) << newest->skipped[0];
}

// Makes valid checkpoints at steps 1 and 2 (different states), damages step 2 with `damage`,
// and expects restore to skip it with `reason` and load step 1 bitwise.
void expectSkipped(const std::string& tag, const std::function<void(const std::string& step2_dir)>& damage,
                   const std::string& reason) {
  std::string dir = freshDir(tag);
  Events ev;
  auto c = make(opts(dir), FileSystem::posix(), ev);
  State s1(1), s2(2);
  saveAndCommit(*c, s1, 1);
  saveAndCommit(*c, s2, 2);
  damage(c->stepDir(2));
  State got(0);
  auto step = restoreInto(*c, got);
  ASSERT_TRUE(step.has_value()) << tag;
  EXPECT_EQ(*step, 1) << tag;
  EXPECT_TRUE(got == s1) << tag;
  auto reasons = ev.reasons("checkpoint_skipped");
  ASSERT_EQ(reasons.size(), 1u) << tag;
  EXPECT_NE(reasons[0].find(reason), std::string::npos) << tag << ": " << reasons[0];
}

TEST(CheckpointRestoreTest, DamagedCheckpointsAreSkippedWithTheRightReason) {
  const std::string shard = "/" + shardFileName(0, 1);
  expectSkipped("truncated", [&](const std::string& d) {
    std::filesystem::resize_file(d + shard, std::filesystem::file_size(d + shard) / 2);
  }, "size mismatch");
  expectSkipped("flipped", [&](const std::string& d) { flipByte(d + shard, 100); }, "checksum mismatch in tensor");
  expectSkipped("nomanifest", [&](const std::string& d) { std::filesystem::remove(d + "/MANIFEST.json"); },
                "missing manifest");
  expectSkipped("noshard", [&](const std::string& d) { std::filesystem::remove(d + shard); }, "missing shard");
  expectSkipped("badheader", [&](const std::string& d) { flipByte(d + shard, 2); }, "bad header");
  expectSkipped("footer", [&](const std::string& d) {
    flipByte(d + shard, std::filesystem::file_size(d + shard) - 20);
  }, "bad footer");
  expectSkipped("index", [&](const std::string& d) {
    flipByte(d + shard, std::filesystem::file_size(d + shard) - 60);
  }, "checksum mismatch in the index");
  // A shard from another checkpoint in its place: right format, wrong content for this manifest.
  expectSkipped("swapped", [&](const std::string& d) {
    State other(3, 4000);
    ShardInfo info;
    ASSERT_TRUE(writeShard(FileSystem::posix(), d, 0, 1, 2, other.refs(), &info).isOk());
  }, "size mismatch");
  expectSkipped("sameSizeSwap", [&](const std::string& d) {
    State other(3);
    ShardInfo info;
    ASSERT_TRUE(writeShard(FileSystem::posix(), d, 0, 1, 2, other.refs(), &info).isOk());
  }, "differs from the manifest");
  // A manifest whose checksum is right but whose content points elsewhere (tampering, or a
  // copied manifest): another step, another rank's shard, a file outside the directory.
  auto rewrite = [](const std::string& d, const std::function<void(Manifest&)>& edit) {
    auto m = readManifest(FileSystem::posix(), d);
    ASSERT_TRUE(m.isOk()) << m.status().toString();
    edit(*m);
    ASSERT_TRUE(writeManifest(FileSystem::posix(), d, *m).isOk());
  };
  expectSkipped("otherStep", [&](const std::string& d) { rewrite(d, [](Manifest& m) { m.step = 9; }); },
                "the manifest is of step 9");
  expectSkipped("traversal", [&](const std::string& d) {
    rewrite(d, [](Manifest& m) { m.shards[0].file = "../../escape.tsc"; });
  }, "expected rank 0 and 'shard-r00000-of-00001.tsc'");
  expectSkipped("noWorld", [&](const std::string& d) {
    rewrite(d, [](Manifest& m) { m.world_size = 0; m.shards.clear(); });
  }, "0 shards for world size 0");
}

// Restores `dir` as the two ranks of a job (rank 1 on a thread, so that the agreement
// completes): rank 0's result and state, rank 1's result.
struct TwoRankRestore {
  Result<std::optional<int64_t>> rank0 = Status::internal("unset"), rank1 = Status::internal("unset");
  State state0{0};
};
TwoRankRestore restoreOnTwoRanks(const std::string& dir, Events& ev) {
  auto channel = std::make_shared<LocalCommitChannel>();
  auto other = std::async(std::launch::async, [&] {
    Events e2;
    auto c = make(opts(dir), FileSystem::posix(), e2, Clock::real(), rankIdentity(1, 2), channel);
    State x(0);
    return c->restore(x.load());
  });
  TwoRankRestore out;
  auto c = make(opts(dir), FileSystem::posix(), ev, Clock::real(), rankIdentity(0, 2), channel);
  out.rank0 = c->restore(out.state0.load());
  out.rank1 = other.get();
  return out;
}

TEST(CheckpointRestoreTest, WorldSizeMismatchIsSkippedAndAClearErrorWhenNothingElseFits) {
  std::string dir = freshDir("world");
  Events ev;
  auto one = make(opts(dir), FileSystem::posix(), ev);
  State s(1);
  saveAndCommit(*one, s, 5);
  one.reset();
  auto two = restoreOnTwoRanks(dir, ev);
  auto& r = two.rank0;
  ASSERT_FALSE(r.isOk());
  EXPECT_NE(r.status().message().find("world size 1, this job has 2"), std::string::npos) << r.status().message();
  EXPECT_NE(r.status().message().find("resharding is not supported"), std::string::npos);
  EXPECT_FALSE(two.rank1.isOk());
  auto reasons = ev.reasons("checkpoint_skipped");
  ASSERT_FALSE(reasons.empty());
  EXPECT_NE(reasons.back().find("world-size mismatch"), std::string::npos);
}

// The persist hook (torch.distributed.checkpoint's writer in Python): what it writes is listed
// in the shard, must be there for the checkpoint to be valid, and a layout that reshards is
// offered to a job of another world size.
TEST(CheckpointPersistHookTest, CompanionFilesMustBePresentAndTheLayoutReshards) {
  std::string dir = freshDir("hook");
  Events ev;
  auto c = make(opts(dir), FileSystem::posix(), ev);
  std::vector<std::string> written;
  c->setPersistHook([&](const std::string& step_dir, int64_t step)
                        -> Result<std::vector<std::pair<std::string, std::string>>> {
    const std::string name = "data-" + std::to_string(step) + ".bin";
    std::ofstream(step_dir + "/" + name) << std::string(100 + step, 'x');
    written.push_back(step_dir + "/" + name);
    return std::vector<std::pair<std::string, std::string>>{
        {kCompanionsEntry, R"([{"file":")" + name + R"(","size":)" + std::to_string(100 + step) + "}]"}};
  });
  State s(1);
  Checkpointer::Collect collect = [&](std::vector<BufferRef>& b, std::map<std::string, std::string>& meta) {
    b = s.refs();
    meta[kLayoutKey] = "dcp";
    return Status::ok();
  };
  for (int64_t step : {1, 2, 3}) {
    ASSERT_TRUE(c->save(step, collect).isOk());
    ASSERT_TRUE(c->waitIdle(seconds(30)).isOk());
  }
  ASSERT_EQ(written.size(), 3u);
  auto shard = ShardReader::open(FileSystem::posix(), c->stepDir(3) + "/" + shardFileName(0, 1));
  ASSERT_TRUE(shard.isOk());
  EXPECT_NE((*shard)->find(kCompanionsEntry), nullptr);
  EXPECT_TRUE(checkCheckpoint(FileSystem::posix(), c->stepDir(3), 3).isOk());
  // Step 3's file gone, step 2's truncated: neither is valid, and each says why.
  std::filesystem::remove(written[2]);
  std::filesystem::resize_file(written[1], 10);
  auto three = checkCheckpoint(FileSystem::posix(), c->stepDir(3), 3);
  ASSERT_FALSE(three.isOk());
  EXPECT_NE(three.status().message().find("missing file '" + written[2] + "'"), std::string::npos)
      << three.status().message();
  auto two = checkCheckpoint(FileSystem::posix(), c->stepDir(2), 2);
  ASSERT_FALSE(two.isOk());
  EXPECT_NE(two.status().message().find("size mismatch: 10 bytes, shard 0 says 102"), std::string::npos)
      << two.status().message();
  c.reset();
  // Two ranks restore what one wrote (the layout reshards): both get step 1, the newest valid.
  auto restored = restoreOnTwoRanks(dir, ev);
  ASSERT_TRUE(restored.rank0.isOk()) << restored.rank0.status().toString();
  EXPECT_EQ(*restored.rank0, std::optional<int64_t>(1));
  ASSERT_TRUE(restored.rank1.isOk()) << restored.rank1.status().toString();
  EXPECT_EQ(*restored.rank1, std::optional<int64_t>(1));
  EXPECT_EQ(restored.state0.weights, s.weights);
}

TEST(CheckpointPersistHookTest, AHookErrorFailsThatSaveOnly) {
  std::string dir = freshDir("hookfail");
  Events ev;
  auto c = make(opts(dir), FileSystem::posix(), ev);
  bool fail = true;
  c->setPersistHook([&](const std::string&, int64_t) -> Result<std::vector<std::pair<std::string, std::string>>> {
    if (fail) return Status::ioError("disk quota exceeded");
    return std::vector<std::pair<std::string, std::string>>{};
  });
  State s(1);
  ASSERT_TRUE(c->save(1, s.collect(1)).isOk());
  Status w = c->waitIdle(seconds(30));
  ASSERT_FALSE(w.isOk());
  EXPECT_NE(w.message().find("writing the checkpoint data: disk quota exceeded"), std::string::npos) << w.toString();
  EXPECT_FALSE(std::filesystem::exists(c->stepDir(1) + "/" + kManifestName));
  fail = false;
  saveAndCommit(*c, s, 2);
  EXPECT_EQ(c->stats().last_committed_step, 2);
}

TEST(CheckpointRestoreTest, EmptyDirectoryRestoresNothing) {
  Events ev;
  auto c = make(opts(freshDir("empty")), FileSystem::posix(), ev);
  State s(0);
  EXPECT_FALSE(restoreInto(*c, s).has_value());
}

struct DiskFault {
  const char* name;
  FaultyFileSystem::Op op;
  int err;
};

TEST(CheckpointFaultTest, DiskErrorsFailOneSaveAndTrainingContinues) {
  for (DiskFault f : {DiskFault{"enospc_write", FaultyFileSystem::Op::kAppend, ENOSPC},
                      DiskFault{"eio_write", FaultyFileSystem::Op::kAppend, EIO},
                      DiskFault{"enospc_fsync", FaultyFileSystem::Op::kSync, ENOSPC},
                      DiskFault{"eio_fsync", FaultyFileSystem::Op::kSync, EIO}}) {
    SCOPED_TRACE(f.name);
    std::string dir = freshDir(f.name);
    FaultyFileSystem fs;
    Events ev;
    auto c = make(opts(dir), fs, ev);
    State s1(1), s2(2), s3(3);
    saveAndCommit(*c, s1, 1);
    fs.arm({f.op, "shard", 5000, Status::ioError(std::string("injected: ") + std::strerror(f.err))});
    auto r = c->save(2, s2.collect(2));
    ASSERT_TRUE(r.isOk());  // the stall part succeeded; the persist fails in the background
    Status w = c->waitIdle(seconds(30));
    EXPECT_FALSE(w.isOk());
    EXPECT_NE(w.message().find(std::strerror(f.err)), std::string::npos) << w.message();
    Status reported = c->takeError();
    EXPECT_FALSE(reported.isOk());
    EXPECT_TRUE(c->takeError().isOk());  // reported once
    EXPECT_EQ(ev.count("checkpoint_failed"), 1);
    EXPECT_FALSE(std::filesystem::exists(c->stepDir(2) + "/MANIFEST.json"));
    EXPECT_FALSE(std::filesystem::exists(c->stepDir(2) + "/.shard-r00000-of-00001.tsc.tmp"));
    // The next save works, and the old one is intact.
    saveAndCommit(*c, s3, 3);
    State got(0);
    EXPECT_EQ(restoreInto(*c, got), 3);
    EXPECT_TRUE(got == s3);
    std::filesystem::remove_all(c->stepDir(3));
    EXPECT_EQ(restoreInto(*c, got), 1);
    EXPECT_TRUE(got == s1);
  }
}

// The same over the in-memory file system (base/mem_file_system.h: one fault injector over
// either file system): the checkpointer's writer thread and the training thread share it.
TEST(CheckpointFaultTest, AFullDiskFailsOneSaveOverTheInMemoryFileSystemToo) {
  testing::MemFileSystem mem;
  FaultyFileSystem fs(mem);
  Events ev;
  auto c = make(opts("/mem/ckpt"), fs, ev);
  State s1(1), s2(2), s3(3);
  saveAndCommit(*c, s1, 1);
  fs.arm({FaultyFileSystem::Op::kAppend, "shard", 5000, Status::ioError("injected: No space left on device")});
  ASSERT_TRUE(c->save(2, s2.collect(2)).isOk());
  EXPECT_FALSE(c->waitIdle(seconds(30)).isOk());
  EXPECT_EQ(ev.count("checkpoint_failed"), 1);
  EXPECT_FALSE(fs.exists(c->stepDir(2) + "/MANIFEST.json"));
  EXPECT_FALSE(mem.file(c->stepDir(2) + "/.shard-r00000-of-00001.tsc.tmp").has_value());
  saveAndCommit(*c, s3, 3);
  State got(0);
  EXPECT_EQ(restoreInto(*c, got), 3);
  EXPECT_TRUE(got == s3);
  EXPECT_FALSE(std::filesystem::exists("/mem/ckpt")) << "nothing reached the disk";
}

// kill -9 of the writing process at each point of a persist leaves the previous checkpoint
// restorable and the interrupted one invalid.
TEST(CheckpointFaultTest, KillNineAtEachPointOfAPersist) {
  struct Point {
    const char* name;
    FaultyFileSystem::Fault fault;
  };
  const std::vector<Point> points = {
      {"before_data", {FaultyFileSystem::Op::kAppend, "shard", 0, Status::ok()}},
      {"mid_data", {FaultyFileSystem::Op::kAppend, "shard", 8000, Status::ok()}},
      {"before_rename", {FaultyFileSystem::Op::kRename, "shard", 0, Status::ok()}},
      {"before_manifest", {FaultyFileSystem::Op::kCreate, "MANIFEST", 0, Status::ok()}},
      {"before_manifest_rename", {FaultyFileSystem::Op::kRename, "MANIFEST", 0, Status::ok()}},
  };
  for (const Point& p : points) {
    SCOPED_TRACE(p.name);
    std::string dir = freshDir(std::string("kill_") + p.name);
    pid_t pid = fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      // The child: commit step 1, then die inside the persist of step 2.
      FaultyFileSystem fs;
      Events ev;
      auto c = make(opts(dir), fs, ev);
      State s1(1), s2(2);
      if (!c->save(1, s1.collect(1)).isOk() || !c->waitIdle(seconds(30)).isOk()) _exit(3);
      fs.arm(p.fault);
      if (!c->save(2, s2.collect(2)).isOk()) _exit(4);
      c->waitIdle(seconds(30));
      _exit(5);  // not reached: the fault kills us
    }
    int status = 0;
    ASSERT_EQ(waitpid(pid, &status, 0), pid);
    ASSERT_TRUE(WIFSIGNALED(status)) << "child exited with " << WEXITSTATUS(status);
    ASSERT_EQ(WTERMSIG(status), SIGKILL);
    Events ev;
    auto c = make(opts(dir), FileSystem::posix(), ev);
    State got(0);
    EXPECT_EQ(restoreInto(*c, got), 1);
    EXPECT_TRUE(got == State(1));
    EXPECT_FALSE(std::filesystem::exists(c->stepDir(2) + "/MANIFEST.json"));
  }
}

TEST(CheckpointRetentionTest, KeepsNewestKAndNeverTheNewestValid) {
  std::string dir = freshDir("retention");
  Events ev;
  auto c = make(opts(dir, /*keep=*/2), FileSystem::posix(), ev);
  for (int64_t step = 1; step <= 5; ++step) saveAndCommit(*c, State(static_cast<uint32_t>(step)), step);
  std::vector<int64_t> left;
  for (const auto& e : std::filesystem::directory_iterator(dir)) left.push_back(*parseCheckpointDirName(e.path().filename().string()));
  std::sort(left.begin(), left.end());
  EXPECT_EQ(left, (std::vector<int64_t>{4, 5}));
  // A deletion that crashed after removing the manifest leaves an invalid directory, which is
  // skipped at restore and removed by the next retention; the newest valid is never touched.
  std::filesystem::remove(c->stepDir(4) + "/MANIFEST.json");
  auto plan = planRetention(FileSystem::posix(), dir, 2, 5);
  ASSERT_TRUE(plan.isOk());
  EXPECT_EQ(plan->keep, std::vector<int64_t>{5});
  EXPECT_EQ(plan->remove, std::vector<int64_t>{4});
  // A newer directory that looks complete (right sizes) but whose shard does not match its
  // manifest — a checkpoint restore skipped — neither counts nor costs the committed one.
  std::filesystem::copy(c->stepDir(5), c->stepDir(9));
  const std::string shard9 = c->stepDir(9) + "/" + shardFileName(0, 1);
  ShardInfo other;
  ASSERT_TRUE(writeShard(FileSystem::posix(), c->stepDir(9), 0, 1, 9, State(99).refs(), &other).isOk());
  ASSERT_EQ(std::filesystem::file_size(shard9), std::filesystem::file_size(c->stepDir(5) + "/" + shardFileName(0, 1)));
  plan = planRetention(FileSystem::posix(), dir, 1, 5);
  EXPECT_EQ(plan->keep, std::vector<int64_t>{5});
  EXPECT_EQ(plan->remove, std::vector<int64_t>{4}) << "step 9 is newer than the commit: left alone";
  // An *older* one that looks complete but does not verify is removed, never counted as kept.
  std::filesystem::copy(c->stepDir(9), c->stepDir(3));
  plan = planRetention(FileSystem::posix(), dir, 2, 5);
  EXPECT_EQ(plan->keep, std::vector<int64_t>{5});
  EXPECT_EQ(plan->remove, (std::vector<int64_t>{4, 3}));
}

TEST(CheckpointRetentionTest, CrashDuringDeletionNeverLosesTheNewestValid) {
  std::string dir = freshDir("retention_crash");
  pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    FaultyFileSystem fs;
    Events ev;
    auto c = make(opts(dir, 1), fs, ev);
    for (int64_t step = 1; step <= 2; ++step) {
      if (step == 2) fs.arm({FaultyFileSystem::Op::kRemove, "shard", 0, Status::ok()});  // die mid-deletion of step 1
      if (!c->save(step, State(static_cast<uint32_t>(step)).collect(step)).isOk()) _exit(3);
      c->waitIdle(seconds(30));
    }
    _exit(5);
  }
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFSIGNALED(status));
  Events ev;
  auto c = make(opts(dir, 1), FileSystem::posix(), ev);
  State got(0);
  EXPECT_EQ(restoreInto(*c, got), 2);
  EXPECT_TRUE(got == State(2));
}

TEST(CheckpointPolicyTest, BusySkipIsRecordedAndWaitWaits) {
  for (BusyPolicy policy : {BusyPolicy::kSkip, BusyPolicy::kWait}) {
    SCOPED_TRACE(busyPolicyName(policy));
    std::string dir = freshDir(std::string("busy_") + busyPolicyName(policy));
    // Holds the first persist inside fsync until released.
    struct GateFs : FileSystemWrapper {
      using FileSystemWrapper::FileSystemWrapper;
      std::promise<void> entered, release;
      std::shared_future<void> released{release.get_future().share()};
      std::atomic<bool> first{true};
      Status syncDir(const std::string& d) override {
        if (first.exchange(false)) {
          entered.set_value();
          released.wait();
        }
        return target().syncDir(d);
      }
    } fs(FileSystem::posix());
    Events ev;
    CheckpointOptions o = opts(dir);
    o.busy_policy = policy;
    auto c = make(o, fs, ev);
    State s1(1), s2(2);
    ASSERT_EQ(*c->save(1, s1.collect(1)), Checkpointer::Outcome::kStarted);
    fs.entered.get_future().wait();  // the persist of step 1 is in flight
    if (policy == BusyPolicy::kSkip) {
      EXPECT_EQ(*c->save(2, s2.collect(2)), Checkpointer::Outcome::kSkippedBusy);
      EXPECT_EQ(ev.count("checkpoint_skipped_busy"), 1);
      fs.release.set_value();
      EXPECT_TRUE(c->waitIdle(seconds(30)).isOk());
      EXPECT_EQ(c->stats().committed, 1);
      EXPECT_EQ(c->stats().skipped_busy, 1);
    } else {
      std::thread releaser([&] { fs.release.set_value(); });
      EXPECT_EQ(*c->save(2, s2.collect(2)), Checkpointer::Outcome::kStarted);  // waited for step 1
      releaser.join();
      EXPECT_TRUE(c->waitIdle(seconds(30)).isOk());
      EXPECT_EQ(c->stats().committed, 2);
      EXPECT_EQ(ev.count("checkpoint_skipped_busy"), 0);
    }
  }
}

// Overlapped mode: save() returns before the copy; after awaitSnapshot() the trainer may change
// the state, and the checkpoint still holds the values of the save. (Under ThreadSanitizer a
// missing happens-before between the writer's copy and these writes is reported as a race.)
TEST(CheckpointPolicyTest, OverlappedSnapshotHoldsTheStateOfTheSave) {
  std::string dir = freshDir("overlapped");
  Events ev;
  CheckpointOptions o = opts(dir);
  o.snapshot = SnapshotMode::kOverlapped;
  o.busy_policy = BusyPolicy::kWait;
  auto c = make(o, FileSystem::posix(), ev);
  const size_t n = size_t{8} << 20;  // 32 MiB of weights: the copy takes a while
  State live(1, n);
  const State at_save_1 = live;
  ASSERT_EQ(*c->save(1, live.collect(1)), Checkpointer::Outcome::kStarted);
  EXPECT_TRUE(c->snapshotOutstanding());
  ASSERT_TRUE(c->awaitSnapshot().isOk());
  EXPECT_FALSE(c->snapshotOutstanding());
  EXPECT_EQ(ev.count("checkpoint_snapshot"), 1);
  // The optimizer step: every saved buffer changes in place.
  std::fill(live.weights.begin(), live.weights.end(), -1.0f);
  std::fill(live.counters.begin(), live.counters.end(), -1);
  const State at_save_2 = live;
  // Not awaited by the caller: the next save awaits it itself.
  ASSERT_EQ(*c->save(2, live.collect(2)), Checkpointer::Outcome::kStarted);
  ASSERT_TRUE(c->waitIdle(seconds(60)).isOk());
  EXPECT_EQ(ev.count("checkpoint_snapshot"), 2);
  EXPECT_EQ(c->stats().committed, 2);
  EXPECT_GT(c->stats().last_stall_s, 0);

  // Both checkpoints hold exactly the state at their save.
  State restored(0, n);
  ASSERT_EQ(**c->restore(restored.load()), 2);
  EXPECT_TRUE(restored == at_save_2);
  ASSERT_TRUE(std::filesystem::remove_all(c->stepDir(2)) > 0);
  State older(0, n);
  auto c2 = make(o, FileSystem::posix(), ev);
  ASSERT_EQ(**c2->restore(older.load()), 1);
  EXPECT_TRUE(older == at_save_1);
}

TEST(CheckpointPolicyTest, IntervalAndEveryNStepsWithAnInjectedClock) {
  ManualClock clock;
  Events ev;
  CheckpointOptions o = opts(freshDir("interval"));
  o.interval_s = 600;
  auto c = make(o, FileSystem::posix(), ev, clock);
  State s(1);
  for (int64_t step = 0; step < 10; ++step) {
    clock.advance(seconds(59));
    EXPECT_EQ(*c->maybeSave(step, s.collect(step)), Checkpointer::Outcome::kNotDue);
  }
  clock.advance(seconds(20));  // 610 s since start
  EXPECT_EQ(*c->maybeSave(10, s.collect(10)), Checkpointer::Outcome::kStarted);
  ASSERT_TRUE(c->waitIdle(seconds(30)).isOk());
  clock.advance(seconds(599));
  EXPECT_EQ(*c->maybeSave(11, s.collect(11)), Checkpointer::Outcome::kNotDue);
  clock.advance(seconds(2));
  EXPECT_EQ(*c->maybeSave(12, s.collect(12)), Checkpointer::Outcome::kStarted);
  ASSERT_TRUE(c->waitIdle(seconds(30)).isOk());

  CheckpointOptions e = opts(freshDir("every"));
  e.every_steps = 4;
  auto d = make(e, FileSystem::posix(), ev, clock);
  std::vector<int64_t> saved;
  for (int64_t step = 0; step <= 12; ++step) {
    if (*d->maybeSave(step, s.collect(step)) == Checkpointer::Outcome::kStarted) {
      saved.push_back(step);
      ASSERT_TRUE(d->waitIdle(seconds(30)).isOk());
    }
  }
  EXPECT_EQ(saved, (std::vector<int64_t>{4, 8, 12}));
}

// Ranks as threads, stepping in lockstep like a synchronous job.
class Barrier {
 public:
  explicit Barrier(int n) : n_(n) {}
  void arrive() {
    std::unique_lock<std::mutex> lock(mu_);
    int gen = gen_;
    if (++count_ == n_) {
      count_ = 0;
      ++gen_;
      cv_.notify_all();
    } else {
      cv_.wait(lock, [&] { return gen != gen_; });
    }
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  int n_, count_ = 0, gen_ = 0;
};

// `world` ranks as threads sharing one commit channel and checkpoint directory, each with its
// own manual clock; `barrier` keeps them in step.
struct RankThreads {
  RankThreads(int world, const std::string& name) : world(world), dir(freshDir(name)), clocks(world), barrier(world) {}
  void run(const std::function<void(int)>& rank_main) {
    std::vector<std::thread> ranks;
    for (int r = 0; r < world; ++r) ranks.emplace_back(rank_main, r);
    for (auto& t : ranks) t.join();
  }
  const int world;
  const std::string dir;
  std::shared_ptr<LocalCommitChannel> channel = std::make_shared<LocalCommitChannel>();
  std::vector<ManualClock> clocks;
  Barrier barrier;
};

// Rank 0's store connection fails as it publishes the commit result (issue 14, defect 4).
class ResultNeverArrives : public CommitChannel {
 public:
  explicit ResultNeverArrives(std::shared_ptr<CommitChannel> inner) : inner_(std::move(inner)) {}
  Status set(const std::string& key, const std::string& value) override {
    if (key.size() > 7 && key.compare(key.size() - 7, 7, "/result") == 0) {
      return Status::unavailable("store connection reset (injected)");
    }
    return inner_->set(key, value);
  }
  Result<std::string> get(const std::string& key, Nanos timeout) override { return inner_->get(key, timeout); }
  Result<int64_t> add(const std::string& key, int64_t delta) override { return inner_->add(key, delta); }
  Status remove(const std::string& key) override { return inner_->remove(key); }

 private:
  std::shared_ptr<CommitChannel> inner_;
};

// Before, the other ranks waited out the whole commit timeout (600 s by default) for a result
// that never came; now they find the commit in the manifest within about a second.
TEST(CheckpointMultiRankTest, RanksLearnOfACommitWhoseResultRankZeroCouldNotPublish) {
  RankThreads job(2, "unpublished");
  auto failing = std::make_shared<ResultNeverArrives>(job.channel);
  std::vector<double> took(2);
  std::vector<int> from_manifest(2), unpublished(2);
  job.run([&](int rank) {
    Events ev;
    CheckpointOptions o = opts(job.dir);
    o.commit_timeout_s = 60;
    auto c = make(o, FileSystem::posix(), ev, Clock::real(), rankIdentity(rank, 2),
                  rank == 0 ? std::shared_ptr<CommitChannel>(failing) : job.channel);
    State s(static_cast<uint32_t>(7 + rank));
    const auto t0 = std::chrono::steady_clock::now();
    auto r = c->save(5, s.collect(5));
    ASSERT_TRUE(r.isOk()) << r.status().toString();
    Status w = c->waitIdle(seconds(90));
    took[rank] = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    EXPECT_TRUE(w.isOk()) << "rank " << rank << ": " << w.toString();
    from_manifest[rank] = ev.count("checkpoint_result_from_manifest");
    unpublished[rank] = ev.count("checkpoint_result_unpublished");
  });
  EXPECT_EQ(unpublished[0], 1);
  EXPECT_EQ(from_manifest[1], 1);
  EXPECT_LT(took[1], 10.0) << "rank 1 waited for a result that never came";
}

TEST(CheckpointMultiRankTest, RanksAgreeCommitAndRestoreTogether) {
  constexpr int kWorld = 4;
  RankThreads job(kWorld, "multirank");
  const std::string& dir = job.dir;
  auto& channel = job.channel;
  auto& clocks = job.clocks;
  auto& barrier = job.barrier;
  std::vector<std::vector<int64_t>> saved(kWorld);
  FaultyFileSystem faulty;  // rank 2 fails its shard for step 30
  auto rankMain = [&](int rank) {
    Events ev;
    CheckpointOptions o = opts(dir);
    o.interval_s = 100;
    o.sync_steps = 3;
    o.busy_policy = BusyPolicy::kWait;  // every due checkpoint is taken, even while one persists
    FileSystem& fs = rank == 2 ? static_cast<FileSystem&>(faulty) : FileSystem::posix();
    auto c = make(o, fs, ev, clocks[rank], rankIdentity(rank, kWorld), channel);
    State s(static_cast<uint32_t>(100 + rank));
    for (int64_t step = 1; step <= 40; ++step) {
      // Only rank 0's clock matters for "due": skew the others wildly.
      clocks[rank].advance(seconds(rank == 0 ? 10 : 1 + 50 * rank));
      // The fault names step 30's directory: step 20's persist may still be running here (a
      // loaded machine), and its shard must not be the one that fails.
      if (rank == 2 && step == 30) {
        faulty.arm({FaultyFileSystem::Op::kSync, checkpointDirName(30), 0, Status::ioError("injected EIO")});
      }
      // No waiting for persists: they overlap later steps and decision points, as in a real job.
      auto r = c->maybeSave(step, s.collect(step));
      if (r.isOk() && *r == Checkpointer::Outcome::kStarted) saved[rank].push_back(step);
      barrier.arrive();
    }
    c->waitIdle(seconds(30));
    barrier.arrive();
    // Restore on every rank: the newest committed checkpoint, each rank its own shard.
    State got(0);
    auto step = c->restore(got.load());
    ASSERT_TRUE(step.isOk()) << step.status().toString();
    ASSERT_TRUE(step->has_value()) << "rank " << rank << " skipped: " << ::testing::PrintToString(ev.reasons("checkpoint_skipped"))
                                   << " failed: " << ::testing::PrintToString(ev.reasons("checkpoint_failed"))
                                   << " saved: " << ::testing::PrintToString(saved[rank]);
    EXPECT_TRUE(got == s) << "rank " << rank;
    if (rank == 0) {
      EXPECT_EQ(ev.count("checkpoint_failed"), 1);
      EXPECT_EQ(**step, 40) << "the newest save that every rank persisted (30 failed on rank 2)";
      EXPECT_FALSE(std::filesystem::exists(joinPath(c->stepDir(30), kManifestName)));
    }
  };
  job.run(rankMain);
  for (int r = 1; r < kWorld; ++r) EXPECT_EQ(saved[r], saved[0]) << "rank " << r << " saved other steps than rank 0";
  // Store keys do not pile up: old decisions and old saves are deleted as the job goes on
  // (what is left: the last two decisions, the last save, and the restore votes).
  EXPECT_LT(channel->size(), 2u + (kWorld + 1) + 6u * 3) << "keys leak";
  EXPECT_EQ(saved[0], (std::vector<int64_t>{10, 20, 30, 40}));
  auto m = readManifest(FileSystem::posix(), joinPath(dir, checkpointDirName(40)));
  ASSERT_TRUE(m.isOk()) << m.status().toString();
  EXPECT_EQ(m->world_size, kWorld);
  EXPECT_EQ(m->shards.size(), static_cast<size_t>(kWorld));
}

TEST(CheckpointMultiRankTest, AStopRequestOnOneRankStopsEveryRankAfterTheSameStep) {
  // SIGTERM reached rank 2 only, or every rank but at different step boundaries: each rank must
  // still stop after one and the same step, so that their stop checkpoints are one checkpoint.
  constexpr int kWorld = 3;
  RankThreads job(kWorld, "stop");
  auto& clocks = job.clocks;
  std::vector<int64_t> stopped_at(kWorld, -1);
  std::vector<int> agreed_events(kWorld, 0);
  auto rankMain = [&](int rank) {
    Events ev;
    CheckpointOptions o = opts(job.dir);
    o.sync_steps = 2;
    auto c = make(o, FileSystem::posix(), ev, clocks[rank], rankIdentity(rank, kWorld), job.channel);
    State s(static_cast<uint32_t>(7 + rank));
    for (int64_t step = 1; step <= 40; ++step) {
      clocks[rank].advance(seconds(1));
      if (c->stopAgreed()) {  // the loop's check at the top of a step
        stopped_at[rank] = step;
        auto r = c->save(step - 1, s.collect(step - 1));
        EXPECT_TRUE(r.isOk() && *r == Checkpointer::Outcome::kStarted) << "rank " << rank;
        break;
      }
      if (rank == 2 && step == 7) c->requestStop();
      EXPECT_FALSE(rank != 2 && c->stopAgreed() && step < 7);
      auto r = c->maybeSave(step, s.collect(step));
      EXPECT_TRUE(r.isOk()) << r.status().toString();
      job.barrier.arrive();
    }
    EXPECT_TRUE(c->waitIdle(seconds(30)).isOk());
    agreed_events[rank] = ev.count("stop_agreed");
  };
  job.run(rankMain);
  EXPECT_GT(stopped_at[0], 7);
  EXPECT_LE(stopped_at[0], 7 + 2 * 2 + 1) << "within two decision points of the request";
  for (int r = 1; r < kWorld; ++r) EXPECT_EQ(stopped_at[r], stopped_at[0]) << "rank " << r;
  for (int r = 0; r < kWorld; ++r) EXPECT_EQ(agreed_events[r], 1) << "rank " << r;
  auto m = readManifest(FileSystem::posix(), joinPath(job.dir, checkpointDirName(stopped_at[0] - 1)));
  ASSERT_TRUE(m.isOk()) << "the stop checkpoint of every rank is one committed checkpoint: " << m.status().toString();
  EXPECT_EQ(m->shards.size(), static_cast<size_t>(kWorld));
}

}  // namespace
}  // namespace trainsup
