"""Whether this host's GPU is at fault after one of its workers failed (the launcher's agent, on
torchrun's thread, before it rejoins).

A CUDA error of the program's kernels (an illegal memory access, a device-side assert) is what a
bug in the program produces, and on a failing GPU what its faults produce too. Quarantining on it
alone took healthy hosts out of the job (and drained them) for a program's bug (issue 19). So
the host is blamed only on evidence that hardware alone gives:

1. the worker's own output says so: uncorrectable ECC, a GPU fallen off the bus or lost, row
   remapping, an Xid of the hardware kind (classify.py);
2. the kernel log holds an Xid of the hardware kind since the attempt began (read from
   /dev/kmsg, or TRAINSUP_KERNEL_LOG; unreadable without root or CAP_SYSLOG: then this evidence
   is missing, said in the event, and the others still count);
3. a CUDA error, and the GPUs' NVML counters (read now) show uncorrectable ECC errors, pages or
   rows pending retirement or remapping, or a failed remapping (preflight.py);
4. a CUDA error on this host in two attempts in a row, the first of which saw it on no other
   host: a program's bug shows on every host that runs the same code, a failing GPU stays with
   its host. (A fault that follows a rank's data from host to host can still be taken for a GPU
   once; the restart cap ends such a job.)

Each agent records its CUDA errors of a round in the job's store (names.py: faults/<run>/...),
so that the next round's judgement can tell "alone" from "everywhere": by the time a round has
formed, every agent of the round before has classified its failures.
"""
import errno
import os
import re
from typing import Any, Callable, List, Optional, Sequence, Tuple

from .. import names
from . import preflight
from .classify import HARDWARE_XIDS, xid_of
from .store import peek

__all__ = ["GpuFaultJudge", "kernel_xids"]

KERNEL_LOG = "/dev/kmsg"
# A kmsg record: "<priority>,<sequence>,<microseconds since boot>,<flags>;<message>".
_KMSG = re.compile(r"^\d+,\d+,(\d+),[^;]*;(.*)$")


def kernel_xids(since_monotonic_s, path=None):
    """(hardware Xid lines logged by the kernel since `since_monotonic_s` (time.monotonic()),
    note): the note says why the kernel log could not be read, else ""."""
    path = path or os.environ.get("TRAINSUP_KERNEL_LOG") or KERNEL_LOG
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError as e:
        return [], f"kernel log {path} not readable ({e.strerror}): Xid evidence not available"
    found, chunks = [], []
    try:
        while True:  # /dev/kmsg gives one record per read; a file, all at once
            try:
                chunk = os.read(fd, 65536)
            except OSError as e:
                if e.errno == errno.EPIPE:  # records overwritten while we read: go on
                    continue
                if e.errno == errno.EAGAIN:
                    break
                return [], f"kernel log {path}: {e.strerror}"
            if not chunk:
                break
            chunks.append(chunk)
    finally:
        os.close(fd)
    since_us = since_monotonic_s * 1e6
    for line in b"".join(chunks).decode(errors="replace").splitlines():
        m = _KMSG.match(line)
        if not m or int(m.group(1)) < since_us:
            continue
        if xid_of(m.group(2)) in HARDWARE_XIDS:
            found.append(m.group(2).strip())
    return found, ""


class GpuFaultJudge:
    """One per agent. judge() says whether a failed attempt of this host is its GPU's fault."""

    REPEATS = 2  # attempts in a row with CUDA errors, the first alone among the hosts

    def __init__(self, store, run_id, host, gpu_checks=preflight.gpu_checks, kernel_log=kernel_xids):
        self.store, self.run_id, self.host = store, run_id, host
        self.gpu_checks, self.kernel_log = gpu_checks, kernel_log

    def judge(self, rnd, failures, attempt_started):
        """(verdict, reason, notes) for round `rnd`'s failures on this host ([(local_rank,
        class, line)], classify.classify_attempt), `attempt_started` its time.monotonic():
        verdict "gpu_hardware" or "repeated_gpu_fault" when the host is to be quarantined, else
        None; notes say what evidence was looked at (for the agent's event)."""
        notes: list = []
        for _, cls, line in failures:
            if cls == "gpu_hardware":
                return "gpu_hardware", line, notes
        xids, note = self.kernel_log(attempt_started)
        if note:
            notes.append(note)
        if xids:
            return "gpu_hardware", f"kernel log: {xids[0]}", notes
        cuda = [line for _, cls, line in failures if cls == "cuda_error"]
        if not cuda:
            return None, "", notes
        problems, nvml_note, _ = self.gpu_checks()
        if nvml_note:
            notes.append(nvml_note)
        if problems:
            return "gpu_hardware", f"{cuda[0]} (NVML: {'; '.join(problems)})", notes
        self.store.set(names.cuda_fault_key(self.run_id, rnd, self.host), cuda[0])
        self.store.add(names.cuda_fault_count_key(self.run_id, rnd), 1)
        before = peek(self.store, names.cuda_fault_key(self.run_id, rnd - 1, self.host)) if rnd > 0 else None
        if before is not None:
            hosts_before = int(peek(self.store, names.cuda_fault_count_key(self.run_id, rnd - 1)) or 0)
            if hosts_before == 1:
                return ("repeated_gpu_fault",
                        f"CUDA errors on this host in {self.REPEATS} attempts in a row, the first on no other "
                        f"host: {before}; then {cuda[0]}", notes)
            notes.append(f"CUDA errors in the previous attempt on {hosts_before} hosts: the program's, not this GPU's")
        return None, "", notes
