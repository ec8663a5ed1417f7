"""The rendezvous hook of `python3 -m trainsup.run`: torchrun's own c10d (or etcd-v2)
rendezvous, wrapped so that

- each round starts this host's telemetry services (node monitor; coordinator where elected)
  for that round's workers, and hands the workers their TRAINSUP_COORDINATOR and job token;
- the first fatal verdict quarantines the culprit's host; the agent on that host kills its
  workers, leaves the rendezvous and exits with EXIT_QUARANTINED (95), so that the others form
  the next round at once, with a spare in its place or with fewer nodes when MIN allows;
- nodes beyond MAX wait as spares without making the active nodes restart again and again;
- restarts are counted for the whole job (a round that ends because nodes joined or left is no
  restart, as in torchrun), and a job that keeps failing ends with EXIT_DO_NOT_REQUEUE (96); so
  does one whose checkpoints this round's size cannot restore (the next attempt would fail the
  same way), and every agent follows a job that gave up;
- inside a fixed allocation (Slurm's, allocation.py) a job left with fewer hosts than its
  minimum ends at once with EXIT_REQUEUE (97) instead of waiting for hosts that cannot come.
Each agent writes its events to <run dir>/agent-<host>.events.jsonl (docs/events.md).

This module is the rendezvous wrapping and the wiring; each job is a module of its own:
telemetry.NodeServices (services), quarantine.AgentQuarantine (quarantine and preflight),
restarts.RestartGuard (restart policy), classify.classify_attempt (classification),
gpu_faults.GpuFaultJudge (whether a failure is this host's GPU's fault),
verdict_watch.VerdictWatch (verdicts and host loss), liveness.HostLiveness (keep-alives),
expedite.expedite_round (ending the last call early), waiting.NodesWaiting (torchrun's
"nodes waiting?" at a store cost that does not grow with the job), _compat (torchrun's internals).
"""
import json
import os
import re
import time

from torch.distributed import PrefixStore
from torch.distributed.elastic.rendezvous import RendezvousHandler

from . import _compat as compat
from .. import _trainsup, _trainsup_agent, names
from .agent_events import AgentEvents, node_name
from .classify import classify_attempt
from .expedite import expected_back, expedite_round
from .gpu_faults import GpuFaultJudge
from .liveness import HostLiveness
from ..quarantine import EXIT_QUARANTINED, Quarantine
from .quarantine_policy import AgentQuarantine
from .restarts import EXIT_DO_NOT_REQUEUE, RestartGuard
from .node_services import NodeServices
from .snapshots import DEFAULT_MEMORY, SnapshotService
from .store import first_set, peek
from .verdict_watch import VerdictWatch
from .waiting import NodesWaiting
from .fast_round import FastRestart

EXIT_REQUEUE = _trainsup.EXIT_REQUEUE  # trainsup/exit_codes.h: 97

__all__ = ["TrainsupRendezvousHandler"]

_INCOMPATIBLE = re.compile(r"were written by world size (\d+), this job has (\d+)")


# How long a restart waits for this agent's coordinator to name its failed workers, at most
# (NodeServices.flush): 5 node-monitor forwarding intervals.
VERDICT_SETTLE_S = 0.25


