"""Host liveness for the launcher: names a host whose agent died outright (power loss, kernel
panic, a killed node), which no rank can report because the host's ranks, node monitor and
perhaps the coordinator went with it.

Each agent renews a keep-alive counter in the job's store every `interval_s`
(TRAINSUP_AGENT_HEARTBEAT_S) and, after each rendezvous, registers its group rank. Each agent
watches the next two agents of its round in group-rank order (a ring: every agent is watched
twice, and each reads two keys a second, so the store's load grows with the number of hosts, not
its square). An agent whose counter has not moved for `timeout_s` (TRAINSUP_AGENT_TIMEOUT_S), and
that has not said it left on purpose (a normal end, a quarantine exit, giving up), is reported
through on_lost(host, silent_s, node_desc, round).

Keys, under the launcher's "trainsup/" prefix:
  agents/<run>/<host>/beat       the counter
  agents/<run>/<host>/node       JSON [fqdn, pid, local_id]: its node in torch's rendezvous
  agents/<run>/<host>/left       set when it ends on purpose
  agents/<run>/round-<r>/<g>     the host of group rank g in round r
"""
import json
import threading
import time

from .telemetry import peek


class HostLiveness:
    def __init__(self, store, run_id, host, node_desc, on_lost, interval_s=1.0, timeout_s=5.0):
        self.store = store
        self.run_id = run_id
        self.host = host
        self.interval_s = float(interval_s)
        self.timeout_s = float(timeout_s)
        self.on_lost = on_lost
        self._lock = threading.Lock()
        self._round = None            # (round, group_rank, group_world) of our last rendezvous
        self._seen = {}               # host -> (counter value, monotonic time it last changed)
        self._lost = set()
        self._stop = threading.Event()
        self.store.set(self._key(host, "node"), json.dumps(node_desc))
        self._beat()
        self._thread = threading.Thread(target=self._run, name="trainsup-agent-liveness", daemon=True)
        self._thread.start()

    def _key(self, host, name):
        return f"agents/{self.run_id}/{host}/{name}"

    def _round_key(self, rnd, group_rank):
        return f"agents/{self.run_id}/round-{rnd}/{group_rank}"

    def _beat(self):
        self.store.add(self._key(self.host, "beat"), 1)

    def joined_round(self, rnd, group_rank, group_world):
        """After a rendezvous: registers our place and watches the next agents of this round."""
        self.store.set(self._round_key(rnd, group_rank), self.host)
        with self._lock:
            self._round = (rnd, group_rank, group_world)
            self._seen = {}

    def hosts_of_round(self, rnd, group_world):
        """The hosts registered for round `rnd` (those that registered)."""
        hosts = []
        for g in range(group_world):
            host = peek(self.store, self._round_key(rnd, g))
            if host:
                hosts.append(host)
        return hosts

    def has_left(self, host):
        return host in self._lost or peek(self.store, self._key(host, "left")) is not None

    def left(self):
        """This agent ends on purpose: nobody should report it lost."""
        self._stop.set()
        try:
            self.store.set(self._key(self.host, "left"), "1")
        except Exception:
            pass  # the store is gone with the job

    def stop(self):
        self._stop.set()

    def _watched(self):
        with self._lock:
            if self._round is None:
                return None, []
            rnd, g, world = self._round
        hosts = []
        for i in range(1, min(2, world - 1) + 1):
            host = peek(self.store, self._round_key(rnd, (g + i) % world))
            if host and host != self.host:
                hosts.append(host)
        return rnd, hosts

    def _check(self):
        rnd, hosts = self._watched()
        now = time.monotonic()
        for host in hosts:
            if host in self._lost:
                continue
            value = peek(self.store, self._key(host, "beat"))
            last = self._seen.get(host)
            if last is None or last[0] != value:
                self._seen[host] = (value, now)
                continue
            silent = now - last[1]
            if silent < self.timeout_s or peek(self.store, self._key(host, "left")) is not None:
                continue
            self._lost.add(host)
            desc = peek(self.store, self._key(host, "node"))
            self.on_lost(host, silent, json.loads(desc) if desc else None, rnd)

    def _run(self):
        while not self._stop.wait(self.interval_s):
            try:
                self._beat()
                self._check()
            except Exception as e:  # the store may be unreachable for a moment: try again
                self.last_error = e
