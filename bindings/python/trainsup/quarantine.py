"""Quarantined hosts: persistent records on shared storage, mirrored in the job's store.

A record is `<dir>/<host>.json` = {"host", "gpu", "reason", "verdict", "time", "expiry"} (Unix
seconds; default expiry 24 h), written atomically (temporary name, fsync, rename). The job's
agents also keep a copy in the job's store (for hosts that do not share the directory). The
directory is the record's home: `remove` deletes the file and leaves `<dir>/<host>.released`
(the time of the release), which outranks any store copy written before it, so that an operator
who releases a host with the CLI (which has no store) releases it for the running job too; a
later quarantine, newer than the release, counts again. The launcher's
agent on a quarantined host does not join the next rendezvous and exits with
EXIT_QUARANTINED (95). Records outlive the job: the next job launched with the same directory
keeps avoiding the host until the record expires or is removed
(`python3 -m trainsup quarantine remove <host>`). On quarantine, configured commands run with
{host}, {gpu}, {reason}, {verdict} replaced (TRAINSUP_QUARANTINE_COMMANDS, one per line), e.g.
`scontrol update NodeName={host} State=DRAIN Reason="{reason}"` or `kubectl cordon {host}`.
"""
import json
import os
import shlex
import subprocess
import time
from typing import Any, Dict, List, Optional, Tuple

from ._trainsup import EXIT_QUARANTINED  # noqa: F401  (trainsup/exit_codes.h: 95)
from .names import quarantine_changes_key, quarantine_dir, quarantine_key

__all__ = ["Quarantine", "run_commands", "default_dir", "DEFAULT_TTL_S", "EXIT_QUARANTINED"]

DEFAULT_TTL_S = 24 * 3600


def default_dir() -> str:
    return os.environ.get("TRAINSUP_QUARANTINE_DIR") or quarantine_dir(
        os.environ.get("TRAINSUP_RUN_DIR", "trainsup-run"))


def _safe(host: str) -> str:
    if not host or "/" in host or host in (".", ".."):
        raise ValueError(f"quarantine: {host!r} is not a host name")
    return host


class Quarantine:
    def __init__(self, directory: Optional[str] = None, store: Any = None) -> None:
        self.dir = directory or default_dir()
        self.store = store
        os.makedirs(self.dir, exist_ok=True)
        self._cache: Tuple[Any, Dict[str, Optional[Dict[str, Any]]]] = (None, {})  # records(): (read at, host -> record)

    def _path(self, host: str) -> str:
        return os.path.join(self.dir, _safe(host) + ".json")

    def _released_path(self, host: str) -> str:
        return os.path.join(self.dir, _safe(host) + ".released")

    def _write_atomically(self, path: str, text: str) -> None:
        tmp = f"{path}.tmp.{os.getpid()}"
        with open(tmp, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.rename(tmp, path)
        fd = os.open(self.dir, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    def released_at(self, host: str) -> Optional[float]:
        """When `host` was last released with remove() (Unix seconds), or None."""
        try:
            with open(self._released_path(host)) as f:
                return float(json.load(f)["time"])
        except (FileNotFoundError, ValueError, KeyError, TypeError):
            return None

    def add(self, host: str, reason: str, verdict: str = "manual", gpu: str = "",
            ttl_s: float = DEFAULT_TTL_S) -> Dict[str, Any]:
        """Writes the record (replacing an older one); returns it."""
        now = time.time()
        record = {"host": _safe(host), "gpu": gpu, "reason": reason, "verdict": verdict, "time": now,
                  "expiry": now + ttl_s}
        self._write_atomically(self._path(host), json.dumps(record))
        if self.store is not None:
            self.store.set(quarantine_key(host), json.dumps(record))
            self.store.add(quarantine_changes_key(), 1)
        return record

    def remove(self, host: str) -> bool:
        """Releases `host`: deletes its record and marks the release in the directory (which
        outranks a copy in a running job's store). True if there was a live record here."""
        removed = self.get(host) is not None
        try:
            os.remove(self._path(host))
        except FileNotFoundError:
            pass
        self._write_atomically(self._released_path(host), json.dumps({"host": host, "time": time.time()}))
        if self.store is not None:
            try:
                self.store.delete_key(quarantine_key(host))
                self.store.add(quarantine_changes_key(), 1)
            except Exception:
                pass
        return removed

    def get(self, host: str) -> Optional[Dict[str, Any]]:
        """The live record of `host`, or None (expired records count as absent, and so does a
        store copy older than the host's release)."""
        record: Optional[Dict[str, Any]] = None
        try:
            with open(self._path(host)) as f:
                record = json.load(f)
        except (FileNotFoundError, ValueError):
            record = None
        if record is None and self.store is not None:
            from .launch.store import peek
            text = peek(self.store, quarantine_key(host))
            record = json.loads(text) if text else None
            released = self.released_at(host) if record is not None else None
            if record is not None and released is not None and float(record.get("time", 0)) <= released:
                record = None  # released by an operator since it was written
        if record is not None and record.get("expiry", 0) <= time.time():
            return None
        return record

    # A directory whose mtime is at least this old is trusted to show every change since (file
    # systems keep mtimes in coarse ticks: two changes in one tick look like one).
    MTIME_SETTLED_S = 1.0

    def records(self, hosts: List[str]) -> Dict[str, Dict[str, Any]]:
        """{host: live record} for those of `hosts` that are quarantined: get() of each, but
        read again only when something changed since the last call (the directory's mtime, the
        store's change counter): an agent that asks every poll about every host of a large job
        costs one stat and one store read while nothing changes, not one of each per host."""
        changes = None
        if self.store is not None:
            from .launch.store import peek
            changes = peek(self.store, quarantine_changes_key())
        try:
            mtime_ns = os.stat(self.dir).st_mtime_ns
        except FileNotFoundError:
            mtime_ns = None
        key = (changes, mtime_ns)
        settled = mtime_ns is not None and time.time() - mtime_ns / 1e9 >= self.MTIME_SETTLED_S
        if not settled or self._cache[0] != key:
            self._cache = (key, {})
        known = self._cache[1]  # per host (record or None): the callers ask about different lists
        for h in hosts:
            if h not in known:
                known[h] = self.get(h)
        now = time.time()
        return {h: r for h in hosts if (r := known[h]) is not None and r.get("expiry", 0) > now}

    def list(self) -> List[Dict[str, Any]]:
        out = []
        for name in sorted(os.listdir(self.dir)):
            if name.endswith(".json"):
                r = self.get(name[:-5])
                if r is not None:
                    out.append(r)
        return out

    def exclude_arg(self) -> str:
        """The sbatch text that keeps a job off the quarantined hosts ("" when none)."""
        hosts = [r["host"] for r in self.list()]
        return f"--exclude={','.join(hosts)}" if hosts else ""


def run_commands(record: Dict[str, Any], commands: Optional[str] = None) -> List[Tuple[str, int]]:
    """Runs the configured quarantine commands for `record`; returns [(command, exit code)]."""
    text = commands if commands is not None else os.environ.get("TRAINSUP_QUARANTINE_COMMANDS", "")
    results = []
    for line in text.splitlines():
        line = line.strip()
        if not line:
            continue
        values = {k: shlex.quote(str(record.get(k, ""))) for k in ("host", "gpu", "reason", "verdict")}
        command = line.format(**values)
        try:
            rc = subprocess.run(command, shell=True, timeout=60).returncode
        except subprocess.TimeoutExpired:
            rc = -1
        results.append((command, rc))
    return results
