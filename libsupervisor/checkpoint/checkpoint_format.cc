#include "trainsup/checkpoint_format.h"

#include <xxhash.h>

#include <algorithm>
#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <future>
#include <nlohmann/json.hpp>
#include <set>

#include "trainsup/version.h"

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "the shard format is little-endian");

namespace trainsup {
namespace {

constexpr char kShardMagic[8] = {'T', 'S', 'U', 'P', 'S', 'H', 'R', 'D'};
constexpr char kFooterMagic[8] = {'T', 'S', 'U', 'P', 'E', 'N', 'D', '1'};
constexpr size_t kHeaderSize = 40;
constexpr size_t kFooterSize = 48;
constexpr uint64_t kAlign = 64;

struct Header {
  char magic[8];
  uint32_t version;
  uint32_t header_size;
  uint32_t rank;
  uint32_t world_size;
  int64_t step;
  uint64_t reserved;
};
static_assert(sizeof(Header) == kHeaderSize, "header layout");

struct Footer {
  uint64_t index_offset;
  uint64_t index_length;
  uint64_t index_xxh3;
  uint64_t header_xxh3;
  char magic[8];
  uint64_t footer_xxh3;  // of the 40 bytes above
};
static_assert(sizeof(Footer) == kFooterSize, "footer layout");

std::string hex64(uint64_t v) {
  char buf[17];
  std::snprintf(buf, sizeof(buf), "%016" PRIx64, v);
  return buf;
}

std::optional<uint64_t> parseHex64(const std::string& s) {
  if (s.size() != 16) return std::nullopt;
  uint64_t v = 0;
  for (char c : s) {
    int d = (c >= '0' && c <= '9') ? c - '0' : (c >= 'a' && c <= 'f') ? c - 'a' + 10 : -1;
    if (d < 0) return std::nullopt;
    v = (v << 4) | static_cast<uint64_t>(d);
  }
  return v;
}

// Writes through a WritableFile while tracking the offset.
class CountingWriter {
 public:
  explicit CountingWriter(WritableFile& f) : f_(f) {}
  Status write(const void* p, size_t n) {
    Status s = f_.append(p, n);
    if (s.isOk()) offset_ += n;
    return s;
  }
  Status padTo(uint64_t align) {
    static const char zeros[kAlign] = {};
    size_t pad = static_cast<size_t>((align - offset_ % align) % align);
    return pad == 0 ? Status::ok() : write(zeros, pad);
  }
  uint64_t offset() const { return offset_; }

 private:
  WritableFile& f_;
  uint64_t offset_ = 0;
};

std::string indexJson(int rank, int world_size, int64_t step, const std::vector<TensorEntry>& entries) {
  nlohmann::json tensors = nlohmann::json::array();
  for (const auto& e : entries) {
    tensors.push_back({{"name", e.meta.name},
                       {"dtype", dtypeName(e.meta.dtype)},
                       {"shape", e.meta.shape},
                       {"offset", e.offset},
                       {"length", e.length},
                       {"xxh3", hex64(e.xxh3)}});
  }
  nlohmann::json j = {{"rank", rank}, {"world_size", world_size}, {"step", step}, {"tensors", tensors}};
  return j.dump();
}

Status corrupt(const std::string& path, const std::string& why) {
  return Status::corruption("'" + path + "': " + why);
}

uint64_t expectedBytes(const TensorMeta& m, bool* ok) {
  uint64_t n = 1;
  *ok = true;
  for (int64_t d : m.shape) {
    if (d < 0 || (d > 0 && n > UINT64_MAX / static_cast<uint64_t>(d))) {
      *ok = false;
      return 0;
    }
    n *= static_cast<uint64_t>(d);
  }
  // The element count fits; its bytes may not (a shape read from a damaged or hostile index).
  const uint64_t size = dtypeSize(m.dtype);
  if (n > UINT64_MAX / size) {
    *ok = false;
    return 0;
  }
  return n * size;
}

}  // namespace

const char* dtypeName(DType d) {
  switch (d) {
    case DType::kBytes: return "bytes";
    case DType::kBool: return "bool";
    case DType::kUInt8: return "uint8";
    case DType::kInt8: return "int8";
    case DType::kInt16: return "int16";
    case DType::kInt32: return "int32";
    case DType::kInt64: return "int64";
    case DType::kFloat16: return "float16";
    case DType::kBFloat16: return "bfloat16";
    case DType::kFloat32: return "float32";
    case DType::kFloat64: return "float64";
  }
  return "?";
}

std::optional<DType> dtypeFromName(std::string_view name) {
  for (int i = 0; i <= static_cast<int>(DType::kFloat64); ++i) {
    if (name == dtypeName(static_cast<DType>(i))) return static_cast<DType>(i);
  }
  return std::nullopt;
}

size_t dtypeSize(DType d) {
  switch (d) {
    case DType::kBytes: case DType::kBool: case DType::kUInt8: case DType::kInt8: return 1;
    case DType::kInt16: case DType::kFloat16: case DType::kBFloat16: return 2;
    case DType::kInt32: case DType::kFloat32: return 4;
    case DType::kInt64: case DType::kFloat64: return 8;
  }
  return 1;
}

std::string checkpointDirName(int64_t step) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "step-%020" PRId64, step);
  return buf;
}

