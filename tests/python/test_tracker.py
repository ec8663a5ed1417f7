"""trainsup.init_process_group puts the collective tracker in the path of every collective of
the default group, including DDP's bucketed all-reduces issued from C++."""
import json
import os
import subprocess
import sys

import pytest

import trainsup
from ranks import Ranks, python_path

HERE = os.path.dirname(os.path.abspath(__file__))


def test_tracker_counts_every_ddp_allreduce(tmp_path):
    world, steps = 2, 6
    with Ranks(world, [sys.executable, os.path.join(HERE, "ddp_count_worker.py"), str(steps),
                       str(tmp_path / "result")]) as job:
        for rc, out in job.communicate(timeout=300):
            assert rc == 0, out
    for rank in range(world):
        r = json.load(open(tmp_path / f"result.{rank}"))
        # DDP's own account of its buckets, against what passed through the wrapper.
        assert r["buckets_rebuilt"] > 1, r
        assert r["allreduce"] == r["expected_ddp"] + 1, r  # + the explicit dist.all_reduce
        assert r["broadcast"] >= 1, r  # DDP's initial module-state broadcast
        assert r["pending"] == 0, r
        assert r["last"]["op"] == "allreduce" and r["last"]["bytes"] == 16 and r["last"]["exit_ns"] >= r["last"]["enter_ns"]
        assert r["sum"] == [2.0] * 4


def test_collective_held_back_by_a_peer_stays_in_flight_until_it_finishes(tmp_path):
    """Completion is read from the work: an all-reduce that a peer has not joined is pending in
    the tracker however long it waits, and its recorded duration covers the wait."""
    job = Ranks(2, [sys.executable, os.path.join(HERE, "held_collective_worker.py")], stdin=subprocess.PIPE,
                stderr=None)
    r0, r1 = job.procs
    try:
        assert json.loads(r1.stdout.readline())["state"] == "waiting"
        assert json.loads(r0.stdout.readline())["state"] == "issued"
        r0.stdin.write("check\n")
        r0.stdin.flush()
        held = json.loads(r0.stdout.readline())
        assert held["state"] == "held"
        assert held["completed"] is False
        assert held["record"]["op"] == "allreduce" and held["record"]["bytes"] == 4096
        assert held["record"]["exit_ns"] == 0, held  # in flight while the peer holds it back
        assert held["pending"] == 1, held
        r1.stdin.write("go\n")
        r1.stdin.flush()
        done = json.loads(r0.stdout.readline())
        assert done["state"] == "done" and done["sum"] == 2.0
        rec = done["record"]
        assert rec["seq"] == held["record"]["seq"] and rec["ok"]
        assert rec["exit_ns"] - rec["enter_ns"] >= held["held_ns"], (rec, held)
        assert json.loads(r1.stdout.readline())["state"] == "done"
        for p in job.procs:
            assert p.wait(timeout=60) == 0
    finally:
        job.kill()


def test_releasing_the_wrapper_from_python_never_holds_the_gil_while_gloo_shuts_down(tmp_path):
    """The wrapper's destructor destroys the real backend; ~ProcessGroupGloo joins its worker
    threads, which may need the GIL to free a collective's tensors. Holding the GIL there
    deadlocked a rank of PyTorch's own DDP tests under trainsup (seen twice in CI)."""
    worker = os.path.join(os.path.dirname(os.path.abspath(__file__)), "backend_release_worker.py")
    env = dict(os.environ, PYTHONPATH=python_path(), OMP_NUM_THREADS="1")
    init = str(tmp_path / "init")
    procs = [subprocess.Popen([sys.executable, worker, str(r), init], env=env, stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for r in (0, 1)]
    try:
        out, err = procs[0].communicate(timeout=60)  # a deadlock never ends: this times out
    finally:
        procs[1].communicate("go\n", timeout=30)
        for p in procs:
            p.kill()
    assert procs[0].returncode == 0, err[-3000:]
    r = json.loads(out.strip().splitlines()[-1])
    print(f"[measure] wrapper released in {r['release_s']:.2f} s; a Python thread ticked {r['ticks']} times meanwhile")
    assert r["release_s"] > 1.0, r  # it did wait for gloo's worker (the all-reduce's 3 s timeout)...
    assert r["ticks"] > 100, r      # ...without the GIL: other Python threads ran
