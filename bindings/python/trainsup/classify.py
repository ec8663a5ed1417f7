"""Classifies why a worker failed from the tail of its output, by known fault signatures (the
message bodies, not the prefixes and source line numbers, which differ between PyTorch and NCCL
versions). Classes, most specific first:

  gpu_hardware        ECC errors, Xid events, row remapping, CUDA errors from the device
  out_of_memory       CUDA or host out-of-memory
  preempted           the scheduler cancelled or preempted the job, SIGTERM from outside
  collective_timeout  an NCCL/gloo collective timed out (the victims of a hung peer)
  network_or_peer     connections to peers or the rendezvous store broke
  user_code           a Python traceback that is none of the above (the program's own bug)
  unknown             nothing recognised

Only gpu_hardware blames the host by itself; user_code never does.
"""
import glob
import os
import re

_SIGNATURES = [
    ("gpu_hardware", [
        r"uncorrectable ECC error", r"CUDA_ERROR_ECC_UNCORRECTABLE", r"NVRM: Xid", r"Row Remapper",
        r"row remap", r"c10::CUDAError", r"CUDA error: (an illegal|unspecified launch failure|misaligned address)",
        r"GPU is lost", r"fallen off the bus",
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
]
_COMPILED = [(cls, [re.compile(p, re.IGNORECASE) for p in pats]) for cls, pats in _SIGNATURES]
_TRACEBACK = re.compile(r"^Traceback \(most recent call last\)|^\w+(\.\w+)*(Error|Exception): ", re.MULTILINE)
CLASSES = [c for c, _ in _SIGNATURES] + ["user_code", "unknown"]


# torch 2.x prefixes every line of an uncaught exception with "[rankN]: ", and torchrun's --tee
# with "[defaultN]:"; neither is part of the message.
_LINE_PREFIX = re.compile(r"^(\[default\d+\]:)?(\[rank\d+\]:)?[ ]?")


def classify(text):
    """(class, the line that decided it) for a worker's output tail."""
    lines = [_LINE_PREFIX.sub("", l, count=1) for l in text.splitlines()]
    text = "\n".join(lines)
    for cls, patterns in _COMPILED:
        for line in lines:
            if any(p.search(line) for p in patterns):
                return cls, line.strip()
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