std::optional<int64_t> parseCheckpointDirName(std::string_view name, std::string* why) {
  if (name.size() != 25 || name.substr(0, 5) != "step-") return std::nullopt;
  int64_t v = 0;
  for (char c : name.substr(5)) {
    if (c < '0' || c > '9') return std::nullopt;
    const int digit = c - '0';
    if (v > (INT64_MAX - digit) / 10) {  // 20 digits can name more than a step can hold
      if (why != nullptr) {
        *why = "'" + std::string(name) + "' names a step beyond the largest one (" + std::to_string(INT64_MAX) +
               "): not a checkpoint of trainsup's";
      }
      return std::nullopt;
    }
    v = v * 10 + digit;
  }
  return v;
}

std::string shardFileName(int rank, int world_size) {
  char buf[48];
  std::snprintf(buf, sizeof(buf), "shard-r%05d-of-%05d.tsc", rank, world_size);
  return buf;
}

Status writeShard(FileSystem& fs, const std::string& dir, int rank, int world_size, int64_t step,
                  const std::vector<BufferRef>& tensors, ShardInfo* info) {
  std::set<std::string> names;
  for (const auto& t : tensors) {
    if (t.meta.name.empty()) return Status::invalidArgument("checkpoint tensor with an empty name");
    if (!names.insert(t.meta.name).second) {
      return Status::invalidArgument("checkpoint tensor name '" + t.meta.name + "' appears twice");
    }
    bool ok = true;
    uint64_t want = expectedBytes(t.meta, &ok);
    if (!ok || want != t.nbytes) {
      return Status::invalidArgument("checkpoint tensor '" + t.meta.name + "': " + std::to_string(t.nbytes) +
                                     " bytes do not match its dtype and shape");
    }
  }
  const std::string final_path = joinPath(dir, shardFileName(rank, world_size));
  const std::string tmp_path = joinPath(dir, "." + shardFileName(rank, world_size) + ".tmp");
  auto opened = fs.newWritableFile(tmp_path);
  if (!opened) return opened.status();
  std::unique_ptr<WritableFile> file = std::move(*opened);
  auto fail = [&](Status s) {
    file->close();
    fs.removeFile(tmp_path);
    return s;
  };
  CountingWriter w(*file);
  Header h{};
  std::memcpy(h.magic, kShardMagic, 8);
  h.version = kCheckpointFormatVersion;
  h.header_size = kHeaderSize;
  h.rank = static_cast<uint32_t>(rank);
  h.world_size = static_cast<uint32_t>(world_size);
  h.step = step;
  if (Status s = w.write(&h, sizeof(h)); !s.isOk()) return fail(s);
  std::vector<TensorEntry> entries;
  entries.reserve(tensors.size());
  for (const auto& t : tensors) {
    if (Status s = w.padTo(kAlign); !s.isOk()) return fail(s);
    TensorEntry e;
    e.meta = t.meta;
    e.offset = w.offset();
    e.length = t.nbytes;
    // The checksum is needed only for the index at the end: for large tensors compute it on
    // another thread while this one writes the same bytes.
    if (t.nbytes >= (size_t{1} << 20)) {
      auto hash = std::async(std::launch::async, [&t] { return XXH3_64bits(t.data, t.nbytes); });
      Status s = w.write(t.data, t.nbytes);
      e.xxh3 = hash.get();
      if (!s.isOk()) return fail(s);
    } else {
      e.xxh3 = XXH3_64bits(t.data, t.nbytes);
      if (Status s = w.write(t.data, t.nbytes); !s.isOk()) return fail(s);
    }
    entries.push_back(std::move(e));
  }
  std::string index = indexJson(rank, world_size, step, entries);
  Footer f{};
  f.index_offset = w.offset();
  f.index_length = index.size();
  f.index_xxh3 = XXH3_64bits(index.data(), index.size());
  f.header_xxh3 = XXH3_64bits(&h, sizeof(h));
  std::memcpy(f.magic, kFooterMagic, 8);
  f.footer_xxh3 = XXH3_64bits(&f, offsetof(Footer, footer_xxh3));
  if (Status s = w.write(index.data(), index.size()); !s.isOk()) return fail(s);
  if (Status s = w.write(&f, sizeof(f)); !s.isOk()) return fail(s);
  if (Status s = file->sync(); !s.isOk()) return fail(s);
  if (Status s = file->close(); !s.isOk()) return fail(s);
  if (Status s = fs.rename(tmp_path, final_path); !s.isOk()) return fail(s);
  if (Status s = fs.syncDir(dir); !s.isOk()) return s;
  if (info != nullptr) {
    info->rank = rank;
    info->world_size = world_size;
    info->step = step;
    info->tensors = std::move(entries);
    info->file_size = w.offset();
    info->index_xxh3 = f.index_xxh3;
  }
  return Status::ok();
}

