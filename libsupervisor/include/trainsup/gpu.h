// trainsup/gpu.h — which GPU this rank runs on, for logs and verdicts.
//
// Contract: describeLocalGpu(local_rank) returns the device a torchrun rank conventionally
// uses (local_rank modulo the visible device count) with its index, name, PCI bus id and UUID.
// "No GPU" is a normal state, not an error of the caller: without a driver, without a device,
// or in a build without the CUDA layer it returns Unavailable with the reason. Built with the
// CUDA layer it links the static CUDA runtime, so no libcudart is needed at run time. Safe
// from any thread; the first call initializes the CUDA driver (tens of milliseconds to a second).
#pragma once

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

}  // namespace trainsup
