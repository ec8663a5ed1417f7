// Crash safety of the persist and commit protocol, at every file-system operation.
//
// A child process commits step 1, then saves step 2 through a file system that journals every
// operation (to a file outside the checkpoint directory, with write(2), so the journal survives
// the child) and SIGKILLs the child right after operation k. For every k, until a save runs to
// its end without reaching k:
//   - process crash: the directory as the kill left it must restore the newest committed
//     checkpoint (step 2 once its manifest was renamed into place, step 1 before), bitwise;
//   - power loss: a copy of the directory is rolled back to what was durable (file data past
//     its last fsync dropped; directory entries created or renamed since the directory's last
//     fsync undone, as leveldb's fault-injection Env does) and must restore step 2 if the
//     checkpointer had reported it committed, else step 1; never a damaged checkpoint.
// Retention (keep 1) runs after the commit, so deleting step 1 is crashed into too.
//
// And a real full disk: a 2 MiB tmpfs fails one save (ENOSPC, reported, the older checkpoint
// intact, no partial files left behind) and the save after space returns succeeds.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/mount.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <cstring>
#include <sstream>

#include "checkpoint_test_util.h"
#include "trainsup/checkpointer.h"

namespace trainsup {
namespace {

namespace fs = std::filesystem;
using testing::Events;
using testing::freshDir;
using testing::State;
using std::chrono::seconds;

// Journals each operation as one line ("op path [path2|size]") and kills the process after the
// kill_after-th one (0 = never).
class JournalingFileSystem : public FileSystemWrapper {
 public:
  JournalingFileSystem(const std::string& journal, uint64_t kill_after)
      : FileSystemWrapper(FileSystem::posix()), kill_after_(kill_after) {
    fd_ = ::open(journal.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_TRUNC, 0644);
  }
  ~JournalingFileSystem() override { ::close(fd_); }

  void record(const std::string& line) {
    std::lock_guard<std::mutex> lock(mu_);
    std::string l = line + "\n";
    if (::write(fd_, l.data(), l.size()) != static_cast<ssize_t>(l.size())) _exit(7);
    if (kill_after_ != 0 && ++ops_ == kill_after_) raise(SIGKILL);
  }

  Result<std::unique_ptr<WritableFile>> newWritableFile(const std::string& p) override {
    auto f = target().newWritableFile(p);
    if (!f) return f;
    record("create " + p);
    return std::unique_ptr<WritableFile>(new File(this, std::move(*f)));
  }
  Status rename(const std::string& from, const std::string& to) override {
    Status s = target().rename(from, to);
    if (s.isOk()) record("rename " + from + " " + to);
    return s;
  }
  Status syncDir(const std::string& d) override {
    Status s = target().syncDir(d);
    if (s.isOk()) record("syncdir " + d);
    return s;
  }
  Status createDirs(const std::string& d) override {
    // Each directory this call makes is a new entry in its parent.
    std::vector<std::string> made;
    for (fs::path p = d; !p.empty() && !target().exists(p.string()); p = p.parent_path()) made.push_back(p.string());
    Status s = target().createDirs(d);
    if (s.isOk()) {
      for (auto it = made.rbegin(); it != made.rend(); ++it) record("mkdir " + *it);
    }
    return s;
  }
  Status removeFile(const std::string& p) override {
    bool existed = target().exists(p);
    Status s = target().removeFile(p);
    if (s.isOk() && existed) record("remove " + p);
    return s;
  }
  Status removeDir(const std::string& d) override {
    bool existed = target().exists(d);
    Status s = target().removeDir(d);
    if (s.isOk() && existed) record("rmdir " + d);
    return s;
  }

 private:
  class File : public WritableFile {
   public:
    File(JournalingFileSystem* fs, std::unique_ptr<WritableFile> f) : fs_(fs), f_(std::move(f)) {}
    Status append(const void* d, size_t n) override {
      Status s = f_->append(d, n);
      if (s.isOk()) {
        size_ += n;
        fs_->record("append " + path() + " " + std::to_string(size_));
      }
      return s;
    }
    Status sync() override {
      Status s = f_->sync();
      if (s.isOk()) fs_->record("sync " + path() + " " + std::to_string(size_));
      return s;
    }
    Status close() override { return f_->close(); }
    const std::string& path() const override { return f_->path(); }

