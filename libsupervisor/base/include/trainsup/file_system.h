// trainsup/file_system.h — the file operations checkpoints use, behind an interface.
//
// Contract: every file-system call of the checkpoint code goes through a FileSystem, so tests
// can wrap the real one (FileSystemWrapper) and inject ENOSPC, EIO, short writes, fsync errors
// or a crash (kill -9) at a chosen point, as leveldb's Env does. Failures are Status values
// whose message names the operation, the path and strerror. FileSystem::posix() is the real
// one: thread-safe, never destroyed. A WritableFile belongs to one thread at a time.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "trainsup/export.h"
#include "trainsup/status.h"

namespace trainsup {

class TRAINSUP_EXPORT WritableFile {
 public:
  virtual ~WritableFile() = default;
  // All n bytes or an error. The POSIX file starts the disk writes of each 16 MiB as it goes
  // (sync_file_range), so that sync() waits for the tail only.
  virtual Status append(const void* data, size_t n) = 0;
  virtual Status sync() = 0;                              // fsync: data and size are durable
  virtual Status close() = 0;                             // idempotent
  virtual const std::string& path() const = 0;
};

class TRAINSUP_EXPORT ReadableFile {
 public:
  virtual ~ReadableFile() = default;
  // Reads exactly n bytes at offset, or fails (a short file is Corruption naming the path).
  virtual Status readAt(uint64_t offset, void* buf, size_t n) const = 0;
  virtual uint64_t size() const = 0;
  virtual const std::string& path() const = 0;
};

class TRAINSUP_EXPORT FileSystem {
 public:
  virtual ~FileSystem() = default;
  // Creates or truncates.
  virtual Result<std::unique_ptr<WritableFile>> newWritableFile(const std::string& path) = 0;
  virtual Result<std::unique_ptr<ReadableFile>> newReadableFile(const std::string& path) = 0;
  virtual Status rename(const std::string& from, const std::string& to) = 0;  // atomic replace
  virtual Status syncDir(const std::string& dir) = 0;                         // fsync a directory
  virtual Status createDirs(const std::string& dir) = 0;  // mkdir -p; each directory made is fsynced into its parent
  virtual Status removeFile(const std::string& path) = 0;                     // missing = OK
  virtual Status removeDir(const std::string& dir) = 0;                       // empty dir; missing = OK
  virtual Result<std::vector<std::string>> listDir(const std::string& dir) = 0;  // names, no . or ..
  virtual bool exists(const std::string& path) = 0;

  static FileSystem& posix();
};

// Forwards everything to a target; tests override the calls they want to break.
class TRAINSUP_EXPORT FileSystemWrapper : public FileSystem {
 public:
  explicit FileSystemWrapper(FileSystem& target) : target_(target) {}
  Result<std::unique_ptr<WritableFile>> newWritableFile(const std::string& p) override { return target_.newWritableFile(p); }
  Result<std::unique_ptr<ReadableFile>> newReadableFile(const std::string& p) override { return target_.newReadableFile(p); }
  Status rename(const std::string& f, const std::string& t) override { return target_.rename(f, t); }
  Status syncDir(const std::string& d) override { return target_.syncDir(d); }
  Status createDirs(const std::string& d) override { return target_.createDirs(d); }
  Status removeFile(const std::string& p) override { return target_.removeFile(p); }
  Status removeDir(const std::string& d) override { return target_.removeDir(d); }
  Result<std::vector<std::string>> listDir(const std::string& d) override { return target_.listDir(d); }
  bool exists(const std::string& p) override { return target_.exists(p); }
  FileSystem& target() { return target_; }

 private:
  FileSystem& target_;
};

// Joins two path parts with one '/'.
TRAINSUP_EXPORT std::string joinPath(const std::string& a, const std::string& b);

}  // namespace trainsup
