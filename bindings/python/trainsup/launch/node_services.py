"""Per-host telemetry services, as the launcher runs them in each node's agent (process: the
launcher agent, `trainsup-run`; threads: its own, every 0.2 s).

NodeServices(store, ...) runs this host's node monitor (ranks connect to its Unix socket:
TRAINSUP_COORDINATOR=unix:<path>) and takes part in choosing the job coordinator through the
job's c10d store (torchrun's rendezvous store, a TCPStore, or any store with compare_set):

  trainsup/telemetry/<job>/token        the job token: the first agent's random one wins
  trainsup/telemetry/<job>/coordinator  "<host>:<port>/<epoch>" of the coordinator in office
  trainsup/telemetry/<job>/ranks        JSON [[rank, local_rank, host, gpu], ...] it has learned
  trainsup/telemetry/<job>/verdict      JSON of the first fatal verdict (what the agents act on)

Election: every agent tries compare_set(coordinator, "", mine); the winner starts the
coordinator and the others point their node monitors at it. Takeover: when an agent's node
monitor has not been connected to the coordinator in office for `takeover_s`, the agent starts a
coordinator of its own, seeded with the published rank table and expecting every rank within
`heartbeat_timeout_s`, and offers it with compare_set(coordinator, <the silent one>, mine); one
agent wins, everyone follows the key. A background thread does all this every 0.2 s and
publishes the coordinator's verdicts and rank table. Without a store (one host), the agent
simply runs both.
"""
import hashlib
import json
import os
import secrets
import threading
import time
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from .. import _trainsup_agent
from ..names import telemetry_key
from .store import _text, compare_set, first_set, peek


__all__ = ["NodeServices", "publish_verdict", "rank_table"]


def publish_verdict(store: Any, job_id: str, verdict: Dict[str, Any],
                    replaces: Sequence[str] = ()) -> Dict[str, Any]:
    """Makes `verdict` the job round's first fatal verdict unless one is there already (or the
    one there is of a kind in `replaces`). Returns the verdict in force."""
    key = telemetry_key(job_id, "verdict")
    text = json.dumps(verdict)
    current = first_set(store, key, text)
    while current != text:
        try:
            held = json.loads(current)
        except ValueError:
            return verdict
        if held.get("kind") not in replaces:
            return held
        current = _text(compare_set(store, key, current, text))
    return verdict


def rank_table(store: Any, job_id: str) -> List[List[Any]]:
    """[[rank, local_rank, host, gpu], ...] as the job round's coordinator last published it."""
    text = peek(store, telemetry_key(job_id, "ranks"))
    return [list(r) for r in json.loads(text)] if text else []


