#!/usr/bin/env python3
"""What in-memory snapshots cost a training (issue 22, docs/snapshots.md), measured side by side
in one run:

1. Step time. The demo's job (examples/python/train_ddp.py, DDP on gloo, ~20 ms steps, hidden
   256) on two simulated hosts, each under its own trainsup-run agent, with in-memory snapshots
   every N steps (held by the agents, copied to the peer host) and without; the disk at its
   default 10-minute interval in both. Interleaved rounds, the median of each variant's
   steady-state step time (train_ddp.py's step_time_s: the steps after the first 50). Goal:
   ratio <= 1.05.
2. The stall. One process, a state of S MiB of float32 tensors: the time the training thread
   is held by a snapshot (the "stall_s" of its checkpoint_snapshot event) over the time of one
   copy of the same bytes into a preallocated, already-touched buffer (torch's Tensor.copy_,
   which uses as many threads as the snapshot's copy), for both snapshot modes: blocking (the
   stall is collecting the state in Python, and the copy into staging memory) and overlapped
   (the copy runs beside the step's compute; the stall is collecting plus any wait for the copy
   in await_snapshot). Goal: ratio <= 1 (the stall is no more than a memcpy of the state).

Last line: {"bench": "snapshots", "step_time_ratio": ..., "stall_over_memcpy": {...}, ...}

    PYTHONPATH=build/bindings/python .venv/bin/python bench/snapshot_bench.py [--rounds 3]
        [--steps 400] [--every 5] [--sizes-mib 64,256]
"""
import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TRAIN = os.path.join(REPO, "examples", "python", "train_ddp.py")