class TrainsupRendezvousHandler(RendezvousHandler):
    def __init__(self, inner, settings):
        self.inner = inner
        self.settings = settings
        self.node = node_name()
        self.run_dir = settings["run_dir"]
        self.events = AgentEvents(self.run_dir, self.node, inner.get_run_id())
        # A store written in Python (etcd) must stay referenced here: the PrefixStore keeps only
        # its C++ half, and torch finds the Python methods through the live Python object.
        self._base_store = compat.trainsup_store(inner)
        self.store = PrefixStore("trainsup/", self._base_store)
        self.quarantine = AgentQuarantine(Quarantine(settings["quarantine_dir"], self.store), self.node, self.events,
                                          ttl_s=settings["quarantine_ttl_s"],
                                          commands=settings["quarantine_commands"],
                                          preflight_command=settings.get("preflight_command"),
                                          kubernetes=settings.get("kubernetes_quarantine", False))
        self.restarts = RestartGuard(self.store, inner.get_run_id(), settings["checkpoint_dir"],
                                     settings["max_restarts"], settings["max_restarts_without_progress"], self.events,
                                     memory_step=self._newest_snapshot_step)
        self.gpu_faults = GpuFaultJudge(self.store, inner.get_run_id(), self.node)
        self.services = None
        self.round = None
        self.world = 0  # group world of self.round
        self._round_started = time.monotonic()
        self.waiting = NodesWaiting(inner, self.store, inner.get_run_id())
        self.fast_restart = FastRestart(inner, inner.get_run_id())
        # In the wait (or redundancy) list behind a complete round, as the stored state says: a spare.
        self.fast_restart.on_waiting = lambda rnd: self.events.write("rendezvous_waiting", behind_round=rnd)
        self._incompatible = None  # (world size the checkpoints need, the failure line) after such a failure
        self._last_desync = None  # (group, op, other_op, ranks) of the last round's desync verdict
        self.watch = VerdictWatch(self)
        self.watch.start()
        poll_s = compat.shorten_rendezvous_polls(inner)
        compat.wake_rendezvous_polls(self.fast_restart.wait_for_round)  # a spare hears of its round at once
        compat.damp_rendezvous_contention(inner)
        self.events.write("agent_start", run_id=inner.get_run_id(), max_nodes=compat.max_nodes(inner),
                          rendezvous_poll_s=poll_s)
        self.liveness = HostLiveness(self.store, inner.get_run_id(), self.node, compat.node_desc(inner),
                                     self.watch.host_lost, interval_s=settings["agent_heartbeat_s"],
                                     timeout_s=settings["agent_timeout_s"],
                                     on_error=lambda host, e: self.events.write("agent_lost_unhandled",
                                                                                lost_host=host, error=str(e)),
                                     on_unconfirmed=lambda host, silent_s, own, reason="stale": self.events.write(
                                         "agent_silence_unconfirmed", silent_host=host, silent_s=round(silent_s, 3),
                                         own_beats=own, reason=reason),
                                     on_slow=self.watch.slow_link,
                                     slow_link_multiplier=_trainsup_agent.DETECTOR_DEFAULTS["slow_link_multiplier"])
        self.quarantine.preflight()
        # This host's share of the in-memory snapshots, held across rounds (snapshots.py).
        self.snapshots = SnapshotService(self.store, inner.get_run_id(), self.node, settings["bind"],
                                         settings["advertise"], memory=settings.get("snapshot_memory", DEFAULT_MEMORY),
                                         max_bytes=settings.get("snapshot_max_bytes", 0),
                                         on_event=lambda name, **f: self.events.write(name, round=self.round, **f))
        self.metrics = None
        if settings.get("metrics_port") is not None:
            self._start_metrics(settings)

    def _start_metrics(self, settings):
        """/metrics and /status on --metrics-port (metrics.py); its address goes to
        <run dir>/agent-<host>.endpoint for `trainsup status`."""
        from .metrics import MetricsServer
        self.metrics = MetricsServer(self._metrics_state, self.run_dir, os.environ.get("TRAINSUP_LOG_DIR"),
                                     settings["metrics_port"], settings.get("metrics_bind", "0.0.0.0"))
        bind = settings.get("metrics_bind", "0.0.0.0")
        # Where others reach it: the address it listens on, if one; else the coordinator's.
        advertise = bind if bind not in ("0.0.0.0", "::", "") else (settings.get("advertise") or self.node)
        url = f"http://{advertise}:{self.metrics.port}"
        names.write_endpoint(self.run_dir, self.node, url)
        self.events.write("metrics_serving", url=url)

    def _metrics_state(self):
        """The agent's view for metrics.py: read at each scrape, from other threads."""
        services = self.services
        in_office = bool(services is not None and services.in_office)
        snapshot = None
        if services is not None and in_office and services.coordinator is not None:
            try:
                snapshot = services.coordinator.snapshot()
            except Exception:  # the coordinator closed between the two reads
                snapshot = None
        hosts = []
        if self.round is not None:
            try:
                hosts = self.liveness.hosts_of_round(self.round, self.world)
            except Exception:
                hosts = []
        try:
            quarantined = [r["host"] for r in self.quarantine.records.list()]
        except OSError:
            quarantined = []
        return {"host": self.node, "run_id": self.get_run_id(), "round": self.round if self.round is not None else -1,
                "world": self.world, "in_round": services is not None, "in_office": in_office,
                "coordinator": services.following if services is not None else None, "hosts": hosts,
                "snapshot": snapshot, "quarantined": quarantined, "spares_waiting": self.waiting.spares,
                "restarts_used": self.restarts.used, "max_restarts": self.settings["max_restarts"]}

    def _newest_snapshot_step(self):
        return self.snapshots.newest_step()

    # --- RendezvousHandler ---
    def get_backend(self):
        return "trainsup"

    def get_run_id(self):
        return self.inner.get_run_id()

    @property
    def use_agent_store(self):
        return compat.use_agent_store(self.inner)

    def is_closed(self):
        return self.inner.is_closed()

    def set_closed(self):
        self.inner.set_closed()

    def shutdown(self):
        self.watch.stop()
        self.liveness.left()
        if self.services is not None:
            self.services.close()
            self.services = None
        self.snapshots.close()
        self.fast_restart.close()
        self.events.write("agent_stop")
        return self.inner.shutdown()

    def stopped_by_signal(self, sig):
        """The agent is ending on a signal from outside (torchrun does not call shutdown() then,
        so that the rendezvous stays open): it leaves on purpose, so that no other agent takes
        this host for dead, and leaves the rendezvous, so that the others form the next round
        now instead of after torch's keep-alive expiry."""
        self.watch.stop()
        self.liveness.left()
        self.events.write("agent_signalled", signal=int(sig))
        self._leave_rendezvous()
        self.fast_restart.close()

    def num_nodes_waiting(self):
        # torchrun asks only while its workers are healthy, and restarts the round at once when
        # nodes wait: that restart is a change of membership, not a failure. The answer costs a
        # read of the whole rendezvous state only when a node announced a join (waiting.py).
        return self.waiting()

    def _membership_change(self):
        """Whether the round that ended was ended for nodes that joined (torchrun restarts a
        healthy round for them and, deliberately, does not count it against --max-restarts):
        asked for by num_nodes_waiting(), and no fatal verdict in the round. A grown job must not
        give up on its next real failure for having grown (issue 19)."""
        waiting = self.waiting.answer
        # The next round asks afresh (a cached answer would end it at once for the same nodes).
        self.waiting.reset()
        if not waiting or self.round is None:
            return 0
        try:
            if self.services is not None and self.services.first_verdict() is not None:
                return 0  # the round failed, whatever else was going on
        except Exception:
            pass
        return waiting

    def next_rendezvous(self):
        if self.services is not None:
            # The round ended, perhaps on our coordinator's own abort order moments ago: its
            # verdict goes to the store and is acted on now, before the services close.
            # A round ended by this host's own failed workers (not for nodes that joined): our
            # coordinator may still be reaching its verdict on them.
            self.services.flush(settle_s=0.0 if self.waiting.answer else VERDICT_SETTLE_S)
            self.watch.act_now()
            self._check_repeated_desync()
        joined = self._membership_change()
        self._follow_give_up()
        if self.round is not None and not joined:
            self._classify_failures()
        self._leave_if_quarantined()
        if self.round is not None and joined:
            self.events.write("membership_change", previous_round=self.round, nodes_waiting=joined)
        elif self.round is not None:
            why = self.restarts.account(self.round)
            if why is not None:
                self._give_up(why)
            self._requeue_if_exhausted()
        if self.services is not None:
            self.services.close()
            self.services = None
        t0 = time.monotonic()
        self.events.write("rendezvous_join", previous_round=self.round)
        self.waiting.announce()
        result = self._fast_restart() if self.round is not None and not joined else None
        if result is None:
            expedite = expedite_round(self)
            try:
                result = self.inner.next_rendezvous()
            finally:
                expedite.set()
        store, group_rank, group_world = compat.unpack_rendezvous(result)
        self.round = compat.round_of(self.inner)
        self.services = self._start_services(group_world)
        os.environ.update(self.services.rank_env)
        self.snapshots.joined_round(self.round, group_rank, group_world)
        os.environ.update(self.snapshots.rank_env)
        os.environ["TRAINSUP_NODE_NAME"] = self.node
        os.environ["TRAINSUP_RESTART_COUNT"] = str(self.round)
        os.environ.setdefault("TRAINSUP_JOB_ID", self.get_run_id())
        self.liveness.joined_round(self.round, group_rank, group_world)
        self.world = group_world
        self.events.write("rendezvous", round=self.round, group_rank=group_rank, group_world=group_world,
                          wait_s=round(time.monotonic() - t0, 3), coordinator=self.services.following)
        self._check_restorable(group_world)
        self._round_started = time.monotonic()
        return result

    def _fast_restart(self):
        """A restart after a fault: the round written once by one survivor (fast_round.py),
        or None for torch's protocol."""
        try:
            hosts = self.liveness.hosts_of_round(self.round, self.world)
            # Asked again while the round forms: a host found lost meanwhile is no longer waited for.
            # This host may be quarantined while the round forms (the verdict naming it can come
            # after its own worker's exit brought it here): it leaves then, not later.
            result = self.fast_restart(lambda: self._leave_if_out() or expected_back(self, hosts))
        except Exception as e:  # torch's protocol still forms the round
            self.events.write("rendezvous_fast", outcome="fallback", reason=f"{type(e).__name__}: {e}")
            return None
        if result is None:
            self._leave_if_quarantined()
            self.events.write("rendezvous_fast", outcome="fallback", reason=self.fast_restart.last)
        else:
            self.events.write("rendezvous_fast", outcome="written", phases=self.fast_restart.phases)
        return result

    # --- the round's services ---
    def _start_services(self, group_world):
        """This host's node monitor (and, where elected, the job's coordinator) for the round."""
        s = self.settings
        return NodeServices(self.store, f"{self.get_run_id()}.{self.round}", self.node, group_world * s["nproc_per_node"],
                            s["socket_dir"], bind=s["bind"], advertise=s["advertise"],
                            hang_floor_s=s.get("hang_floor_s"), heartbeat_timeout_s=s.get("rank_silence_s"),
                            collective_budgets=s.get("collective_budgets", ""),
                            network_grace_s=s.get("network_grace_s"),
                            on_event=lambda name, **f: self.events.write(name, round=self.round, **f),
                            on_verdict=self.watch.report, vet=self.watch.vet, slow_hosts=self.watch.slow_hosts,
                            on_published=self.watch.poke)

    def _classify_failures(self):
        """Classifies the previous attempt's worker output on this host (torchrun's log files).
        This host is quarantined only on evidence that its GPU is at fault (gpu_faults.py): a
        program's own CUDA errors are reported, not blamed on the host. Never a reason to stop."""
        try:
            failures = classify_attempt(self.settings.get("worker_log_dir"), self.get_run_id())
            for local_rank, cls, line in failures:
                self.events.write("worker_failure", round=self.round, local_rank=local_rank, error_class=cls,
                                  line=line)
                m = _INCOMPATIBLE.search(line) if cls == "checkpoint_incompatible" else None
                if m:
                    self._incompatible = (int(m.group(1)), line)
            verdict, reason, notes = self.gpu_faults.judge(self.round, failures, self._round_started)
            if verdict is not None:
                if self.quarantine.get(self.node) is None:
                    self.quarantine.impose(self.node, reason, verdict)
            elif any(cls == "cuda_error" for _, cls, _ in failures):
                self.events.write("cuda_error_not_blamed", round=self.round, evidence=notes,
                                  reason="no evidence that only hardware gives (NVML counters, kernel log Xid, "
                                         "uncorrectable ECC, a lost GPU): the program's error until it recurs "
                                         "here alone")
        except Exception as e:
            self.events.write("worker_failure_unreadable", error=f"{type(e).__name__}: {e}")

    def _check_repeated_desync(self):
        """A desync (ranks entering different collectives at the same point) is the program's
        error: restarted from the same checkpoint it happens again, attempt after attempt, until
        the restart cap. When the round that ended had the same desync as the one before (group,
        ops, ranks), give up now, saying where."""
        if self.services is None:
            return
        try:
            v = self.services.first_verdict()
        except Exception:
            return
        signature = None
        if v is not None and v.get("kind") == "desync":
            signature = (v.get("group", ""), v.get("op", ""), v.get("other_op", ""), tuple(v.get("ranks", [])))
        previous, self._last_desync = self._last_desync, signature
        if signature is not None and signature == previous:
            group, op, other, ranks = signature
            self._give_up(f"the program issued collectives out of order in two attempts in a row: in group "
                          f"'{group or '?'}' rank(s) {list(ranks)} entered {other or '?'} where the others entered "
                          f"{op or '?'}; a restart from the same checkpoint repeats it. Fix the program. "
                          f"Evidence: {v.get('evidence', '')}", cause="desync")

    def _check_restorable(self, group_world):
        """After a failure to restore checkpoints written by another world size: a round of the
        same wrong size would fail the same way, attempt after attempt, until the restart cap
        (issue 19). Give up now, saying why; a round of the right size (nodes came back) goes on."""
        if self._incompatible is None:
            return
        written, line = self._incompatible
        self._incompatible = None
        world = group_world * int(self.settings["nproc_per_node"])
        if world == written:
            self.events.write("checkpoint_world_matches", round=self.round, world_size=world)
            return
        self._give_up(f"the job's checkpoints were written by world size {written} and its workers cannot restore "
                      f"them with world size {world} (trainsup's own shards of non-replicated state do not "
                      f"reshard; Python states holding DTensors are written as torch.distributed.checkpoint "
                      f"checkpoints, which do); the next attempt would fail the same way. Relaunch with world size {written}, "
                      f"or restore elsewhere. The workers said: {line}", cause="checkpoint_incompatible")

    # --- leaving ---
    def evict(self, host, desc):
        """Removes a lost host's node from the rendezvous (VerdictWatch.host_lost)."""
        try:
            present = compat.evict(self.inner, desc)
            self.events.write("rendezvous_evicted", evicted_host=host, was_present=present)
        except Exception as e:  # torch's keep-alive expiry removes it anyway, later
            self.events.write("rendezvous_evict_failed", evicted_host=host, error=str(e))

    def _leave_rendezvous(self):
        try:
            compat.leave(self.inner)
        except Exception as e:  # our keep-alive expires anyway
            self.events.write("rendezvous_leave_failed", error=str(e))

    def _leave_if_quarantined(self):
        record = self.quarantine.get(self.node)
        if record is None:
            return
        self.events.write("quarantined_exit", reason=record.get("reason", ""), verdict=record.get("verdict", ""))
        self._leave_rendezvous()
        if self.services is not None:
            self.services.close()
        print(f"[trainsup] host {self.node} is quarantined ({record.get('reason', '')}); "
              f"its agent leaves the job (exit {EXIT_QUARANTINED})", flush=True)
        self._exit(EXIT_QUARANTINED)

    def _give_up(self, why, cause="restart_cap", followed=False):
        """Ends this agent with EXIT_DO_NOT_REQUEUE (96), and the job with it: the reason is
        published (set once), and every agent that restarts afterwards gives up with it."""
        if not followed:
            try:
                first_set(self.store, names.give_up_key(self.get_run_id()),
                          json.dumps({"reason": why, "cause": cause, "host": self.node, "time": time.time()}))
            except Exception as e:  # the others reach the same decision on their own, or time out
                self.events.write("give_up_unpublished", error=f"{type(e).__name__}: {e}")
        self.events.write("give_up", reason=why, cause=cause, code=EXIT_DO_NOT_REQUEUE, followed=followed)
        print(f"[trainsup] giving up: {why}: exit {EXIT_DO_NOT_REQUEUE} (do not requeue)", flush=True)
        self._leave_rendezvous()
        self._exit(EXIT_DO_NOT_REQUEUE)

    def _allocation_exhausted(self):
        """Why the job cannot re-form in its allocation (allocation.py), or None: fewer of the
        allocation's hosts are left, once the quarantined and the lost or departed are taken
        out, than the rendezvous's minimum. (Asked every poll while a round forms: batched
        reads, one store read each while nothing changes.)"""
        hosts = self.settings.get("allocation_hosts")
        if not hosts:
            return None
        others = [h for h in hosts if h != self.node]  # here: a quarantined host left before it asks
        quarantined = self.quarantine.records.records(others)
        members = self.liveness.current_nodes(others)
        out = []
        for h in others:
            if h in quarantined:
                out.append(f"{h} (quarantined)")
            elif members[h][1]:
                out.append(f"{h} (lost or left)")
        need = compat.min_nodes(self.inner)
        left = len(hosts) - len(out)
        if left >= need:
            return None
        return (f"the allocation's hosts {','.join(hosts)} have {left} left and the job needs {need} "
                f"(--nnodes minimum): out are {', '.join(out)}; no other host can join this allocation")

    def _leave_if_out(self):
        """While a round forms: this host quarantined leaves (95), an exhausted allocation ends
        the job for a requeue (97); returns None otherwise."""
        self._leave_if_quarantined()
        return self._requeue_if_exhausted()

    def _requeue_if_exhausted(self):
        """Ends this agent with EXIT_REQUEUE (97) when the allocation is exhausted; returns None
        otherwise. Every agent reaches the same answer from the same records."""
        why = self._allocation_exhausted()
        if why is None:
            return None
        self.events.write("requeue", reason=why, code=EXIT_REQUEUE)
        print(f"[trainsup] {why}: exit {EXIT_REQUEUE} (requeue the job)", flush=True)
        self._leave_rendezvous()
        self._exit(EXIT_REQUEUE)

    FOLLOW_NEW_AGENTS_S = 600.0  # torchrun's default join timeout: how long a newcomer would wait

    def _follow_give_up(self):
        """Another agent gave the job up: so does this one, which would otherwise wait for a
        round that never forms. A newcomer (no round yet) follows only a recent decision: a
        store that outlives the job (etcd) may hold one from before an operator's requeue."""
        try:
            text = peek(self.store, names.give_up_key(self.get_run_id()))
        except Exception:
            return
        if not text:
            return
        decided = json.loads(text)
        if self.round is None and time.time() - float(decided.get("time", 0)) > self.FOLLOW_NEW_AGENTS_S:
            return
        self._give_up(f"{decided['reason']} (decided by {decided['host']})", cause=decided.get("cause", ""),
                      followed=True)

    def _exit(self, code):
        """Ends this agent, which has left the rendezvous. If the rendezvous store lives in this
        process, it keeps serving, without taking part, until the others are done with it:
        otherwise every other node would lose the rendezvous (when the job ends or gives up at
        once, this agent may simply be the first to get here)."""
        self.liveness.left()
        if compat.serves_store(self.inner):
            self.events.write("store_kept", reason="this agent serves the rendezvous store", code=code)
            empty_since = None
            while True:
                time.sleep(1.0)  # polling the shared rendezvous state, once a second
                try:
                    over = compat.rendezvous_over(self.inner)
                except Exception:
                    over = True
                if compat.state(self.inner).closed:
                    break
                if over and not compat.others_alive(self.inner):
                    break  # nobody else ever joined, or everyone has gone
                empty_since = (empty_since or time.monotonic()) if over else None
                if empty_since is not None and time.monotonic() - empty_since > 60:
                    break
        # Until here a quarantined host's snapshot memory still served the others (its GPU
        # failed, not its memory); now it is freed.
        self.snapshots.close()
        os._exit(code)
