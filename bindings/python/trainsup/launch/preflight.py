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

__all__ = ["run", "gpu_records", "gpu_checks", "problems_of"]

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


def gpu_records():
    """(records, note): one dict per device NVML sees, with what the checks read:
    index, uuid, ecc_uncorrected (volatile count; None where the GPU has no ECC or the driver
    cannot say), retired_pages_pending (bool or None), remapped_rows (dict of correctable,
    uncorrectable, pending, failed; None where unsupported), accessible (False: no handle).
    Empty records and a note saying why when there is no NVML, driver or device."""
    lib = _nvml()
    if lib is None:
        return [], "no NVML (no NVIDIA driver): GPU checks skipped"
    if lib.nvmlInit_v2() != NVML_SUCCESS:
        return [], "NVML present but no usable driver/device: GPU checks skipped"
    records = []
    try:
        count = ctypes.c_uint(0)
        if lib.nvmlDeviceGetCount_v2(ctypes.byref(count)) != NVML_SUCCESS:
            return [], "NVML could not count devices: GPU checks skipped"
        for i in range(count.value):
            dev = ctypes.c_void_p()
            if lib.nvmlDeviceGetHandleByIndex_v2(i, ctypes.byref(dev)) != NVML_SUCCESS:
                records.append({"index": i, "uuid": "", "accessible": False})
                continue
            buf = ctypes.create_string_buffer(96)
            uuid = buf.value.decode() if _call(lib, "nvmlDeviceGetUUID", dev, buf, 96) == NVML_SUCCESS else ""
            record = {"index": i, "uuid": uuid, "accessible": True, "ecc_uncorrected": None,
                      "retired_pages_pending": None, "remapped_rows": None}
            ecc = ctypes.c_ulonglong(0)
            if _call(lib, "nvmlDeviceGetTotalEccErrors", dev, NVML_MEMORY_ERROR_TYPE_UNCORRECTED, NVML_VOLATILE_ECC,
                     ctypes.byref(ecc)) == NVML_SUCCESS:
                record["ecc_uncorrected"] = ecc.value
            pending = ctypes.c_int(0)
            if _call(lib, "nvmlDeviceGetRetiredPagesPendingStatus", dev, ctypes.byref(pending)) == NVML_SUCCESS:
                record["retired_pages_pending"] = pending.value == NVML_FEATURE_ENABLED
            corr, unc, is_pending, failure = (ctypes.c_uint(0) for _ in range(4))
            if _call(lib, "nvmlDeviceGetRemappedRows", dev, ctypes.byref(corr), ctypes.byref(unc),
                     ctypes.byref(is_pending), ctypes.byref(failure)) == NVML_SUCCESS:
                record["remapped_rows"] = {"correctable": corr.value, "uncorrectable": unc.value,
                                           "pending": bool(is_pending.value), "failed": bool(failure.value)}
            records.append(record)
        return records, f"{count.value} GPU(s) checked"
    finally:
        lib.nvmlShutdown()


def problems_of(record):
    """What is wrong with one GPU record of gpu_records(): [] for a healthy GPU."""
    if not record.get("accessible", True):
        return ["not accessible"]
    found = []
    if record.get("ecc_uncorrected"):
        found.append(f"{record['ecc_uncorrected']} uncorrectable ECC errors")
    if record.get("retired_pages_pending"):
        found.append("retired pages pending (reset the GPU)")
    rows = record.get("remapped_rows") or {}
    if rows.get("failed"):
        found.append("row remapping failed")
    elif rows.get("pending"):
        found.append("row remapping pending (reset the GPU)")
    return found


def gpu_checks(records=None, note=None):
    """(problems, note, bad_gpus): problems name the GPU (index and UUID) and what is wrong;
    bad_gpus are the UUIDs of the GPUs with a problem. Reads NVML unless given gpu_records()."""
    if records is None:
        records, note = gpu_records()
    problems, bad = [], []
    for r in records:
        found = problems_of(r)
        name = f"GPU {r['index']} ({r['uuid']})" if r.get("uuid") else f"GPU {r['index']}"
        problems += [f"{name}: {f}" for f in found]
        if found:
            bad.append(r.get("uuid") or f"GPU {r['index']}")
    return problems, note, bad


def run(command=None, records=None):
    """(healthy, details, bad_gpus) for this host. `records`, when given a list, receives the
    GPU records the checks read (gpu_records())."""
    found, note = gpu_records()
    if records is not None:
        records.extend(found)
    problems, note, bad = gpu_checks(found, note)
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
