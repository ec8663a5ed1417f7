"""`trainsup report` at the scale of the seed's incident: a generated month of a 512-host job.

    PYTHONPATH=build/bindings/python .venv/bin/python bench/report_month.py [--dir DIR] [--keep]

Writes a run directory as trainsup's agents and ranks would have left it after 30 days of a job of
512 hosts x 8 ranks (4,096 ranks) with checkpoints every 10 minutes and 40 incidents, 11 of them on
the same two hosts (h017: uncorrectable ECC six times, h342: five hangs), each culprit
quarantined and replaced by a spare (s00..), then times `trainsup report` on it (a process of its
own, as an operator runs it) and prints the sizes. The last line is one JSON object:
{"bench": "report_month", "report_s", "html_bytes", "events", ...}.

What is written (generate()): every agent's event log (agent_start, and per round: rendezvous,
the verdict and the restart as every agent logs them, the quarantine from the coordinator's
agent, the culprit's quarantined_exit); a fault marker per incident (as a harness leaves: real
faults leave none, and the report then counts no detection); rank 0's event log with every
checkpoint (checkpoint_snapshot with its stall, checkpoint_committed with its persist time),
and each restore and first step after a restart; the other 4,095 ranks' logs with their restores
and first steps only. (Real ranks log every checkpoint too: the report reads rank 0's logs only
past 64 rank logs, so their size does not matter to it.)
"""
import argparse
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time

DAY = 86400.0


def _line(e):
    return json.dumps(e, separators=(",", ":")) + "\n"


