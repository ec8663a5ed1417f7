"""`trainsup report RUN_DIR [--logs DIR] [--html FILE]`: what happened to a job and what it cost.

Reads the launcher's agent event logs (RUN_DIR/agent-*.events.jsonl), the ranks' event logs
(--logs, default RUN_DIR/../logs or TRAINSUP_LOG_DIR) and fault markers a harness may leave
(RUN_DIR/faults.jsonl: {"event": "fault_injected", "time", "host", "kind"}; without one, an
incident's fault time is the verdict's onset: verdict time - onset_s). Prints a timeline
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
import re
import sys
from typing import Any, Dict, List, Optional, Sequence, Tuple

from .. import names

__all__ = ["load", "analyse", "checkpoint_figures", "timeline", "text_report", "html_report", "main"]

Event = Dict[str, Any]


def _events(path: str) -> List[Event]:
    out: List[Event] = []
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


# Past this many rank logs only rank 0's are read (every rank logs the same checkpoints,
# restores and first steps; a month of 4,096 ranks' logs is gigabytes): rank_logs().
ALL_RANKS_UP_TO = 64
_RANK0 = re.compile(r"-r0\.events\.jsonl$")


def rank_logs(logs_dir: str, all_ranks: bool = False) -> Tuple[List[str], int]:
    """The rank event logs to read, and how many there are: every one up to ALL_RANKS_UP_TO
    (or with all_ranks), else rank 0's (one file per host rank 0 ever ran on)."""
    paths = sorted(glob.glob(os.path.join(logs_dir, "*.events.jsonl")))
    if all_ranks or len(paths) <= ALL_RANKS_UP_TO:
        return paths, len(paths)
    return [p for p in paths if _RANK0.search(p)], len(paths)


def default_logs_dir(run_dir: str) -> str:
    return os.environ.get("TRAINSUP_LOG_DIR") or os.path.join(os.path.dirname(os.path.abspath(run_dir)), "logs")


def load(run_dir: str, logs_dir: Optional[str] = None,
         all_ranks: bool = False) -> Tuple[List[Event], List[Event], List[Event]]:
    agents = [e for p in sorted(glob.glob(names.agent_events_file(run_dir, "*"))) for e in _events(p)]
    paths, _ = rank_logs(logs_dir or default_logs_dir(run_dir), all_ranks)
    ranks = [e for p in paths for e in _events(p)]
    for e in ranks:
        e["time"] = e.get("wall_s", 0.0)
    faults = _events(names.faults_file(run_dir))
    return agents, ranks, faults


def checkpoint_figures(ranks: List[Dict[str, Any]]) -> Dict[str, Any]:
    """Checkpoint stall, persist and restore durations (one per step or restore: the slowest
    rank's, since the job waits for it) and the newest committed step."""
    stall: Dict[Tuple[Any, Any], float] = {}
    persist: Dict[Tuple[Any, Any], float] = {}
    restore: Dict[Tuple[Any, Any], float] = {}
    newest = -1
    for e in ranks:
        ev = e.get("event")
        key = (e.get("restart", 0), e.get("step"))
        if ev == "checkpoint_snapshot" and "stall_s" in e:
            stall[key] = max(stall.get(key, 0.0), float(e["stall_s"]))
        elif ev == "checkpoint_committed":
            if "persist_s" in e:
                persist[key] = max(persist.get(key, 0.0), float(e["persist_s"]))
            newest = max(newest, int(e.get("step", -1)))
        elif ev == "checkpoint_restored" and "restore_s" in e:
            rkey = (e.get("restart", 0), e.get("step"))
            restore[rkey] = max(restore.get(rkey, 0.0), float(e["restore_s"]))
    return {"stall_s": list(stall.values()), "persist_s": list(persist.values()),
            "restore_s": list(restore.values()), "newest_step": newest}