Result<std::unique_ptr<ShardReader>> ShardReader::open(FileSystem& fs, const std::string& path) {
  auto opened = fs.newReadableFile(path);
  if (!opened) return opened.status();
  std::unique_ptr<ShardReader> r(new ShardReader());
  r->file_ = std::move(*opened);
  const uint64_t size = r->file_->size();
  if (size < kHeaderSize + kFooterSize) {
    return corrupt(path, "bad header: file of " + std::to_string(size) + " bytes is too short (truncated?)");
  }
  Header h{};
  if (Status s = r->file_->readAt(0, &h, sizeof(h)); !s.isOk()) return s;
  if (std::memcmp(h.magic, kShardMagic, 8) != 0) return corrupt(path, "bad header: not a trainsup shard (magic)");
  if (h.version != kCheckpointFormatVersion) {
    return corrupt(path, "bad header: format version " + std::to_string(h.version) + " is not supported");
  }
  Footer f{};
  if (Status s = r->file_->readAt(size - kFooterSize, &f, sizeof(f)); !s.isOk()) return s;
  if (std::memcmp(f.magic, kFooterMagic, 8) != 0 ||
      XXH3_64bits(&f, offsetof(Footer, footer_xxh3)) != f.footer_xxh3) {
    return corrupt(path, "bad footer: missing or damaged (truncated shard?)");
  }
  if (XXH3_64bits(&h, sizeof(h)) != f.header_xxh3) return corrupt(path, "bad header: checksum mismatch");
  if (f.index_offset < kHeaderSize || f.index_length > size || f.index_offset > size - kFooterSize - f.index_length ||
      f.index_offset + f.index_length + kFooterSize != size) {
    return corrupt(path, "size mismatch: the footer's index position does not fit the file size");
  }
  std::string index(f.index_length, '\0');
  if (Status s = r->file_->readAt(f.index_offset, index.data(), index.size()); !s.isOk()) return s;
  if (XXH3_64bits(index.data(), index.size()) != f.index_xxh3) return corrupt(path, "checksum mismatch in the index");
  ShardInfo& info = r->info_;
  info.rank = static_cast<int>(h.rank);
  info.world_size = static_cast<int>(h.world_size);
  info.step = h.step;
  info.file_size = size;
  info.index_xxh3 = f.index_xxh3;
  try {
    auto j = nlohmann::json::parse(index);
    for (const auto& t : j.at("tensors")) {
      TensorEntry e;
      e.meta.name = t.at("name").get<std::string>();
      auto dt = dtypeFromName(t.at("dtype").get<std::string>());
      if (!dt) return corrupt(path, "unknown dtype in the index for '" + e.meta.name + "'");
      e.meta.dtype = *dt;
      e.meta.shape = t.at("shape").get<std::vector<int64_t>>();
      e.offset = t.at("offset").get<uint64_t>();
      e.length = t.at("length").get<uint64_t>();
      auto hash = parseHex64(t.at("xxh3").get<std::string>());
      if (!hash) return corrupt(path, "bad checksum text in the index for '" + e.meta.name + "'");
      e.xxh3 = *hash;
      bool ok = true;
      if (expectedBytes(e.meta, &ok) != e.length || !ok || e.offset < kHeaderSize || e.length > f.index_offset ||
          e.offset > f.index_offset - e.length) {
        return corrupt(path, "index entry '" + e.meta.name + "' does not fit the file");
      }
      info.tensors.push_back(std::move(e));
    }
  } catch (const nlohmann::json::exception& e) {
    return corrupt(path, std::string("unreadable index: ") + e.what());
  }
  return r;
}

