#!/usr/bin/env python3
"""FSDP2 x TP step time with trainsup (every process group tracked: the mesh's dp and tp groups
and the default one; watchdog; no checkpoint due) over the same script without trainsup:
examples/python/train_mesh.py, 4 gloo ranks on a 2 x 2 DeviceMesh on this machine, interleaved
rounds, median per variant; steady state (the first 20 steps are not timed). Last line: one JSON
object with "mesh_overhead_ratio" (issue 20's target: <= 1.02).

    PYTHONPATH=build/bindings/python .venv/bin/python bench/mesh_overhead_bench.py [rounds] [steps]
"""
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile

from trainsup.ports import free_port

HERE = os.path.dirname(os.path.abspath(__file__))
TRAIN = os.path.join(os.path.dirname(HERE), "examples", "python", "train_mesh.py")
WORLD = 4


def run(plain, steps, tmp):
    port = free_port()
    procs = []
    for rank in range(WORLD):
        env = dict(os.environ, RANK=str(rank), WORLD_SIZE=str(WORLD), LOCAL_RANK=str(rank),
                   LOCAL_WORLD_SIZE=str(WORLD), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
                   TRAINSUP_LOG_DIR=os.path.join(tmp, "logs"), TRAINSUP_LOG_STDERR="0", OMP_NUM_THREADS="1",
                   PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
        args = [sys.executable, TRAIN, "--steps", str(steps), "--tp", "2"] + (["--plain"] if plain else [])
        procs.append(subprocess.Popen(args, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    outs = [p.communicate(timeout=900)[0] for p in procs]
    for p, o in zip(procs, outs):
        if p.returncode != 0:
            raise SystemExit(o)
    return float(re.search(r"step_time_s=([0-9.]+)", outs[0]).group(1))


def main():
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 6
    steps = int(sys.argv[2]) if len(sys.argv) > 2 else 300
    with tempfile.TemporaryDirectory() as tmp:
        plain, supervised = [], []
        for r in range(rounds):
            order = [True, False] if r % 2 == 0 else [False, True]
            for is_plain in order:
                t = run(is_plain, steps, tmp)
                (plain if is_plain else supervised).append(t)
            print(f"round {r}: plain {plain[-1] * 1e3:.3f} ms/step, trainsup {supervised[-1] * 1e3:.3f} ms/step",
                  flush=True)
        p, s = statistics.median(plain), statistics.median(supervised)
        ratios = sorted(b / a for a, b in zip(plain, supervised))
        print(json.dumps({"bench": "mesh_overhead", "mesh_overhead_ratio": round(s / p, 4),
                          "round_ratio_range": [round(ratios[0], 4), round(ratios[-1], 4)],
                          "plain_step_ms": round(p * 1e3, 4), "trainsup_step_ms": round(s * 1e3, 4),
                          "ranks": WORLD, "mesh": "2x2 (dp, tp)", "steps": steps, "rounds": rounds}))


if __name__ == "__main__":
    main()