def generate(root, hosts=512, ranks_per_host=8, incidents=40, days=30, seed=1, checkpoint_every_s=600.0):
    """Writes <root>/run (agents) and <root>/logs (ranks); returns a summary of what it wrote."""
    rnd = random.Random(seed)
    run, logs = os.path.join(root, "run"), os.path.join(root, "logs")
    os.makedirs(run, exist_ok=True)
    os.makedirs(logs, exist_ok=True)
    t0 = 1_780_000_000.0
    end = t0 + days * DAY
    names = [f"h{i:03d}" for i in range(hosts)]
    # Incident times: spread over the month, at least an hour apart.
    times = sorted(rnd.uniform(t0 + 3600, end - 3600) for _ in range(incidents))
    for k in range(1, len(times)):
        times[k] = max(times[k], times[k - 1] + 3600)
    # Culprits: h017 (ECC) six times, h342 (hangs) five times, the rest on distinct other hosts.
    repeated = ["h017"] * 6 + ["h342"] * 5
    others = rnd.sample([h for h in names if h not in ("h000", "h017", "h342")], incidents - len(repeated))
    culprits = repeated + others
    rnd.shuffle(culprits)
    kinds = {"h017": "gpu_hardware", "h342": "hung_rank"}
    active = list(names)
    agent_lines = {h: [_line({"event": "agent_start", "time": t0, "host": h, "run_id": "llm-month"})] for h in names}
    rank0 = [_line({"event": "first_step", "wall_s": t0 + 30, "step": 0, "restart": 0, "rank": 0, "host": "h000"})]
    other_rank_lines = {}
    faults = []
    step_s = 1.0  # one step a second: the step number is the seconds trained
    saved_step, next_ckpt = 0, t0 + 30 + checkpoint_every_s
    spare = 0
    events = 0

    def rendezvous(rnd_no, at):
        for g, h in enumerate(active):
            agent_lines.setdefault(h, []).append(_line({"event": "rendezvous", "time": at + 0.001 * (g % 50), "host": h,
                                                        "round": rnd_no, "group_rank": g, "group_world": len(active)}))

    rendezvous(0, t0 + 20)
    step_at = lambda t: int((t - t0 - 30) / step_s)  # noqa: E731  (no time lost in this approximation)
    for k, (tf, culprit) in enumerate(zip(times, culprits)):
        while next_ckpt < tf:  # the checkpoints before this fault
            st = step_at(next_ckpt)
            rank0.append(_line({"event": "checkpoint_snapshot", "wall_s": next_ckpt, "step": st, "stall_s":
                                round(rnd.uniform(0.15, 0.35), 3), "bytes": 2 << 30, "mode": "overlapped",
                                "restart": k, "rank": 0, "host": "h000"}))
            rank0.append(_line({"event": "checkpoint_committed", "wall_s": next_ckpt + 25, "step": st, "persist_s":
                                round(rnd.uniform(18, 30), 2), "restart": k, "rank": 0, "host": "h000"}))
            saved_step = st
            next_ckpt += checkpoint_every_s
        if culprit not in active:
            # Back after its 24 h quarantine expired (as the incident's scheduler let it back):
            # it took a spare's place at an earlier restart.
            slot = max(i for i, h in enumerate(active) if h.startswith("s"))
            active[slot] = culprit
        kind = kinds.get(culprit) or rnd.choice(["silent_rank", "dead_rank", "hung_rank", "dead_host"])
        detection = rnd.uniform(3.0, 9.0)
        tv = tf + detection
        faults.append(_line({"event": "fault_injected", "time": tf, "host": culprit, "kind": kind}))
        coord = active[0] if active[0] != culprit else active[1]
        for g, h in enumerate(active):
            agent_lines[h].append(_line({"event": "verdict", "time": tv + 0.002 * (g % 100), "host": h, "round": k,
                                         "kind": kind, "hosts": [culprit], "ranks": [active.index(culprit) * ranks_per_host],
                                         "evidence": f"{kind} on {culprit} (generated)"}))
        agent_lines[coord].append(_line({"event": "quarantine", "time": tv + 0.01, "host": coord,
                                         "quarantined_host": culprit, "verdict": kind}))
        agent_lines[culprit].append(_line({"event": "quarantined_exit", "time": tv + 0.3, "host": culprit,
                                           "verdict": kind, "reason": f"{kind} (generated)"}))
        replacement = f"s{spare:02d}"
        spare += 1
        active[active.index(culprit)] = replacement
        agent_lines[replacement] = [_line({"event": "agent_start", "time": t0 + 10, "host": replacement,
                                           "run_id": "llm-month"})]
        restart_s = rnd.uniform(8.0, 40.0)
        for g, h in enumerate(active):
            if h != replacement:
                agent_lines[h].append(_line({"event": "restart", "time": tv + 0.5 + 0.002 * (g % 100), "host": h,
                                             "restarts": k + 1, "newest_checkpoint_step": saved_step,
                                             "restarts_without_progress": 0}))
        rendezvous(k + 1, tv + 2.0)
        t_restore, t_first = tv + restart_s - 3.0, tv + restart_s
        for r in range(hosts * ranks_per_host):
            h = active[r // ranks_per_host]
            restored = {"event": "checkpoint_restored", "wall_s": t_restore + 0.0001 * (r % 1000), "step": saved_step,
                        "restore_s": round(rnd.uniform(2.0, 3.0), 2), "restart": k + 1, "rank": r, "host": h}
            first = {"event": "first_step", "wall_s": t_first + 0.0001 * (r % 1000), "step": saved_step + 1,
                     "restart": k + 1, "rank": r, "host": h}
            if r == 0:
                rank0 += [_line(restored), _line(first)]
            else:
                other_rank_lines.setdefault((h, r), []).extend([_line(restored), _line(first)])
    while next_ckpt < end:
        st = step_at(next_ckpt)
        rank0.append(_line({"event": "checkpoint_snapshot", "wall_s": next_ckpt, "step": st,
                            "stall_s": round(rnd.uniform(0.15, 0.35), 3), "bytes": 2 << 30, "mode": "overlapped",
                            "restart": len(times), "rank": 0, "host": "h000"}))
        rank0.append(_line({"event": "checkpoint_committed", "wall_s": next_ckpt + 25, "step": st,
                            "persist_s": round(rnd.uniform(18, 30), 2), "restart": len(times), "rank": 0, "host": "h000"}))
        next_ckpt += checkpoint_every_s
    for h in active:
        agent_lines[h].append(_line({"event": "agent_stop", "time": end, "host": h}))
    for h, lines in agent_lines.items():
        with open(os.path.join(run, f"agent-{h}.events.jsonl"), "w") as f:
            f.writelines(lines)
        events += len(lines)
    with open(os.path.join(run, "faults.jsonl"), "w") as f:
        f.writelines(faults)
    with open(os.path.join(logs, "llm-month-h000-r0.events.jsonl"), "w") as f:
        f.writelines(rank0)
    events += len(rank0) + len(faults)
    for r in range(1, hosts * ranks_per_host):  # every rank has a log, as on the real job
        h = names[r // ranks_per_host]
        other_rank_lines.setdefault((h, r), [])
    for (h, r), lines in other_rank_lines.items():
        with open(os.path.join(logs, f"llm-month-{h}-r{r}.events.jsonl"), "w") as f:
            f.writelines(lines)
        events += len(lines)
    return {"hosts": hosts, "ranks": hosts * ranks_per_host, "incidents": len(times), "days": days,
            "events": events, "checkpoints": int((end - t0 - 30) // checkpoint_every_s),
            "agent_logs": len(agent_lines), "rank_logs": len(other_rank_lines) + 1}


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dir", default=None)
    p.add_argument("--keep", action="store_true")
    args = p.parse_args()
    root = args.dir or tempfile.mkdtemp(prefix="trainsup-month-")
    try:
        t = time.perf_counter()
        made = generate(root)
        gen_s = time.perf_counter() - t
        disk = sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(root) for f in fs)
        t = time.perf_counter()
        out = subprocess.run([sys.executable, "-m", "trainsup", "report", os.path.join(root, "run"), "--logs",
                              os.path.join(root, "logs")], capture_output=True, text=True, timeout=600)
        report_s = time.perf_counter() - t
        if out.returncode != 0:
            sys.exit(out.stderr[-2000:])
        summary = json.loads(out.stdout.strip().splitlines()[-1])
        html_bytes = os.path.getsize(os.path.join(root, "run", "report.html"))
        print("\n".join(out.stdout.splitlines()[:8]))
        print(f"generated {made['events']:,} events ({disk / 1e6:.0f} MB, {made['agent_logs']} agent logs, "
              f"{made['rank_logs']} rank logs) in {gen_s:.1f} s; trainsup report: {report_s:.2f} s, "
              f"HTML {html_bytes / 1e3:.0f} kB, ETTR {summary['ettr']}")
        print(json.dumps({"bench": "report_month", **made, "disk_bytes": disk, "generate_s": round(gen_s, 2),
                          "report_s": round(report_s, 2), "html_bytes": html_bytes, "ettr": summary["ettr"],
                          "goodput": summary["goodput"], "lost_by_cause_s": summary["lost_by_cause_s"],
                          "top_hosts": summary["hosts_by_incidents"][:3],
                          "dir": root if args.keep else None}))
    finally:
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