const TensorEntry* ShardReader::find(std::string_view name) const {
  for (const auto& e : info_.tensors) {
    if (e.meta.name == name) return &e;
  }
  return nullptr;
}

Status ShardReader::read(const TensorEntry& entry, void* dst, size_t nbytes) const {
  if (nbytes != entry.length) {
    return Status::invalidArgument("tensor '" + entry.meta.name + "' in '" + path() + "' has " +
                                   std::to_string(entry.length) + " bytes, the destination " + std::to_string(nbytes));
  }
  if (Status s = file_->readAt(entry.offset, dst, nbytes); !s.isOk()) return s;
  if (XXH3_64bits(dst, nbytes) != entry.xxh3) {
    return corrupt(path(), "checksum mismatch in tensor '" + entry.meta.name + "'");
  }
  return Status::ok();
}

Status ShardReader::verifyAll() const {
  std::vector<char> buf;
  for (const auto& e : info_.tensors) {
    // Hash in bounded pieces: verification must not need memory the size of the shard.
    XXH3_state_t* st = XXH3_createState();
    XXH3_64bits_reset(st);
    buf.resize(std::min<uint64_t>(e.length, uint64_t{16} << 20));
    Status s;
    for (uint64_t off = 0; off < e.length && s.isOk();) {
      size_t n = static_cast<size_t>(std::min<uint64_t>(buf.size(), e.length - off));
      s = file_->readAt(e.offset + off, buf.data(), n);
      if (s.isOk()) XXH3_64bits_update(st, buf.data(), n);
      off += n;
    }
    uint64_t h = XXH3_64bits_digest(st);
    XXH3_freeState(st);
    if (!s.isOk()) return s;
    if (h != e.xxh3) return corrupt(path(), "checksum mismatch in tensor '" + e.meta.name + "'");
  }
  return Status::ok();
}

namespace {

nlohmann::json manifestBody(const Manifest& m) {
  nlohmann::json shards = nlohmann::json::array();
  for (const auto& s : m.shards) {
    shards.push_back({{"rank", s.rank}, {"file", s.file}, {"size", s.size}, {"xxh3", hex64(s.xxh3)}});
  }
  return {{"format", "trainsup-checkpoint"}, {"format_version", m.format_version},
          {"step", m.step},                  {"world_size", m.world_size},
          {"created_unix_s", m.created_unix_s}, {"library_version", m.library_version},
          {"job_id", m.job_id},              {"shards", shards},
          {"metadata", m.metadata}};
}

}  // namespace

std::string manifestText(const Manifest& manifest) {
  nlohmann::json j = manifestBody(manifest);
  // The checksum covers the canonical (sorted-key) text of everything else.
  j["checksum"] = hex64(XXH3_64bits(j.dump().data(), j.dump().size()));
  return j.dump(2) + "\n";
}

Status writeManifest(FileSystem& fs, const std::string& dir, const Manifest& manifest) {
  return writeManifestText(fs, dir, manifestText(manifest));
}

