#!/usr/bin/env python3
"""The costs of a restart that grow with the number of hosts (issue 22): N simulated hosts on
this machine (N = 2, 4, 8, 16 by default), each a trainsup-run agent with one worker of the
demo's job (examples/python/train_ddp.py, DDP on gloo, in-memory snapshots every 5 steps, disk
at its default interval). Once every host trains, the last host's worker is killed (SIGKILL);
the job restarts every worker from the newest snapshot, as the demo does. Per N, from the event
logs (the same definitions as bench/recovery_bench.py):

  detect_s       fault -> the first fatal verdict
  stop_s         verdict -> every agent back in the rendezvous
  rendezvous_s   -> the next round formed on every host
  start_s        -> every worker's Supervisor started (warm workers: forked from the zygote)
  restore_s      -> every worker restored
  restart_s      verdict -> the first step of the resumed attempt
  coordinator_cpu_s_per_s  CPU time of the process that held the coordinator (an agent) per
                 second of training before the fault: the agent's and coordinator's load

All hosts share this machine's cores, so the figures at larger N include CPU contention: they
bound, from above, what separate hosts would see. The script fits each phase against N (linear
and logarithmic least squares), prints the fits and their extrapolation to 128, 512 and 2,048
hosts, and writes them as a JSON file that bench/goodput_model.py takes (--scale-json).

Last line: {"bench": "scale", "hosts": [...], "rows": [...], "fits": {...}}

    PYTHONPATH=build/bindings/python .venv/bin/python bench/scale_bench.py [--hosts 2,4,8,16]
        [--out scale.json]
"""
import argparse
import importlib.util
import json
import math
import os
import pathlib
import signal
import sys
import tempfile
import time

REPO = pathlib.Path(__file__).resolve().parent.parent
_spec = importlib.util.spec_from_file_location("recovery_scenario", REPO / "examples" / "launch" / "recovery_scenario.py")
scenario = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(scenario)

PHASES = ("detect_s", "stop_s", "rendezvous_s", "start_s", "restore_s", "restart_s")


