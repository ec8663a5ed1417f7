// base/mem_file_system.h — the file systems of the tests and fuzz targets (internal; never
// installed), in one place, as leveldb keeps its in-memory Env in helpers/memenv:
//
// MemFileSystem: files are byte strings kept in memory, keyed by path; directories are implied
// by the paths under them. Thread-safe (one mutex), so a checkpointer's writer thread and the
// training thread can share it. Nothing reaches the disk: what a test or a fuzz input writes is
// gone with the object.
//
// FaultyFileSystem: wraps any FileSystem (the real one, FileSystem::posix(), or a MemFileSystem)
// and injects one armed fault into the first matching operation: a Status (ENOSPC, EIO; an
// append fails after writing half of its bytes, as a short write does), or, with an OK status,
// SIGKILL of this process at that point (the crash tests, over the real disk, so that the
// parent can look at what a crash left).
#pragma once

#include <signal.h>

#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "trainsup/file_system.h"

namespace trainsup::testing {

class MemFileSystem : public FileSystem {
 public:
  // A file's bytes, if there is one at `path`.
  std::optional<std::string> file(const std::string& path) const {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = files_.find(path);
    if (it == files_.end()) return std::nullopt;
    return it->second;
  }
  void setFile(const std::string& path, std::string data) {
    std::lock_guard<std::mutex> lock(mu_);
    files_[path] = std::move(data);
  }

  Result<std::unique_ptr<WritableFile>> newWritableFile(const std::string& path) override {
    std::lock_guard<std::mutex> lock(mu_);
    files_[path].clear();
    return std::unique_ptr<WritableFile>(new Writer(this, path));
  }
  Result<std::unique_ptr<ReadableFile>> newReadableFile(const std::string& path) override {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = files_.find(path);
    if (it == files_.end()) return Status::notFound("'" + path + "' does not exist");
    return std::unique_ptr<ReadableFile>(new Reader(it->second, path));  // a snapshot of its bytes
  }
  Status rename(const std::string& from, const std::string& to) override {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = files_.find(from);
    if (it == files_.end()) return Status::notFound("rename: '" + from + "' does not exist");
    std::string data = std::move(it->second);
    files_.erase(it);
    files_[to] = std::move(data);
    return Status::ok();
  }
  Status syncDir(const std::string&) override { return Status::ok(); }
  Status createDirs(const std::string&) override { return Status::ok(); }
  Status removeFile(const std::string& path) override {
    std::lock_guard<std::mutex> lock(mu_);
    files_.erase(path);
    return Status::ok();
  }
  Status removeDir(const std::string&) override { return Status::ok(); }
  Result<std::vector<std::string>> listDir(const std::string& dir) override {
    // Files directly in `dir`, and the directories implied by deeper paths.
    std::lock_guard<std::mutex> lock(mu_);
    std::vector<std::string> names;
    const std::string prefix = dir + "/";
    for (const auto& [path, data] : files_) {
      if (path.rfind(prefix, 0) != 0) continue;
      std::string name = path.substr(prefix.size(), path.find('/', prefix.size()) - prefix.size());
      if (names.empty() || names.back() != name) names.push_back(name);
    }
    return names;
  }
  bool exists(const std::string& path) override {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = files_.lower_bound(path);
    return it != files_.end() && (it->first == path || it->first.rfind(path + "/", 0) == 0);
  }

 private:
  class Writer : public WritableFile {
   public:
    Writer(MemFileSystem* fs, std::string path) : fs_(fs), path_(std::move(path)) {}
    Status append(const void* data, size_t n) override {
      std::lock_guard<std::mutex> lock(fs_->mu_);
      fs_->files_[path_].append(static_cast<const char*>(data), n);
      return Status::ok();
    }
    Status sync() override { return Status::ok(); }
    Status close() override { return Status::ok(); }
    const std::string& path() const override { return path_; }

   private:
    MemFileSystem* fs_;
    std::string path_;
  };
  class Reader : public ReadableFile {
   public:
    Reader(std::string data, std::string path) : data_(std::move(data)), path_(std::move(path)) {}
    Status readAt(uint64_t offset, void* buf, size_t n) const override {
      if (offset > data_.size() || n > data_.size() - offset) {
        return Status::corruption("'" + path_ + "' is shorter than expected");
      }
      if (n > 0) std::memcpy(buf, data_.data() + offset, n);
      return Status::ok();
    }
    uint64_t size() const override { return data_.size(); }
    const std::string& path() const override { return path_; }

   private:
    std::string data_;
    std::string path_;
  };

  mutable std::mutex mu_;
  std::map<std::string, std::string> files_;  // guarded by mu_
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
