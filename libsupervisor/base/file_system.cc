#include "trainsup/file_system.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace trainsup {
namespace {

Status posixError(const char* op, const std::string& path, int err) {
  std::string m = std::string(op) + " '" + path + "': " + std::strerror(err);
  return Status::ioError(m);
}

class PosixWritableFile final : public WritableFile {
 public:
  PosixWritableFile(std::string path, int fd) : path_(std::move(path)), fd_(fd) {}
  ~PosixWritableFile() override { close(); }
  Status append(const void* data, size_t n) override {
    const char* p = static_cast<const char*>(data);
    while (n > 0) {
      // Large writes in bounded pieces, each handed to writeback at once (below).
      size_t chunk = std::min<size_t>(n, kWritebackChunk);
      ssize_t w = ::write(fd_, p, chunk);
      if (w < 0 && errno == EINTR) continue;
      if (w < 0) return posixError("write", path_, errno);
      if (w == 0) return posixError("write", path_, EIO);
      p += w;
      n -= static_cast<size_t>(w);
      written_ += static_cast<uint64_t>(w);
      startWriteback();
    }
    return Status::ok();
  }
  Status sync() override {
    if (::fsync(fd_) != 0) return posixError("fsync", path_, errno);
    return Status::ok();
  }
  Status close() override {
    if (fd_ < 0) return Status::ok();
    int fd = fd_;
    fd_ = -1;
    if (::close(fd) != 0) return posixError("close", path_, errno);
    return Status::ok();
  }
  const std::string& path() const override { return path_; }

 private:
  // Starts the disk writes of every full chunk written so far without waiting for them
  // (RocksDB's bytes_per_sync): the device works while the next chunk is copied into the page
  // cache, so sync() at the end waits for the last chunk only, not for the whole file, and a
  // checkpoint does not pile up gigabytes of dirty pages that would throttle every writer of
  // the process. Durability still comes from sync() alone. Best effort: an error here is
  // ignored (sync() reports what matters) and file systems without it fall back to fsync.
  void startWriteback() {
    if (written_ - scheduled_ < kWritebackChunk) return;
#ifdef SYNC_FILE_RANGE_WRITE
    ::sync_file_range(fd_, static_cast<off64_t>(scheduled_), static_cast<off64_t>(written_ - scheduled_),
                      SYNC_FILE_RANGE_WRITE);
#endif
    scheduled_ = written_;
  }

  static constexpr size_t kWritebackChunk = size_t{16} << 20;
  std::string path_;
  int fd_;
  uint64_t written_ = 0;    // bytes appended
  uint64_t scheduled_ = 0;  // bytes handed to writeback
};

class PosixReadableFile final : public ReadableFile {
 public:
  PosixReadableFile(std::string path, int fd, uint64_t size) : path_(std::move(path)), fd_(fd), size_(size) {}
  ~PosixReadableFile() override { ::close(fd_); }
  Status readAt(uint64_t offset, void* buf, size_t n) const override {
    if (offset > size_ || n > size_ - offset) {
      return Status::corruption("read of " + std::to_string(n) + " bytes at offset " + std::to_string(offset) +
                                " past the end of '" + path_ + "' (" + std::to_string(size_) + " bytes)");
    }
    char* p = static_cast<char*>(buf);
    while (n > 0) {
      ssize_t r = ::pread(fd_, p, std::min<size_t>(n, size_t{64} << 20), static_cast<off_t>(offset));
      if (r < 0 && errno == EINTR) continue;
      if (r < 0) return posixError("read", path_, errno);
      if (r == 0) return Status::corruption("unexpected end of '" + path_ + "'");
      p += r;
      n -= static_cast<size_t>(r);
      offset += static_cast<uint64_t>(r);
    }
    return Status::ok();
  }
  uint64_t size() const override { return size_; }
  const std::string& path() const override { return path_; }

 private:
  std::string path_;
  int fd_;
  uint64_t size_;
};

class PosixFileSystem final : public FileSystem {
 public:
  Result<std::unique_ptr<WritableFile>> newWritableFile(const std::string& path) override {
    int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) return posixError("create", path, errno);
    return std::unique_ptr<WritableFile>(new PosixWritableFile(path, fd));
  }
  Result<std::unique_ptr<ReadableFile>> newReadableFile(const std::string& path) override {
    int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
      if (errno == ENOENT) return Status::notFound("'" + path + "' does not exist");
      return posixError("open", path, errno);
    }
    struct stat st;
    if (::fstat(fd, &st) != 0) {
      int err = errno;
      ::close(fd);
      return posixError("stat", path, err);
    }
    // Shards are read front to back in large pieces: ask for aggressive read-ahead.
    ::posix_fadvise(fd, 0, 0, POSIX_FADV_SEQUENTIAL);
    return std::unique_ptr<ReadableFile>(new PosixReadableFile(path, fd, static_cast<uint64_t>(st.st_size)));
  }
  Status rename(const std::string& from, const std::string& to) override {
    if (::rename(from.c_str(), to.c_str()) != 0) return posixError("rename", from + "' to '" + to, errno);
    return Status::ok();
  }
  Status syncDir(const std::string& dir) override {
    int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) return posixError("open directory", dir, errno);
    int rc = ::fsync(fd);
    int err = errno;
    ::close(fd);
    if (rc != 0) return posixError("fsync directory", dir, err);
    return Status::ok();
  }
  Status createDirs(const std::string& dir) override {
    std::string partial;
    size_t pos = 0;
    while (pos != std::string::npos) {
      pos = dir.find('/', pos + 1);
      partial = dir.substr(0, pos);
      if (partial.empty()) continue;
      if (::mkdir(partial.c_str(), 0755) == 0) {
        // A new directory's entry is durable once its parent is fsynced.
        const size_t slash = partial.find_last_of('/');
        const std::string parent = slash == 0 ? "/" : slash == std::string::npos ? "." : partial.substr(0, slash);
        if (Status s = syncDir(parent); !s.isOk()) return s;
      } else if (errno != EEXIST) {
        return posixError("mkdir", partial, errno);
      }
    }
    return Status::ok();
  }
  Status removeFile(const std::string& path) override {
    if (::unlink(path.c_str()) != 0 && errno != ENOENT) return posixError("unlink", path, errno);
    return Status::ok();
  }
  Status removeDir(const std::string& dir) override {
    if (::rmdir(dir.c_str()) != 0 && errno != ENOENT) return posixError("rmdir", dir, errno);
    return Status::ok();
  }
  Result<std::vector<std::string>> listDir(const std::string& dir) override {
    DIR* d = ::opendir(dir.c_str());
    if (d == nullptr) {
      if (errno == ENOENT) return Status::notFound("directory '" + dir + "' does not exist");
      return posixError("opendir", dir, errno);
    }
    std::vector<std::string> names;
    while (dirent* e = ::readdir(d)) {
      if (std::strcmp(e->d_name, ".") == 0 || std::strcmp(e->d_name, "..") == 0) continue;
      names.emplace_back(e->d_name);
    }
    ::closedir(d);
    return names;
  }
  bool exists(const std::string& path) override {
    struct stat st;
    return ::stat(path.c_str(), &st) == 0;
  }
};

}  // namespace

FileSystem& FileSystem::posix() {
  static PosixFileSystem* fs = new PosixFileSystem();
  return *fs;
}

std::string joinPath(const std::string& a, const std::string& b) {
  if (a.empty()) return b;
  if (a.back() == '/') return a + b;
  return a + "/" + b;
}

}  // namespace trainsup
