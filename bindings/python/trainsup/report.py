"""`trainsup report RUN_DIR [--logs DIR] [--html FILE]`: what happened to a job and what it cost.

Reads the launcher's agent event logs (RUN_DIR/agent-*.events.jsonl), the ranks' event logs
(--logs, default RUN_DIR/../logs or TRAINSUP_LOG_DIR) and fault markers a harness may leave
(RUN_DIR/faults.jsonl: {"event": "fault_injected", "time", "host", "kind"}). Prints a timeline
(fault, verdict, quarantine, abort, rendezvous, restore, first step after resume) and, per
incident, the time lost split into detection (fault -> verdict), replay (work since the restored
checkpoint's step was snapshotted, done again) and restart (verdict -> first step after resume), then the
run's ETTR: productive time over wall time. Writes an HTML page with an SVG timeline (one lane
per host) that a person would rather look at than read.
"""
import argparse
import glob
import html
import json
import os
import sys


def _events(path):
    out = []
    try:
        with open(path) as f:
            for line in f:
                line = line.strip()
                if line:
                    try:
                        out.append(json.loads(line))
                    except ValueError:
                        pass  # a torn last line of a crashed writer
    except OSError:
        pass
    return out


def load(run_dir, logs_dir=None):
    agents = [e for p in sorted(glob.glob(os.path.join(run_dir, "agent-*.events.jsonl"))) for e in _events(p)]
    if logs_dir is None:
        guess = os.path.join(os.path.dirname(os.path.abspath(run_dir)), "logs")
        logs_dir = os.environ.get("TRAINSUP_LOG_DIR") or guess
    ranks = [e for p in sorted(glob.glob(os.path.join(logs_dir, "*.events.jsonl"))) for e in _events(p)]
    for e in ranks:
        e["time"] = e.get("wall_s", 0.0)
    faults = _events(os.path.join(run_dir, "faults.jsonl"))
    return agents, ranks, faults


def analyse(agents, ranks, faults):
    """Incidents (one per round with a verdict: the first one in it) and totals."""
    everything = agents + ranks + faults
    if not everything:
        raise ValueError("no events found")
    start = min(e["time"] for e in everything)
    end = max(e["time"] for e in everything)
    verdicts = sorted((e for e in agents if e["event"] == "verdict"), key=lambda e: e["time"])
    firsts = sorted((e for e in ranks if e["event"] == "first_step"), key=lambda e: e["time"])
    restores = sorted((e for e in ranks if e["event"] == "checkpoint_restored"), key=lambda e: e["time"])
    # The work a restore throws away starts at the step the checkpoint holds: its snapshot (the
    # commit may even come after the fault, when the persist finishes); older logs: its commit.
    snapshots = [e for e in ranks if e["event"] in ("checkpoint_snapshot", "checkpoint_committed")]
    incidents = []
    seen_rounds = set()
    for v in verdicts:
        if v.get("round") in seen_rounds:
            continue
        seen_rounds.add(v.get("round"))
        fault = max((f["time"] for f in faults if f["time"] <= v["time"]), default=None)
        resumed = next((f["time"] for f in firsts if f["time"] > v["time"]), None)
        restored = next((r for r in restores if r["time"] > v["time"]), None)
        saved = None
        if restored is not None:
            saved = min((c["time"] for c in snapshots if c.get("step") == restored["step"] and c["time"] <= v["time"]),
                            default=None)
        t_fault = fault if fault is not None else v["time"]
        inc = {
            "round": v.get("round"), "verdict": v["kind"], "hosts": v.get("hosts", []), "section": v.get("section", ""),
            "fault_time": fault, "verdict_time": v["time"], "resumed_time": resumed,
            "restored_step": restored["step"] if restored else None,
            "detection_s": (v["time"] - fault) if fault is not None else None,
            "replay_s": (t_fault - saved) if saved is not None else None,
            "restart_s": (resumed - v["time"]) if resumed is not None else None,
        }
        inc["lost_s"] = sum(x for x in (inc["detection_s"], inc["replay_s"], inc["restart_s"]) if x is not None)
        incidents.append(inc)
    wall = end - start
    lost = sum(i["lost_s"] for i in incidents)
    return {"start": start, "end": end, "wall_s": wall, "lost_s": lost,
            "ettr": (wall - lost) / wall if wall > 0 else 1.0, "incidents": incidents}


TIMELINE_AGENT = {"rendezvous", "coordinator_elected", "coordinator_takeover", "verdict", "quarantine",
                  "quarantined_exit", "worker_failure", "restart", "give_up", "agent_lost", "rendezvous_evicted"}
TIMELINE_RANK = {"abort_ordered", "stall", "exit", "checkpoint_restored", "first_step"}


def timeline(agents, ranks, faults):
    rows = [e for e in agents if e["event"] in TIMELINE_AGENT]
    rows += [e for e in ranks if e["event"] in TIMELINE_RANK]
    rows += faults
    return sorted(rows, key=lambda e: e["time"])


def _describe(e):
    keys = ("round", "kind", "hosts", "section", "quarantined_host", "error_class", "restarts", "code", "step",
            "verdict", "culprit_host", "group_world", "reason", "lost_host", "silent_s", "evicted_host")
    return " ".join(f"{k}={e[k]}" for k in keys if k in e and e[k] not in ("", None, []))


