// describeLocalGpu() through the CUDA runtime (linked statically).
#include <cuda_runtime_api.h>

#include <cstdio>
#include <string>
#include <vector>

#include "device/gpu.h"

namespace trainsup {

Result<GpuInfo> describeLocalGpu(int local_rank) {
  int count = 0;
  cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess) {
    return Status::unavailable(std::string("no GPU: cudaGetDeviceCount: ") + cudaGetErrorString(err));
  }
  if (count == 0) return Status::unavailable("no GPU: no CUDA device is visible");
  GpuInfo info;
  info.index = local_rank % count;
  cudaDeviceProp prop{};
  if (cudaGetDeviceProperties(&prop, info.index) == cudaSuccess) {
    info.name = prop.name;
    char uuid[64];
    const auto* b = reinterpret_cast<const unsigned char*>(prop.uuid.bytes);
    std::snprintf(uuid, sizeof(uuid),
                  "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", b[0], b[1], b[2],
                  b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12], b[13], b[14], b[15]);
    info.uuid = uuid;
  }
  char bus[32] = {};
  if (cudaDeviceGetPCIBusId(bus, sizeof(bus), info.index) == cudaSuccess) info.pci_bus_id = bus;
  return info;
}

bool pinHostMemory(void* p, size_t n) {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) return false;
  if (cudaHostRegister(p, n, cudaHostRegisterDefault) != cudaSuccess) {
    cudaGetLastError();  // clear it: a failed registration is not the caller's CUDA error
    return false;
  }
  return true;
}

void unpinHostMemory(void* p) {
  if (cudaHostUnregister(p) != cudaSuccess) cudaGetLastError();
}

Status synchronizeDevice(int device) {
  int previous = -1;
  cudaGetDevice(&previous);
  cudaError_t err = cudaSetDevice(device);
  if (err == cudaSuccess) err = cudaDeviceSynchronize();
  if (previous >= 0) cudaSetDevice(previous);
  if (err != cudaSuccess) {
    return Status::ioError("synchronizing CUDA device " + std::to_string(device) + ": " + cudaGetErrorString(err));
  }
  return Status::ok();
}

Status copyDeviceToHost(void* dst, const void* src, size_t n, int device) {
  // One non-blocking stream per thread and device, kept for the thread's life: the copy must
  // not serialize with the legacy default stream the training computes on.
  thread_local std::vector<cudaStream_t> streams;
  int previous = -1;
  cudaGetDevice(&previous);
  cudaError_t err = cudaSetDevice(device);
  if (err == cudaSuccess && static_cast<size_t>(device) >= streams.size()) streams.resize(device + 1, nullptr);
  if (err == cudaSuccess && streams[device] == nullptr) {
    err = cudaStreamCreateWithFlags(&streams[device], cudaStreamNonBlocking);
  }
  if (err == cudaSuccess) err = cudaMemcpyAsync(dst, src, n, cudaMemcpyDeviceToHost, streams[device]);
  if (err == cudaSuccess) err = cudaStreamSynchronize(streams[device]);
  if (previous >= 0) cudaSetDevice(previous);
  if (err != cudaSuccess) {
    return Status::ioError("copy of " + std::to_string(n) + " bytes from CUDA device " + std::to_string(device) +
                           ": " + cudaGetErrorString(err));
  }
  return Status::ok();
}

}  // namespace trainsup
