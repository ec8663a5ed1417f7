"""The hosts a job can ever run on, where the scheduler fixes them: a Slurm allocation.

torchrun's elastic rendezvous waits for hosts to join (up to its join timeout, 600 s by
default) because one may come from anywhere. Inside a Slurm allocation none can: the hosts are
SLURM_JOB_NODELIST. When the quarantined and lost hosts leave fewer of them than the round's
minimum (--nnodes=MIN:MAX), the survivors would wait ten minutes for nobody; the agent instead
ends at once with EXIT_REQUEUE (97), so that the batch script requeues the job (its quarantined
hosts drained, or excluded from the next placement). TRAINSUP_ALLOCATION_HOSTS names the hosts
explicitly (a Slurm hostlist or a comma-separated list), "none" turns the check off; unset, it
is SLURM_JOB_NODELIST under Slurm and off elsewhere (Kubernetes replaces a lost pod: a host can
come)."""
import os
import re
from typing import List, Mapping, Optional

__all__ = ["expand_hostlist", "allocation_hosts"]

_RANGE = re.compile(r"^(\d+)(?:-(\d+))?$")


def _split_top(text: str) -> List[str]:
    """Splits at commas outside brackets: "n[1-3,5],gpu01" -> ["n[1-3,5]", "gpu01"]."""
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth -= 1
            if depth < 0:
                raise ValueError(f"hostlist {text!r}: ']' at {i} closes nothing")
        elif ch == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    if depth:
        raise ValueError(f"hostlist {text!r}: a '[' is never closed")
    parts.append(text[start:])
    return [p.strip() for p in parts if p.strip()]


def _expand_one(item: str) -> List[str]:
    """"rack[1-2]-n[01-02]" -> rack1-n01, rack1-n02, rack2-n01, rack2-n02 (zero padding kept)."""
    open_at = item.find("[")
    if open_at < 0:
        return [item]
    close_at = item.index("]", open_at)
    head, body, tail = item[:open_at], item[open_at + 1:close_at], item[close_at + 1:]
    numbers = []
    for r in body.split(","):
        m = _RANGE.match(r.strip())
        if not m:
            raise ValueError(f"hostlist item {item!r}: {r!r} is not a number or a range a-b")
        lo, hi = m.group(1), m.group(2) or m.group(1)
        if int(hi) < int(lo):
            raise ValueError(f"hostlist item {item!r}: range {r!r} runs backwards")
        width = len(lo) if lo.startswith("0") and len(lo) > 1 else 0
        numbers += [str(n).zfill(width) for n in range(int(lo), int(hi) + 1)]
    return [f"{head}{n}{rest}" for n in numbers for rest in _expand_one(tail)]


def expand_hostlist(text: str) -> List[str]:
    """Slurm's compressed host list ("n[1-3],gpu[01-02]") as host names, in order, each once."""
    hosts: List[str] = []
    for item in _split_top(text.strip()):
        for h in _expand_one(item):
            if h not in hosts:
                hosts.append(h)
    return hosts


def allocation_hosts(environ: Optional[Mapping[str, str]] = None) -> Optional[List[str]]:
    """The hosts of this job's allocation, or None when any host may join (no check)."""
    env: Mapping[str, str] = os.environ if environ is None else environ
    given = env.get("TRAINSUP_ALLOCATION_HOSTS")
    if given is not None:
        if given.strip().lower() in ("", "none", "off", "0"):
            return None
        try:
            return expand_hostlist(given)
        except ValueError as e:
            raise ValueError(f"TRAINSUP_ALLOCATION_HOSTS: {e}") from None
    nodelist = env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST")
    if nodelist:
        try:
            return expand_hostlist(nodelist)
        except ValueError:
            return None  # a form this parser does not know: no check, as without Slurm
    return None