Status writeManifestText(FileSystem& fs, const std::string& dir, const std::string& text) {
  const std::string tmp = joinPath(dir, std::string(".") + kManifestName + ".tmp");
  auto opened = fs.newWritableFile(tmp);
  if (!opened) return opened.status();
  auto& file = *opened;
  Status s = file->append(text.data(), text.size());
  if (s.isOk()) s = file->sync();
  if (s.isOk()) s = file->close();
  if (s.isOk()) s = fs.rename(tmp, joinPath(dir, kManifestName));
  if (!s.isOk()) {
    file->close();
    fs.removeFile(tmp);
    return s;
  }
  return fs.syncDir(dir);
}

Result<Manifest> readManifest(FileSystem& fs, const std::string& dir) {
  const std::string path = joinPath(dir, kManifestName);
  auto opened = fs.newReadableFile(path);
  if (!opened) {
    if (opened.status().code() == StatusCode::kNotFound) return Status::notFound("missing manifest '" + path + "'");
    return opened.status();
  }
  std::string text((*opened)->size(), '\0');
  if (Status s = (*opened)->readAt(0, text.data(), text.size()); !s.isOk()) return s;
  Manifest m;
  try {
    auto j = nlohmann::json::parse(text);
    auto stored = parseHex64(j.at("checksum").get<std::string>());
    j.erase("checksum");
    std::string canon = j.dump();
    if (!stored || *stored != XXH3_64bits(canon.data(), canon.size())) {
      return corrupt(path, "checksum mismatch in the manifest");
    }
    if (j.at("format").get<std::string>() != "trainsup-checkpoint") return corrupt(path, "not a trainsup manifest");
    m.format_version = j.at("format_version").get<int>();
    if (m.format_version != kCheckpointFormatVersion) {
      return corrupt(path, "manifest format version " + std::to_string(m.format_version) + " is not supported");
    }
    m.step = j.at("step").get<int64_t>();
    m.world_size = j.at("world_size").get<int>();
    m.created_unix_s = j.at("created_unix_s").get<double>();
    m.library_version = j.at("library_version").get<std::string>();
    m.job_id = j.at("job_id").get<std::string>();
    m.metadata = j.at("metadata").get<std::map<std::string, std::string>>();
    for (const auto& s : j.at("shards")) {
      ManifestShard ms;
      ms.rank = s.at("rank").get<int>();
      ms.file = s.at("file").get<std::string>();
      ms.size = s.at("size").get<uint64_t>();
      auto h = parseHex64(s.at("xxh3").get<std::string>());
      if (!h) return corrupt(path, "bad shard checksum text");
      ms.xxh3 = *h;
      m.shards.push_back(std::move(ms));
    }
  } catch (const nlohmann::json::exception& e) {
    return corrupt(path, std::string("unreadable manifest: ") + e.what());
  }
  if (m.world_size < 1 || static_cast<int>(m.shards.size()) != m.world_size) {
    return corrupt(path, "manifest lists " + std::to_string(m.shards.size()) + " shards for world size " +
                             std::to_string(m.world_size));
  }
  // Shard r is the r-th entry and has the name the writer gives it: a manifest can never point
  // a reader at another rank's shard, or at a file outside its directory.
  for (int r = 0; r < m.world_size; ++r) {
    const ManifestShard& ms = m.shards[static_cast<size_t>(r)];
    if (ms.rank != r || ms.file != shardFileName(r, m.world_size)) {
      return corrupt(path, "manifest entry " + std::to_string(r) + " names rank " + std::to_string(ms.rank) +
                               " and file '" + ms.file + "'; expected rank " + std::to_string(r) + " and '" +
                               shardFileName(r, m.world_size) + "'");
    }
  }
  return m;
}