def analyse(agents: List[Event], ranks: List[Event], faults: List[Event]) -> Dict[str, Any]:
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
    snapshots = [e for e in ranks if e["event"] == "checkpoint_snapshot"]
    fallbacks = sorted((e for e in ranks if e["event"] == "snapshot_restore_fallback"), key=lambda e: e["time"])
    commits = [e for e in ranks if e["event"] == "checkpoint_committed"]
    incidents = []
    seen_rounds = set()
    for v in verdicts:
        if v.get("round") in seen_rounds:
            continue
        seen_rounds.add(v.get("round"))
        fault = max((f["time"] for f in faults if f["time"] <= v["time"]), default=None)
        # No fault marker (real faults leave none): the verdict's own onset, where its evidence
        # gives one (a dead or silent rank's last sign of life, a hung collective's first entry).
        estimated = fault is None and float(v.get("onset_s", -1)) >= 0
        if estimated:
            fault = v["time"] - float(v["onset_s"])
        resumed = next((f["time"] for f in firsts if f["time"] > v["time"]), None)
        restored = next((r for r in restores if r["time"] > v["time"]), None)
        t_fault = fault if fault is not None else v["time"]
        saved = None
        if restored is not None:
            # The latest save of that step before the fault (an earlier attempt may have saved
            # the same step and failed to commit it).
            for events in (snapshots, commits):
                saved = max((c["time"] for c in events if c.get("step") == restored["step"] and c["time"] <= t_fault),
                            default=None)
                if saved is not None:
                    break
        inc = {
            "round": v.get("round"), "verdict": v["kind"], "hosts": v.get("hosts", []), "section": v.get("section", ""),
            "group": v.get("group", ""), "op": v.get("op", ""), "seq": v.get("seq", 0), "other_op": v.get("other_op", ""),
            "fault_time": fault, "fault_estimated": estimated, "verdict_time": v["time"], "resumed_time": resumed,
            "saved_time": saved,
            "restored_step": restored["step"] if restored else None,
            # Where the state came from: "memory" (this host's or a peer's copy) or "disk"; and,
            # when the memory tier could not serve, why (docs/snapshots.md).
            "restored_from": (restored.get("tier") or "disk") if restored else None,
            "ranks_from_peers": restored.get("ranks_from_peers") if restored else None,
            "memory_fallback": next((f.get("reason", "") for f in fallbacks
                                     if f["time"] > v["time"] and (restored is None or f["time"] <= restored["time"])),
                                    None),
            "detection_s": (v["time"] - fault) if fault is not None else None,
            "replay_s": (t_fault - saved) if saved is not None else None,
            "restart_s": (resumed - v["time"]) if resumed is not None else None,
        }
        inc["lost_s"] = sum(x for x in (inc["detection_s"], inc["replay_s"], inc["restart_s"]) if x is not None)
        incidents.append(inc)
    wall = end - start
    lost = sum(i["lost_s"] for i in incidents)
    # Training held by checkpoint saves: per save (restart, step), the slowest rank's stall.
    stalls = checkpoint_figures(ranks)["stall_s"]
    by_cause = {cause: sum(i[f"{cause}_s"] or 0.0 for i in incidents) for cause in ("detection", "restart", "replay")}
    by_cause["checkpoint_stall"] = sum(stalls)
    return {"start": start, "end": end, "wall_s": wall, "lost_s": lost,
            "ettr": (wall - lost) / wall if wall > 0 else 1.0, "incidents": incidents,
            "lost_by_cause_s": by_cause, "checkpoint_saves": len(stalls),
            "goodput": (wall - sum(by_cause.values())) / wall if wall > 0 else 1.0}


TIMELINE_AGENT = {"rendezvous", "coordinator_elected", "coordinator_takeover", "verdict", "quarantine",
                  "quarantined_exit", "worker_failure", "restart", "give_up", "agent_lost", "rendezvous_evicted",
                  "straggler", "slow_link", "slow_link_recovered"}
TIMELINE_RANK = {"abort_ordered", "stall", "exit", "checkpoint_restored", "first_step", "snapshot_restore_fallback"}


