"""`trainsup status RUN_DIR [--json]` (or `--url http://host:port`): the live view of a running job.

Asks every agent of the run directory (their addresses: `<run dir>/agent-<host>.endpoint`, left by
agents started with --metrics-port) for its /status, and prints the job as the agent holding the
coordinator sees it: the round, its hosts and ranks, the slowest ranks, the oldest open
collectives with the ranks and hosts that have not entered them, incidents so far, quarantined
hosts, spares waiting and restarts left; then one line per agent. `--json` prints the answers as
one JSON object instead. Needs no torch (a login node). Exit status 1 when no agent answers.
"""
import argparse
import glob
import json
import os
import sys
import urllib.request
from typing import Any, Dict, List, Optional, Sequence

from .. import names

__all__ = ["main", "gather"]


def _get(url: str, timeout_s: float) -> Dict[str, Any]:
    with urllib.request.urlopen(url.rstrip("/") + "/status", timeout=timeout_s) as r:
        return json.loads(r.read())


def gather(run_dir: Optional[str] = None, url: Optional[str] = None, timeout_s: float = 3.0) -> List[Dict[str, Any]]:
    """Every agent's /status answer (with "url"), or {"url", "error"} for one that did not answer."""
    if url:
        urls = [url]
    else:
        urls = []
        for path in sorted(glob.glob(names.endpoint_file(run_dir or ".", "*"))):
            try:
                with open(path) as f:
                    urls.append(f.read().strip())
            except OSError:
                pass
    out = []
    for u in urls:
        try:
            out.append(dict(_get(u, timeout_s), url=u))
        except Exception as e:  # an agent that ended leaves its endpoint file behind
            out.append({"url": u, "error": f"{type(e).__name__}: {e}"})
    return out


def _fmt_s(v: Any) -> str:
    return "-" if v is None else f"{v:.2f} s"


def render(answers: List[Dict[str, Any]]) -> str:
    lines = []
    job = next((a for a in answers if a.get("in_office")), None)
    if job is None:
        lines.append("no agent holds the coordinator now (between rounds, or the job has ended)")
    else:
        lines.append(f"job {job.get('run_id')}: round {job.get('round')}, {len(job.get('hosts') or [])} hosts "
                     f"({', '.join(job.get('hosts') or [])}), {job.get('ranks', 0)} ranks; coordinator on {job['host']}")
        lines.append(f"restarts {job.get('restarts_used', 0)} of {job.get('max_restarts', 0)}; spares waiting "
                     f"{job.get('spares_waiting', 0)}; quarantined: {', '.join(job.get('quarantined') or []) or 'none'}; "
                     f"newest checkpoint step {job.get('newest_checkpoint_step')}")
        slow = job.get("slowest") or []
        if slow:
            lines.append("slowest ranks: " + "; ".join(
                f"rank {r['rank']} on {r['host']} {r['step_s'] * 1e3:.1f} ms/step (step {r['step']}, {r['section']})"
                for r in slow))
        for o in job.get("oldest_open") or []:
            missing = o.get("missing") or []
            lines.append(f"open: {o['what']} for {o['age_s']:.2f} s, {o['entered']} of {o['members']} entered"
                         + (f"; not entered: rank(s) {', '.join(map(str, missing))} on "
                            f"{', '.join(o.get('missing_hosts') or [])}" if missing else "; all entered"))
        if not job.get("oldest_open"):
            lines.append(f"open collectives: {job.get('open_collectives', 0)}")
        incidents = job.get("incidents") or []
        ettr = job.get("ettr")
        lines.append(f"incidents: {len(incidents)}" + (f", ETTR so far {ettr:.4f}" if ettr is not None else ""))
        for i in incidents:
            lines.append(f"  round {i['round']}: {i['verdict']} on {', '.join(i.get('hosts') or [])}: detection "
                         f"{_fmt_s(i.get('detection_s'))}, restart {_fmt_s(i.get('restart_s'))}, replay "
                         f"{_fmt_s(i.get('replay_s'))}")
    lines.append("agents:")
    for a in answers:
        if "error" in a:
            lines.append(f"  {a['url']}: no answer ({a['error']})")
        else:
            role = "coordinator" if a.get("in_office") else ("training" if a.get("in_round") else "waiting (spare)")
            lines.append(f"  {a.get('host')}: round {a.get('round')}, {role} ({a['url']})")
    return "\n".join(lines)


def main(argv: Optional[Sequence[str]] = None) -> int:
    p = argparse.ArgumentParser(prog="trainsup status", description=__doc__.splitlines()[0])
    p.add_argument("run_dir", nargs="?", default=os.environ.get("TRAINSUP_RUN_DIR", "trainsup-run"))
    p.add_argument("--url", default=None, help="ask this agent only (http://host:port)")
    p.add_argument("--json", action="store_true")
    p.add_argument("--timeout-s", type=float, default=3.0)
    args = p.parse_args(argv)
    answers = gather(args.run_dir, args.url, args.timeout_s)
    if not answers:
        print(f"trainsup status: no agent endpoints in {args.run_dir} (agents serve them with --metrics-port)",
              file=sys.stderr)
        return 1
    print(json.dumps({"agents": answers}) if args.json else render(answers))
    return 0 if any("error" not in a for a in answers) else 1


if __name__ == "__main__":
    sys.exit(main())
