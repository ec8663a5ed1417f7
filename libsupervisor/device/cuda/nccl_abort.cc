// ncclCommAbort through the NCCL found at run time (trainsup/nccl.h). nccl.h is included only
// to check the signatures we look up.
#include <dlfcn.h>
#include <nccl.h>

#include <mutex>
#include <string>

#include "trainsup/nccl.h"

namespace trainsup {
namespace {

struct Nccl {
  decltype(&ncclCommAbort) comm_abort = nullptr;
  decltype(&ncclGetErrorString) error_string = nullptr;
  Status status = Status::unavailable("NCCL not loaded");
};

Nccl& nccl() {
  static Nccl n;
  static std::once_flag once;
  std::call_once(once, [] {
    void* h = nullptr;
    std::string tried;
    // The NCCL already in the process (PyTorch's) first: never a second copy.
    for (const char* name : {"libnccl.so.2", "libnccl.so"}) {
      if ((h = dlopen(name, RTLD_NOW | RTLD_NOLOAD)) != nullptr) break;
    }
    for (const char* name : {"libnccl.so.2", TRAINSUP_NCCL_LIBRARY_HINT}) {
      if (h != nullptr) break;
      h = dlopen(name, RTLD_NOW | RTLD_LOCAL);
      if (h == nullptr) tried += std::string(tried.empty() ? "" : "; ") + dlerror();
    }
    if (h == nullptr) {
      n.status = Status::unavailable("NCCL not found: " + tried);
      return;
    }
    n.comm_abort = reinterpret_cast<decltype(&ncclCommAbort)>(dlsym(h, "ncclCommAbort"));
    n.error_string = reinterpret_cast<decltype(&ncclGetErrorString)>(dlsym(h, "ncclGetErrorString"));
    n.status = n.comm_abort != nullptr ? Status::ok() : Status::unavailable("libnccl has no ncclCommAbort");
  });
  return n;
}

}  // namespace

Status loadNccl() { return nccl().status; }

Status abortNcclCommunicator(void* comm) {
  Nccl& n = nccl();
  if (!n.status.isOk()) return n.status;
  ncclResult_t r = n.comm_abort(static_cast<ncclComm_t>(comm));
  if (r == ncclSuccess) return Status::ok();
  std::string why = n.error_string != nullptr ? n.error_string(r) : "error " + std::to_string(static_cast<int>(r));
  return Status::ioError("ncclCommAbort: " + why);
}

}  // namespace trainsup
