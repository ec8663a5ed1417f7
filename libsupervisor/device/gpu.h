// device/gpu.h — which GPU this rank runs on, for logs and verdicts.
//
// Contract: describeLocalGpu(local_rank) returns the device a torchrun rank conventionally
// uses (local_rank modulo the visible device count) with its index, name, PCI bus id and UUID.
// "No GPU" is a normal state, not an error of the caller: without a driver, without a device,
// or in a build without the CUDA layer it returns Unavailable with the reason. Built with the
// CUDA layer it links the static CUDA runtime, so no libcudart is needed at run time. Safe
// from any thread; the first call initializes the CUDA driver (tens of milliseconds to a second).
#pragma once

#include <cstddef>
#include <string>

#include "trainsup/export.h"
#include "trainsup/status.h"

namespace trainsup {

struct GpuInfo {
  int index = -1;
  std::string name;
  std::string pci_bus_id;  // e.g. "0000:1B:00.0"
  std::string uuid;        // e.g. "GPU-4f6a...", as nvidia-smi prints it
};

TRAINSUP_EXPORT Result<GpuInfo> describeLocalGpu(int local_rank);

// Page-locks host memory so device-to-host copies into it run at full speed (cudaHostRegister).
// False (and nothing changed) without the CUDA layer, a driver or a device.
TRAINSUP_EXPORT bool pinHostMemory(void* p, size_t n);
TRAINSUP_EXPORT void unpinHostMemory(void* p);

// Waits until all work queued on CUDA device `device` is done, so that its memory holds the
// values the training thread has asked for. Unavailable without the CUDA layer.
TRAINSUP_EXPORT Status synchronizeDevice(int device);

// Copies n bytes from memory of CUDA device `device` to host memory and waits for the copy.
// The copy runs on a non-blocking stream owned by the calling thread, so it neither waits for
// nor delays the training's own streams: call synchronizeDevice() first (on any thread) when
// the source was written by queued work. Unavailable without the CUDA layer; IoError naming
// the CUDA error otherwise.
TRAINSUP_EXPORT Status copyDeviceToHost(void* dst, const void* src, size_t n, int device);

}  // namespace trainsup
