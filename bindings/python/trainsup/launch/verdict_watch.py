"""What a launcher agent does with the verdicts of its round and with hosts that vanish:

- VerdictWatch's thread acts on the round's first fatal verdict (published in the store by the
  coordinator, or by an agent that found a host dead): it orders this host's ranks to abort,
  quarantines the culprit's host (the coordinator's agent, or the culprit's own), and on the
  culprit's host kills the workers so that the agent leaves;
- host_lost() is HostLiveness's callback for a host whose agent went silent: it publishes a
  dead_host verdict, quarantines the host and removes its node from the rendezvous;
- vet() keeps an agent that hears no other agent (likely cut off itself) from publishing its
  coordinator's verdict against another host; report() says stragglers (never acted on);
- slow_link() and slow_hosts() carry the slow-link measurements to the events and to the
  coordinator.
It reads the agent's current round and services from `agent` (the rendezvous handler)."""
import json
import os
import signal
import sys
import threading

from .. import names
from .node_services import publish_verdict, rank_table
from .liveness import join_threads
from .store import first_set

__all__ = ["VerdictWatch", "QUARANTINE_KINDS"]

# Verdicts that say a host is broken (not the program): its host is quarantined.
QUARANTINE_KINDS = {"hung_rank", "silent_rank", "stalled_rank", "dead_rank", "dead_host"}


def _children():
    """Pids of this process's children (the agent's workers)."""
    pids = []
    for task in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{task}/children") as f:
                pids += [int(p) for p in f.read().split()]
        except OSError:
            pass
    return pids


