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
    """The driver's NVML (TRAINSUP_NVML_LIBRARY names it where the loader cannot find it, e.g.
    a container's /usr/local/nvidia/lib64), with the signatures the checks use, or None."""
    configured = os.environ.get("TRAINSUP_NVML_LIBRARY")
    for name in [configured] if configured else ["libnvidia-ml.so.1", "libnvidia-ml.so"]:
        try:
            lib = ctypes.CDLL(name)
            break
        except OSError:
            continue
    else:
        return None
    c_uint_p, c_int_p = ctypes.POINTER(ctypes.c_uint), ctypes.POINTER(ctypes.c_int)
    signatures = {
        "nvmlInit_v2": [],
        "nvmlShutdown": [],
        "nvmlDeviceGetCount_v2": [c_uint_p],
        "nvmlDeviceGetHandleByIndex_v2": [ctypes.c_uint, ctypes.POINTER(ctypes.c_void_p)],
        "nvmlDeviceGetUUID": [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_uint],
        "nvmlDeviceGetTotalEccErrors": [ctypes.c_void_p, ctypes.c_int, ctypes.c_int,
                                        ctypes.POINTER(ctypes.c_ulonglong)],
        "nvmlDeviceGetRetiredPagesPendingStatus": [ctypes.c_void_p, c_int_p],
        "nvmlDeviceGetRemappedRows": [ctypes.c_void_p, c_uint_p, c_uint_p, c_uint_p, c_uint_p],
    }
    for fn, args in signatures.items():
        f = getattr(lib, fn, None)
        if f is None:
            continue  # an old driver: that check is skipped
        f.argtypes, f.restype = args, ctypes.c_int
    return lib


def _call(lib, fn, *args):
    """NVML's return code, or None when this driver lacks the entry point."""
    f = getattr(lib, fn, None)
    return None if f is None else f(*args)


def gpu_checks():
    """(problems, note, bad_gpus): problems name the GPU (index and UUID) and what is wrong;
    bad_gpus are the UUIDs of the GPUs with a problem."""
    lib = _nvml()
    if lib is None:
        return [], "no NVML (no NVIDIA driver): GPU checks skipped", []
    if lib.nvmlInit_v2() != NVML_SUCCESS:
        return [], "NVML present but no usable driver/device: GPU checks skipped", []
    problems, bad = [], []
    try:
        count = ctypes.c_uint(0)
        if lib.nvmlDeviceGetCount_v2(ctypes.byref(count)) != NVML_SUCCESS:
            return [], "NVML could not count devices: GPU checks skipped", []
        for i in range(count.value):
            dev = ctypes.c_void_p()
            if lib.nvmlDeviceGetHandleByIndex_v2(i, ctypes.byref(dev)) != NVML_SUCCESS:
                problems.append(f"GPU {i}: not accessible")
                bad.append(f"GPU {i}")
                continue
            buf = ctypes.create_string_buffer(96)
            uuid = buf.value.decode() if _call(lib, "nvmlDeviceGetUUID", dev, buf, 96) == NVML_SUCCESS else ""
            name = f"GPU {i} ({uuid})" if uuid else f"GPU {i}"
            found = []
            ecc = ctypes.c_ulonglong(0)
            if _call(lib, "nvmlDeviceGetTotalEccErrors", dev, NVML_MEMORY_ERROR_TYPE_UNCORRECTED, NVML_VOLATILE_ECC,
                     ctypes.byref(ecc)) == NVML_SUCCESS and ecc.value > 0:
                found.append(f"{ecc.value} uncorrectable ECC errors")
            pending = ctypes.c_int(0)
            if _call(lib, "nvmlDeviceGetRetiredPagesPendingStatus", dev, ctypes.byref(pending)) == NVML_SUCCESS and \
                    pending.value == NVML_FEATURE_ENABLED:
                found.append("retired pages pending (reset the GPU)")
            corr, unc, is_pending, failure = (ctypes.c_uint(0) for _ in range(4))
            if _call(lib, "nvmlDeviceGetRemappedRows", dev, ctypes.byref(corr), ctypes.byref(unc),
                     ctypes.byref(is_pending), ctypes.byref(failure)) == NVML_SUCCESS:
                if failure.value:
                    found.append("row remapping failed")
                elif is_pending.value:
                    found.append("row remapping pending (reset the GPU)")
            problems += [f"{name}: {f}" for f in found]
            if found:
                bad.append(uuid or f"GPU {i}")
        return problems, f"{count.value} GPU(s) checked", bad
    finally:
        lib.nvmlShutdown()


def run(command=None):
    """(healthy, details, bad_gpus) for this host."""
    problems, note, bad = gpu_checks()
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
    return not problems, details, bad