def timeline(agents: List[Event], ranks: List[Event], faults: List[Event]) -> List[Event]:
    rows = [e for e in agents if e["event"] in TIMELINE_AGENT]
    rows += [e for e in ranks if e["event"] in TIMELINE_RANK]
    rows += faults
    return sorted(rows, key=lambda e: e["time"])


def _describe(e: Event) -> str:
    keys = ("round", "kind", "hosts", "section", "quarantined_host", "error_class", "restarts", "code", "step",
            "verdict", "culprit_host", "group_world", "reason", "lost_host", "silent_s", "evicted_host",
            "slow_host", "round_trip_ms", "tier", "source")
    return " ".join(f"{k}={e[k]}" for k in keys if k in e and e[k] not in ("", None, []))


# Past this many hosts the whole-run timeline (text and picture) gives way to the hosts ranked by
# incidents and each incident's own timeline of the hosts involved.
WHOLE_TIMELINE_HOSTS = 16


def _hosts(rows: List[Event]) -> List[str]:
    return sorted({e.get("host", "?") for e in rows})


def hosts_by_incidents(a: Dict[str, Any]) -> List[Dict[str, Any]]:
    """The culprit hosts, most incidents first: [{"host", "incidents", "kinds": {kind: n},
    "lost_s", "first", "last"}] (the "which node keeps failing" question)."""
    by: Dict[str, Dict[str, Any]] = {}
    for i in a["incidents"]:
        for h in i["hosts"][:1] or ["?"]:
            r = by.setdefault(h, {"host": h, "incidents": 0, "kinds": {}, "lost_s": 0.0, "first": i["verdict_time"],
                                  "last": i["verdict_time"]})
            r["incidents"] += 1
            r["kinds"][i["verdict"]] = r["kinds"].get(i["verdict"], 0) + 1
            r["lost_s"] += i["lost_s"]
            r["first"], r["last"] = min(r["first"], i["verdict_time"]), max(r["last"], i["verdict_time"])
    return sorted(by.values(), key=lambda r: (-r["incidents"], -r["lost_s"], r["host"]))


def _duration(seconds: float) -> str:
    if seconds >= 2 * 86400:
        return f"{seconds / 86400:.1f} days"
    if seconds >= 2 * 3600:
        return f"{seconds / 3600:.1f} h"
    if seconds >= 120:
        return f"{seconds / 60:.1f} min"
    return f"{seconds:.1f} s"


def text_report(a: Dict[str, Any], rows: List[Event]) -> str:
    out = []
    t0 = a["start"]
    out.append(f"run: {_duration(a['wall_s'])} wall, {len(a['incidents'])} incident(s), "
               f"{a['lost_s']:.1f} s lost, ETTR {a['ettr']:.3f}")
    causes = a.get("lost_by_cause_s", {})
    if causes:
        out.append("time lost by cause: " + ", ".join(f"{c} {v:.1f} s" for c, v in causes.items())
                   + f"; goodput (checkpoint stalls counted too) {a.get('goodput', a['ettr']):.4f}")
    hosts = _hosts(rows)
    if len(hosts) <= WHOLE_TIMELINE_HOSTS:
        out.append("\ntimeline (s from the start)")
        for e in rows:
            who = e.get("host", "?") + (f" rank {e['rank']}" if "rank" in e and "wall_s" in e else "")
            out.append(f"  {e['time'] - t0:9.2f}  {who:<16} {e['event']:<22} {_describe(e)}")
    else:
        out.append(f"\n{len(rows)} timeline events on {len(hosts)} hosts: each incident's own in the HTML report")
        ranked = hosts_by_incidents(a)
        out.append("\nhosts by incidents")
        for r in ranked[:20]:
            kinds = ", ".join(f"{k} x{n}" for k, n in sorted(r["kinds"].items(), key=lambda kv: -kv[1]))
            out.append(f"  {r['host']:<16} {r['incidents']:3d}  {kinds}  ({r['lost_s']:.1f} s lost)")
    for n, i in enumerate(a["incidents"], 1):
        fmt = lambda x: "?" if x is None else f"{x:.2f} s"  # noqa: E731
        out.append(f"\nincident {n} (round {i['round']}): {i['verdict']} on {', '.join(i['hosts'])}"
                   + (f" in section '{i['section']}'" if i["section"] else ""))
        if i.get("group"):
            # Which collective: the group (its mesh dimension), the op and its number in the group.
            out.append(f"  at {i['op']} #{i['seq']} of group '{i['group']}'"
                       + (f"; the named rank(s) entered {i['other_op']}" if i.get("other_op") else ""))
        out.append(f"  detection {fmt(i['detection_s'])}, replay since the checkpoint {fmt(i['replay_s'])} "
                   f"(resumed from step {i['restored_step']}), restart {fmt(i['restart_s'])}: "
                   f"{i['lost_s']:.2f} s lost")
        if i.get("restored_from") == "memory":
            out.append(f"  restored from memory ({i.get('ranks_from_peers') or 0} rank(s) from a peer host's copy)")
        if i.get("memory_fallback"):
            out.append(f"  restored from disk, not memory: {i['memory_fallback']}")
    return "\n".join(out)