   private:
    JournalingFileSystem* fs_;
    std::unique_ptr<WritableFile> f_;
    uint64_t size_ = 0;
  };
  std::mutex mu_;
  int fd_ = -1;
  uint64_t kill_after_;
  uint64_t ops_ = 0;
};

struct Op {
  std::string kind, a, b;
};

std::vector<Op> readJournal(const std::string& path) {
  std::vector<Op> ops;
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) {
    std::istringstream s(line);
    Op op;
    s >> op.kind >> op.a >> op.b;
    ops.push_back(op);
  }
  return ops;
}

// Rolls the directory tree at `root` (a copy; journal paths are under `orig`) back to what a
// power loss right after the journal's last operation would leave.
void rollBackToDurable(const std::vector<Op>& ops, const std::string& orig, const std::string& root) {
  auto here = [&](const std::string& p) { return root + p.substr(orig.size()); };
  auto parent = [](const std::string& p) { return fs::path(p).parent_path().string(); };
  std::map<std::string, uint64_t> synced;               // file (current name) -> durable size
  std::map<std::string, std::vector<size_t>> pending;   // dir -> its entry changes since its fsync
  for (size_t i = 0; i < ops.size(); ++i) {
    const Op& op = ops[i];
    if (op.kind == "create") {
      synced[op.a] = 0;
      pending[parent(op.a)].push_back(i);
    } else if (op.kind == "sync") {
      synced[op.a] = std::stoull(op.b);
    } else if (op.kind == "rename") {
      if (synced.count(op.a)) synced[op.b] = synced[op.a];
      synced.erase(op.a);
      pending[parent(op.a)].push_back(i);
      if (parent(op.b) != parent(op.a)) pending[parent(op.b)].push_back(i);
    } else if (op.kind == "mkdir") {
      pending[parent(op.a)].push_back(i);
    } else if (op.kind == "syncdir") {
      pending.erase(op.a);
    }
    // remove/rmdir: taken as durable at once (harsher: what was removed never comes back).
  }
  for (const auto& [path, size] : synced) {
    if (fs::exists(here(path)) && fs::file_size(here(path)) > size) fs::resize_file(here(path), size);
  }
  // Undo the entries no directory fsync made durable, newest first; an undone mkdir takes
  // everything under it along.
  std::set<size_t> undo;
  for (const auto& [dir, list] : pending) undo.insert(list.begin(), list.end());
  for (auto it = undo.rbegin(); it != undo.rend(); ++it) {
    const Op& op = ops[*it];
    if (op.kind == "create") {
      fs::remove(here(op.a));
    } else if (op.kind == "mkdir") {
      fs::remove_all(here(op.a));
    } else if (op.kind == "rename" && fs::exists(here(op.b))) {
      fs::rename(here(op.b), here(op.a));
    }
  }
}

CheckpointOptions options(const std::string& dir) {
  CheckpointOptions o;
  o.dir = dir;
  o.interval_s = 0;
  o.keep = 1;
  o.commit_timeout_s = 20;
  return o;
}

Identity soleRank() {
  Identity id;
  id.rank = 0;
  id.world_size = 1;
  id.host = "h0";
  id.job_id = "crash";
  return id;
}

std::optional<int64_t> restoreFrom(const std::string& dir, State& into, std::string* skipped) {
  Events ev;
  auto c = Checkpointer::create(options(dir), soleRank(), FileSystem::posix(), Clock::real(), nullptr, ev.hooks());
  if (!c) throw std::runtime_error(c.status().toString());
  auto r = (*c)->restore(into.load());
  if (!r) throw std::runtime_error(r.status().toString());
  for (const auto& why : ev.reasons("checkpoint_skipped")) *skipped += why + "; ";
  return *r;
}

TEST(CrashSafetyTest, KillAndPowerLossAfterEveryFileSystemOperationOfASave) {
  const std::string base = freshDir("crash_every_op");
  int points = 0, committed_points = 0, rolled_back_commits = 0;
  for (uint64_t k = 1;; ++k) {
    SCOPED_TRACE("killed after operation " + std::to_string(k));
    const std::string dir = base + "/run-" + std::to_string(k) + "/ckpt";
    const std::string journal = base + "/run-" + std::to_string(k) + ".journal";
    fs::create_directories(fs::path(dir).parent_path());
    pid_t pid = fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      // Step 1 is committed with nothing armed (its own journal); step 2 is crashed into.
      {
        JournalingFileSystem quiet(journal + ".step1", 0);
        Events ev;
        auto c = Checkpointer::create(options(dir), soleRank(), quiet, Clock::real(), nullptr, ev.hooks());
        State s1(1);
        if (!c || !(*c)->save(1, s1.collect(1)).isOk() || !(*c)->waitIdle(seconds(30)).isOk()) _exit(3);
      }
      JournalingFileSystem armed(journal, k);
      Events ev;
      auto c = Checkpointer::create(options(dir), soleRank(), armed, Clock::real(), nullptr, ev.hooks());
      State s2(2);
      if (!c || !(*c)->save(2, s2.collect(2)).isOk()) _exit(4);
      Status w = (*c)->waitIdle(seconds(30));
      (*c).reset();  // retention and close: every operation of the save is in reach
      _exit(w.isOk() ? 0 : 5);
    }
    int status = 0;
    ASSERT_EQ(waitpid(pid, &status, 0), pid);
    if (WIFEXITED(status)) {
      ASSERT_EQ(WEXITSTATUS(status), 0) << "the save failed without a fault";
      ASSERT_GT(points, 0) << "no operation was journaled";
      break;  // k is past the last operation: every point was covered
    }
    ASSERT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL);
    ++points;
    const std::vector<Op> ops = readJournal(journal);
    ASSERT_EQ(ops.size(), k);
    const std::string manifest = "/" + checkpointDirName(2) + "/" + kManifestName;
    bool visible = false, durable = false;
    for (const Op& op : ops) {
      if (op.kind == "rename" && op.b.size() >= manifest.size() &&
          op.b.compare(op.b.size() - manifest.size(), manifest.size(), manifest) == 0) {
        visible = true;
      }
      // The checkpointer reports the commit after the manifest's directory fsync.
      if (visible && op.kind == "syncdir" && op.a == dir + "/" + checkpointDirName(2)) durable = true;
    }
    committed_points += durable;

