// describeLocalGpu() for builds without the CUDA layer (TRAINSUP_WITH_CUDA=OFF).
#include "device/gpu.h"

namespace trainsup {

Result<GpuInfo> describeLocalGpu(int) {
  return Status::unavailable("no GPU information: trainsup was built without the CUDA layer");
}

bool pinHostMemory(void*, size_t) { return false; }
void unpinHostMemory(void*) {}

Status synchronizeDevice(int device) {
  return Status::unavailable("cannot synchronize CUDA device " + std::to_string(device) +
                             ": trainsup was built without the CUDA layer");
}

Status copyDeviceToHost(void*, const void*, size_t, int device) {
  return Status::unavailable("cannot copy from CUDA device " + std::to_string(device) +
                             ": trainsup was built without the CUDA layer");
}

}  // namespace trainsup
