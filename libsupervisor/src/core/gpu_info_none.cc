// describeLocalGpu() for builds without the CUDA layer (TRAINSUP_WITH_CUDA=OFF).
#include "trainsup/gpu.h"

namespace trainsup {

Result<GpuInfo> describeLocalGpu(int) {
  return Status::unavailable("no GPU information: trainsup was built without the CUDA layer");
}

}  // namespace trainsup
