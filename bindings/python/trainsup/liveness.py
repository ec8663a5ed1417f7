"""Host liveness for the launcher: names a host whose agent died outright (power loss, kernel
panic, a killed node), which no rank can report because the host's ranks, node monitor and
perhaps the coordinator went with it.

Each agent renews a keep-alive counter in the job's store every `interval_s`
(TRAINSUP_AGENT_HEARTBEAT_S) on a thread that does nothing else and, after each rendezvous,
registers its group rank. A second thread watches the next two agents of its round in
group-rank order (a ring: every agent is watched twice, and each reads a few keys a second, so
the store's load grows with the number of hosts, not its square). An agent whose counter has not
moved for `timeout_s` (TRAINSUP_AGENT_TIMEOUT_S), and that has not said it left on purpose (a
normal end, a quarantine exit, giving up, a signal from the scheduler), is reported through
on_lost(host, silent_s, node_desc, round) on the watching thread; if on_lost raises, on_error
is told and the host is reported again at the next check.

Silence only counts while the watcher's own view is fresh: a host is reported only if, since its
counter last moved, the watcher's own counter has moved at least `own_beats_needed` times. A
stalled store (every counter stops at once) or a watcher that was not scheduled therefore
reports nobody, where it would otherwise take every host it watches for dead. An agent that is
itself frozen past the timeout is still reported: its node monitor forwards its ranks'
telemetry, so to the job it is a dead host.

The store must be a client of this agent's own: a TCPStore client serialises its operations, and
torchrun's agent blocks in long gets on its own (its exit barrier waits up to 300 s), which
would stop the keep-alive and get this host taken for dead.

Keys, under the launcher's "trainsup/" prefix:
  agents/<run>/<host>/beat       the counter
  agents/<run>/<host>/node       JSON [fqdn, pid, local_id]: this agent's node in torch's rendezvous
  agents/<run>/<host>/left       the node JSON of an agent that ended on purpose (a marker left
                                 by an earlier agent of the host, e.g. before a requeue, does
                                 not match the current node and counts for nothing)
  agents/<run>/round-<r>/<g>     the host of group rank g in round r
"""
import json
import threading
import time

from .telemetry import peek


class HostLiveness:
    def __init__(self, store, run_id, host, node_desc, on_lost, interval_s=1.0, timeout_s=5.0, on_error=None,
                 on_unconfirmed=None, clock=time.monotonic, start=True):
        self.store = store
        self.clock = clock
        self.run_id = run_id
        self.host = host
        self.interval_s = float(interval_s)
        self.timeout_s = float(timeout_s)
        self.on_lost = on_lost
        self.on_error = on_error or (lambda host, error: None)
        # Own keep-alives that must have gone through during a host's silence for it to count:
        # most of those due in the timeout, allowing for a late one or two.
        self.own_beats_needed = max(1, int(self.timeout_s / self.interval_s) - 2)
        self.unconfirmed = 0          # checks that found a silence but a stale own view
        self.on_unconfirmed = on_unconfirmed or (lambda host, silent_s, own_beats: None)
        self._node = json.dumps(node_desc)
        self._lock = threading.Lock()
        self._round = None            # (round, group_rank, group_world) of our last rendezvous
        self._seen = {}               # host -> (node, counter value, time it last changed, own counter then)
        self._lost = set()            # (host, node) reported lost
        self._stop = threading.Event()
        self.store.set(self._key(host, "node"), self._node)
        self.beat()
        self._threads = [threading.Thread(target=self._loop, args=(fn,), name=f"trainsup-agent-{name}", daemon=True)
                         for name, fn in (("keepalive", self.beat), ("watch", self.check))] if start else []
        for t in self._threads:
            t.start()

    def _key(self, host, name):
        return f"agents/{self.run_id}/{host}/{name}"

    def _round_key(self, rnd, group_rank):
        return f"agents/{self.run_id}/round-{rnd}/{group_rank}"

    def beat(self):
        """Renews this agent's keep-alive (the keep-alive thread calls it every interval_s)."""
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

    def current_node(self, host):
        """(node, gone) of the host's current agent: its node in torch's rendezvous
        ([fqdn, pid, local_id], None when unknown), and whether it left on purpose or was
        reported lost."""
        text = peek(self.store, self._key(host, "node"))
        gone = (host, text) in self._lost or (text is not None and peek(self.store, self._key(host, "left")) == text)
        return (json.loads(text) if text else None), gone

    def left(self):
        """This agent ends on purpose: nobody should report it lost."""
        self._stop.set()
        try:
            self.store.set(self._key(self.host, "left"), self._node)
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

    def check(self):
        """Reads the watched agents' counters and reports those silent for timeout_s (the watch
        thread calls it every interval_s)."""
        rnd, hosts = self._watched()
        now = self.clock()
        own = int(peek(self.store, self._key(self.host, "beat")) or 0)
        for host in hosts:
            node = peek(self.store, self._key(host, "node"))
            if (host, node) in self._lost:
                continue
            value = peek(self.store, self._key(host, "beat"))
            last = self._seen.get(host)
            if last is None or last[:2] != (node, value):
                self._seen[host] = (node, value, now, own)  # a new agent of the host starts afresh
                continue
            silent = now - last[2]
            if silent < self.timeout_s or peek(self.store, self._key(host, "left")) == node:
                continue
            if own - last[3] < self.own_beats_needed:
                self.unconfirmed += 1  # our own keep-alives stalled too: the store or we were stuck
                self.on_unconfirmed(host, silent, own - last[3])
                continue
            try:
                self.on_lost(host, silent, json.loads(node) if node else None, rnd)
                self._lost.add((host, node))
            except Exception as e:  # told, and reported again at the next check
                self.on_error(host, e)

    def _loop(self, fn):
        while not self._stop.wait(self.interval_s):
            try:
                fn()
            except Exception as e:  # the store may be unreachable for a moment: try again
                self.last_error = e