def text_report(a, rows):
    out = []
    t0 = a["start"]
    out.append(f"run: {a['wall_s']:.1f} s wall, {len(a['incidents'])} incident(s), "
               f"{a['lost_s']:.1f} s lost, ETTR {a['ettr']:.3f}")
    out.append("\ntimeline (s from the start)")
    for e in rows:
        who = e.get("host", "?") + (f" rank {e['rank']}" if "rank" in e and "wall_s" in e else "")
        out.append(f"  {e['time'] - t0:9.2f}  {who:<16} {e['event']:<22} {_describe(e)}")
    for n, i in enumerate(a["incidents"], 1):
        fmt = lambda x: "?" if x is None else f"{x:.2f} s"  # noqa: E731
        out.append(f"\nincident {n} (round {i['round']}): {i['verdict']} on {', '.join(i['hosts'])}"
                   + (f" in section '{i['section']}'" if i["section"] else ""))
        out.append(f"  detection {fmt(i['detection_s'])}, replay since the checkpoint {fmt(i['replay_s'])} "
                   f"(resumed from step {i['restored_step']}), restart {fmt(i['restart_s'])}: "
                   f"{i['lost_s']:.2f} s lost")
    return "\n".join(out)


COLORS = {"verdict": "#d62728", "quarantine": "#9467bd", "quarantined_exit": "#9467bd", "fault_injected": "#000000",
          "abort_ordered": "#ff7f0e", "exit": "#ff7f0e", "rendezvous": "#1f77b4", "checkpoint_restored": "#2ca02c",
          "first_step": "#2ca02c", "restart": "#8c564b", "give_up": "#7f7f7f", "worker_failure": "#e377c2",
          "stall": "#d62728", "coordinator_elected": "#17becf", "coordinator_takeover": "#17becf",
          "agent_lost": "#d62728", "rendezvous_evicted": "#1f77b4"}


def html_report(a, rows, text):
    hosts = sorted({e.get("host", "?") for e in rows})
    width, lane, left = 1000, 46, 90
    height = 40 + lane * len(hosts) + 30
    t0, span = a["start"], max(a["wall_s"], 1e-6)
    x = lambda t: left + (t - t0) / span * (width - left - 20)  # noqa: E731
    svg = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" font-family="sans-serif" '
           f'font-size="11">']
    for n, h in enumerate(hosts):
        y = 30 + n * lane
        svg.append(f'<text x="5" y="{y + 22}">{html.escape(h)}</text>')
        svg.append(f'<line x1="{left}" y1="{y + 18}" x2="{width - 20}" y2="{y + 18}" stroke="#ccc"/>')
    for i in a["incidents"]:
        if i["fault_time"] is not None and i["resumed_time"] is not None:
            svg.append(f'<rect x="{x(i["fault_time"]):.1f}" y="20" width="{x(i["resumed_time"]) - x(i["fault_time"]):.1f}" '
                       f'height="{lane * len(hosts) + 10}" fill="#d62728" opacity="0.08"/>')
    for e in rows:
        y = 30 + hosts.index(e.get("host", "?")) * lane
        color = COLORS.get(e["event"], "#555")
        title = html.escape(f"{e['time'] - t0:.2f} s {e['event']} {_describe(e)}")
        svg.append(f'<circle cx="{x(e["time"]):.1f}" cy="{y + 18}" r="5" fill="{color}"><title>{title}</title></circle>')
    for k in range(11):
        t = t0 + span * k / 10
        svg.append(f'<text x="{x(t):.1f}" y="{height - 8}" text-anchor="middle">{t - t0:.0f} s</text>')
    svg.append("</svg>")
    legend = " ".join(f'<span style="color:{c}">&#9679;</span> {k}' for k, c in COLORS.items())
    return ("<!doctype html><meta charset=utf-8><title>trainsup report</title>"
            f"<h1>trainsup run: ETTR {a['ettr']:.3f}</h1><p>{len(a['incidents'])} incident(s), "
            f"{a['lost_s']:.1f} s lost of {a['wall_s']:.1f} s (hover a dot for the event)</p>"
            + "\n".join(svg) + f"<p>{legend}</p><pre>{html.escape(text)}</pre>")


def main(argv=None):
    p = argparse.ArgumentParser(prog="trainsup report", description=__doc__.split("\n")[0])
    p.add_argument("run_dir")
    p.add_argument("--logs", default=None, help="the ranks' TRAINSUP_LOG_DIR (default: RUN_DIR/../logs)")
    p.add_argument("--html", default=None, help="where to write the HTML timeline (default RUN_DIR/report.html)")
    args = p.parse_args(argv)
    agents, ranks, faults = load(args.run_dir, args.logs)
    if not agents and not ranks:
        print(f"trainsup report: no event logs in {args.run_dir} (nor in the ranks' log dir)", file=sys.stderr)
        return 1
    a = analyse(agents, ranks, faults)
    rows = timeline(agents, ranks, faults)
    text = text_report(a, rows)
    print(text)
    path = args.html or os.path.join(args.run_dir, "report.html")
    with open(path, "w") as f:
        f.write(html_report(a, rows, text))
    print(f"\nHTML timeline: {path}")
    print(json.dumps({"ettr": round(a["ettr"], 4), "lost_s": round(a["lost_s"], 3), "wall_s": round(a["wall_s"], 3),
                      "incidents": [{k: (round(v, 3) if isinstance(v, float) else v) for k, v in i.items()}
                                    for i in a["incidents"]]}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