class NodeServices:
    def __init__(self, store: Any, job_id: str, node_name: str, world_size: int, socket_dir: str,
                 bind: str = "127.0.0.1", advertise: Optional[str] = None, takeover_s: float = 3.0,
                 hang_floor_s: Optional[float] = None, heartbeat_timeout_s: Optional[float] = None,
                 collective_budgets: str = "", network_grace_s: Optional[float] = None,
                 on_verdict: Optional[Callable[[Dict[str, Any]], None]] = None,
                 on_event: Optional[Callable[..., None]] = None,
                 vet: Optional[Callable[[Dict[str, Any]], bool]] = None,
                 slow_hosts: Optional[Callable[[], List[str]]] = None,
                 on_published: Optional[Callable[[], None]] = None) -> None:
        self.store = store
        self.job_id = job_id
        self.node_name = node_name
        self.world_size = int(world_size)
        self.bind = bind
        self.advertise = advertise or bind
        self.takeover_s = takeover_s
        defaults = _trainsup_agent.DETECTOR_DEFAULTS  # None: the C++ default
        self.hang_floor_s = defaults["hang_floor_s"] if hang_floor_s is None else hang_floor_s
        self.heartbeat_timeout_s = defaults["heartbeat_timeout_s"] if heartbeat_timeout_s is None else heartbeat_timeout_s
        self.collective_budgets = collective_budgets
        self.network_grace_s = defaults["network_grace_s"] if network_grace_s is None else network_grace_s
        self.on_verdict = on_verdict
        self.vet = vet or (lambda verdict: True)  # may our coordinator's fatal verdict be published?
        # slow_hosts() -> the job's hosts whose links are slow now; our coordinator is told (read
        # at most once a second, and again whenever a new coordinator of ours starts).
        self.slow_hosts = slow_hosts
        self._slow_told: Tuple[Any, List[str]] = (None, [])  # (coordinator, hosts) last told
        self._slow_read_at = 0.0
        self.on_event = on_event or (lambda name, **fields: None)
        # Called once our coordinator's fatal verdict is in the store: the agent acts on it now
        # rather than at its watch thread's next look.
        self.on_published = on_published or (lambda: None)
        os.makedirs(socket_dir, mode=0o700, exist_ok=True)
        tag = hashlib.sha1(job_id.encode()).hexdigest()[:8]
        self.socket_path = os.path.join(socket_dir, f"{tag}-{node_name}.sock")
        self.token = self._agree_token()
        self.coordinator: Any = None  # ours, when in office (or offered)
        self.following: Optional[str] = None  # "host:port/epoch" our node monitor points at
        self.verdicts: List[Dict[str, Any]] = []  # every verdict our coordinator reached
        self._unpublished: Optional[Dict[str, Any]] = None      # our coordinator's first fatal verdict, until the store has it
        self._publish_failures = 0
        self._published_verdict = False
        self._lock = threading.Lock()
        self._tick_lock = threading.Lock()  # one pass at a time: the thread's tick, or flush()
        self._stop = threading.Event()
        self._disconnected_since: Optional[float] = None
        self._mine = ""
        self._last_table: Optional[str] = None
        self._last_error: Optional[Exception] = None
        self.monitor = _trainsup_agent.NodeMonitor(self.socket_path, "127.0.0.1", 0, self.token)
        self._follow_or_elect()
        self._thread = threading.Thread(target=self._run, name="trainsup-node-services", daemon=True)
        self._thread.start()

    # --- what the ranks of this host need ---
    @property
    def rank_env(self) -> Dict[str, str]:
        return {"TRAINSUP_COORDINATOR": f"unix:{self.socket_path}", "TRAINSUP_JOB_TOKEN": self.token}

    @property
    def in_office(self) -> bool:
        return self.coordinator is not None and self.following == self._mine

    # --- internals ---
    def _agree_token(self) -> str:
        mine = secrets.token_hex(16)
        if self.store is None:
            return mine
        return first_set(self.store, telemetry_key(self.job_id, "token"), mine)

    def _published(self) -> str:
        if self.store is None:
            return self.following or ""
        try:
            return peek(self.store, telemetry_key(self.job_id, "coordinator")) or ""
        except Exception:  # the store itself is unreachable: keep what we follow
            return self.following or ""

    def _start_coordinator(self, takeover: bool) -> Any:
        known = []
        if takeover and self.store is not None:
            try:
                known = [tuple(r) for r in rank_table(self.store, self.job_id)]
            except Exception:
                known = []
        c = _trainsup_agent.Coordinator(self.world_size, self.token, bind=self.bind, port=0,
                                  hang_floor_s=self.hang_floor_s, heartbeat_timeout_s=self.heartbeat_timeout_s,
                                  expect_within_s=self.heartbeat_timeout_s + 1.0 if takeover else 0.0,
                                  known_ranks=known, collective_budgets=self.collective_budgets,
                                  network_grace_s=self.network_grace_s)
        epoch = int(time.time() * 1000)
        self._mine = f"{self.advertise}:{c.port}/{epoch}"
        return c

    def _follow(self, published: str) -> None:
        if published and published != self.following:
            address = published.split("/")[0]
            host, port = address.rsplit(":", 1)
            self.monitor.set_coordinator(host, int(port))
            self.following = published
            self._disconnected_since = None

    def _follow_or_elect(self, expected: str = "") -> None:
        """Offers our own coordinator for the office held by `expected` ("" = nobody)."""
        candidate = self._start_coordinator(takeover=bool(expected))
        if self.store is None:
            won = self._mine
        else:
            won = _text(compare_set(self.store, telemetry_key(self.job_id, "coordinator"), expected, self._mine))
        if won == self._mine:
            if self.coordinator is not None:
                self.coordinator.stop()
            self.coordinator = candidate
            self.on_event("coordinator_elected" if not expected else "coordinator_takeover",
                          coordinator=won, replaced=expected)
        else:
            candidate.stop()
        self._follow(won)

    def _publish(self) -> None:
        c = self.coordinator
        if c is None or not self.in_office:
            return
        verdicts = c.take_verdicts()
        if verdicts:
            with self._lock:
                self.verdicts.extend(verdicts)
            fatal = [v for v in verdicts if v["kind"] != "straggler"]
            if fatal and self._unpublished is None and not self._published_verdict and self.store is not None \
                    and self.vet(fatal[0]):
                self._unpublished = fatal[0]
            if self.on_verdict:
                for v in verdicts:
                    self.on_verdict(v)
        if self._unpublished is not None:
            # Taken from the coordinator already: until the store has it, it exists only here.
            # A store error (a moment of unreachability) leaves it for the next tick, said once.
            try:
                publish_verdict(self.store, self.job_id, self._unpublished)
            except Exception as e:
                self._publish_failures += 1
                if self._publish_failures == 1:
                    self.on_event("verdict_publish_failed", kind=self._unpublished["kind"],
                                  hosts=self._unpublished.get("hosts", []), error=f"{type(e).__name__}: {e}")
                raise
            if self._publish_failures:
                self.on_event("verdict_published", kind=self._unpublished["kind"], attempts=self._publish_failures + 1)
            self._unpublished, self._publish_failures, self._published_verdict = None, 0, True
            self.on_published()
        if self.store is not None:
            table = [list(r) for r in c.known_ranks() if r[2]]
            text = json.dumps(table)
            if text != self._last_table:
                self.store.set(telemetry_key(self.job_id, "ranks"), text)
                self._last_table = text

    def flush(self, settle_s: float = 0.0) -> None:
        """Publishes now what our coordinator concluded and the 0.2 s tick has not published
        yet. The agent calls it when the round ends: the ranks exit on the coordinator's own
        abort order at once, and an agent that restarted before the next tick closed the
        coordinator with the verdict still in it; the other agents then took the office over
        and named this host's ranks for their silence (a healthy host quarantined).

        settle_s: the round ended because this host's own workers failed. When our coordinator
        is in office and has reached no verdict yet, it may be on its way: a killed worker's
        closed connection reaches it through this host's node monitor (forwarded every 0.05 s),
        while torchrun noticed the exit within its 0.02 s monitor interval. Wait up to settle_s
        for it (returning as soon as there is one); else the coordinator closed with the
        failure unnamed and the job restarted with the failed host in it."""
        c = self.coordinator
        if settle_s > 0 and c is not None and self.in_office:
            deadline = time.monotonic() + settle_s
            while not self._published_verdict and self._unpublished is None:
                left = deadline - time.monotonic()
                # The tick thread may take the verdict first (and publish it): short slices.
                if left <= 0 or c.wait_verdicts(min(0.02, left)):
                    break
        with self._tick_lock:
            try:
                self._publish()
            except Exception as e:  # said by _publish when the store refused; the tick retries
                self._last_error = e

    def _pause(self, seconds: float) -> None:
        """Waits for the next tick: `seconds`, or less when our coordinator reaches a verdict
        meanwhile (it is published at once, not up to a tick later)."""
        c = self.coordinator
        if c is not None and self.in_office:
            c.wait_verdicts(seconds)
        else:
            self._stop.wait(seconds)

    def _run(self) -> None:
        failing = False
        while not self._stop.is_set():
            self._pause(0.2)
            if self._stop.is_set():
                break
            try:
                with self._tick_lock:
                    self._tick()
                failing = False
            except Exception as e:  # the store may be gone for a moment; try again next tick
                self._last_error = e
                if not failing:  # said once per spell of failures, not every 0.2 s
                    self.on_event("node_services_error", error=f"{type(e).__name__}: {e}")
                failing = True

    def _tick(self) -> None:
        published = self._published()
        if published and published != self.following:
            if self.coordinator is not None and published != self._mine:
                # Another agent took the office over from ours (or never let ours in): stop it
                # now, not at the next round. Its node monitors are moving to the new one, and
                # a coordinator left running would read their departures as dead ranks (they
                # tell it they moved, which deposes it; stopping also frees its port and thread).
                self.coordinator.stop()
                self.coordinator = None
                self.on_event("coordinator_deposed", coordinator=self._mine, replaced_by=published)
            self._follow(published)
        self._publish()
        self._tell_slow_hosts()
        connected = self.monitor.counters()["coordinator_connected"]
        now = time.monotonic()
        if connected or self.in_office:
            self._disconnected_since = None
            return
        if self._disconnected_since is None:
            self._disconnected_since = now
        elif now - self._disconnected_since >= self.takeover_s:
            self._disconnected_since = None
            self._follow_or_elect(expected=self.following or "")

    def _tell_slow_hosts(self) -> None:
        c = self.coordinator
        now = time.monotonic()
        if self.slow_hosts is None or c is None or not self.in_office:
            return
        if self._slow_told[0] is c and now - self._slow_read_at < 1.0:
            return
        self._slow_read_at = now
        try:
            hosts = sorted(self.slow_hosts())
        except Exception:  # the store may be away for a moment: the rest of the tick must run
            return
        if self._slow_told != (c, hosts):
            c.set_slow_hosts(hosts)
            if self._slow_told[1] != hosts:
                self.on_event("slow_hosts", hosts=hosts)
            self._slow_told = (c, hosts)

    def first_verdict(self) -> Optional[Dict[str, Any]]:
        """The job's first fatal verdict as published in the store (any agent), or None."""
        if self.store is None:
            with self._lock:
                return self.verdicts[0] if self.verdicts else None
        try:
            text = peek(self.store, telemetry_key(self.job_id, "verdict"))
            if text:
                return json.loads(text)
        except Exception:
            pass
        return None

    def close(self) -> None:
        self._stop.set()
        c = self.coordinator
        if c is not None:
            c.wake()  # the tick thread may be waiting for verdicts: up to 0.2 s of every restart
        self._thread.join(timeout=5)
        self.flush()  # a verdict our coordinator reached since the last tick goes out, not down with it
        self.monitor.stop()
        if self.coordinator is not None:
            self.coordinator.stop()
            self.coordinator = None