COLORS = {"verdict": "#d62728", "quarantine": "#9467bd", "quarantined_exit": "#9467bd", "fault_injected": "#000000",
          "abort_ordered": "#ff7f0e", "exit": "#ff7f0e", "rendezvous": "#1f77b4", "checkpoint_restored": "#2ca02c",
          "first_step": "#2ca02c", "restart": "#8c564b", "give_up": "#7f7f7f", "worker_failure": "#e377c2",
          "stall": "#d62728", "coordinator_elected": "#17becf", "coordinator_takeover": "#17becf",
          "agent_lost": "#d62728", "rendezvous_evicted": "#1f77b4", "straggler": "#bcbd22", "slow_link": "#bcbd22",
          "slow_link_recovered": "#2ca02c"}


def _tick_step(span: float) -> float:
    """A round tick interval giving about 6 to 12 ticks over `span` seconds."""
    for step in (0.5, 1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 21600, 43200, 86400):
        if span / step <= 12:
            return step
    return span / 10


# Events labelled on the picture (the others are dots with a tooltip).
LABELS = {"fault_injected": lambda e: f"fault ({e.get('kind', '')})",
          "verdict": lambda e: f"verdict: {e.get('kind', '')}",
          "quarantine": lambda e: f"quarantine {e.get('quarantined_host', '')}",
          "agent_lost": lambda e: f"lost {e.get('lost_host', '')}",
          "slow_link": lambda e: f"slow link {e.get('slow_host', '')} ({e.get('round_trip_ms', '?')} ms)",
          "give_up": lambda e: "gave up"}


