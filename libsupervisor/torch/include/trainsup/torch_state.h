// trainsup/torch_state.h — libtorch adapters: what to checkpoint, and the job's c10d store as
// the commit channel. Part of trainsup::torch (built with TRAINSUP_WITH_TORCH).
//
// Usage:
//   trainsup::TorchState state;
//   state.addModule("model", model);          // parameters and buffers, by their names
//   state.addOptimizer("optim", optimizer);   // any torch::optim optimizer
//   state.addTensor("rng", rng_state);        // any tensor, restored in place
//   state.metadata()["data.position"] = "1234";
//   auto* ckpt = *sup.checkpointer(trainsup::storeChannel(store));  // store: null for one rank
//   auto step = sup.restore(state.loader());      // newest valid checkpoint, or nullopt
//   ... sup.maybeCheckpoint(step, state.collector());
//
// Contract: collector() hands the checkpointer pointers to contiguous tensors as they are
// (no copy here: the checkpointer copies them into staging memory during the stall, GPU
// tensors with one device-to-host copy into pinned memory); non-contiguous ones are first made
// contiguous. Optimizer state is stored as one blob in
// torch's own serialization (OutputArchive), restored exactly. loader() writes into the
// registered tensors in place under NoGradGuard, checking every checksum; a tensor missing
// from the checkpoint, or with another dtype or shape, is InvalidArgument (the model does not
// match: restore stops instead of silently using an older checkpoint). restoredMetadata() holds
// the manifest's metadata after a restore. Not thread-safe: use from the training thread.
// This header includes only the torch headers its declarations need (module, optimizer,
// serialization, tensors), not <torch/torch.h>, which costs every includer ~10 s more to
// compile: include that yourself where you use the rest of torch.
#pragma once

#include <torch/cuda.h>
#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>
#include <torch/serialize/archive.h>
#include <torch/types.h>

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "trainsup/checkpointer.h"
#include "trainsup/commit_channel.h"

namespace c10d {
class Store;
}

namespace trainsup {

// The checkpoint dtype of a torch scalar type; InvalidArgument for complex/quantized types.
TRAINSUP_EXPORT Result<DType> dtypeOf(c10::ScalarType type);

class TRAINSUP_EXPORT TorchState {
 public:
  void addModule(std::string prefix, torch::nn::Module& module);
  void addOptimizer(std::string name, torch::optim::Optimizer& optimizer);
  void addTensor(std::string name, torch::Tensor tensor);
  // The default CPU generator's state (torch::manual_seed / randn), saved and set back on restore.
  void addCpuRngState(std::string name = "torch.rng.cpu");
  std::map<std::string, std::string>& metadata() { return metadata_; }
  const std::map<std::string, std::string>& restoredMetadata() const { return restored_metadata_; }

  Checkpointer::Collect collector();
  Checkpointer::Load loader();

  // All tensors this state saves, by checkpoint name (for tests and tools).
  std::vector<std::pair<std::string, torch::Tensor>> namedTensors() const;

 private:
  Status collect(std::vector<BufferRef>& buffers, std::map<std::string, std::string>& metadata);
  Status load(const Manifest& manifest, const ShardReader& shard);

  std::vector<std::pair<std::string, torch::nn::Module*>> modules_;
  std::vector<std::pair<std::string, torch::optim::Optimizer*>> optimizers_;
  std::vector<std::pair<std::string, torch::Tensor>> tensors_;
  std::string rng_name_;  // empty: the RNG state is not saved
  std::map<std::string, std::string> metadata_;
  std::map<std::string, std::string> restored_metadata_;
  // Kept alive while the checkpointer copies them.
  std::vector<torch::Tensor> hold_;
  std::vector<std::string> blobs_;
};

// The job's c10d store (TCPStore, FileStore, HashStore) as a CommitChannel. Store errors
// (a dead store, a timeout) become Unavailable / TimedOut statuses. Null store: null channel.
TRAINSUP_EXPORT std::shared_ptr<CommitChannel> storeChannel(c10::intrusive_ptr<c10d::Store> store);

}  // namespace trainsup
