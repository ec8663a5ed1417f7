#!/usr/bin/env python3
"""The DDP example's step time with trainsup (watchdog + collective tracker, no checkpoint due)
over the same script without trainsup, 2 gloo ranks on this machine, interleaved rounds,
median per variant; steady state (the first 50 steps, with DDP's bucket rebuild and start-up
skew between ranks, are not timed). Last line: one JSON object with "ddp_overhead_ratio"
(target <= 1.02).

    PYTHONPATH=build/bindings/python /usr/bin/python3 bench/ddp_overhead_bench.py [rounds] [steps]
"""
import json
import os
import re
import statistics
import subprocess
import sys

from trainsup.ports import free_port

HERE = os.path.dirname(os.path.abspath(__file__))
TRAIN = os.path.join(os.path.dirname(HERE), "examples", "python", "train_ddp.py")


def run(plain, steps, tmp):
    port = free_port()
    procs = []
    for rank in range(2):
        env = dict(os.environ, RANK=str(rank), WORLD_SIZE="2", LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE="2",
                   MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), TRAINSUP_LOG_DIR=os.path.join(tmp, "logs"),
                   TRAINSUP_CHECKPOINT_DIR=os.path.join(tmp, "ckpt"), TRAINSUP_LOG_STDERR="0",
                   OMP_NUM_THREADS="1", PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
        args = [sys.executable, TRAIN, "--steps", str(steps), "--hidden", "256"] + (["--plain"] if plain else [])
        procs.append(subprocess.Popen(args, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    outs = [p.communicate(timeout=600)[0] for p in procs]
    for p, o in zip(procs, outs):
        if p.returncode != 0:
            raise SystemExit(o)
    return float(re.search(r"step_time_s=([0-9.]+)", outs[0]).group(1))


def main():
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 6
    steps = int(sys.argv[2]) if len(sys.argv) > 2 else 400
    import tempfile
    with tempfile.TemporaryDirectory() as tmp:
        plain, supervised = [], []
        for r in range(rounds):
            order = [True, False] if r % 2 == 0 else [False, True]
            for is_plain in order:
                t = run(is_plain, steps, tmp)
                (plain if is_plain else supervised).append(t)
            print(f"round {r}: plain {plain[-1] * 1e3:.3f} ms/step, trainsup {supervised[-1] * 1e3:.3f} ms/step", flush=True)
        p, s = statistics.median(plain), statistics.median(supervised)
        print(json.dumps({"bench": "ddp_overhead", "ddp_overhead_ratio": round(s / p, 4), "plain_step_ms": round(p * 1e3, 4),
                          "trainsup_step_ms": round(s * 1e3, 4), "ranks": 2, "steps": steps, "rounds": rounds}))


if __name__ == "__main__":
    main()
