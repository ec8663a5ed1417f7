// The process-wide list of NCCL communicators to abort (trainsup/nccl.h). The call into NCCL
// itself lives in device/cuda/nccl_abort.cc (abortNcclCommunicator, loadNccl), or is reported as
// unavailable in builds without NCCL.
#include <algorithm>
#include <mutex>
#include <vector>

#include "trainsup/nccl.h"

namespace trainsup {
namespace {
std::mutex& registryMutex() {
  static std::mutex mu;
  return mu;
}
std::vector<void*>& registry() {
  static std::vector<void*> comms;
  return comms;
}
}  // namespace

void registerNcclCommunicator(void* comm) {
  if (comm == nullptr) return;
  std::lock_guard<std::mutex> lock(registryMutex());
  auto& r = registry();
  if (std::find(r.begin(), r.end(), comm) == r.end()) r.push_back(comm);
}

void unregisterNcclCommunicator(void* comm) {
  std::lock_guard<std::mutex> lock(registryMutex());
  auto& r = registry();
  r.erase(std::remove(r.begin(), r.end(), comm), r.end());
}

int registeredNcclCommunicators() {
  std::lock_guard<std::mutex> lock(registryMutex());
  return static_cast<int>(registry().size());
}

NcclAbortResult abortNcclCommunicators() {
  std::vector<void*> comms;
  {
    std::lock_guard<std::mutex> lock(registryMutex());
    comms.swap(registry());
  }
  NcclAbortResult result;
  for (void* c : comms) {
    Status s = abortNcclCommunicator(c);
    if (s.isOk()) {
      ++result.aborted;
    } else {
      ++result.failed;
      if (result.first_error.isOk()) result.first_error = s;
    }
  }
  return result;
}

}  // namespace trainsup