    // Process crash: the directory as it is.
    std::string skipped;
    State got(0);
    auto step = restoreFrom(dir, got, &skipped);
    ASSERT_TRUE(step.has_value()) << "nothing restorable after the kill; skipped: " << skipped;
    EXPECT_EQ(*step, visible ? 2 : 1) << "skipped: " << skipped;
    EXPECT_TRUE(got == State(static_cast<uint32_t>(*step))) << "restored data differs from step " << *step;

    // Power loss: a rolled-back copy.
    const std::string copy = base + "/run-" + std::to_string(k) + "/powerloss";
    fs::copy(dir, copy, fs::copy_options::recursive);
    rollBackToDurable(ops, dir, copy);
    std::string skipped_pl;
    State got_pl(0);
    auto step_pl = restoreFrom(copy, got_pl, &skipped_pl);
    ASSERT_TRUE(step_pl.has_value()) << "nothing restorable after a power loss; skipped: " << skipped_pl;
    if (durable) {
      EXPECT_EQ(*step_pl, 2) << "step 2 was reported committed and a power loss lost it; skipped: " << skipped_pl;
    }
    if (durable && *step_pl != 2) ++rolled_back_commits;
    EXPECT_TRUE(got_pl == State(static_cast<uint32_t>(*step_pl))) << "restored data differs from step " << *step_pl;
    fs::remove_all(base + "/run-" + std::to_string(k));
    ASSERT_LT(k, 500u) << "the save never ended";
  }
  std::cout << "[measure] crash points " << points << " (after each create, append, fsync, rename, mkdir, "
            << "directory fsync and removal), " << committed_points << " after the commit; committed checkpoints "
            << "lost: " << rolled_back_commits << "\n";
  EXPECT_GE(points, 10);
  EXPECT_GT(committed_points, 0);
}

