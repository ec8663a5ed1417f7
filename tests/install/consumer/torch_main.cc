// The libtorch side of an installed trainsup: a module's state through TorchState, and the
// tracking wrapper put in front of a process group's backend (a minimal one: the torch wheel
// ships no gloo headers).
#include <torch/csrc/distributed/c10d/HashStore.hpp>
#include <torch/torch.h>

#include <iostream>

#include "trainsup/torch_state.h"
#include "trainsup/tracking_backend.h"

namespace {
class DoneWork : public c10d::Work {
 public:
  DoneWork() { finish(); }
};
class LocalBackend : public c10d::Backend {
 public:
  LocalBackend() : c10d::Backend(0, 1) {}
  const std::string getBackendName() const override { return "local"; }
  c10::intrusive_ptr<c10d::Work> allreduce(std::vector<at::Tensor>&, const c10d::AllreduceOptions&) override {
    return c10::make_intrusive<DoneWork>();
  }
};
}  // namespace

int main() {
  torch::nn::Linear model(4, 4);
  trainsup::TorchState state;
  state.addModule("model", *model);

  auto pg = c10::make_intrusive<c10d::ProcessGroup>(c10::make_intrusive<c10d::HashStore>(), 0, 1);
  pg->setBackend(c10::DeviceType::CPU, c10d::ProcessGroup::BackendType::CUSTOM, c10::make_intrusive<LocalBackend>());
  if (trainsup::trackProcessGroup(*pg) != 1) return 1;
  std::vector<at::Tensor> t{torch::ones({4})};
  pg->allreduce(t)->wait();
  auto issued = trainsup::CollectiveTracker::global().stats().issued;
  std::cout << "consumer_torch: tracked " << issued << " collective(s)\n";
  return issued == 1 ? 0 : 1;
}
