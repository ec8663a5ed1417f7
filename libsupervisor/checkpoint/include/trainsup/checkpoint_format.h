// trainsup/checkpoint_format.h — the on-disk checkpoint format (docs/checkpoint-format.md).
//
// A checkpoint is one directory per step, `step-<20 digits>/`, holding one shard file per rank
// (`shard-r<rank>-of-<world>.tsc`) and, written last by one rank after every shard is durable,
// `MANIFEST.json`. A directory without a manifest is not a checkpoint.
//
// Shard file: a 40-byte header (magic "TSUPSHRD", version, rank, world size, step), the tensor
// data (each tensor 64-byte aligned), a JSON index (name, dtype, shape, offset, length, XXH3-64
// per tensor) and a 48-byte footer (index offset/length/XXH3, header XXH3, magic "TSUPEND1",
// footer XXH3). Every byte that matters is covered by a checksum. The manifest records each
// shard's size and the XXH3 of its index, so checking that a shard belongs to a manifest costs
// a footer and an index read.
//
// Thread-safety: the functions are reentrant; a ShardReader may be read from several threads.
// Errors are Status values naming the file and what is wrong ("checksum mismatch", ...).
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "trainsup/export.h"
#include "trainsup/file_system.h"
#include "trainsup/status.h"

namespace trainsup {

enum class DType : uint8_t {
  kBytes = 0,  // opaque bytes (pickles, RNG states); shape is {nbytes}
  kBool, kUInt8, kInt8, kInt16, kInt32, kInt64, kFloat16, kBFloat16, kFloat32, kFloat64,
};
TRAINSUP_EXPORT const char* dtypeName(DType d);
TRAINSUP_EXPORT std::optional<DType> dtypeFromName(std::string_view name);
TRAINSUP_EXPORT size_t dtypeSize(DType d);  // 1 for kBytes

struct TensorMeta {
  std::string name;
  DType dtype = DType::kBytes;
  std::vector<int64_t> shape;
};

// A named buffer to save. `data` is caller memory that must stay valid during the call:
// host memory (device = -1) or memory of CUDA device `device` (copied into pinned staging
// memory by the checkpointer; needs the CUDA layer).
struct BufferRef {
  TensorMeta meta;
  const void* data = nullptr;
  size_t nbytes = 0;
  int device = -1;
};

struct TensorEntry {
  TensorMeta meta;
  uint64_t offset = 0;  // in the shard file
  uint64_t length = 0;  // bytes
  uint64_t xxh3 = 0;
};

struct ShardInfo {
  int rank = 0;
  int world_size = 1;
  int64_t step = 0;
  std::vector<TensorEntry> tensors;
  uint64_t file_size = 0;
  uint64_t index_xxh3 = 0;  // the shard's checksum in the manifest
};

inline constexpr int kCheckpointFormatVersion = 1;
inline constexpr const char* kManifestName = "MANIFEST.json";
// A shard's `bytes` entry listing the other files of the checkpoint that this rank wrote (UTF-8
// JSON array of objects with at least "file", a name in the step directory, and "size" in
// bytes). A checkpoint is valid only if each is present with that size.
inline constexpr const char* kCompanionsEntry = "trainsup.companions";
// Manifest metadata naming how the tensors are laid out: absent for trainsup's own shards,
// "dcp" for torch.distributed.checkpoint files beside them (any world size may read them).
inline constexpr const char* kLayoutKey = "trainsup.layout";

TRAINSUP_EXPORT std::string checkpointDirName(int64_t step);                   // "step-00000000000000001234"
// The step of a checkpoint directory's name, or nullopt for any other name. A name of that
// shape whose number exceeds the largest step (INT64_MAX; 20 digits can) is not a checkpoint
// either: nullopt, and `why` (when given) says so, naming it, for the listing that skips it.
TRAINSUP_EXPORT std::optional<int64_t> parseCheckpointDirName(std::string_view name, std::string* why = nullptr);
TRAINSUP_EXPORT std::string shardFileName(int rank, int world_size);         // "shard-r00003-of-00008.tsc"

// Writes `tensors` as the shard of `rank` in `dir` (which must exist): to a temporary name,
// fsync, rename, fsync(dir). On failure the temporary file is removed and `dir` is unchanged.
// Names must be unique and non-empty (InvalidArgument otherwise).
TRAINSUP_EXPORT Status writeShard(FileSystem& fs, const std::string& dir, int rank, int world_size, int64_t step,
                                  const std::vector<BufferRef>& tensors, ShardInfo* info);

class TRAINSUP_EXPORT ShardReader {
 public:
  // Checks the header, footer and index checksums and the index's consistency.
  static Result<std::unique_ptr<ShardReader>> open(FileSystem& fs, const std::string& path);
  const ShardInfo& info() const { return info_; }
  const TensorEntry* find(std::string_view name) const;
  // Reads one tensor into dst (exactly entry.length bytes) and checks its checksum.
  Status read(const TensorEntry& entry, void* dst, size_t nbytes) const;
  // Reads every tensor and checks every checksum.
  Status verifyAll() const;
  const std::string& path() const { return file_->path(); }

