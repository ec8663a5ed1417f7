// Checkpoint costs, each measured side by side with its baseline in one run (interleaved,
// median of several rounds), for states of 256 MiB and 1 GiB in 16 tensors:
//   stall_vs_memcpy        training stall of a save / a plain memcpy of the same bytes  (<= 1.2)
//   stall_vs_sync_save     stall / synchronous torch::save + fsync of the same tensors   (<= 0.05)
//   persist_vs_raw_write   persist throughput / raw sequential write + fsync, same disk  (>= 0.8)
//   restore_vs_torch_load  verified restore / torch::load of the same tensors           (<= 1.0)
// The stall — the time the training thread is held by the checkpoint — is measured for both
// snapshot modes:
//   blocking    save() (a parallel copy to staging memory);
//   overlapped  save() + awaitSnapshot() after a forward/backward-like compute of `step_s`
//               seconds (single-thread matrix products) that runs while the copy is made.
// The compute running beside the copy and the persist is slowed by them (same memory bus, and
// on this 2-core machine the same cores): "overlapped_interference_s" is the whole sequence's
// time minus the compute alone (measured in the same round), reported per size. A blocking
// snapshot's persist interferes with the following steps the same way.
// The last line is one JSON object: the ratios of the overlapped mode (worst over the sizes),
// the blocking mode's as "blocking_*", and per-size figures.
//
//   trainsup_bench_checkpoint [dir=/tmp/trainsup-bench] [rounds=6] [step_s=0.5]
#include <fcntl.h>
#include <torch/serialize.h>
#include <torch/types.h>
#include <torch/utils.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "trainsup/checkpointer.h"
#include "trainsup/torch_state.h"

namespace {

using Clock = std::chrono::steady_clock;
double since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }
double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}
void fsyncFile(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY);
  if (fd >= 0) {
    ::fsync(fd);
    ::close(fd);
  }
}
void dropCaches() {
  ::sync();
  if (FILE* f = std::fopen("/proc/sys/vm/drop_caches", "w")) {
    std::fputs("3", f);
    std::fclose(f);
  }
}
bool canDropCaches() { return ::access("/proc/sys/vm/drop_caches", W_OK) == 0; }

struct Figures {
  double bytes, memcpy_s, stall_s, sync_save_s, persist_s, raw_write_s, restore_s, torch_load_s, overlapped_stall_s,
      compute_s, interference_s;
};

// A forward/backward stand-in: single-thread products of 384x384 matrices (a working set that
// stays in cache, like a GPU job's host thread it leaves the memory bus mostly free).
struct Compute {
  torch::Tensor a = torch::randn({384, 384}), b = torch::randn({384, 384});
  int reps = 1;
  double run() {
    auto t = Clock::now();
    torch::Tensor c = a;
    for (int i = 0; i < reps; ++i) c = torch::mm(c, b).div_(20);
    volatile float sink = c[0][0].item<float>();
    (void)sink;
    return since(t);
  }
  void calibrate(double seconds) {
    reps = 8;
    double t = run();
    reps = std::max(1, static_cast<int>(reps * seconds / std::max(t, 1e-6)));
    t = run();
    reps = std::max(1, static_cast<int>(reps * seconds / std::max(t, 1e-6)));
  }
};

