// trainsup/nccl.h — aborting the process's NCCL communicators when the job must stop now.
//
// A rank whose peer is gone waits inside an NCCL collective until NCCL's own timeout (10 to 30
// minutes), and a process that exits while NCCL kernels are pending can hang in the driver.
// ncclCommAbort, called from another thread, makes the pending operations fail at once.
//
// Contract: registerNcclCommunicator(comm) adds a communicator (an ncclComm_t, passed as void*
// so that this header needs no nccl.h) to a process-wide list; unregisterNcclCommunicator()
// removes it and must be called before the owner destroys it. abortNcclCommunicators() calls
// ncclCommAbort on each registered communicator (each at most once; it is removed from the list
// first) and reports how many were aborted and the first error. The Supervisor calls it on its
// abort paths (a stall that exits, the coordinator's abort order) before the user's abort
// callbacks. NCCL is found at run time, not linked: the libnccl already loaded in the process
// (the one PyTorch uses), else libnccl.so.2 on the loader path, else the library trainsup was
// built against; so trainsup never brings a second NCCL into a process. Without NCCL, or in a
// build without the CUDA layer, loadNccl() returns Unavailable with the reason and aborting
// registered communicators fails with it. Thread-safe.
#pragma once

#include <string>

#include "trainsup/export.h"
#include "trainsup/status.h"

namespace trainsup {

TRAINSUP_EXPORT Status loadNccl();
TRAINSUP_EXPORT void registerNcclCommunicator(void* comm);
TRAINSUP_EXPORT void unregisterNcclCommunicator(void* comm);
TRAINSUP_EXPORT int registeredNcclCommunicators();

struct NcclAbortResult {
  int aborted = 0;
  int failed = 0;
  Status first_error;
};
TRAINSUP_EXPORT NcclAbortResult abortNcclCommunicators();
// Aborts one communicator directly (not via the list): ncclCommAbort's result as a Status.
TRAINSUP_EXPORT Status abortNcclCommunicator(void* comm);

}  // namespace trainsup