def svg_timeline(a: Dict[str, Any], rows: List[Event], title: Optional[str] = None) -> str:
    """The run (or one incident's window: `a` then holds that window's start, span and incident)
    as an SVG picture: one lane per host, a dot per event (hover for details), key events
    labelled, and each incident's lost time as bands: replay (work since the restored
    checkpoint), detection (fault -> verdict), restart (verdict -> first step after resume)."""
    hosts = _hosts(rows)
    width, lane, left, top = 1100, 52, 90, 64
    plot_w = width - left - 30
    height = top + lane * len(hosts) + 70
    t0, span = a["start"], max(a["wall_s"], 1e-6)
    x = lambda t: left + (t - t0) / span * plot_w  # noqa: E731
    if title is None:
        title = f'{len(a["incidents"])} incident(s), {a["lost_s"]:.1f} s lost of {a["wall_s"]:.1f} s: ETTR {a["ettr"]:.3f}'
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" font-family="sans-serif" '
           f'font-size="11"><rect width="100%" height="100%" fill="white"/>',
           f'<text x="{left}" y="16" font-size="13" font-weight="bold">{html.escape(title)}</text>']
    bottom = top + lane * len(hosts)
    bands = (("replay", "#7f7f7f", "saved_time", "fault_time"), ("detection", "#d62728", "fault_time", "verdict_time"),
             ("restart", "#ff7f0e", "verdict_time", "resumed_time"))
    for n, i in enumerate(a["incidents"]):
        for name, color, t_from, t_to in bands:
            if i.get(t_from) is None or i.get(t_to) is None or i[t_to] <= i[t_from]:
                continue
            x0, x1 = x(i[t_from]), x(i[t_to])
            out.append(f'<rect x="{x0:.1f}" y="{top - 8}" width="{x1 - x0:.1f}" height="{bottom - top + 8}" '
                       f'fill="{color}" opacity="0.10"><title>{name} {i[t_to] - i[t_from]:.2f} s</title></rect>')
            out.append(f'<text x="{(x0 + x1) / 2:.1f}" y="{top - 12 - 11 * (n % 2)}" text-anchor="middle" '
                       f'fill="{color}">{name} {i[t_to] - i[t_from]:.1f} s</text>')
    for n, h in enumerate(hosts):
        y = top + n * lane + lane / 2
        out.append(f'<text x="8" y="{y + 4:.0f}" font-weight="bold">{html.escape(h)}</text>')
        out.append(f'<line x1="{left}" y1="{y:.0f}" x2="{left + plot_w}" y2="{y:.0f}" stroke="#ccc"/>')
    step = _tick_step(span)
    k = 0
    while k * step <= span + 1e-9:
        tx = x(t0 + k * step)
        out.append(f'<line x1="{tx:.1f}" y1="{bottom}" x2="{tx:.1f}" y2="{bottom + 4}" stroke="#888"/>')
        label = f"{k * step:g} s" if step < 60 else f"{k * step / 60:g} min"
        out.append(f'<text x="{tx:.1f}" y="{bottom + 16}" text-anchor="middle" fill="#444">{label}</text>')
        k += 1
    labelled: Dict[Any, Tuple[float, int]] = {}
    for e in sorted(rows, key=lambda e: e["time"]):
        y = top + hosts.index(e.get("host", "?")) * lane + lane / 2
        cx = x(e["time"])
        color = COLORS.get(e["event"], "#555")
        title = html.escape(f"{e['time'] - t0:.2f} s {e.get('host', '')} {e['event']} {_describe(e)}")
        out.append(f'<circle cx="{cx:.1f}" cy="{y:.0f}" r="5" fill="{color}"><title>{title}</title></circle>')
        if e["event"] in LABELS:
            # Alternate above and below the lane, and skip a label that would overlap the last.
            last = labelled.get(e.get("host"), (-1e9, 0))
            if cx - last[0] < 70 and last[1] == 1:
                continue
            side = -1 if cx - last[0] >= 70 else 1
            labelled[e.get("host")] = (cx, 1 if side == 1 else 0)
            out.append(f'<text x="{cx:.1f}" y="{y + side * 12 + (4 if side > 0 else 0):.0f}" text-anchor="middle" '
                       f'fill="{color}">{html.escape(LABELS[e["event"]](e))}</text>')
    present = [k for k in COLORS if any(e["event"] == k for e in rows)]
    lx, ly = float(left), bottom + 40
    for kind in present:
        w = 14 + 6.2 * len(kind)
        if lx + w > width - 10:
            lx, ly = left, ly + 16
        out.append(f'<circle cx="{lx + 4}" cy="{ly - 4}" r="4" fill="{COLORS[kind]}"/>'
                   f'<text x="{lx + 12}" y="{ly}">{kind}</text>')
        lx += w + 12
    out.append("</svg>")
    return "\n".join(out)


CAUSE_COLORS = {"detection": "#d62728", "restart": "#ff7f0e", "replay": "#7f7f7f", "checkpoint_stall": "#1f77b4"}


