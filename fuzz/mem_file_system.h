// An in-memory FileSystem for the fuzz targets and their replay test: files are byte strings
// keyed by path; directories are implied. Not thread-safe (one fuzz input at a time).
#pragma once

#include <cstring>
#include <map>
#include <memory>
#include <string>

#include "trainsup/file_system.h"

namespace trainsup::fuzz {

class MemFileSystem : public FileSystem {
 public:
  std::map<std::string, std::string> files;

  Result<std::unique_ptr<WritableFile>> newWritableFile(const std::string& path) override {
    files[path].clear();
    return std::unique_ptr<WritableFile>(new Writer(this, path));
  }
  Result<std::unique_ptr<ReadableFile>> newReadableFile(const std::string& path) override {
    auto it = files.find(path);
    if (it == files.end()) return Status::notFound("'" + path + "' does not exist");
    return std::unique_ptr<ReadableFile>(new Reader(it->second, path));
  }
  Status rename(const std::string& from, const std::string& to) override {
    auto it = files.find(from);
    if (it == files.end()) return Status::notFound("rename: '" + from + "' does not exist");
    files[to] = std::move(it->second);
    files.erase(from);
    return Status::ok();
  }
  Status syncDir(const std::string&) override { return Status::ok(); }
  Status createDirs(const std::string&) override { return Status::ok(); }
  Status removeFile(const std::string& path) override {
    files.erase(path);
    return Status::ok();
  }
  Status removeDir(const std::string&) override { return Status::ok(); }
  Result<std::vector<std::string>> listDir(const std::string& dir) override {
    // Files directly in `dir`, and the directories implied by deeper paths.
    std::vector<std::string> names;
    const std::string prefix = dir + "/";
    for (const auto& [path, data] : files) {
      if (path.rfind(prefix, 0) != 0) continue;
      std::string name = path.substr(prefix.size(), path.find('/', prefix.size()) - prefix.size());
      if (names.empty() || names.back() != name) names.push_back(name);
    }
    return names;
  }
  bool exists(const std::string& path) override {
    auto it = files.lower_bound(path);
    return it != files.end() && (it->first == path || it->first.rfind(path + "/", 0) == 0);
  }

 private:
  class Writer : public WritableFile {
   public:
    Writer(MemFileSystem* fs, std::string path) : fs_(fs), path_(std::move(path)) {}
    Status append(const void* data, size_t n) override {
      fs_->files[path_].append(static_cast<const char*>(data), n);
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
};

}  // namespace trainsup::fuzz
