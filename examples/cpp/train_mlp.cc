// A small supervised C++ trainer: an MLP regressing a fixed random linear map on synthetic
// data, with trainsup's watchdog timing every step and asynchronous checkpoints it resumes from.
//
//   trainsup_example_train --steps 200 --checkpoint-every 20 --stall-at-step 50
//
// Data is a pure function of (seed, step), so a run that crashes and resumes from a checkpoint
// ends with parameters bitwise equal to an uninterrupted run; the last line prints their hash.
// After SIGTERM the loop checkpoints at the next step boundary and exits with code 90.
//
// Fault injection (for the demo and the tests): --stall-at-step N (or TRAINSUP_INJECT_STALL_AT_STEP)
// makes step N block forever — sleeping (--stall-kind sleep), spinning on the CPU (spin), or
// waiting on a lock that is never released (deadlock) — so the watchdog must catch it.
#include <torch/nn/modules/linear.h>
#include <torch/optim/sgd.h>
#include <torch/utils.h>

#include <CLI/CLI.hpp>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <iostream>
#include <mutex>
#include <csignal>
#include <cstdio>
#include <thread>

#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#include <xxhash.h>

#include "trainsup/supervisor.h"
#include "trainsup/torch_state.h"

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
  int64_t checkpoint_every = -1;
  int64_t crash_at = -1;
  std::string checkpoint_dir;
  if (const char* v = std::getenv("TRAINSUP_INJECT_STALL_AT_STEP")) stall_at = std::atoll(v);
  app.add_option("--steps", steps, "number of training steps")->check(CLI::PositiveNumber);
  app.add_option("--stall-at-step", stall_at, "block forever inside this step (default: TRAINSUP_INJECT_STALL_AT_STEP)");
  app.add_option("--stall-kind", stall_kind, "how the injected stall blocks")->check(CLI::IsMember({"sleep", "spin", "deadlock"}));
  app.add_option("--batch", batch, "batch size")->check(CLI::PositiveNumber);
  app.add_option("--hidden", hidden, "hidden width")->check(CLI::PositiveNumber);
  app.add_option("--step-sleep-ms", step_sleep_ms, "extra time per step, to mimic a bigger model")->check(CLI::NonNegativeNumber);
  app.add_option("--checkpoint-every", checkpoint_every, "checkpoint every N steps (default: TRAINSUP_CHECKPOINT_EVERY_STEPS / _INTERVAL_S)");
  app.add_option("--checkpoint-dir", checkpoint_dir, "checkpoint directory (default: TRAINSUP_CHECKPOINT_DIR)");
  app.add_option("--crash-at-step", crash_at, "fault injection: kill -9 this process at the end of step N");
  CLI11_PARSE(app, argc, argv);

  auto config = trainsup::Config::fromEnvironment();
  if (!config) {
    std::cerr << "trainsup_example_train: bad configuration: " << config.status().message() << "\n";
    return trainsup::kExitBadConfig;
  }
  if (checkpoint_every >= 0) config->checkpoint.every_steps = checkpoint_every;
  if (!checkpoint_dir.empty()) config->checkpoint.dir = checkpoint_dir;
  auto created = trainsup::Supervisor::create(*config);
  if (!created) {
    std::cerr << "trainsup_example_train: cannot start the supervisor: " << created.status().message() << "\n";
    return trainsup::kExitBadConfig;
  }
  trainsup::Supervisor& sup = **created;

  const int64_t seed = 1234 + sup.identity().rank;
  torch::manual_seed(seed);
  torch::set_num_threads(1);
  const int in = 64;
  Mlp model(in, hidden, 1);
  torch::optim::SGD optimizer(model.parameters(), torch::optim::SGDOptions(0.01).momentum(0.9));
  torch::Tensor true_w;
  trainsup::TorchState state;
  int64_t first_step = 0;
  bool checkpoints = false;
  {
    auto scope = sup.section("setup");
    true_w = torch::randn({in, 1});
    state.addModule("model", model);
    state.addOptimizer("optim", optimizer);
    state.addCpuRngState();
    // Ranks agree on checkpoint commits through the job's c10d store: torchrun's agent store
    // (TORCHELASTIC_USE_AGENT_STORE) or one served by rank 0 at MASTER_ADDR:MASTER_PORT.
    std::shared_ptr<trainsup::CommitChannel> channel;
    const trainsup::Identity& id = sup.identity();
    if (id.world_size > 1 && !id.master_addr.empty() && id.master_port > 0) {
      c10d::TCPStoreOptions o;
      o.port = static_cast<uint16_t>(id.master_port);
      const char* agent = std::getenv("TORCHELASTIC_USE_AGENT_STORE");
      o.isServer = id.rank == 0 && !(agent != nullptr && std::string(agent) == "True");
      o.numWorkers = id.world_size;
      o.timeout = std::chrono::minutes(5);
      channel = trainsup::storeChannel(c10::make_intrusive<c10d::TCPStore>(id.master_addr, o));
    }
    if (id.world_size == 1 || channel) {
      auto ckpt = sup.checkpointer(channel);
      if (!ckpt) {
        std::cerr << "trainsup_example_train: checkpoints: " << ckpt.status().message() << "\n";
        return trainsup::kExitBadConfig;
      }
      checkpoints = true;
    } else {
      sup.log(trainsup::LogLevel::kWarn, "checkpoints off: world size " + std::to_string(id.world_size) +
                                             " but no MASTER_ADDR/MASTER_PORT store to agree through");
    }
  }
  auto restored = checkpoints ? sup.restore(state.loader()) : trainsup::Result<std::optional<int64_t>>(std::nullopt);
  if (!restored) {
    std::cerr << "trainsup_example_train: restore failed: " << restored.status().message() << "\n";
    return trainsup::kExitBadConfig;
  }
  if (*restored) {
    first_step = **restored + 1;
    sup.log(trainsup::LogLevel::kInfo, "resumed from step " + std::to_string(**restored));
  }
  sup.log(trainsup::LogLevel::kInfo,
          "example trainer: steps " + std::to_string(first_step) + ".." + std::to_string(steps - 1) + ", batch " +
              std::to_string(batch) +
              (stall_at >= 0 ? ", stall injected at step " + std::to_string(stall_at) + " (" + stall_kind + ")" : ""));

  auto checkpointAt = [&](int64_t step, bool now) {
    if (!checkpoints) return;
    state.metadata()["data.next_step"] = std::to_string(step + 1);
    auto r = now ? sup.checkpoint(step, state.collector()) : sup.maybeCheckpoint(step, state.collector());
    if (!r) sup.log(trainsup::LogLevel::kError, "checkpoint at step " + std::to_string(step) + ": " + r.status().message());
  };

  int64_t step = first_step;
  for (; step < steps && !sup.stopRequested(); ++step) {
    {
      auto scope = sup.step(step);
      torch::manual_seed(seed * 1000003 + step);  // the batch is a function of the step
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
    checkpointAt(step, /*now=*/false);
    if (step == crash_at) {
      sup.log(trainsup::LogLevel::kWarn, "injecting a crash (SIGKILL) after step " + std::to_string(step));
      sup.event("fault_injected", {{"kind", "crash"}, {"step", step}});
      raise(SIGKILL);
    }
  }
  // Bitwise fingerprint of the parameters, to compare runs.
  XXH3_state_t* h = XXH3_createState();
  XXH3_64bits_reset(h);
  for (const auto& p : model.parameters()) XXH3_64bits_update(h, p.data_ptr(), p.nbytes());
  char fingerprint[17];
  std::snprintf(fingerprint, sizeof(fingerprint), "%016llx", static_cast<unsigned long long>(XXH3_64bits_digest(h)));
  XXH3_freeState(h);
  if (sup.stopRequested() && step < steps) {
    // Preemption: save where we are, wait until it is durable, and say so with the exit code.
    sup.log(trainsup::LogLevel::kWarn, "stop requested: checkpointing step " + std::to_string(step - 1) +
                                           " and leaving the loop");
    checkpointAt(step - 1, /*now=*/true);
    sup.close();  // waits for the persist
    sup.event("exit", {{"code", trainsup::kExitStopRequested}, {"reason", "stop_requested"}, {"step", step - 1}});
    return trainsup::kExitStopRequested;
  }
  sup.log(trainsup::LogLevel::kInfo, std::string("finished at step ") + std::to_string(step - 1) +
                                         "; parameters xxh3=" + fingerprint);
  std::printf("final parameters xxh3=%s\n", fingerprint);
  sup.close();
  return 0;
}