def summary_svg(a: Dict[str, Any]) -> str:
    """Time lost by cause as one bar (widths: shares of the time lost), labelled."""
    causes = a.get("lost_by_cause_s", {})
    total = sum(causes.values())
    width, left, bar_w = 1100, 10, 1000
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="64" font-family="sans-serif" '
           f'font-size="12" id="lost-by-cause">']
    xpos = float(left)
    for cause, v in causes.items():
        w = bar_w * v / total if total > 0 else 0.0
        if w > 0:
            out.append(f'<rect x="{xpos:.1f}" y="6" width="{w:.1f}" height="28" fill="{CAUSE_COLORS[cause]}">'
                       f'<title>{cause} {v:.1f} s</title></rect>')
        xpos += w
    lx = float(left)
    for cause, v in causes.items():
        share = v / total if total > 0 else 0.0
        out.append(f'<rect x="{lx:.1f}" y="44" width="10" height="10" fill="{CAUSE_COLORS[cause]}"/>'
                   f'<text x="{lx + 14:.1f}" y="54">{cause} {_duration(v)} ({share:.0%})</text>')
        lx += 240
    out.append("</svg>")
    return "".join(out)


INCIDENT_EVENTS = {"verdict", "quarantine", "quarantined_exit", "restart", "rendezvous", "coordinator_takeover",
                   "agent_lost", "rendezvous_evicted", "worker_failure", "give_up"}


def incident_window(i: Dict[str, Any], rows: List[Event], a: Dict[str, Any]) -> Tuple[Dict[str, Any], List[Event]]:
    """One incident's own timeline: its window (from the replayed work's start, or the fault, to
    a little after the first step after resume) and the events of the hosts involved only: the
    culprits, who quarantined or evicted them, and the hosts of the ranks that restored and
    resumed (one event of a kind per host: every agent logs the verdict and the restart)."""
    t_from = min(t for t in (i.get("saved_time"), i.get("fault_time"), i["verdict_time"]) if t is not None)
    t_to = i.get("resumed_time") or i["verdict_time"]
    pad = max(2.0, 0.05 * (t_to - t_from))
    w0, w1 = t_from - pad, t_to + pad
    window = [e for e in rows if w0 <= e["time"] <= w1]
    involved = set(i["hosts"])
    for e in window:
        if e["event"] in ("quarantine", "agent_lost", "rendezvous_evicted", "coordinator_takeover",
                          "fault_injected", "checkpoint_restored", "first_step"):
            involved.add(e.get("host", "?"))
    seen = set()
    picked = []
    for e in window:
        h = e.get("host", "?")
        if h not in involved or (e["event"] not in INCIDENT_EVENTS and "wall_s" not in e and
                                 e["event"] != "fault_injected"):
            continue
        key = (h, e["event"], e.get("rank"))
        if key in seen:
            continue
        seen.add(key)
        picked.append(e)
    sub = {"start": w0, "wall_s": w1 - w0, "incidents": [i], "lost_s": i["lost_s"], "ettr": a["ettr"]}
    return sub, picked


def _when(a: Dict[str, Any], t: float) -> str:
    return f"day {(t - a['start']) / 86400:.2f}" if a["wall_s"] > 2 * 86400 else f"{t - a['start']:.1f} s"


