#!/usr/bin/env python3
"""What the warm-worker zygote's gc.freeze() does to a worker's steady state (issue 22,
docs/snapshots.md "Warm workers"), measured side by side in one run.

The zygote (trainsup/launch/zygote.py) imports its module list with collection off, then calls
gc.freeze(), so the ~290,000 objects of torch & co. sit in the permanent generation: a worker's
collections never walk them, and never write to their copy-on-write pages. The cost side: in
CPython 3.11 a full collection comes once the objects that survived the younger generations
reach a quarter of those already in the oldest one; with torch's objects frozen that "already
there" count is small, so full collections come more often (each cheap). This bench measures
the sum.

One parent process imports the zygote's list (DEFAULT_IMPORTS) with collection off, as the
zygote does. Each round it forks two workers, one with the imports frozen (gc.freeze() before
the fork) and one without (gc.unfreeze() before the fork; order alternated by round). Each
worker turns collection on and trains the same model for --steps steps: an MLP (hidden
--hidden) with Adam on batches of 64, plus the Python objects a training loop keeps: a dict
of metrics per step appended to a history list (kept to the end), and an input pipeline's
queue of --queue batches, each a list of 64 per-sample dicts, that lives a few steps (objects
that survive the young generations, then die in the old one, as a DataLoader's prefetched
samples do). With --collect-every N the loop also calls gc.collect() every N steps, as loops
that manage collection themselves do (Megatron-LM's --manual-gc).

In a loop whose live objects do not grow, CPython's automatic collection (3.11: a full one only
once the survivors reach a quarter of the old generation) may never walk the old generation,
frozen or not; --collect-every shows the cost where it does. Per worker: median and p99 step time, the total time spent in collections
(gc.callbacks) with the count of full ones, and the memory the worker wrote to pages it shares
with the parent (Private_Dirty of /proc/self/smaps_rollup, after the loop, minus at its start).

Last line: {"bench": "zygote_gc", "ratios_frozen_over_unfrozen": {...}, "frozen": {...},
"unfrozen": {...}, ...} with per-variant medians over rounds and [min, max] ranges.

    PYTHONPATH=build/bindings/python .venv/bin/python bench/zygote_gc_bench.py [--rounds 5]
        [--steps 3000] [--hidden 256] [--queue 32]
        [--collect-every N]
"""
import argparse
import collections
import gc
import importlib
import json
import os
import statistics
import sys
import time


def private_dirty_kib():
    with open("/proc/self/smaps_rollup") as f:
        for line in f:
            if line.startswith("Private_Dirty:"):
                return int(line.split()[1])
    return 0


