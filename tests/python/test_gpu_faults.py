"""When a worker's failure is its host's GPU's fault (trainsup/launch/gpu_faults.py). A program's own
CUDA errors (an illegal memory access, a device-side assert) were classified as hardware and the
launcher quarantined and drained its own, healthy host for 24 h (issue 19, defect 3)."""
import time

import torch.distributed as dist

from trainsup.launch.classify import classify
from trainsup.launch.gpu_faults import GpuFaultJudge, kernel_xids

ILLEGAL = "RuntimeError: CUDA error: an illegal memory access was encountered"
ASSERT = "RuntimeError: CUDA error: device-side assert triggered"


def _judge(store, host, problems=(), xids=()):
    """A judge whose NVML reads `problems` and whose kernel log holds `xids`."""
    return GpuFaultJudge(store, "run", host, gpu_checks=lambda: (list(problems), "1 GPU(s) checked", []),
                         kernel_log=lambda since: (list(xids), ""))


def _failure(line):
    return [("0", classify(line + "\n")[0], line)]


def test_a_programs_cuda_error_never_blames_the_host_by_itself():
    assert classify(ILLEGAL + "\n")[0] == "cuda_error"
    assert classify("terminate called after throwing an instance of 'c10::CUDAError'\n")[0] == "cuda_error"
    verdict, reason, notes = _judge(dist.HashStore(), "host-a").judge(0, _failure(ILLEGAL), time.monotonic())
    assert verdict is None, reason
    assert "1 GPU(s) checked" in notes


def test_the_same_cuda_error_with_evidence_only_hardware_gives_blames_the_gpu():
    store = dist.HashStore()
    verdict, reason, _ = _judge(store, "host-a", problems=["GPU 3 (GPU-abc): 2 uncorrectable ECC errors"]).judge(
        0, _failure(ILLEGAL), time.monotonic())
    assert verdict == "gpu_hardware" and ILLEGAL in reason and "uncorrectable ECC" in reason
    xid = "NVRM: Xid (PCI:0000:3b:00): 48, pid=2210, name=python, An uncorrectable double bit error (DBE)"
    verdict, reason, _ = _judge(store, "host-b", xids=[xid]).judge(0, _failure(ILLEGAL), time.monotonic())
    assert verdict == "gpu_hardware" and "kernel log" in reason and ": 48," in reason
    fallen = "RuntimeError: CUDA error: GPU has fallen off the bus"
    assert _judge(store, "host-c").judge(0, _failure(fallen), time.monotonic())[0] == "gpu_hardware"


def test_a_cuda_error_on_the_same_host_alone_two_attempts_in_a_row_escalates():
    store = dist.HashStore()
    a, b = _judge(store, "host-a"), _judge(store, "host-b")
    assert a.judge(4, _failure(ILLEGAL), time.monotonic())[0] is None  # round 4: host-a alone
    assert b.judge(4, [("0", "collective_timeout", "Timed out waiting 1800000ms for recv")], time.monotonic())[0] \
        is None
    verdict, reason, _ = a.judge(5, _failure(ASSERT), time.monotonic())  # round 5: again
    assert verdict == "repeated_gpu_fault", reason
    assert ILLEGAL in reason and ASSERT in reason


def test_a_cuda_error_every_host_shares_is_the_programs_however_often():
    store = dist.HashStore()
    a, b = _judge(store, "host-a"), _judge(store, "host-b")
    for rnd in (0, 1, 2):
        assert a.judge(rnd, _failure(ASSERT), time.monotonic())[0] is None
        assert b.judge(rnd, _failure(ASSERT), time.monotonic())[0] is None
    _, _, notes = a.judge(3, _failure(ASSERT), time.monotonic())
    assert any("on 2 hosts" in n for n in notes), notes


def test_hardware_xids_since_the_attempt_began_are_read_from_the_kernel_log(tmp_path):
    log = tmp_path / "kmsg"
    log.write_text(
        "3,1001,5000000,-;NVRM: Xid (PCI:0000:3b:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus.\n"
        "3,1002,9000000,-;NVRM: Xid (PCI:0000:3b:00): 13, pid=2210, name=python, Graphics Exception\n"
        "3,1003,9500000,-;NVRM: Xid (PCI:0000:3b:00): 94, pid=2210, name=python, Contained: SM (0x1).\n"
        "6,1004,9600000,-;eth0: link up\n")
    found, note = kernel_xids(6.0, path=str(log))  # the attempt began 6 s after boot
    assert note == "" and len(found) == 1 and ": 94," in found[0], found  # 79 was before; 13 is a program's
    found, note = kernel_xids(0.0, path=str(tmp_path / "absent"))
    assert found == [] and "not readable" in note
