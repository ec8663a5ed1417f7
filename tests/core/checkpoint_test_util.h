// Helpers for the checkpoint tests: a temp dir, deterministic buffers and a recorder of
// checkpointer events (the fault-injecting and in-memory file systems: base/mem_file_system.h).
#pragma once

#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <functional>
#include <mutex>
#include <string>
#include <vector>

#include "base/mem_file_system.h"  // MemFileSystem, FaultyFileSystem
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

}  // namespace trainsup::testing