def worker(steps, hidden, queue_len, collect_every, out_fd):
    import torch
    import torch.nn as nn

    dirty0 = private_dirty_kib()
    gc_s = [0.0]
    full = [0]
    started = [0.0]

    def on_gc(phase, info):
        if phase == "start":
            started[0] = time.perf_counter()
        else:
            gc_s[0] += time.perf_counter() - started[0]
            if info["generation"] == 2:
                full[0] += 1

    gc.callbacks.append(on_gc)
    gc.enable()  # as the zygote's worker does (trainsup/launch/zygote.py _become_worker)
    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = nn.Sequential(nn.Linear(64, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU(), nn.Linear(hidden, 1))
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    history = []
    queue = collections.deque(maxlen=queue_len)  # the oldest batch leaves as a new one comes
    times = []
    for step in range(steps):
        t0 = time.perf_counter()
        queue.append([{"index": step * 64 + i, "source": ("shard", step % 7), "tokens": [i, step]} for i in range(64)])
        x = torch.randn(64, 64)
        loss = ((model(x) - x.sum(dim=1, keepdim=True) * 0.1) ** 2).mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        history.append({"step": step, "loss": loss.item(), "lr": opt.param_groups[0]["lr"], "t": t0})
        if collect_every and step % collect_every == collect_every - 1:
            gc.collect()  # a loop that collects on its own schedule (Megatron-LM's --manual-gc)
        times.append(time.perf_counter() - t0)
    gc.callbacks.remove(on_gc)
    times.sort()
    res = {"step_ms_median": statistics.median(times) * 1e3, "step_ms_p99": times[int(0.99 * (len(times) - 1))] * 1e3,
           "gc_s": gc_s[0], "full_collections": full[0], "dirtied_mib": (private_dirty_kib() - dirty0) / 1024,
           "loop_s": sum(times)}
    os.write(out_fd, json.dumps(res).encode())
    os.close(out_fd)
    os._exit(0)


def run_one(frozen, steps, hidden, queue_len, collect_every):
    if frozen:
        gc.freeze()
    else:
        gc.unfreeze()
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        try:
            worker(steps, hidden, queue_len, collect_every, w)
        finally:
            os._exit(1)
    os.close(w)
    with os.fdopen(r, "rb") as f:
        data = f.read()
    _, status = os.waitpid(pid, 0)
    if status != 0 or not data:
        raise SystemExit(f"zygote_gc_bench: the {'frozen' if frozen else 'unfrozen'} worker failed (status {status})")
    return json.loads(data)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--steps", type=int, default=3000)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--queue", type=int, default=32, help="batches of per-sample dicts alive at once")
    ap.add_argument("--collect-every", type=int, default=0, help="gc.collect() every N steps (0: only automatic)")
    args = ap.parse_args()

    from trainsup.launch.zygote import DEFAULT_IMPORTS

    gc.disable()  # as the zygote imports (zygote.serve)
    t0 = time.perf_counter()
    for name in filter(None, os.environ.get("TRAINSUP_WARM_IMPORTS", DEFAULT_IMPORTS).split(",")):
        importlib.import_module(name.strip())
    tracked = len(gc.get_objects())
    print(f"imported in {time.perf_counter() - t0:.2f} s; {tracked} objects tracked by the collector", flush=True)

    rows = {"frozen": [], "unfrozen": []}
    for rnd in range(args.rounds):
        order = ("frozen", "unfrozen") if rnd % 2 == 0 else ("unfrozen", "frozen")
        for variant in order:
            res = run_one(variant == "frozen", args.steps, args.hidden, args.queue, args.collect_every)
            rows[variant].append(res)
            print(f"round {rnd} {variant:8s}: step {res['step_ms_median']:.3f} ms (p99 {res['step_ms_p99']:.3f}), "
                  f"gc {res['gc_s'] * 1e3:.1f} ms with {res['full_collections']} full, "
                  f"loop {res['loop_s']:.2f} s, dirtied {res['dirtied_mib']:.1f} MiB", flush=True)
    keys = ("step_ms_median", "step_ms_p99", "gc_s", "full_collections", "dirtied_mib", "loop_s")
    summary = {v: {k: round(statistics.median(r[k] for r in rows[v]), 4) for k in keys} for v in rows}
    ranges = {v: {k: [round(min(r[k] for r in rows[v]), 4), round(max(r[k] for r in rows[v]), 4)] for k in keys}
              for v in rows}

    def ratio(k):
        u = summary["unfrozen"][k]
        return round(summary["frozen"][k] / u, 4) if u else None

    print(json.dumps({"bench": "zygote_gc", "rounds": args.rounds, "steps": args.steps, "hidden": args.hidden,
                      "queue": args.queue, "collect_every": args.collect_every,
                      "objects_imported": tracked,
                      "ratios_frozen_over_unfrozen": {k: ratio(k) for k in ("step_ms_median", "step_ms_p99", "gc_s",
                                                                             "dirtied_mib", "loop_s")},
                      "frozen": summary["frozen"], "unfrozen": summary["unfrozen"], "ranges": ranges}))


if __name__ == "__main__":
    sys.exit(main())