Figures measure(const std::string& dir, size_t total_bytes, int rounds, double step_s) {
  const int kTensors = 16;
  const int64_t per = static_cast<int64_t>(total_bytes / kTensors / sizeof(float));
  std::vector<torch::Tensor> tensors;
  trainsup::TorchState state;
  for (int i = 0; i < kTensors; ++i) {
    tensors.push_back(torch::randn({per}));
    state.addTensor("layer" + std::to_string(i) + ".weight", tensors.back());
  }
  const size_t bytes = static_cast<size_t>(per) * kTensors * sizeof(float);
  std::vector<char> dst(bytes);
  std::memset(dst.data(), 1, bytes);  // pre-touched, like the checkpointer's reused staging memory

  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  trainsup::CheckpointOptions o;
  o.dir = dir + "/ckpt";
  o.interval_s = 0;
  o.keep = 1;
  trainsup::Identity id;
  id.host = "bench";
  auto created = trainsup::Checkpointer::create(o, id, trainsup::FileSystem::posix(), trainsup::Clock::real(), nullptr, {});
  if (!created) std::abort();
  std::unique_ptr<trainsup::Checkpointer> ckpt = std::move(created.value());
  trainsup::CheckpointOptions ov = o;
  ov.dir = dir + "/ckpt-overlapped";
  ov.snapshot = trainsup::SnapshotMode::kOverlapped;
  auto created_ov =
      trainsup::Checkpointer::create(ov, id, trainsup::FileSystem::posix(), trainsup::Clock::real(), nullptr, {});
  if (!created_ov) std::abort();
  std::unique_ptr<trainsup::Checkpointer> ckpt_ov = std::move(created_ov.value());
  Compute compute;
  compute.calibrate(step_s);
  std::vector<double> memcpy_s, stall_s, sync_s, persist_s, raw_s, restore_s, load_s, ov_stall_s, compute_s,
      interference_s;
  const bool cold = canDropCaches();
  int64_t step = 0;
  for (int r = 0; r <= rounds; ++r) {  // round 0 warms up (first-touch of the staging memory)
    auto t = Clock::now();
    size_t off = 0;
    for (const auto& x : tensors) {
      std::memcpy(dst.data() + off, x.data_ptr(), x.nbytes());
      off += x.nbytes();
    }
    double m = since(t);

    trainsup::Checkpointer::Stats st;
    auto persist = [&] {
      ::sync();
      auto started = ckpt->save(++step, state.collector());
      if (!started || *started != trainsup::Checkpointer::Outcome::kStarted) std::abort();
      if (!ckpt->waitIdle(std::chrono::minutes(10)).isOk()) std::abort();
      st = ckpt->stats();
    };
    double raw = 0;
    const std::string raw_file = dir + "/raw.bin";
    auto rawWrite = [&] {
      std::filesystem::remove(raw_file);
      ::sync();
      auto t0 = Clock::now();
      // From a copy in ordinary memory, as the checkpointer writes from its staging copy.
      int fd = ::open(raw_file.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      const char* p = dst.data();
      size_t left = dst.size();
      while (left > 0) {
        ssize_t w = ::write(fd, p, std::min<size_t>(left, size_t{64} << 20));
        if (w <= 0) std::abort();
        p += w;
        left -= static_cast<size_t>(w);
      }
      ::fsync(fd);
      ::close(fd);
      raw = since(t0);
    };
    // Fresh files for the baseline too (the checkpointer always writes new files).
    const std::string torch_file = dir + "/torch_save.pt";
    double sync_save = 0;
    auto torchSave = [&] {
      std::filesystem::remove(torch_file);
      ::sync();
      auto t0 = Clock::now();
      torch::save(tensors, torch_file);
      fsyncFile(torch_file);
      sync_save = since(t0);
    };
    // The disk here is much slower for a write that follows another large write, so the two
    // alternate going first, and each is compared in that position only. The virtual disk also
    // reads recently written files faster (the host's cache), so torch::save goes before the
    // checkpoint in alternate rounds: neither file is always the newer one when read back.
    const bool persist_first = r % 2 == 1;
    if (persist_first) torchSave();
    if (persist_first) {
      persist();
      rawWrite();
    } else {
      rawWrite();
      persist();
    }

    // Overlapped: save, the next forward/backward, awaitSnapshot — against the compute alone,
    // which goes first or second in alternate rounds.
    double alone = 0, overlapped = 0, held = 0;
    auto computeAlone = [&] { alone = compute.run(); };
    auto computeOverlapped = [&] {
      ::sync();
      auto t0 = Clock::now();
      auto started = ckpt_ov->save(step, state.collector());
      if (!started || *started != trainsup::Checkpointer::Outcome::kStarted) std::abort();
      compute.run();
      if (!ckpt_ov->awaitSnapshot().isOk()) std::abort();
      overlapped = since(t0);
      held = ckpt_ov->stats().last_stall_s;
      if (!ckpt_ov->waitIdle(std::chrono::minutes(10)).isOk()) std::abort();
    };
    if (persist_first) {
      computeOverlapped();
      computeAlone();
    } else {
      computeAlone();
      computeOverlapped();
    }

    if (!persist_first) torchSave();

    // Restore and torch::load alternate going first too, each from a cold cache.
    double restore = 0, load = 0;
    auto doRestore = [&] {
      if (cold) dropCaches();
      auto t0 = Clock::now();
      auto restored = ckpt->restore(state.loader());
      restore = since(t0);
      if (!restored || !*restored) std::abort();
    };
    auto doLoad = [&] {
      if (cold) dropCaches();
      auto t0 = Clock::now();
      std::vector<torch::Tensor> loaded;
      torch::load(loaded, torch_file);
      load = since(t0);
    };
    if (persist_first) {
      doRestore();
      doLoad();
    } else {
      doLoad();
      doRestore();
    }

    if (r == 0) continue;
    memcpy_s.push_back(m);
    stall_s.push_back(st.last_stall_s);
    ov_stall_s.push_back(held);
    interference_s.push_back(std::max(0.0, overlapped - alone));
    compute_s.push_back(alone);
    sync_s.push_back(sync_save);
    if (persist_first) persist_s.push_back(st.last_persist_s);
    if (!persist_first) raw_s.push_back(raw);
    restore_s.push_back(restore);
    load_s.push_back(load);
    std::printf("  %4zu MiB round %d: memcpy %.3f s, stall %.3f s, torch::save+fsync %.3f s, persist %.3f s%s, "
                "raw write+fsync %.3f s%s, restore %.3f s, torch::load %.3f s, compute %.3f s, with overlapped save %.3f s "
                "(held %.4f s)\n",
                bytes >> 20, r, m, st.last_stall_s, sync_save, st.last_persist_s, persist_first ? " (first)" : "", raw,
                persist_first ? "" : " (first)", restore, load, alone, overlapped, held);
    std::fflush(stdout);
  }
  ckpt.reset();
  ckpt_ov.reset();
  std::filesystem::remove_all(dir);
  return {static_cast<double>(bytes), median(memcpy_s), median(stall_s), median(sync_s), median(persist_s),
          median(raw_s), median(restore_s), median(load_s), median(ov_stall_s), median(compute_s),
          median(interference_s)};
}

}  // namespace

