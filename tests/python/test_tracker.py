"""trainsup.init_process_group puts the collective tracker in the path of every collective of
the default group, including DDP's bucketed all-reduces issued from C++."""
import json
import os
import socket
import subprocess
import sys

import pytest

import trainsup

HERE = os.path.dirname(os.path.abspath(__file__))


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.skipif(not trainsup.distributed.tracking_available(), reason="tracking module not built for this torch")
def test_tracker_counts_every_ddp_allreduce(tmp_path):
    world, steps = 2, 6
    port = _free_port()
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