def cpu_s(pid):
    """User + system CPU seconds of a process so far."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def one(workdir, n):
    hosts = [f"h{i:02d}" for i in range(n)]
    # MIN = N - 1: if the killed worker's host is quarantined, the others go on without it.
    c = scenario.Cluster(workdir, f"{n - 1}:{n}", 100000, snapshot_every=5)
    try:
        for h in hosts:
            c.start(h)
        c.wait_until(lambda: all(c.training_at(h, 30) for h in hosts), 600, "training on every host")
        elected = max((e for h in hosts for e in c.agent_events(h) if e["event"] == "coordinator_elected"),
                      key=lambda e: e["time"])["host"]
        agent_pid = c.agents[elected].pid
        t0, cpu0 = time.monotonic(), cpu_s(agent_pid)
        time.sleep(5)  # the window in which the coordinator's agent's CPU time is measured
        coordinator_cpu = (cpu_s(agent_pid) - cpu0) / (time.monotonic() - t0)
        victim = hosts[-1]
        pid = c.worker_pid(victim)
        fault = time.time()
        os.kill(pid, signal.SIGKILL)

        def back(h):
            return any(e["event"] == "first_step" and e["wall_s"] > fault for e in c.rank_events(h))

        def gone(h):  # quarantined: its agent leaves the job (it may keep serving the store a while)
            return c.agents[h].poll() is not None or any(e["event"] == "quarantined_exit" and e["time"] > fault
                                                         for e in c.agent_events(h))

        def resumed():
            return back(hosts[0]) and all(back(h) or gone(h) for h in hosts)
        c.wait_until(resumed, 300, "the job to resume on every host")
        agent = [e for h in hosts for e in c.agent_events(h)]
        ranks = [e for h in hosts for e in c.rank_events(h)]
    finally:
        c.kill_all()
        for h in hosts:  # Cluster.kill_all knows the demo's host names only
            for e in c.rank_events(h):
                if e["event"] == "supervisor_start":
                    try:
                        os.kill(e["pid"], signal.SIGKILL)
                    except (ProcessLookupError, PermissionError):
                        pass
    verdict = min(e["time"] for e in agent if e["event"] == "verdict" and e["time"] > fault)
    formed = [e for e in agent if e["event"] == "rendezvous" and e["time"] > verdict]
    next_round = min(e["round"] for e in formed)
    round_formed = max(e["time"] for e in formed if e["round"] == next_round)
    rejoined = max(verdict, max(e["time"] for e in agent if e["event"] == "rendezvous_join" and verdict < e["time"]
                                < round_formed))
    started = max(e["wall_s"] for e in ranks if e["event"] == "supervisor_start" and e["wall_s"] > fault)
    restored = max(e["wall_s"] for e in ranks if e["event"] == "checkpoint_restored" and e["wall_s"] > fault)
    resumed_hosts = sorted({e["host"] for e in ranks if e["event"] == "first_step" and e["wall_s"] > fault})
    first = max(min(e["wall_s"] for e in ranks if e["event"] == "first_step" and e["wall_s"] > fault
                    and e["host"] == h) for h in resumed_hosts)
    row = {"hosts": n, "detect_s": verdict - fault, "stop_s": rejoined - verdict, "rendezvous_s": round_formed - rejoined,
           "start_s": started - round_formed, "restore_s": restored - started, "restart_s": first - verdict,
           "coordinator_cpu_s_per_s": coordinator_cpu, "hosts_after": len(resumed_hosts),
           "verdict": next(e["kind"] for e in sorted(agent, key=lambda e: e["time"]) if e["event"] == "verdict"
                           and e["time"] > fault),
           "restored_tier": sorted({e.get("tier", "disk") for e in ranks if e["event"] == "checkpoint_restored"
                                    and e["wall_s"] > fault})}
    return {k: (round(v, 4) if isinstance(v, float) else v) for k, v in row.items()}


def fit(xs, ys, transform):
    """Least squares y = a + b * transform(x): (a, b)."""
    ts = [transform(x) for x in xs]
    mt, my = sum(ts) / len(ts), sum(ys) / len(ys)
    var = sum((t - mt) ** 2 for t in ts)
    b = sum((t - mt) * (y - my) for t, y in zip(ts, ys)) / var if var > 0 else 0.0
    return my - b * mt, b


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--hosts", default="2,4,8,16")
    p.add_argument("--out", default=None, help="also write the JSON here (for goodput_model.py --scale-json)")
    a = p.parse_args()
    sizes = [int(x) for x in a.hosts.split(",")]
    rows = []
    for n in sizes:
        with tempfile.TemporaryDirectory() as d:
            row = one(pathlib.Path(d), n)
        rows.append(row)
        print("  " + ", ".join(f"{k} {v}" for k, v in row.items()), flush=True)
    fits = {}
    for k in PHASES + ("coordinator_cpu_s_per_s",):
        ys = [r[k] for r in rows]
        lin = fit(sizes, ys, float)
        log = fit(sizes, ys, math.log2)
        fits[k] = {"linear": {"a": round(lin[0], 5), "b_per_host": round(lin[1], 6)},
                   "log2": {"a": round(log[0], 5), "b_per_doubling": round(log[1], 5)},
                   "at": {str(h): {"linear": round(lin[0] + lin[1] * h, 3), "log2": round(log[0] + log[1] * math.log2(h), 3)}
                          for h in (128, 512, 2048)}}
        print(f"  {k}: linear {lin[0]:.3f} + {lin[1]:.4f} x hosts, log {log[0]:.3f} + {log[1]:.3f} x log2(hosts); "
              f"at 2048 hosts: linear {fits[k]['at']['2048']['linear']}, log {fits[k]['at']['2048']['log2']}")
    # "points" and "measured_hosts" are what bench/goodput_model.py --scale-json reads (the demo's
    # incident measurement has 2 hosts after the fault).
    out = {"bench": "scale", "hosts": sizes, "rows": rows, "points": rows, "measured_hosts": 2, "fits": fits,
           "note": "simulated hosts share 2 cores: larger N includes CPU contention (an upper bound)"}
    if a.out:
        with open(a.out, "w") as f:
            json.dump(out, f, indent=1)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