def html_report(a: Dict[str, Any], rows: List[Event], text: str) -> str:
    """The page: time lost by cause and ETTR first; the hosts ranked by incidents; every
    incident, each expandable to its own timeline of the hosts involved; and, for a run of at
    most WHOLE_TIMELINE_HOSTS hosts, the whole run's timeline and the text report."""
    causes = a.get("lost_by_cause_s", {})
    hosts = _hosts(rows)
    out = ["<!doctype html><meta charset=utf-8><title>trainsup report</title>",
           "<style>body{font-family:sans-serif;margin:16px}table{border-collapse:collapse}"
           "td,th{padding:2px 10px;text-align:left;border-bottom:1px solid #ddd}summary{cursor:pointer}"
           ".big{font-size:28px;font-weight:bold}</style>",
           f"<h1>trainsup run: ETTR {a['ettr']:.4f}</h1>",
           f"<p class=big>{_duration(sum(causes.values()))} lost of {_duration(a['wall_s'])} in "
           f"{len(a['incidents'])} incident(s) on {len(hosts)} hosts; goodput {a.get('goodput', a['ettr']):.4f}</p>",
           summary_svg(a),
           "<table><tr><th>cause</th><th>time lost</th><th>per incident</th></tr>"]
    n = max(1, len(a["incidents"]))
    for cause, v in causes.items():
        per = f"{v / n:.1f} s" if cause != "checkpoint_stall" else f"{a.get('checkpoint_saves', 0)} saves"
        out.append(f"<tr><td>{cause}</td><td>{_duration(v)}</td><td>{per}</td></tr>")
    out.append("</table>")
    ranked = hosts_by_incidents(a)
    if ranked:
        out.append("<h2>Hosts by incidents</h2><table><tr><th>host</th><th>incidents</th><th>kinds</th>"
                   "<th>time lost</th><th>first</th><th>last</th></tr>")
        for r in ranked[:25]:
            kinds = ", ".join(f"{k} &times;{c}" for k, c in sorted(r["kinds"].items(), key=lambda kv: -kv[1]))
            out.append(f"<tr><td>{html.escape(r['host'])}</td><td>{r['incidents']}</td><td>{kinds}</td>"
                       f"<td>{_duration(r['lost_s'])}</td><td>{_when(a, r['first'])}</td><td>{_when(a, r['last'])}</td></tr>")
        if len(ranked) > 25:
            out.append(f"<tr><td colspan=6>... {len(ranked) - 25} more hosts with one incident or fewer</td></tr>")
        out.append("</table>")
    if a["incidents"]:
        out.append("<h2>Incidents</h2>")
    fmt = lambda v: "?" if v is None else f"{v:.1f} s"  # noqa: E731
    for k, i in enumerate(a["incidents"], 1):
        sub, picked = incident_window(i, rows, a)
        head = (f"incident {k} ({_when(a, i['verdict_time'])}, round {i['round']}): {html.escape(i['verdict'])} on "
                f"{html.escape(', '.join(i['hosts']))}: detection {fmt(i['detection_s'])}, restart "
                f"{fmt(i['restart_s'])}, replay {fmt(i['replay_s'])}")
        out.append(f"<details><summary>{head}</summary>"
                   + svg_timeline(sub, picked, title=f"incident {k}: {i['lost_s']:.1f} s lost") + "</details>")
    if len(hosts) <= WHOLE_TIMELINE_HOSTS:
        out.append("<h2>The whole run</h2><p>hover a dot for the event</p>" + svg_timeline(a, rows)
                   + f"<pre>{html.escape(text)}</pre>")
    return "\n".join(out)


def main(argv: Optional[Sequence[str]] = None) -> int:
    p = argparse.ArgumentParser(prog="trainsup report", description=__doc__.split("\n")[0])
    p.add_argument("run_dir")
    p.add_argument("--logs", default=None, help="the ranks' TRAINSUP_LOG_DIR (default: RUN_DIR/../logs)")
    p.add_argument("--html", default=None, help="where to write the HTML timeline (default RUN_DIR/report.html)")
    p.add_argument("--all-ranks", action="store_true",
                   help=f"read every rank's event log (default: all up to {ALL_RANKS_UP_TO} logs, else rank 0's)")
    args = p.parse_args(argv)
    logs_dir = args.logs or default_logs_dir(args.run_dir)
    read, there = rank_logs(logs_dir, args.all_ranks)
    if len(read) < there:
        print(f"(read the event logs of rank 0 only: {len(read)} of {there} rank logs; --all-ranks reads every one)")
    agents, ranks, faults = load(args.run_dir, logs_dir, args.all_ranks)
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
                      "goodput": round(a["goodput"], 4),
                      "lost_by_cause_s": {k: round(v, 3) for k, v in a["lost_by_cause_s"].items()},
                      "hosts_by_incidents": [{k: r[k] for k in ("host", "incidents")} for r in hosts_by_incidents(a)][:10],
                      "incidents": [{k: (round(v, 3) if isinstance(v, float) else v) for k, v in i.items()}
                                    for i in a["incidents"]]}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
