// Helpers for the checkpoint tests: a temp dir, deterministic buffers, a fault-injecting
// file system, and a recorder of checkpointer events.
#pragma once

#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <functional>
#include <mutex>
#include <string>
#include <vector>

#include "trainsup/checkpointer.h"

namespace trainsup::testing {

inline std::string freshDir(const std::string& tag) {
  auto dir = std::filesystem::temp_directory_path() / ("trainsup_ckpt_" + std::to_string(getpid()) + "_" + tag);
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir.string();
}

// Named float/int buffers whose contents depend on (seed, name).
struct State {
  std::vector<float> weights;
  std::vector<int64_t> counters;
  std::vector<uint8_t> blob;
  explicit State(uint32_t seed, size_t n = 4096) : weights(n), counters(17), blob(1000) {
    uint32_t x = seed * 2654435761u + 1;
    for (auto& w : weights) w = static_cast<float>((x = x * 1664525u + 1013904223u) >> 8) / 16777216.0f;
    for (auto& c : counters) c = static_cast<int64_t>(x = x * 1664525u + 1013904223u);
    for (auto& b : blob) b = static_cast<uint8_t>((x = x * 1664525u + 1013904223u) >> 24);
  }
  std::vector<BufferRef> refs() const {
    return {{{"model.weight", DType::kFloat32, {static_cast<int64_t>(weights.size())}}, weights.data(), weights.size() * 4},
            {{"optim.step", DType::kInt64, {17}}, counters.data(), counters.size() * 8},
            {{"rng", DType::kBytes, {1000}}, blob.data(), blob.size()}};
  }
  Checkpointer::Collect collect(int64_t step) const {
    return [this, step](std::vector<BufferRef>& b, std::map<std::string, std::string>& meta) {
      b = refs();
      meta["step"] = std::to_string(step);
      return Status::ok();
    };
  }
  // Loads into *this from a shard (checksummed reads).
  Checkpointer::Load load() {
    return [this](const Manifest&, const ShardReader& shard) -> Status {
      struct Dst { const char* name; void* p; size_t n; };
      for (Dst d : {Dst{"model.weight", weights.data(), weights.size() * 4},
                    Dst{"optim.step", counters.data(), counters.size() * 8}, Dst{"rng", blob.data(), blob.size()}}) {
        const TensorEntry* e = shard.find(d.name);
        if (e == nullptr) return Status::notFound(std::string("tensor ") + d.name + " missing");
        if (Status s = shard.read(*e, d.p, d.n); !s.isOk()) return s;
      }
      return Status::ok();
    };
  }
  bool operator==(const State& o) const { return weights == o.weights && counters == o.counters && blob == o.blob; }
};

struct Events {
  std::mutex mu;
  std::vector<std::pair<std::string, std::string>> items;  // event, reason/summary
  Checkpointer::Hooks hooks() {
    Checkpointer::Hooks h;
    h.event = [this](std::string_view e, const EventFields& f) {
      std::string reason;
      for (const auto& field : f) {
        if (field.key() == "reason") reason = std::get<std::string>(field.value());
      }
      std::lock_guard<std::mutex> lock(mu);
      items.emplace_back(std::string(e), reason);
    };
    return h;
  }
  std::vector<std::string> reasons(const std::string& event) {
    std::lock_guard<std::mutex> lock(mu);
    std::vector<std::string> out;
    for (auto& [e, r] : items) if (e == event) out.push_back(r);
    return out;
  }
  int count(const std::string& event) { return static_cast<int>(reasons(event).size()); }
};

// Injects a failure (a Status, or SIGKILL of this process) into the first matching operation.
class FaultyFileSystem : public FileSystemWrapper {
 public:
  enum class Op { kCreate, kAppend, kSync, kRename, kSyncDir, kRemove };
  struct Fault {
    Op op;
    std::string path_contains;
    uint64_t after_bytes = 0;  // kAppend: fail once this many bytes were written to the file
    Status error;              // OK = kill -9 this process
  };
  explicit FaultyFileSystem(FileSystem& target = FileSystem::posix()) : FileSystemWrapper(target) {}
  void arm(Fault f) {
    std::lock_guard<std::mutex> lock(mu_);
    fault_ = std::move(f);
    armed_ = true;
  }
  void disarm() {
    std::lock_guard<std::mutex> lock(mu_);
    armed_ = false;
  }
  // Returns the failure to inject for this operation, if any (kills for an OK status).
  Status check(Op op, const std::string& path, uint64_t written = 0, uint64_t n = 0) {
    std::lock_guard<std::mutex> lock(mu_);
    if (!armed_ || fault_.op != op || path.find(fault_.path_contains) == std::string::npos) return Status::ok();
    if (op == Op::kAppend && written + n <= fault_.after_bytes) return Status::ok();
    armed_ = false;
    if (fault_.error.isOk()) raise(SIGKILL);
    return fault_.error;
  }

  Result<std::unique_ptr<WritableFile>> newWritableFile(const std::string& p) override {
    if (Status s = check(Op::kCreate, p); !s.isOk()) return s;
    auto f = target().newWritableFile(p);
    if (!f) return f;
    return std::unique_ptr<WritableFile>(new File(this, std::move(*f)));
  }
  Status rename(const std::string& from, const std::string& to) override {
    if (Status s = check(Op::kRename, from); !s.isOk()) return s;
    return target().rename(from, to);
  }
  Status syncDir(const std::string& d) override {
    if (Status s = check(Op::kSyncDir, d); !s.isOk()) return s;
    return target().syncDir(d);
  }
  Status removeFile(const std::string& p) override {
    if (Status s = check(Op::kRemove, p); !s.isOk()) return s;
    return target().removeFile(p);
  }

 private:
  class File : public WritableFile {
   public:
    File(FaultyFileSystem* fs, std::unique_ptr<WritableFile> f) : fs_(fs), f_(std::move(f)) {}
    Status append(const void* d, size_t n) override {
      if (Status s = fs_->check(Op::kAppend, path(), written_, n); !s.isOk()) {
        // A short write: part of the data reaches the file before the error.
        size_t part = n / 2;
        f_->append(d, part);
        return s;
      }
      written_ += n;
      return f_->append(d, n);
    }
    Status sync() override {
      if (Status s = fs_->check(Op::kSync, path()); !s.isOk()) return s;
      return f_->sync();
    }
    Status close() override { return f_->close(); }
    const std::string& path() const override { return f_->path(); }

   private:
    FaultyFileSystem* fs_;
    std::unique_ptr<WritableFile> f_;
    uint64_t written_ = 0;
  };
  std::mutex mu_;
  Fault fault_;
  bool armed_ = false;
};

}  // namespace trainsup::testing