def step_time(tmp, steps, every):
    """One run of the two-host job; rank 0's steady-state step time."""
    from trainsup.ports import free_port
    port = free_port()
    shm = f"/dev/shm/trainsup-bench-{port}"
    env = dict(os.environ, OMP_NUM_THREADS="1", TRAINSUP_LOG_DIR=os.path.join(tmp, "logs"), TRAINSUP_LOG_STDERR="0",
               TRAINSUP_CHECKPOINT_DIR=os.path.join(tmp, "ckpt"), TRAINSUP_SNAPSHOT_MEMORY=shm,
               PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    if every:
        env["TRAINSUP_SNAPSHOT_EVERY_STEPS"] = str(every)
    agents = []
    try:
        for host in ("host-a", "host-b"):
            cmd = [sys.executable, "-m", "trainsup.run", "--nnodes=2", "--nproc_per_node=1", "--rdzv_backend=c10d",
                   f"--rdzv_endpoint=127.0.0.1:{port}", f"--rdzv_id=bench{port}", "--run-dir",
                   os.path.join(tmp, "run"), TRAIN, "--steps", str(steps), "--hidden", "256", "--step-sleep-ms", "20"]
            agents.append(subprocess.Popen(cmd, env=dict(env, TRAINSUP_NODE_NAME=host), stdout=subprocess.PIPE,
                                           stderr=subprocess.STDOUT, text=True))
        outs = [a.communicate(timeout=600)[0] for a in agents]
    finally:
        for a in agents:
            if a.poll() is None:
                a.kill()
        shutil.rmtree(shm, ignore_errors=True)
    for a, o in zip(agents, outs):
        if a.returncode != 0:
            raise SystemExit(o[-3000:])
    found = re.findall(r"step_time_s=([0-9.]+)", "".join(outs))
    if not found:
        raise SystemExit("no step_time_s in the output:\n" + outs[0][-3000:])
    committed = 0
    logs = os.path.join(tmp, "logs")
    for name in os.listdir(logs):
        if name.endswith(".events.jsonl"):
            with open(os.path.join(logs, name)) as f:
                committed += sum(1 for line in f if '"event":"snapshot_committed"' in line)
    return float(found[0]), committed


def stall_vs_memcpy(size_mib, reps, tmp, mode):
    """(median stall s, median memcpy s, snapshots) for a state of size_mib MiB; `mode` is the
    snapshot mode (TRAINSUP_CHECKPOINT_SNAPSHOT): blocking, or overlapped with a step's compute
    (awaited, as guard_optimizer does, before the state would change)."""
    import torch
    import trainsup
    n = size_mib * (1 << 20) // 4 // 8
    state = {f"t{i}": torch.randn(n) for i in range(8)}
    os.environ.update(TRAINSUP_LOG_DIR=os.path.join(tmp, "stall-logs"), TRAINSUP_LOG_STDERR="0",
                      TRAINSUP_CHECKPOINT_DIR=os.path.join(tmp, "stall-ckpt"))
    stalls, copies = [], []
    dst = {k: torch.empty_like(v) for k, v in state.items()}
    for v in dst.values():
        v.fill_(0)  # touched: no page faults in the copy timed
    shm = tempfile.mkdtemp(prefix="trainsup-stall-", dir="/dev/shm")
    try:
        with trainsup.Supervisor(snapshot_every_steps=1, snapshot_dir=shm, snapshot_replicas=0,
                                 checkpoint_interval_s=0, checkpoint_snapshot=mode,
                                 job_id=f"stall{size_mib}{mode}") as sup:
            for step in range(1, reps + 2):
                sup.maybe_checkpoint(step, state)
                time.sleep(0.05 + size_mib / 2000)  # a step's compute: the copy and the persist run meanwhile
                sup.await_snapshot()
                t0 = time.perf_counter()
                for k, v in state.items():
                    dst[k].copy_(v)
                copies.append(time.perf_counter() - t0)
            log = sup.event_log
        with open(log) as f:
            events = [json.loads(line) for line in f]
        stalls = [e["stall_s"] for e in events if e["event"] == "checkpoint_snapshot"]
    finally:
        shutil.rmtree(shm, ignore_errors=True)
    # The first snapshot also allocates (and faults in) the staging memory: steady state only.
    return statistics.median(stalls[1:]), statistics.median(copies[1:]), len(stalls)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--steps", type=int, default=400)
    p.add_argument("--every", type=int, default=5)
    p.add_argument("--sizes-mib", default="64,256")
    p.add_argument("--reps", type=int, default=7)
    a = p.parse_args()
    times = {"off": [], "on": []}
    commits = []
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(a.rounds):
            for variant in ("off", "on"):
                t, c = step_time(os.path.join(tmp, f"{variant}{r}"), a.steps, a.every if variant == "on" else 0)
                times[variant].append(t)
                if variant == "on":
                    commits.append(c)
                print(f"  round {r} snapshots {variant}: step {t * 1000:.2f} ms" +
                      (f", {c} snapshot commits (all ranks)" if variant == "on" else ""), flush=True)
        stalls = {}
        for size in (int(s) for s in a.sizes_mib.split(",") if s):
            for mode in ("blocking", "overlapped"):
                stall, copy, n = stall_vs_memcpy(size, a.reps, tmp, mode)
                stalls[f"{size}MiB.{mode}"] = {"stall_s": round(stall, 5), "memcpy_s": round(copy, 5),
                                               "ratio": round(stall / copy, 3), "snapshots": n}
                print(f"  {size} MiB, {mode}: stall {stall * 1000:.1f} ms, memcpy {copy * 1000:.1f} ms, "
                      f"ratio {stall / copy:.2f}", flush=True)
    off, on = statistics.median(times["off"]), statistics.median(times["on"])
    print(json.dumps({"bench": "snapshots", "step_time_ratio": round(on / off, 4),
                      "step_s": {"off": round(off, 6), "on": round(on, 6)},
                      "step_s_ranges": {k: [round(min(v), 6), round(max(v), 6)] for k, v in times.items()},
                      "snapshot_every_steps": a.every, "snapshot_commits": commits, "rounds": a.rounds,
                      "stall_over_memcpy": stalls,
                      "goals": {"step_time_le_1.05x": on / off <= 1.05,
                                "stall_le_memcpy_overlapped": all(s["ratio"] <= 1.0 for k, s in stalls.items()
                                                                  if k.endswith("overlapped")),
                                "stall_le_memcpy_blocking": all(s["ratio"] <= 1.0 for k, s in stalls.items()
                                                                if k.endswith("blocking"))}}))


if __name__ == "__main__":
    main()