 private:
  ShardReader() = default;
  std::unique_ptr<ReadableFile> file_;
  ShardInfo info_;
};

struct ManifestShard {
  int rank = 0;
  std::string file;
  uint64_t size = 0;
  uint64_t xxh3 = 0;  // ShardInfo::index_xxh3
};

struct Manifest {
  int format_version = kCheckpointFormatVersion;
  int64_t step = 0;
  int world_size = 1;
  double created_unix_s = 0;
  std::string library_version;
  std::string job_id;
  std::vector<ManifestShard> shards;  // by rank
  std::map<std::string, std::string> metadata;  // user metadata (UTF-8 strings)
};

// Atomically writes `dir`/MANIFEST.json (temporary name, fsync, rename, fsync(dir)).
TRAINSUP_EXPORT Status writeManifest(FileSystem& fs, const std::string& dir, const Manifest& manifest);
// The text writeManifest writes (checksum included), and writing such a text the same atomic way
// (the memory tier copies rank 0's manifest to every host as text, byte for byte).
TRAINSUP_EXPORT std::string manifestText(const Manifest& manifest);
TRAINSUP_EXPORT Status writeManifestText(FileSystem& fs, const std::string& dir, const std::string& text);
// Manifest metadata of the memory tier: JSON [[host, replica host], ...] by rank, where each
// rank's shard and its peer copy are held ("" when a shard has no peer copy).
inline constexpr const char* kPlacementKey = "trainsup.placement";
// NotFound if missing; Corruption (naming the file) if unparsable or its checksum is wrong.
TRAINSUP_EXPORT Result<Manifest> readManifest(FileSystem& fs, const std::string& dir);

// What a valid checkpoint is, in one place (restore, retention, the launcher's restart guard and
// trainsup.load_checkpoint all ask here). Short of reading the tensor data, whose checksums are
// verified as it is read:
// - openCheckedShard: shard `shard_rank` of `manifest` in `dir` is present, of the manifest's
//   size, its index has the manifest's checksum, and its header names that rank, the
//   manifest's world size and `step`, and every companion file it lists (kCompanionsEntry) is
//   present with its size. Returns it opened; else NotFound ("missing shard", "missing file")
//   or Corruption saying what is wrong.
// - checkCheckpoint: `dir`'s manifest reads (its checksum holds), is of `step`, and every shard
//   passes openCheckedShard. Returns the manifest, or the first reason the checkpoint is not valid.
TRAINSUP_EXPORT Result<std::unique_ptr<ShardReader>> openCheckedShard(FileSystem& fs, const std::string& dir,
                                                                      const Manifest& manifest, int shard_rank,
                                                                      int64_t step);
TRAINSUP_EXPORT Result<Manifest> checkCheckpoint(FileSystem& fs, const std::string& dir, int64_t step);

// The newest valid checkpoint under `root` (step directories), with the reasons the newer ones
// were skipped ("step-...: missing manifest"). NotFound if there is none.
struct NewestCheckpoint {
  int64_t step = -1;
  std::string dir;
  Manifest manifest;
  std::vector<std::string> skipped;
};
TRAINSUP_EXPORT Result<NewestCheckpoint> newestValidCheckpoint(FileSystem& fs, const std::string& root);

}  // namespace trainsup
