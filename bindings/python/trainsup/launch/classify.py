"""Classifies why a worker failed from the tail of its output, by known fault signatures (the
message bodies, not the prefixes and source line numbers, which differ between PyTorch and NCCL
versions). Classes, most specific first:

  gpu_hardware        evidence that only broken hardware gives: uncorrectable ECC errors, a GPU
                      fallen off the bus or lost, row remapping, an Xid of the hardware kind
  out_of_memory       CUDA or host out-of-memory
  preempted           the scheduler cancelled or preempted the job, SIGTERM from outside
  collective_timeout  an NCCL/gloo collective timed out (the victims of a hung peer)
  network_or_peer     connections to peers or the rendezvous store broke
  checkpoint_incompatible
                      the checkpoints were written by another world size and this job cannot
                      restore them (trainsup's own restore error): the next attempt of the same
                      size fails the same way
  cuda_error          a CUDA error of the program's kernels (an illegal memory access, a
                      device-side assert, a misaligned address, a launch failure, an Xid of the
                      application kind): usually the program's bug, sometimes a failing GPU
  user_code           a Python traceback that is none of the above (the program's own bug)
  unknown             nothing recognised

Only gpu_hardware blames the host by itself. A cuda_error does not: the launcher looks for
evidence that only hardware gives (the GPUs' NVML counters, Xid events in the kernel log,
gpu_faults.py), and escalates one that recurs on the same host, alone, after a restart.

Xid codes (NVIDIA's Xid catalog, docs.nvidia.com/deploy/xid-errors): the hardware kind are
ECC (48 double-bit, 63/64 row remapping, 92 high single-bit rate, 94/95 contained/uncontained,
140 unrecovered), the bus or the GPU lost (79), NVLink (74), the GPU's firmware or C2C link
(119, 120, 121, 123); others (13 graphics exception, 31 MMU fault, 43 stopped, 45 cleanup) are
what a program's illegal access or assert also produces.
"""
import glob
import os
import re

__all__ = ["classify", "classify_attempt", "xid_of", "tail", "CLASSES", "HARDWARE_XIDS"]

HARDWARE_XIDS = frozenset({48, 63, 64, 74, 79, 92, 94, 95, 119, 120, 121, 123, 140})
_XID = re.compile(r"NVRM: Xid \([^)]*\): (\d+)")

_SIGNATURES = [
    ("gpu_hardware", [
        r"uncorrectable ECC error", r"CUDA_ERROR_ECC_UNCORRECTABLE", r"Row Remapper", r"row remap",
        r"GPU is lost", r"fallen off the bus", r"CUDA_ERROR_ILLEGAL_STATE.*lost",
    ]),
    ("out_of_memory", [r"OutOfMemoryError", r"CUDA out of memory", r"\bout of memory\b", r"Cannot allocate memory",
                       r"std::bad_alloc"]),
    ("preempted", [r"CANCELLED AT .* DUE TO (TIME LIMIT|PREEMPTION|NODE FAILURE)", r"DUE TO PREEMPTION",
                   r"Received SIGTERM", r"SignalException: Process \d+ got signal: 15"]),
    ("collective_timeout", [
        r"Watchdog caught collective operation timeout", r"Timeout at NCCL work", r"Timed out waiting \d+ms for",
        r"watchdog got stuck", r"Exception \(either an error or timeout\) detected by watchdog",
        r"NCCL communicator was aborted",
    ]),
    ("network_or_peer", [
        r"Connection closed by (remote )?peer", r"Broken pipe", r"Connection reset by peer", r"socketProgress",
        r"RendezvousConnectionError", r"Connection refused", r"NCCL WARN Net",
        # A port taken between torchrun choosing it and the worker binding it: not the program's bug.
        r"DistNetworkError", r"EADDRINUSE", r"[Aa]ddress already in use",
    ]),
    ("checkpoint_incompatible", [r"were written by world size \d+, this job has \d+"]),
    ("cuda_error", [
        r"an illegal memory access", r"device-side assert", r"unspecified launch failure", r"misaligned address",
        r"c10::CUDAError", r"CUDA error: ", r"CUDA_ERROR_", r"NVRM: Xid",
    ]),
]
_COMPILED = [(cls, [re.compile(p, re.IGNORECASE) for p in pats]) for cls, pats in _SIGNATURES]
_TRACEBACK = re.compile(r"^Traceback \(most recent call last\)|^\w+(\.\w+)*(Error|Exception): ", re.MULTILINE)
CLASSES = [c for c, _ in _SIGNATURES] + ["user_code", "unknown"]


# torch 2.x prefixes every line of an uncaught exception with "[rankN]: ", and torchrun's --tee
# with "[defaultN]:"; neither is part of the message.
_LINE_PREFIX = re.compile(r"^(\[default\d+\]:)?(\[rank\d+\]:)?[ ]?")


def xid_of(line):
    """The Xid code of a kernel log line ("NVRM: Xid (PCI:0000:10:1c): 79, ..."), or None."""
    m = _XID.search(line)
    return int(m.group(1)) if m else None


def classify(text):
    """(class, the line that decided it) for a worker's output tail."""
    lines = [_LINE_PREFIX.sub("", l, count=1) for l in text.splitlines()]
    text = "\n".join(lines)
    for line in lines:  # an Xid of the hardware kind outranks everything it causes
        if xid_of(line) in HARDWARE_XIDS:
            return "gpu_hardware", line.strip()
    for cls, patterns in _COMPILED:
        matching = [line for line in lines if any(p.search(line) for p in patterns)]
        if matching:
            # The line that says it, not source code a traceback quotes (indented): the line
            # becomes the quarantine's reason and the drain reason an operator reads.
            said = [line for line in matching if not line[:1].isspace()]
            return cls, (said or matching)[0].strip()
    m = _TRACEBACK.search(text)
    if m:
        # The exception line is the last line of the traceback.
        last = [l for l in lines if re.match(r"^\w+(\.\w+)*(Error|Exception)\b", l)]
        return "user_code", (last[-1] if last else m.group(0)).strip()
    return "unknown", ""


def tail(path, max_bytes=64 * 1024):
    try:
        with open(path, "rb") as f:
            f.seek(0, 2)
            size = f.tell()
            f.seek(max(0, size - max_bytes))
            return f.read().decode(errors="replace")
    except OSError:
        return ""


def classify_attempt(worker_log_dir, run_id):
    """(local rank, class, line) for each worker of the newest attempt of run `run_id` under
    torchrun's log directory `worker_log_dir` whose stderr tail has a known failure class."""
    if not worker_log_dir:
        return []
    attempts = sorted(glob.glob(os.path.join(worker_log_dir, f"{run_id}_*", "attempt_*")), key=os.path.getmtime)
    if not attempts:
        return []
    found = []
    for stderr in sorted(glob.glob(os.path.join(attempts[-1], "*", "stderr.log"))):
        cls, line = classify(tail(stderr))
        if cls != "unknown":
            found.append((os.path.basename(os.path.dirname(stderr)), cls, line))
    return found
