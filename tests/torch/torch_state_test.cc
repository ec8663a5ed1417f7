// The libtorch adapter: modules, optimizers, tensors and the CPU RNG state go through a real
// checkpoint and come back bitwise; a model that does not match stops the restore.
#include <gtest/gtest.h>
#include <torch/nn/modules/batchnorm.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/adam.h>
#include <torch/utils.h>
#include <unistd.h>

#include <filesystem>

#include "trainsup/torch_state.h"

namespace trainsup {
namespace {

std::string freshDir(const std::string& tag) {
  auto dir = std::filesystem::temp_directory_path() / ("trainsup_torch_" + std::to_string(getpid()) + "_" + tag);
  std::filesystem::remove_all(dir);
  return dir.string();
}

std::unique_ptr<Checkpointer> makeCheckpointer(const std::string& dir) {
  CheckpointOptions o;
  o.dir = dir;
  o.interval_s = 0;
  Identity id;
  id.host = "t";
  auto c = Checkpointer::create(o, id, FileSystem::posix(), Clock::real(), nullptr, {});
  if (!c) throw std::runtime_error(c.status().toString());
  return std::move(c.value());
}

struct Net : torch::nn::Module {
  Net() : fc(register_module("fc", torch::nn::Linear(8, 4))), bn(register_module("bn", torch::nn::BatchNorm1d(4))) {}
  torch::Tensor forward(torch::Tensor x) { return bn(fc(x)); }
  torch::nn::Linear fc;
  torch::nn::BatchNorm1d bn;
};

void trainSteps(Net& net, torch::optim::Optimizer& opt, int n) {
  for (int i = 0; i < n; ++i) {
    opt.zero_grad();
    auto loss = net.forward(torch::randn({16, 8})).pow(2).mean();
    loss.backward();
    opt.step();
  }
}

TEST(TorchStateTest, ModuleOptimizerTensorAndRngRoundTripBitwise) {
  torch::manual_seed(3);
  Net net;
  torch::optim::Adam opt(net.parameters(), torch::optim::AdamOptions(1e-2));
  torch::Tensor extra = torch::arange(10, torch::kLong);
  TorchState state;
  state.addModule("net", net);
  state.addOptimizer("opt", opt);
  state.addTensor("extra", extra);
  state.addCpuRngState();
  state.metadata()["epoch"] = "7";
  trainSteps(net, opt, 5);
  auto ckpt = makeCheckpointer(freshDir("roundtrip"));
  ASSERT_EQ(*ckpt->save(5, state.collector()), Checkpointer::Outcome::kStarted);
  ASSERT_TRUE(ckpt->waitIdle(std::chrono::seconds(30)).isOk());
  // What the run would do next, from the saved state.
  std::vector<torch::Tensor> saved;
  for (auto& [name, t] : state.namedTensors()) saved.push_back(t.clone());
  torch::NoGradGuard no_grad;
  torch::Tensor next_random = torch::randn({4});
  {
    torch::AutoGradMode enable(true);
    trainSteps(net, opt, 3);  // moves parameters, optimizer moments and the RNG on
  }
  extra.fill_(-1);
  auto restored = ckpt->restore(state.loader());
  ASSERT_TRUE(restored.isOk()) << restored.status().toString();
  ASSERT_EQ(*restored, std::optional<int64_t>(5));
  size_t i = 0;
  for (auto& [name, t] : state.namedTensors()) EXPECT_TRUE(torch::equal(t, saved[i++])) << name;
  EXPECT_TRUE(torch::equal(torch::randn({4}), next_random)) << "RNG state not restored";
  EXPECT_EQ(state.restoredMetadata().at("epoch"), "7");
  // Optimizer moments too: training on from here repeats the first continuation exactly.
  {
    torch::AutoGradMode enable(true);
    torch::manual_seed(99);
    trainSteps(net, opt, 2);
  }
  auto after_a = net.fc->weight.clone();
  ASSERT_TRUE(ckpt->restore(state.loader()).isOk());
  {
    torch::AutoGradMode enable(true);
    torch::manual_seed(99);
    trainSteps(net, opt, 2);
  }
  EXPECT_TRUE(torch::equal(net.fc->weight, after_a));
}

TEST(TorchStateTest, AModelThatDoesNotMatchStopsTheRestore) {
  torch::manual_seed(1);
  Net net;
  TorchState state;
  state.addModule("net", net);
  std::string dir = freshDir("mismatch");
  auto ckpt = makeCheckpointer(dir);
  ASSERT_EQ(*ckpt->save(1, state.collector()), Checkpointer::Outcome::kStarted);
  ASSERT_TRUE(ckpt->waitIdle(std::chrono::seconds(30)).isOk());
  torch::nn::Linear other(8, 5);  // another shape under the same name
  TorchState changed;
  changed.addModule("net.fc", *other);
  auto r = ckpt->restore(changed.loader());
  ASSERT_FALSE(r.isOk());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("net.fc.weight"), std::string::npos) << r.status().message();
}

}  // namespace
}  // namespace trainsup
