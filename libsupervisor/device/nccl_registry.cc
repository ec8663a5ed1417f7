// The process-wide list of NCCL communicators to abort (trainsup/nccl.h). The call into NCCL
// itself lives in device/cuda/nccl_abort.cc (abortNcclCommunicator, loadNccl), or is reported as
// unavailable in builds without NCCL.
#include <algorithm>
#include <vector>

#include "trainsup/mutex.h"
#include "trainsup/nccl.h"

namespace trainsup {
namespace {
Mutex& registryMutex() {
  static Mutex mu;
  return mu;
}
std::vector<void*>& registry() TRAINSUP_REQUIRES(registryMutex()) {
  static std::vector<void*> comms;
  return comms;
}
}  // namespace

void registerNcclCommunicator(void* comm) {
  if (comm == nullptr) return;
  MutexLock lock(registryMutex());
  auto& r = registry();
  if (std::find(r.begin(), r.end(), comm) == r.end()) r.push_back(comm);
}

void unregisterNcclCommunicator(void* comm) {
  MutexLock lock(registryMutex());
  auto& r = registry();
  r.erase(std::remove(r.begin(), r.end(), comm), r.end());
}

int registeredNcclCommunicators() {
  MutexLock lock(registryMutex());
  return static_cast<int>(registry().size());
}

NcclAbortResult abortNcclCommunicators() {
  std::vector<void*> comms;
  {
    MutexLock lock(registryMutex());
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
