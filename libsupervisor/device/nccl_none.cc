// trainsup/nccl.h in builds without NCCL (no CUDA layer, or nccl.h not found at build time).
#include "trainsup/nccl.h"

namespace trainsup {

Status loadNccl() { return Status::unavailable("trainsup was built without NCCL support"); }

Status abortNcclCommunicator(void*) { return loadNccl(); }

}  // namespace trainsup