class VerdictWatch:
    def __init__(self, agent):
        self.agent = agent
        self._handled = set()  # (job id, verdict) already acted on
        self._lost_lock = threading.Lock()
        self._round_hosts = None  # (round, its hosts), for slow_hosts
        self._stop = threading.Event()
        self._wake = threading.Event()  # poke(): a verdict is in the store, look now
        self._act_lock = threading.Lock()  # one pass at a time: the thread's, or act_now()
        self._thread = None

    def start(self):
        self._thread = threading.Thread(target=self._loop, name="trainsup-agent-watch", daemon=True)
        self._thread.start()

    def stop(self):
        """Ends the watch thread and waits (bounded) for it (liveness.join_threads says why)."""
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            join_threads([self._thread], 2.0)

    def poke(self):
        """Our coordinator's verdict has just been published: the watch thread looks now instead
        of at its next 0.2 s pass (the other agents' threads find it at theirs)."""
        self._wake.set()

    # --- the coordinator's verdicts ---
    def vet(self, v):
        """Whether our coordinator's fatal verdict may be published to the job. Not when it names
        another host and this agent hears no other agent either: then it is more likely this
        host that is cut off (a partition looks like that from its side), and publishing would
        get a healthy host quarantined once the network heals."""
        a = self.agent
        hosts = [h for h in v.get("hosts", []) if h != a.node]
        if v.get("kind") in QUARANTINE_KINDS and hosts and a.liveness.isolated_from(hosts[0]):
            a.events.write("verdict_withheld", round=a.round, kind=v["kind"], hosts=v["hosts"],
                           reason="no other agent heard from: this host is likely the one cut off")
            return False
        return True

    def report(self, v):
        """Every verdict of the coordinator in this agent (fatal ones are also acted on through
        the store, by every agent). A straggler is only reported: the job goes on, and this is
        where its operator learns which rank and host hold it back."""
        if v["kind"] != "straggler":
            return
        self.agent.events.write("straggler", round=self.agent.round, ranks=v["ranks"], hosts=v["hosts"],
                                gpus=v.get("gpus", []), evidence=v.get("evidence", ""))
        print(f"[trainsup] straggler: rank(s) {v['ranks']} on host(s) {v['hosts']}: {v.get('evidence', '')}",
              file=sys.stderr, flush=True)

    def order_local_abort(self, services, v):
        """The round is over: order our ranks to abort, as the coordinator does. When the
        coordinator was on the host that was lost, this is the only order they get (otherwise
        they would wait in a collective until their own watchdog gave up)."""
        a = self.agent
        try:
            services.monitor.abort_local_ranks(v["ranks"][0] if v.get("ranks") else -1, v["kind"],
                                               (v.get("hosts") or [""])[0])
            a.events.write("abort_relayed", round=a.round, kind=v["kind"], hosts=v.get("hosts", []))
        except Exception as e:
            a.events.write("agent_watch_error", error=f"abort order to local ranks: {e}")

    # --- slow links ---
    def slow_hosts(self):
        """The hosts of our round whose agents report a slow link (for our coordinator). The
        round's hosts are read once, when all have registered; then one store read a second."""
        a = self.agent
        rnd, world = a.round, a.world
        if rnd is None:
            return []
        cached = self._round_hosts
        if cached is None or cached[0] != rnd or len(cached[1]) < world:
            cached = self._round_hosts = (rnd, a.liveness.hosts_of_round(rnd, world))
        return a.liveness.slow_hosts(cached[1])

    def slow_link(self, host, median_s, baseline_s, slow):
        """This host's round trips to the store crossed the slow-link threshold (or came back):
        recorded and said, never quarantined (a slow host is a straggler, not a dead one)."""
        a = self.agent
        a.events.write("slow_link" if slow else "slow_link_recovered", slow_host=host,
                       round_trip_ms=round(median_s * 1000, 1), baseline_ms=round(baseline_s * 1000, 2))
        if slow:
            print(f"trainsup: {host}: round trips to the rendezvous store take {median_s * 1000:.0f} ms "
                  f"(median of the last {a.liveness.round_trip_window}; {baseline_s * 1000:.1f} ms at best): "
                  "this host's network is slow; the job runs at its pace", file=sys.stderr, flush=True)

    # --- hosts that vanish ---
    def host_lost(self, host, silent_s, desc, rnd):
        """HostLiveness found `host`'s agent silent: the host died outright. Names it (unless a
        verdict already explains the round; one that only says a rank failed is replaced: the
        vanished host explains it), quarantines it, and removes its node from the rendezvous so
        that the others do not wait out torch's keep-alive expiry."""
        a = self.agent
        with self._lost_lock:
            job_id = f"{a.get_run_id()}.{rnd}"
            a.events.write("agent_lost", round=rnd, lost_host=host, silent_s=round(silent_s, 3))
            try:
                table = rank_table(a.store, job_id)
            except Exception:
                table = []
            ranks = sorted(r[0] for r in table if r[2] == host)
            gpus = [r[3] for r in sorted(table) if r[2] == host]
            evidence = (f"host {host}'s agent stopped renewing its keep-alive {silent_s:.1f} s ago "
                        f"(timeout {a.settings['agent_timeout_s']:g} s): the host died with its ranks "
                        f"{', '.join(map(str, ranks)) or '(none known)'}")
            ours = {"kind": "dead_host", "ranks": ranks, "hosts": [host], "gpus": gpus, "section": "",
                    "evidence": evidence, "onset_s": round(silent_s, 3)}
            held = publish_verdict(a.store, job_id, ours, replaces=("failed_rank",))
            if held == ours:
                self._handled.add((job_id, json.dumps(ours, sort_keys=True)))
                a.events.write("verdict", round=rnd, kind="dead_host", ranks=ranks, hosts=[host], section="",
                               evidence=evidence, onset_s=round(silent_s, 3))
                services = a.services
                if services is not None and services.job_id == job_id:
                    self.order_local_abort(services, ours)
            # Two agents watch each host: the first to claim it quarantines (and runs the commands).
            claim = names.lost_claim_key(a.get_run_id(), host, desc)
            if a.quarantine.get(host) is None and first_set(a.store, claim, a.node) == a.node:
                a.quarantine.impose(host, evidence, "dead_host", gpu=(gpus or [""])[0])
            if desc is not None:
                a.evict(host, desc)

    # --- the watch thread ---
    def act_now(self):
        """One pass now, on the calling thread (the agent, when its round ends): the round's
        verdict is acted on before the round's services go, whatever the watch thread's timing."""
        try:
            with self._act_lock:
                self._once()
        except Exception as e:
            self.agent.events.write("agent_watch_error", error=f"{type(e).__name__}: {e}")

    def _loop(self):
        """Acts on the round's first verdict. Nothing that goes wrong in one pass may end the
        thread: an agent that stopped watching would never leave when its own host is named."""
        while True:
            self._wake.wait(0.2)
            self._wake.clear()
            if self._stop.is_set():
                return
            try:
                with self._act_lock:
                    self._once()
            except Exception as e:
                self.agent.events.write("agent_watch_error", error=f"{type(e).__name__}: {e}")  # never raises

    def _once(self):
        a = self.agent
        services = a.services
        if services is None:
            return
        try:
            v = services.first_verdict()
        except Exception:
            return  # the store is away for a moment: the next pass asks again
        if v is None:
            return
        key = (services.job_id, json.dumps(v, sort_keys=True))
        if key in self._handled:
            return
        self._handled.add(key)
        a.events.write("verdict", round=a.round, kind=v["kind"], ranks=v["ranks"], hosts=v["hosts"],
                       section=v.get("section", ""), group=v.get("group", ""), op=v.get("op", ""),
                       seq=v.get("seq", 0), other_op=v.get("other_op", ""), evidence=v.get("evidence", ""),
                       onset_s=round(float(v.get("onset_s", -1)), 3))
        culprits = v["hosts"][:1] if v["kind"] in QUARANTINE_KINDS else []
        if culprits and culprits[0] != a.node and a.liveness.isolated_from(culprits[0]):
            a.events.write("verdict_withheld", round=a.round, kind=v["kind"], hosts=v["hosts"],
                           reason="no other agent heard from: this host is likely the one cut off")
            culprits = []
        if v["kind"] not in QUARANTINE_KINDS or culprits:
            self.order_local_abort(services, v)
        for host in culprits:
            try:
                if a.quarantine.get(host) is None and (services.in_office or host == a.node):
                    a.quarantine.impose(host, v.get("evidence", v["kind"]), v["kind"], gpu=(v.get("gpus") or [""])[0])
            finally:
                if host == a.node:
                    # Our worker may be stopped or stuck: end it now (even if the record could
                    # not be written) so that the agent restarts, finds the host quarantined and
                    # leaves.
                    for pid in _children():
                        for sig in (signal.SIGCONT, signal.SIGKILL):
                            try:
                                os.kill(pid, sig)
                            except (ProcessLookupError, PermissionError):
                                pass
                    a.events.write("workers_killed", reason="host quarantined")