int main(int argc, char** argv) {
  const std::string dir = argc > 1 ? argv[1] : "/tmp/trainsup-bench";
  const int rounds = std::max(2, argc > 2 ? std::atoi(argv[2]) : 6);
  const double step_s = argc > 3 ? std::atof(argv[3]) : 0.5;
  torch::set_num_threads(1);
  std::printf("checkpoint benchmark in %s, %d rounds per size, %s page cache for reads, forward/backward %.2f s\n",
              dir.c_str(), rounds, canDropCaches() ? "cold (caches dropped)" : "warm (cannot drop caches here)", step_s);
  std::string sizes_json;
  double worst_memcpy = 0, worst_sync = 0, worst_persist = 1e9, worst_restore = 0, worst_blocking_memcpy = 0,
         worst_blocking_sync = 0;
  for (size_t mib : {size_t{256}, size_t{1024}}) {
    Figures f = measure(dir, mib << 20, rounds, step_s);
    double a = f.overlapped_stall_s / f.memcpy_s, b = f.overlapped_stall_s / f.sync_save_s,
           ab = f.stall_s / f.memcpy_s, bb = f.stall_s / f.sync_save_s, c = f.raw_write_s / f.persist_s,
           d = f.restore_s / f.torch_load_s;
    worst_memcpy = std::max(worst_memcpy, a);
    worst_sync = std::max(worst_sync, b);
    worst_blocking_memcpy = std::max(worst_blocking_memcpy, ab);
    worst_blocking_sync = std::max(worst_blocking_sync, bb);
    worst_persist = std::min(worst_persist, c);
    worst_restore = std::max(worst_restore, d);
    std::printf("%zu MiB: overlapped stall_vs_memcpy %.3f, stall_vs_sync_save %.4f; blocking stall_vs_memcpy %.3f, "
                "stall_vs_sync_save %.4f; persist_vs_raw_write %.3f, restore_vs_torch_load %.3f\n",
                mib, a, b, ab, bb, c, d);
    char buf[768];
    std::snprintf(buf, sizeof(buf),
                  "%s\"%zu_MiB\":{\"overlapped_stall_s\":%.4f,\"blocking_stall_s\":%.4f,\"memcpy_s\":%.4f,"
                  "\"sync_save_s\":%.4f,\"persist_s\":%.4f,\"raw_write_s\":%.4f,\"restore_s\":%.4f,"
                  "\"torch_load_s\":%.4f,\"compute_s\":%.4f,\"overlapped_interference_s\":%.4f}",
                  sizes_json.empty() ? "" : ",", mib, f.overlapped_stall_s, f.stall_s, f.memcpy_s, f.sync_save_s,
                  f.persist_s, f.raw_write_s, f.restore_s, f.torch_load_s, f.compute_s, f.interference_s);
    sizes_json += buf;
  }
  std::printf("{\"bench\":\"checkpoint\",\"snapshot\":\"overlapped\",\"stall_vs_memcpy\":%.3f,"
              "\"stall_vs_sync_save\":%.4f,\"persist_vs_raw_write\":%.3f,\"restore_vs_torch_load\":%.3f,"
              "\"blocking_stall_vs_memcpy\":%.3f,\"blocking_stall_vs_sync_save\":%.4f,\"step_s\":%.2f,"
              "\"tensors\":16,\"rounds\":%d,\"cold_reads\":%s,\"sizes\":{%s}}\n",
              worst_memcpy, worst_sync, worst_persist, worst_restore, worst_blocking_memcpy, worst_blocking_sync,
              step_s, rounds, canDropCaches() ? "true" : "false", sizes_json.c_str());
  return 0;
}
