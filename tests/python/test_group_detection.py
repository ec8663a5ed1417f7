"""Detection per process group, end to end (issue 20): the jobs of the incidents on CPU/gloo —
FSDP2 x TP on a 2 x 2 DeviceMesh and a 2-stage pipeline (examples/python/train_mesh.py) — as 4
ranks on two simulated hosts (ranks 0, 1 on host-a; 2, 3 on host-b), telemetry through one node
monitor per host to the job coordinator (detection_harness.Job), default detector settings. The
model code does not know about trainsup: trainsup.init_process_group tracks every group the mesh
and the pipeline create. Each fault scenario prints a "[measure]" line."""
import json
import signal
import time

import pytest

import detection_harness as dh

pytestmark = pytest.mark.skipif(not dh.available(), reason="trainsup_coordinator / trainsup_node_monitor not built")

ENDLESS = ["--steps", "1000000", "--step-sleep-ms", "20"]
FAULT_STEP = 40


def injected(tmp_path, rank, host, kind, timeout=120):
    """Waits until rank's event log shows the fault; returns the monotonic time it was seen."""
    deadline = time.monotonic() + timeout
    while not any(kind in p.read_text() for p in (tmp_path / "logs").glob(f"*-{host}-r{rank}.events.jsonl")):
        assert time.monotonic() < deadline, f"the fault {kind} was not injected"
        time.sleep(0.05)  # polls the event log; bounded by the deadline
    return time.monotonic()


def first_verdict(job, t0, limit):
    t, v = job.wait_for(lambda v: v["kind"] != "straggler", limit + 5)
    assert v is not None, job.verdicts
    return t - t0, v


def fault(tmp_path, kind, rank, host, extra=()):
    """Runs train_mesh.py with fault `kind` on `rank` (on `host`) at FAULT_STEP; returns the
    seconds from the fault to the first verdict, that verdict, and every verdict by then."""
    job = dh.Job(tmp_path, ENDLESS + list(extra) + ["--fault", kind, "--fault-rank", str(rank),
                                                    "--fault-step", str(FAULT_STEP)], script=dh.TRAIN_MESH)
    try:
        t0 = injected(tmp_path, rank, host, kind)
        took, v = first_verdict(job, t0, 10)
        return took, v, [x for _, x in job.all_verdicts()]
    finally:
        job.close()


def test_mesh_rank_that_never_enters_a_tp_allreduce_is_named_with_its_group(tmp_path):
    # Rank 3 (host-b) has all-gathered its FSDP shards and sleeps before the row-parallel
    # layer's tp all-reduce, heart-beating; rank 2 waits in that all-reduce, rank 1 (its dp
    # peer) in the step's reduce-scatter: the coordinator names rank 3, the group and the op.
    took, v, verdicts = fault(tmp_path, "tp_never_enters", 3, "host-b")
    print(f"[measure] mesh tp_never_enters: {v['kind']} ranks {v['ranks']} group {v['group']} "
          f"{v['op']} #{v['seq']} {took:.2f} s after the fault")
    assert v["kind"] == "hung_rank", v
    assert v["ranks"] == [3] and v["hosts"] == ["host-b"], v
    # Its tp peer waits in the tp all-reduce; its dp peer, if it gets there first, in the
    # step's reduce-scatter: either names rank 3 with the group and op it never entered.
    assert (v["group"], v["op"]) in (("mesh_tp", "allreduce"), ("mesh_dp", "reduce_scatter")), v
    assert v["section"] == "forward", v
    assert took <= 10, (took, v)
    # Every verdict names rank 3 only (never a rank that is only waiting for it).
    assert all(x["ranks"] == [3] for x in verdicts), verdicts


def test_mesh_rank_that_issues_collectives_in_the_wrong_order_is_a_desync(tmp_path):
    took, v, _ = fault(tmp_path, "wrong_order", 1, "host-a")
    print(f"[measure] mesh wrong_order: {v['kind']} ranks {v['ranks']} {v['op']} vs {v['other_op']} "
          f"#{v['seq']} {took:.2f} s after the fault")
    assert v["kind"] == "desync", v
    assert v["ranks"] == [1] and v["hosts"] == ["host-a"], v
    assert v["op"].startswith("allreduce") and v["other_op"].startswith("broadcast"), v
    assert took <= 10, (took, v)


def test_pipeline_stage_that_never_sends_is_named_by_its_channel(tmp_path):
    # Stage 0 of pipeline (0, 1) sleeps before its send: rank 1 waits in a receive from it.
    took, v, _ = fault(tmp_path, "stall_before_send", 0, "host-a", ["--pipeline"])
    print(f"[measure] pipeline stall_before_send: {v['kind']} ranks {v['ranks']} {v['op']} "
          f"group {v['group']} {took:.2f} s after the fault")
    assert v["kind"] == "hung_rank", v
    assert v["ranks"] == [0] and v["hosts"] == ["host-a"], v
    assert took <= 10, (took, v)


def test_pipeline_rank_stopped_inside_the_recv_chain_is_named(tmp_path):
    job = dh.Job(tmp_path, ENDLESS + ["--pipeline"], script=dh.TRAIN_MESH)
    try:
        job.wait_for_log("step 0 ")
        time.sleep(2)  # training under way (not a synchronization: any point in the step will do)
        t0 = time.monotonic()
        job.ranks[3].send_signal(signal.SIGSTOP)  # stage 1 of pipeline (2, 3), on host-b
        took, v = first_verdict(job, t0, 10)
        print(f"[measure] pipeline SIGSTOP rank 3: {v['kind']} ranks {v['ranks']} {took:.2f} s after the signal")
        assert v["ranks"] == [3] and v["hosts"] == ["host-b"], v
        assert took <= 10, (took, v)
    finally:
        job.close()


@pytest.mark.parametrize("mode", ["mesh", "pipeline"])
def test_healthy_jittery_runs_raise_no_verdict(tmp_path, mode):
    # +-30% jitter on every rank's compute: 150 steps, every rank finishes, nobody is named.
    args = ["--steps", "150", "--step-sleep-ms", "20", "--jitter", "0.3"] + (["--pipeline"] if mode == "pipeline" else [])
    job = dh.Job(tmp_path, args, script=dh.TRAIN_MESH)
    try:
        codes = job.wait_ranks(240)
        assert codes == [0, 0, 0, 0], codes
        assert job.all_verdicts() == [], job.all_verdicts()
    finally:
        job.close()
    # Every record named a group its members had claimed, and none contradicted another.
    assert job.stopped is not None and job.stopped["records"] > 0, job.stopped
    assert job.stopped["unknown_group_records"] == 0 and job.stopped["bad_group_claims"] == 0, job.stopped
