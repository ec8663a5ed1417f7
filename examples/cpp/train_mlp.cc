// A small supervised C++ trainer: an MLP regressing a fixed random linear map on synthetic
// data, with trainsup's watchdog timing every step.
//
//   trainsup_example_train --steps 200 --stall-at-step 50 --stall-kind sleep
//
// Fault injection (for the demo and the tests): --stall-at-step N (or TRAINSUP_INJECT_STALL_AT_STEP)
// makes step N block forever — sleeping (--stall-kind sleep), spinning on the CPU (spin), or
// waiting on a lock that is never released (deadlock) — so the watchdog must catch it.
#include <torch/torch.h>

#include <CLI/CLI.hpp>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <iostream>
#include <mutex>
#include <thread>

#include "trainsup/supervisor.h"

namespace {

struct Mlp : torch::nn::Module {
  Mlp(int in, int hidden, int out)
      : fc1(register_module("fc1", torch::nn::Linear(in, hidden))),
        fc2(register_module("fc2", torch::nn::Linear(hidden, hidden))),
        fc3(register_module("fc3", torch::nn::Linear(hidden, out))) {}
  torch::Tensor forward(torch::Tensor x) {
    return fc3(torch::relu(fc2(torch::relu(fc1(x)))));
  }
  torch::nn::Linear fc1, fc2, fc3;
};

}  // namespace

// Never return. External linkage (and -rdynamic) so that the stack dump names them.
namespace example {
[[noreturn]] __attribute__((noinline)) void injectedStallSleep() {
  for (;;) std::this_thread::sleep_for(std::chrono::hours(1));
}
[[noreturn]] __attribute__((noinline)) void injectedStallSpin() {
  std::atomic<uint64_t> spins{0};
  for (;;) spins.fetch_add(1, std::memory_order_relaxed);
}
[[noreturn]] __attribute__((noinline)) void injectedStallDeadlock() {
  std::mutex mu;
  std::condition_variable cv;
  std::unique_lock<std::mutex> lock(mu);
  for (;;) cv.wait(lock);  // nobody notifies
}
}  // namespace example

int main(int argc, char** argv) {
  CLI::App app{"trainsup example trainer: a supervised MLP on synthetic data"};
  int64_t steps = 200;
  int64_t stall_at = -1;
  std::string stall_kind = "sleep";
  int batch = 256;
  int hidden = 256;
  double step_sleep_ms = 0;
  if (const char* v = std::getenv("TRAINSUP_INJECT_STALL_AT_STEP")) stall_at = std::atoll(v);
  app.add_option("--steps", steps, "number of training steps")->check(CLI::PositiveNumber);
  app.add_option("--stall-at-step", stall_at, "block forever inside this step (default: TRAINSUP_INJECT_STALL_AT_STEP)");
  app.add_option("--stall-kind", stall_kind, "how the injected stall blocks")->check(CLI::IsMember({"sleep", "spin", "deadlock"}));
  app.add_option("--batch", batch, "batch size")->check(CLI::PositiveNumber);
  app.add_option("--hidden", hidden, "hidden width")->check(CLI::PositiveNumber);
  app.add_option("--step-sleep-ms", step_sleep_ms, "extra time per step, to mimic a bigger model")->check(CLI::NonNegativeNumber);
  CLI11_PARSE(app, argc, argv);

  auto config = trainsup::Config::fromEnvironment();
  if (!config) {
    std::cerr << "trainsup_example_train: bad configuration: " << config.status().message() << "\n";
    return trainsup::kExitBadConfig;
  }
  auto created = trainsup::Supervisor::create(*config);
  if (!created) {
    std::cerr << "trainsup_example_train: cannot start the supervisor: " << created.status().message() << "\n";
    return trainsup::kExitBadConfig;
  }
  trainsup::Supervisor& sup = **created;

  torch::manual_seed(1234 + sup.identity().rank);
  torch::set_num_threads(1);
  const int in = 64;
  Mlp model(in, hidden, 1);
  torch::optim::SGD optimizer(model.parameters(), torch::optim::SGDOptions(0.01).momentum(0.9));
  torch::Tensor true_w;
  {
    auto scope = sup.section("setup");
    true_w = torch::randn({in, 1});
  }
  sup.log(trainsup::LogLevel::kInfo,
          "example trainer: " + std::to_string(steps) + " steps, batch " + std::to_string(batch) +
              (stall_at >= 0 ? ", stall injected at step " + std::to_string(stall_at) + " (" + stall_kind + ")" : ""));

  int64_t step = 0;
  for (; step < steps && !sup.stopRequested(); ++step) {
    auto scope = sup.step(step);
    torch::Tensor x = torch::randn({batch, in});
    torch::Tensor y = x.matmul(true_w) + 0.01 * torch::randn({batch, 1});
    optimizer.zero_grad();
    torch::Tensor loss = torch::mse_loss(model.forward(x), y);
    loss.backward();
    optimizer.step();
    if (step_sleep_ms > 0) std::this_thread::sleep_for(std::chrono::duration<double, std::milli>(step_sleep_ms));
    if (step == stall_at) {
      sup.log(trainsup::LogLevel::kWarn, "injecting a stall (" + stall_kind + ") in step " + std::to_string(step));
      sup.event("fault_injected", {{"kind", "stall_" + stall_kind}, {"step", step}});
      if (stall_kind == "spin") example::injectedStallSpin();
      if (stall_kind == "deadlock") example::injectedStallDeadlock();
      example::injectedStallSleep();
    }
    if (step % 50 == 0 || step + 1 == steps) {
      sup.log(trainsup::LogLevel::kInfo, "step " + std::to_string(step) + " loss " + std::to_string(loss.item<float>()));
    }
  }
  if (sup.stopRequested()) {
    sup.log(trainsup::LogLevel::kWarn, "stop requested: leaving the loop after step " + std::to_string(step - 1));
    sup.event("exit", {{"code", trainsup::kExitStopRequested}, {"reason", "stop_requested"}});
    sup.close();
    return trainsup::kExitStopRequested;
  }
  sup.close();
  return 0;
}
