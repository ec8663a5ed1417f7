"""trainsup.init_process_group puts the collective tracker in the path of every collective of
the default group, including DDP's bucketed all-reduces issued from C++."""
import json
import os
import subprocess
import sys

import pytest

import trainsup
from trainsup.ports import free_port

HERE = os.path.dirname(os.path.abspath(__file__))


def test_tracker_counts_every_ddp_allreduce(tmp_path):
    world, steps = 2, 6
    port = free_port()
    procs = []
    for rank in range(world):
        env = dict(os.environ, RANK=str(rank), WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1",
                   MASTER_PORT=str(port), PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
        procs.append(subprocess.Popen([sys.executable, os.path.join(HERE, "ddp_count_worker.py"), str(steps),
                                       str(tmp_path / "result")], env=env, stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT, text=True))
    for p in procs:
        out, _ = p.communicate(timeout=300)
        assert p.returncode == 0, out
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
    port = free_port()
    procs = []
    for rank in range(2):
        env = dict(os.environ, RANK=str(rank), WORLD_SIZE="2", MASTER_ADDR="127.0.0.1",
                   MASTER_PORT=str(port), PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
        procs.append(subprocess.Popen([sys.executable, os.path.join(HERE, "held_collective_worker.py")], env=env,
                                      stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True))
    r0, r1 = procs
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
        for p in procs:
            assert p.wait(timeout=60) == 0
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
