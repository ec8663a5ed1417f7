"""python3 -m trainsup (installed as `trainsup`): operator commands.

  trainsup quarantine list [--dir DIR]                     live records, one JSON per line
  trainsup quarantine add HOST --reason TEXT [--gpu G] [--ttl-s S] [--dir DIR]
  trainsup quarantine remove HOST [--dir DIR]
  trainsup quarantine exclude-arg [--dir DIR]              e.g. --exclude=node17,node42 (for sbatch)
  trainsup report RUN_DIR [--logs DIR] [--html FILE]       timeline, time lost per incident, ETTR
  trainsup status [RUN_DIR] [--url URL] [--json]           the live view of a running job (--metrics-port)

DIR defaults to TRAINSUP_QUARANTINE_DIR, else <TRAINSUP_RUN_DIR>/quarantine. With
TRAINSUP_KUBERNETES_QUARANTINE=1, add also cordons and taints the Kubernetes node HOST, and
remove lifts that (trainsup/kube.py).
"""
import argparse
import json
import sys
from typing import List, Optional, Sequence

from .. import kube
from ..quarantine import DEFAULT_TTL_S, Quarantine, default_dir, run_commands


__all__ = ["main"]


def main(argv: Optional[Sequence[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["report"]:
        from .report import main as report
        return report(argv[1:])
    if argv[:1] == ["status"]:
        from .status import main as status
        return status(argv[1:])
    p = argparse.ArgumentParser(prog="trainsup", description="trainsup operator commands "
                                "(also: trainsup report RUN_DIR, trainsup status RUN_DIR; see their --help)")
    sub = p.add_subparsers(dest="command", required=True)
    q = sub.add_parser("quarantine", help="hosts kept out of the job")
    qs = q.add_subparsers(dest="action", required=True)
    for name in ("list", "add", "remove", "exclude-arg"):
        a = qs.add_parser(name)
        a.add_argument("--dir", default=None, help="quarantine directory (default: %s)" % default_dir())
        if name in ("add", "remove"):
            a.add_argument("host")
        if name == "add":
            a.add_argument("--reason", required=True)
            a.add_argument("--gpu", default="")
            a.add_argument("--ttl-s", type=float, default=DEFAULT_TTL_S)
    args = p.parse_args(argv)
    quarantine = Quarantine(args.dir)
    if args.action == "list":
        for record in quarantine.list():
            print(json.dumps(record))
    elif args.action == "add":
        record = quarantine.add(args.host, reason=args.reason, verdict="manual", gpu=args.gpu, ttl_s=args.ttl_s)
        for command, rc in run_commands(record):
            print(f"ran {command!r}: exit {rc}", file=sys.stderr)
        print(json.dumps(record))
        if kube.enabled():
            try:
                kube.KubeNodes().quarantine(record)
                print(f"kubernetes: cordoned and tainted node {args.host}", file=sys.stderr)
            except (ValueError, kube.KubeError) as e:
                print(f"trainsup: {e} (the quarantine record is written)", file=sys.stderr)
                return 1
    elif args.action == "remove":
        was = quarantine.remove(args.host)
        if kube.enabled():
            try:
                kube.KubeNodes().release(args.host)
                print(f"kubernetes: released node {args.host} (taint and labels removed, uncordoned if trainsup cordoned it)",
                      file=sys.stderr)
            except (ValueError, kube.KubeError) as e:
                print(f"trainsup: {e} (the quarantine record is removed)", file=sys.stderr)
                return 1
        if not was:
            print(f"trainsup: {args.host} was not quarantined in {quarantine.dir}", file=sys.stderr)
            return 1
    elif args.action == "exclude-arg":
        print(quarantine.exclude_arg())
    return 0


if __name__ == "__main__":
    sys.exit(main())