// A tmpfs of `bytes` mounted for one test (root only: skipped with the reason otherwise).
class SmallDisk {
 public:
  SmallDisk(const std::string& dir, size_t bytes) : dir_(dir) {
    fs::create_directories(dir);
    const std::string opts = "size=" + std::to_string(bytes);
    if (::mount("tmpfs", dir.c_str(), "tmpfs", 0, opts.c_str()) == 0) {
      mounted_ = true;
    } else {
      why_ = std::string("mount -t tmpfs: ") + std::strerror(errno);
    }
  }
  ~SmallDisk() {
    if (mounted_) ::umount2(dir_.c_str(), MNT_DETACH);
  }
  bool mounted() const { return mounted_; }
  const std::string& why() const { return why_; }

 private:
  std::string dir_, why_;
  bool mounted_ = false;
};

TEST(CrashSafetyTest, AFullDiskFailsOneSaveAndTheNextSucceedsWhenSpaceReturns) {
  const std::string mnt = freshDir("full_disk") + "/mnt";
  SmallDisk disk(mnt, 2 << 20);
  if (!disk.mounted()) GTEST_SKIP() << "needs root to mount a tmpfs (" << disk.why() << ")";
  const std::string dir = mnt + "/ckpt";
  CheckpointOptions o = options(dir);
  o.keep = 3;
  Events ev;
  auto made = Checkpointer::create(o, soleRank(), FileSystem::posix(), Clock::real(), nullptr, ev.hooks());
  ASSERT_TRUE(made.isOk()) << made.status().toString();
  auto& c = *made;
  const size_t floats = 64 * 1024;  // 256 KiB per checkpoint
  State s1(1, floats), s2(2, floats), s3(3, floats);
  ASSERT_TRUE(c->save(1, s1.collect(1)).isOk());
  ASSERT_TRUE(c->waitIdle(seconds(30)).isOk());
  // Fill the disk but for 64 KiB: step 2 cannot fit.
  const std::string filler = mnt + "/filler";
  {
    std::ofstream f(filler, std::ios::binary);
    std::vector<char> chunk(64 << 10, 'x');
    while (f.write(chunk.data(), chunk.size())) {
    }
  }
  fs::resize_file(filler, fs::file_size(filler) > (64 << 10) ? fs::file_size(filler) - (64 << 10) : 0);
  auto r = c->save(2, s2.collect(2));
  ASSERT_TRUE(r.isOk()) << "the snapshot part must not fail: " << r.status().toString();
  Status w = c->waitIdle(seconds(30));
  ASSERT_FALSE(w.isOk()) << "a save onto a full disk succeeded";
  EXPECT_NE(w.message().find(std::strerror(ENOSPC)), std::string::npos) << w.message();
  EXPECT_EQ(ev.count("checkpoint_failed"), 1);
  EXPECT_FALSE(c->takeError().isOk());  // reported once to the training loop, which goes on
  // Nothing of the failed save is left taking space.
  for (const auto& e : fs::recursive_directory_iterator(dir)) {
    EXPECT_EQ(e.path().string().find(checkpointDirName(2) + "/."), std::string::npos) << "left behind: " << e.path();
  }
  // Space returns: the next save commits, and both committed checkpoints restore.
  fs::remove(filler);
  ASSERT_TRUE(c->save(3, s3.collect(3)).isOk());
  Status w3 = c->waitIdle(seconds(30));
  ASSERT_TRUE(w3.isOk()) << w3.toString();
  State got(0, floats);
  auto step = c->restore(got.load());
  ASSERT_TRUE(step.isOk()) << step.status().toString();
  EXPECT_EQ(*step, 3);
  EXPECT_TRUE(got == s3);
  c.reset();
  fs::remove_all(dir + "/" + checkpointDirName(3));
  std::string skipped;
  State older(0, floats);
  EXPECT_EQ(restoreFrom(dir, older, &skipped), 1) << skipped;
  EXPECT_TRUE(older == s1);
}

}  // namespace
}  // namespace trainsup