Result<std::unique_ptr<ShardReader>> openCheckedShard(FileSystem& fs, const std::string& dir, const Manifest& manifest,
                                                      int shard_rank, int64_t step) {
  if (shard_rank < 0 || shard_rank >= static_cast<int>(manifest.shards.size())) {
    return Status::corruption("the manifest of '" + dir + "' has no shard for rank " + std::to_string(shard_rank));
  }
  const ManifestShard& ms = manifest.shards[static_cast<size_t>(shard_rank)];
  const std::string file = joinPath(dir, ms.file);
  // Size first: a truncated or overwritten shard is named for what is wrong with it.
  auto raw = fs.newReadableFile(file);
  if (!raw) {
    if (raw.status().code() == StatusCode::kNotFound) return Status::notFound("missing shard '" + file + "'");
    return raw.status();
  }
  if ((*raw)->size() != ms.size) {
    return corrupt(file, "size mismatch: " + std::to_string((*raw)->size()) + " bytes, the manifest says " +
                             std::to_string(ms.size));
  }
  auto opened = ShardReader::open(fs, file);
  if (!opened) return opened.status();
  const ShardInfo& si = (*opened)->info();
  if (si.index_xxh3 != ms.xxh3) return corrupt(file, "checksum mismatch: the shard's index differs from the manifest");
  if (si.rank != shard_rank || si.world_size != manifest.world_size || si.step != step) {
    return corrupt(file, "the shard is rank " + std::to_string(si.rank) + " of " + std::to_string(si.world_size) +
                             " at step " + std::to_string(si.step) + "; the manifest expects rank " +
                             std::to_string(shard_rank) + " of " + std::to_string(manifest.world_size) + " at step " +
                             std::to_string(step));
  }
  if (const TensorEntry* e = (*opened)->find(kCompanionsEntry)) {
    std::string text(e->length, '\0');
    if (Status s = (*opened)->read(*e, text.data(), text.size()); !s.isOk()) return s;
    try {
      for (const auto& c : nlohmann::json::parse(text)) {
        const std::string name = c.at("file").get<std::string>();
        const uint64_t size = c.at("size").get<uint64_t>();
        if (name.empty() || name.find('/') != std::string::npos || name == "." || name == "..") {
          return corrupt(file, "companion file name '" + name + "' is not a name in the step directory");
        }
        const std::string path = joinPath(dir, name);
        auto f = fs.newReadableFile(path);
        if (!f) {
          if (f.status().code() == StatusCode::kNotFound) return Status::notFound("missing file '" + path + "'");
          return f.status();
        }
        if ((*f)->size() != size) {
          return corrupt(path, "size mismatch: " + std::to_string((*f)->size()) + " bytes, shard " +
                                   std::to_string(shard_rank) + " says " + std::to_string(size));
        }
      }
    } catch (const nlohmann::json::exception& ex) {
      return corrupt(file, std::string("bad ") + kCompanionsEntry + " entry: " + ex.what());
    }
  }
  return opened;
}

Result<Manifest> checkCheckpoint(FileSystem& fs, const std::string& dir, int64_t step) {
  auto manifest = readManifest(fs, dir);
  if (!manifest) return manifest.status();
  if (manifest->step != step) {
    return corrupt(joinPath(dir, kManifestName), "the manifest is of step " + std::to_string(manifest->step) +
                                                     ", its directory of step " + std::to_string(step));
  }
  for (int r = 0; r < static_cast<int>(manifest->shards.size()); ++r) {
    auto shard = openCheckedShard(fs, dir, *manifest, r, step);
    if (!shard) return shard.status();
  }
  return manifest;
}

Result<NewestCheckpoint> newestValidCheckpoint(FileSystem& fs, const std::string& root) {
  auto names = fs.listDir(root);
  if (!names) return names.status();
  std::vector<int64_t> steps;
  NewestCheckpoint out;
  for (const auto& n : *names) {
    std::string why;
    if (auto s = parseCheckpointDirName(n, &why)) {
      steps.push_back(*s);
    } else if (!why.empty()) {
      out.skipped.push_back(n + ": " + why);
    }
  }
  std::sort(steps.rbegin(), steps.rend());
  for (int64_t step : steps) {
    const std::string dir = joinPath(root, checkpointDirName(step));
    auto m = checkCheckpoint(fs, dir, step);
    if (!m) {
      out.skipped.push_back(checkpointDirName(step) + ": " + m.status().message());
      continue;
    }
    out.step = step;
    out.dir = dir;
    out.manifest = std::move(*m);
    return out;
  }
  std::string why;
  for (const auto& s : out.skipped) why += "; " + s;
  return Status::notFound("no valid checkpoint under '" + root + "'" + why);
}

}  // namespace trainsup
