"""Health preflight of a host, run by the launcher's agent before its first rendezvous.

GPU checks go through NVML, loaded at run time (libnvidia-ml.so.1, part of the driver): for
every device, uncorrectable ECC errors (volatile), pages pending retirement and rows pending
remapping fail the host. No NVML, no driver or no device is a normal state: reported, not a
failure. Then the optional user command (TRAINSUP_PREFLIGHT_COMMAND, run by the shell; exit
status 0 = healthy). A host that fails quarantines itself and its agent does not join.
"""
import ctypes
import os
import subprocess

NVML_SUCCESS = 0
NVML_MEMORY_ERROR_TYPE_UNCORRECTED = 1
NVML_VOLATILE_ECC = 0
NVML_FEATURE_ENABLED = 1


def _nvml():
    for name in ("libnvidia-ml.so.1", "libnvidia-ml.so"):
        try:
            return ctypes.CDLL(name)
        except OSError:
            continue
    return None


def gpu_checks():
    """(problems, note): problems is a list of strings naming the GPU and what is wrong."""
    lib = _nvml()
    if lib is None:
        return [], "no NVML (no NVIDIA driver): GPU checks skipped"
    if lib.nvmlInit_v2() != NVML_SUCCESS:
        return [], "NVML present but no usable driver/device: GPU checks skipped"
    problems = []
    try:
        count = ctypes.c_uint(0)
        if lib.nvmlDeviceGetCount_v2(ctypes.byref(count)) != NVML_SUCCESS:
            return [], "NVML could not count devices: GPU checks skipped"
        for i in range(count.value):
            dev = ctypes.c_void_p()
            if lib.nvmlDeviceGetHandleByIndex_v2(i, ctypes.byref(dev)) != NVML_SUCCESS:
                problems.append(f"GPU {i}: not accessible")
                continue
            ecc = ctypes.c_ulonglong(0)
            if lib.nvmlDeviceGetTotalEccErrors(dev, NVML_MEMORY_ERROR_TYPE_UNCORRECTED, NVML_VOLATILE_ECC,
                                               ctypes.byref(ecc)) == NVML_SUCCESS and ecc.value > 0:
                problems.append(f"GPU {i}: {ecc.value} uncorrectable ECC errors")
            pending = ctypes.c_int(0)
            if lib.nvmlDeviceGetRetiredPagesPendingStatus(dev, ctypes.byref(pending)) == NVML_SUCCESS and \
                    pending.value == NVML_FEATURE_ENABLED:
                problems.append(f"GPU {i}: retired pages pending (reset the GPU)")
            corr, unc, is_pending, failure = (ctypes.c_uint(0) for _ in range(4))
            if lib.nvmlDeviceGetRemappedRows(dev, ctypes.byref(corr), ctypes.byref(unc), ctypes.byref(is_pending),
                                             ctypes.byref(failure)) == NVML_SUCCESS:
                if failure.value:
                    problems.append(f"GPU {i}: row remapping failed")
                elif is_pending.value:
                    problems.append(f"GPU {i}: row remapping pending (reset the GPU)")
        return problems, f"{count.value} GPU(s) checked"
    finally:
        lib.nvmlShutdown()


def run(command=None):
    """(healthy, details) for this host."""
    problems, note = gpu_checks()
    details = [note] + problems
    command = os.environ.get("TRAINSUP_PREFLIGHT_COMMAND", "") if command is None else command
    if command:
        try:
            rc = subprocess.run(command, shell=True, timeout=300).returncode
        except subprocess.TimeoutExpired:
            rc = -1
        if rc != 0:
            problems.append(f"preflight command {command!r} exited {rc}")
            details.append(problems[-1])
    return not problems, details
