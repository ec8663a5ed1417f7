// The only translation unit of the library that includes torch headers (~25 s to compile).
#include "trainsup/torch_state.h"

#include "base/worker_threads.h"

#include <ATen/CPUGeneratorImpl.h>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <mutex>
#include <sstream>
#include <thread>

namespace trainsup {

Result<DType> dtypeOf(c10::ScalarType t) {
  switch (t) {
    case c10::kBool: return DType::kBool;
    case c10::kByte: return DType::kUInt8;
    case c10::kChar: return DType::kInt8;
    case c10::kShort: return DType::kInt16;
    case c10::kInt: return DType::kInt32;
    case c10::kLong: return DType::kInt64;
    case c10::kHalf: return DType::kFloat16;
    case c10::kBFloat16: return DType::kBFloat16;
    case c10::kFloat: return DType::kFloat32;
    case c10::kDouble: return DType::kFloat64;
    default: return Status::invalidArgument(std::string("tensor dtype ") + c10::toString(t) + " cannot be checkpointed");
  }
}

void TorchState::addModule(std::string prefix, torch::nn::Module& module) { modules_.emplace_back(std::move(prefix), &module); }
void TorchState::addOptimizer(std::string name, torch::optim::Optimizer& o) { optimizers_.emplace_back(std::move(name), &o); }
void TorchState::addTensor(std::string name, torch::Tensor t) { tensors_.emplace_back(std::move(name), std::move(t)); }
void TorchState::addCpuRngState(std::string name) { rng_name_ = std::move(name); }

std::vector<std::pair<std::string, torch::Tensor>> TorchState::namedTensors() const {
  std::vector<std::pair<std::string, torch::Tensor>> out;
  for (const auto& [prefix, m] : modules_) {
    for (const auto& p : m->named_parameters(/*recurse=*/true)) out.emplace_back(prefix + "." + p.key(), p.value());
    for (const auto& b : m->named_buffers(/*recurse=*/true)) out.emplace_back(prefix + "." + b.key(), b.value());
  }
  for (const auto& [name, t] : tensors_) out.emplace_back(name, t);
  return out;
}

Checkpointer::Collect TorchState::collector() {
  return [this](std::vector<BufferRef>& b, std::map<std::string, std::string>& m) { return collect(b, m); };
}

Checkpointer::Load TorchState::loader() {
  return [this](const Manifest& manifest, const ShardReader& shard) { return load(manifest, shard); };
}

Status TorchState::collect(std::vector<BufferRef>& buffers, std::map<std::string, std::string>& metadata) {
  hold_.clear();
  blobs_.clear();
  for (auto& [name, tensor] : namedTensors()) {
    auto dt = dtypeOf(tensor.scalar_type());
    if (!dt) return Status::invalidArgument("'" + name + "': " + dt.status().message());
    torch::Tensor t = tensor.detach();
    if (!t.is_contiguous()) {
      t = t.contiguous();
      hold_.push_back(t);
    }
    if (!t.device().is_cpu() && !t.device().is_cuda()) {
      t = t.to(torch::kCPU);
      hold_.push_back(t);
    }
    BufferRef r;
    r.meta.name = name;
    r.meta.dtype = *dt;
    r.meta.shape.assign(t.sizes().begin(), t.sizes().end());
    r.data = t.data_ptr();
    r.nbytes = t.nbytes();
    r.device = t.device().is_cuda() ? t.device().index() : -1;
    buffers.push_back(std::move(r));
  }
  // The copy to staging memory is a plain cudaMemcpy on the default stream: make sure every
  // kernel that writes these tensors, on any stream, has finished.
  std::vector<int> devices;
  for (const auto& b : buffers) {
    if (b.device >= 0 && std::find(devices.begin(), devices.end(), b.device) == devices.end()) devices.push_back(b.device);
  }
  for (int d : devices) torch::cuda::synchronize(d);
  if (!rng_name_.empty()) {
    auto gen = at::detail::getDefaultCPUGenerator();
    torch::Tensor st;
    {
      std::lock_guard<std::mutex> lock(gen.mutex());
      st = gen.get_state();
    }
    hold_.push_back(st);
    buffers.push_back({{rng_name_, DType::kBytes, {st.numel()}}, st.data_ptr(), static_cast<size_t>(st.nbytes())});
  }
  blobs_.reserve(optimizers_.size());
  for (const auto& [name, opt] : optimizers_) {
    torch::serialize::OutputArchive archive;
    opt->save(archive);
    std::ostringstream os;
    archive.save_to(os);
    blobs_.push_back(os.str());
    const std::string& blob = blobs_.back();
    buffers.push_back({{name, DType::kBytes, {static_cast<int64_t>(blob.size())}}, blob.data(), blob.size()});
  }
  for (const auto& [k, v] : metadata_) metadata[k] = v;
  return Status::ok();
}

Status TorchState::load(const Manifest& manifest, const ShardReader& shard) {
  torch::NoGradGuard no_grad;
  // Check every tensor first, then read them in parallel: reads and checksums overlap.
  struct Read {
    const TensorEntry* entry;
    torch::Tensor target;
  };
  std::vector<Read> reads;
  for (auto& [name, tensor] : namedTensors()) {
    const TensorEntry* e = shard.find(name);
    if (e == nullptr) return Status::invalidArgument("tensor '" + name + "' is not in the checkpoint (model changed?)");
    auto dt = dtypeOf(tensor.scalar_type());
    std::vector<int64_t> shape(tensor.sizes().begin(), tensor.sizes().end());
    if (!dt || *dt != e->meta.dtype || shape != e->meta.shape) {
      return Status::invalidArgument("tensor '" + name + "' has another dtype or shape in the checkpoint (" +
                                     dtypeName(e->meta.dtype) + ")");
    }
    reads.push_back({e, tensor.detach()});
  }
  std::atomic<size_t> next{0};
  std::mutex mu;
  Status first_error;
  auto work = [&] {
    for (size_t i = next.fetch_add(1); i < reads.size(); i = next.fetch_add(1)) {
      torch::Tensor& t = reads[i].target;
      Status s;
      if (t.device().is_cpu() && t.is_contiguous()) {
        s = shard.read(*reads[i].entry, t.data_ptr(), t.nbytes());
      } else {
        torch::Tensor cpu = torch::empty(t.sizes(), t.options().device(torch::kCPU));
        s = shard.read(*reads[i].entry, cpu.data_ptr(), cpu.nbytes());
        if (s.isOk()) t.copy_(cpu);
      }
      if (!s.isOk()) {
        std::lock_guard<std::mutex> lock(mu);
        if (first_error.isOk()) first_error = s;
      }
    }
  };
  unsigned threads = std::min<unsigned>({4u, std::max(1u, std::thread::hardware_concurrency()),
                                         static_cast<unsigned>(std::max<size_t>(reads.size(), 1))});
  // A torch error while reading (an allocation, a device copy) ends that tensor's load with a
  // status, on whichever thread it happened; every helper is joined on every path.
  if (Status s = runOnThreads(threads, work, "loading the checkpoint's tensors"); !s.isOk()) return s;
  if (!first_error.isOk()) return first_error;
  if (!rng_name_.empty()) {
    const TensorEntry* e = shard.find(rng_name_);
    if (e == nullptr) return Status::invalidArgument("RNG state '" + rng_name_ + "' is not in the checkpoint");
    torch::Tensor st = torch::empty({static_cast<int64_t>(e->length)}, torch::kUInt8);
    if (Status s = shard.read(*e, st.data_ptr(), st.nbytes()); !s.isOk()) return s;
    auto gen = at::detail::getDefaultCPUGenerator();
    try {
      std::lock_guard<std::mutex> lock(gen.mutex());
      gen.set_state(st);
    } catch (const c10::Error& err) {
      return Status::invalidArgument("RNG state '" + rng_name_ + "': " + err.what_without_backtrace());
    }
  }
  for (const auto& [name, opt] : optimizers_) {
    const TensorEntry* e = shard.find(name);
    if (e == nullptr) return Status::invalidArgument("optimizer '" + name + "' is not in the checkpoint");
    std::string blob(e->length, '\0');
    if (Status s = shard.read(*e, blob.data(), blob.size()); !s.isOk()) return s;
    try {
      torch::serialize::InputArchive archive;
      std::istringstream is(blob);
      archive.load_from(is);
      opt->load(archive);
    } catch (const c10::Error& err) {
      return Status::invalidArgument("optimizer '" + name + "' does not match the checkpoint: " + err.what_without_backtrace());
    }
  }
  restored_metadata_ = manifest.metadata;
  return Status::ok();
}

namespace {

class StoreChannel final : public CommitChannel {
 public:
  explicit StoreChannel(c10::intrusive_ptr<c10d::Store> store) : store_(std::move(store)) {}
  Status set(const std::string& key, const std::string& value) override {
    return guard("set", key, [&] { store_->set(key, std::vector<uint8_t>(value.begin(), value.end())); });
  }
  // Polls with check() instead of a blocking wait(): a TCPStore client holds its connection's
  // lock for the whole of a wait(), so the writer thread waiting for a commit would block the
  // training thread's decision reads (and, across ranks, deadlock). A check is one short round
  // trip; the pauses between checks grow from 1 ms to 50 ms.
  Result<std::string> get(const std::string& key, Nanos timeout) override {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    auto pause = std::chrono::milliseconds(1);
    for (;;) {
      bool present = false;
      Status s = guard("check", key, [&] { present = store_->check({key}); });
      if (!s.isOk()) return s;
      if (present) {
        std::string out;
        s = guard("get", key, [&] {
          auto v = store_->get(key);
          out.assign(v.begin(), v.end());
        });
        if (!s.isOk()) return s;
        return out;
      }
      auto now = std::chrono::steady_clock::now();
      if (now >= deadline) {
        return Status::timedOut("c10d store: key '" + key + "' did not appear within " +
                                std::to_string(toSeconds(timeout)) + " s");
      }
      std::this_thread::sleep_for(std::min<std::chrono::steady_clock::duration>(pause, deadline - now));
      pause = std::min(pause * 2, std::chrono::milliseconds(50));
    }
  }
  Result<int64_t> add(const std::string& key, int64_t delta) override {
    int64_t v = 0;
    Status s = guard("add", key, [&] { v = store_->add(key, delta); });
    if (!s.isOk()) return s;
    return v;
  }
  Status remove(const std::string& key) override {
    // Some stores (FileStore) cannot delete; leftovers only cost a few bytes.
    guard("delete", key, [&] { store_->deleteKey(key); });
    return Status::ok();
  }

 private:
  template <class F>
  Status guard(const char* op, const std::string& key, F&& f) {
    try {
      f();
      return Status::ok();
    } catch (const std::exception& e) {
      std::string what = e.what();
      std::string msg = std::string("c10d store ") + op + " '" + key + "': " + what.substr(0, what.find('\n'));
      bool timeout = what.find("imeout") != std::string::npos || what.find("imed out") != std::string::npos;
      return timeout ? Status::timedOut(msg) : Status::unavailable(msg);
    }
  }
  c10::intrusive_ptr<c10d::Store> store_;
};

}  // namespace

std::shared_ptr<CommitChannel> storeChannel(c10::intrusive_ptr<c10d::Store> store) {
  if (!store) return nullptr;
  return std::make_shared<StoreChannel>(std::move(store));
}

}  // namespace trainsup
