"""The rendezvous hook of `python3 -m trainsup.run`: torchrun's own c10d (or etcd-v2)
rendezvous, wrapped so that

- each round starts this host's telemetry services (node monitor; coordinator where elected)
  for that round's workers, and hands the workers their TRAINSUP_COORDINATOR and job token;
- the first fatal verdict quarantines the culprit's host; the agent on that host kills its
  workers, leaves the rendezvous and exits with EXIT_QUARANTINED (95), so that the others form
  the next round at once, with a spare in its place or with fewer nodes when MIN allows;
- nodes beyond MAX wait as spares without making the active nodes restart again and again
  (torch 1.13 reports a waiting node that cannot be admitted, and every agent restarts its
  workers for it);
- restarts are counted for the whole job in the store, and a job that restarts more than
  TRAINSUP_MAX_RESTARTS times, or TRAINSUP_MAX_RESTARTS_WITHOUT_PROGRESS times without the
  newest valid checkpoint moving, ends with EXIT_DO_NOT_REQUEUE (96).
Each agent writes its events to <run dir>/agent-<host>.events.jsonl (docs/events.md).
"""
import glob
import json
import os
import signal
import socket
import sys
import threading
import time

from torch.distributed import PrefixStore
from torch.distributed.elastic.rendezvous import RendezvousHandler

from . import _torchrun_compat as compat
from .classify import classify, tail
from . import _trainsup, names, preflight
from .checkpoint import load_checkpoint
from .quarantine import EXIT_QUARANTINED, Quarantine, run_commands
from .liveness import HostLiveness
from .telemetry import NodeServices, compare_set, peek, publish_verdict, rank_table

EXIT_DO_NOT_REQUEUE = _trainsup.EXIT_DO_NOT_REQUEUE  # trainsup/exit_codes.h: 96
# Verdicts that say a host is broken (not the program): its host is quarantined.
QUARANTINE_KINDS = {"hung_rank", "silent_rank", "stalled_rank", "dead_rank", "dead_host"}


def node_name():
    return os.environ.get("TRAINSUP_NODE_NAME") or socket.gethostname()


class AgentEvents:
    """JSON lines like a rank's event log, for the agent."""

    def __init__(self, run_dir, host):
        os.makedirs(run_dir, exist_ok=True)
        self.path = names.agent_events_file(run_dir, host)
        self.host = host
        self._lock = threading.Lock()
        self._warned = False

    def write(self, event, **fields):
        """Appends one event. A log that cannot be written (a full disk) loses the event, says so
        once on stderr, and never stops the agent from doing what the event reports."""
        now = time.time()
        # wall_s as in the ranks' event logs (one name for one fact); time is the same value,
        # kept for readers of earlier releases.
        line = {"event": event, "time": now, "wall_s": now, "mono_ns": time.monotonic_ns(), "host": self.host,
                "pid": os.getpid(), **fields}
        try:
            with self._lock, open(self.path, "a") as f:
                f.write(json.dumps(line) + "\n")
        except OSError as e:
            if not self._warned:
                self._warned = True
                print(f"[trainsup] agent event log {self.path}: {e} (events are lost until it can be written)",
                      file=sys.stderr, flush=True)


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


def newest_valid_step(checkpoint_dir):
    """The step of the newest valid checkpoint, as restore would take it (progress for the
    restart guard: a newer but broken one is not progress), or -1."""
    try:
        return _trainsup.newest_valid_checkpoint(checkpoint_dir)["step"]
    except (OSError, RuntimeError):
        return -1


class TrainsupRendezvousHandler(RendezvousHandler):
    def __init__(self, inner, settings):
        self.inner = inner
        self.settings = settings
        self.node = node_name()
        self.run_dir = settings["run_dir"]
        self.events = AgentEvents(self.run_dir, self.node)
        # A store written in Python (etcd) must stay referenced here: the PrefixStore keeps only
        # its C++ half, and torch finds the Python methods through the live Python object.
        self._base_store = compat.trainsup_store(inner)
        self.store = PrefixStore("trainsup/", self._base_store)
        self.quarantine = Quarantine(settings["quarantine_dir"], self.store)
        self.services = None
        self.round = None
        self._world = 0  # group world of self.round
        self._round_hosts = None  # (round, its hosts), for _slow_hosts
        self._handled_verdicts = set()
        self._stop = threading.Event()
        self._watch = threading.Thread(target=self._watch_loop, name="trainsup-agent-watch", daemon=True)
        self._watch.start()
        self.events.write("agent_start", run_id=inner.get_run_id(), max_nodes=compat.max_nodes(inner))
        self._lost_lock = threading.Lock()
        self.liveness = HostLiveness(self.store, inner.get_run_id(), self.node, compat.node_desc(inner),
                                     self._host_lost, interval_s=settings["agent_heartbeat_s"],
                                     timeout_s=settings["agent_timeout_s"],
                                     on_error=lambda host, e: self.events.write("agent_lost_unhandled",
                                                                                lost_host=host, error=str(e)),
                                     on_unconfirmed=lambda host, silent_s, own, reason="stale": self.events.write(
                                         "agent_silence_unconfirmed", silent_host=host, silent_s=round(silent_s, 3),
                                         own_beats=own, reason=reason),
                                     on_slow=self._slow_link,
                                     slow_link_multiplier=_trainsup.DETECTOR_DEFAULTS["slow_link_multiplier"])
        self._preflight()

    def _preflight(self):
        gpus = []
        healthy, details, bad_gpus = preflight.run(self.settings.get("preflight_command"), records=gpus)
        self.events.write("preflight", healthy=healthy, details=details, bad_gpus=bad_gpus, gpus=gpus)
        if not healthy and self.quarantine.get(self.node) is None:
            self._quarantine(self.node, "preflight: " + "; ".join(details[1:]), "preflight", gpu=",".join(bad_gpus))

    def _quarantine(self, host, reason, verdict, gpu=""):
        """Writes the record, says so in the event log and runs the configured commands."""
        record = self.quarantine.add(host, reason=reason, verdict=verdict, gpu=gpu,
                                     ttl_s=self.settings["quarantine_ttl_s"])
        self.events.write("quarantine", quarantined_host=host, verdict=verdict, gpu=gpu)
        for command, rc in run_commands(record, self.settings["quarantine_commands"]):
            self.events.write("quarantine_command", command=command, exit_code=rc)

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
        self._stop.set()
        self.liveness.left()
        if self.services is not None:
            self.services.close()
            self.services = None
        self.events.write("agent_stop")
        return self.inner.shutdown()

    def stopped_by_signal(self, sig):
        """The agent is ending on a signal from outside (torchrun does not call shutdown() then,
        so that the rendezvous stays open): it leaves on purpose, so that no other agent takes
        this host for dead, and leaves the rendezvous, so that the others form the next round
        now instead of after torch's keep-alive expiry."""
        self._stop.set()
        self.liveness.left()
        self.events.write("agent_signalled", signal=int(sig))
        try:
            compat.leave(self.inner)
        except Exception as e:  # the keep-alive expires anyway
            self.events.write("rendezvous_leave_failed", error=str(e))

    def num_nodes_waiting(self):
        n = self.inner.num_nodes_waiting()
        st = compat.state(self.inner)
        if n and st.complete and len(st.participants) >= compat.max_nodes(self.inner):
            return 0  # spares: no room for them, so no reason to restart for them
        return n

    def next_rendezvous(self):
        if self.round is not None:
            try:
                self._classify_failures()
            except Exception as e:  # classification is a report, never a reason to stop
                self.events.write("worker_failure_unreadable", error=str(e))
        self._leave_if_quarantined()
        self._account_restart()
        if self.services is not None:
            self.services.close()
            self.services = None
        t0 = time.monotonic()
        self.events.write("rendezvous_join", previous_round=self.round)
        expedite = self._start_expediting()
        try:
            result = self.inner.next_rendezvous()
        finally:
            expedite.set()
        store, group_rank, group_world = compat.unpack_rendezvous(result)
        self.round = compat.round_of(self.inner)
        nproc = self.settings["nproc_per_node"]
        self.services = NodeServices(self.store, f"{self.get_run_id()}.{self.round}", self.node, group_world * nproc,
                                     self.settings["socket_dir"], bind=self.settings["bind"],
                                     advertise=self.settings["advertise"],
                                     hang_floor_s=self.settings.get("hang_floor_s"),
                                     heartbeat_timeout_s=self.settings.get("rank_silence_s"),
                                     collective_budgets=self.settings.get("collective_budgets", ""),
                                     network_grace_s=self.settings.get("network_grace_s"),
                                     on_event=lambda name, **f: self.events.write(name, round=self.round, **f),
                                     on_verdict=self._report, vet=self._vet, slow_hosts=self._slow_hosts)
        os.environ.update(self.services.rank_env)
        os.environ["TRAINSUP_NODE_NAME"] = self.node
        os.environ["TRAINSUP_RESTART_COUNT"] = str(self.round)
        os.environ.setdefault("TRAINSUP_JOB_ID", self.get_run_id())
        self.liveness.joined_round(self.round, group_rank, group_world)
        self._world = group_world
        self.events.write("rendezvous", round=self.round, group_rank=group_rank, group_world=group_world,
                          wait_s=round(time.monotonic() - t0, 3), coordinator=self.services.following)
        return result

    def _vet(self, v):
        """Whether our coordinator's fatal verdict may be published to the job. Not when it names
        another host and this agent hears no other agent either: then it is more likely this
        host that is cut off (a partition looks like that from its side), and publishing would
        get a healthy host quarantined once the network heals."""
        hosts = [h for h in v.get("hosts", []) if h != self.node]
        if v.get("kind") in QUARANTINE_KINDS and hosts and self.liveness.isolated_from(hosts[0]):
            self.events.write("verdict_withheld", round=self.round, kind=v["kind"], hosts=v["hosts"],
                              reason="no other agent heard from: this host is likely the one cut off")
            return False
        return True

    def _report(self, v):
        """Every verdict of the coordinator in this agent (fatal ones are also acted on through
        the store, by every agent). A straggler is only reported: the job goes on, and this is
        where its operator learns which rank and host hold it back."""
        if v["kind"] != "straggler":
            return
        self.events.write("straggler", round=self.round, ranks=v["ranks"], hosts=v["hosts"], gpus=v.get("gpus", []),
                          evidence=v.get("evidence", ""))
        print(f"[trainsup] straggler: rank(s) {v['ranks']} on host(s) {v['hosts']}: {v.get('evidence', '')}",
              file=sys.stderr, flush=True)

    # --- policies ---
    def _expected_back(self, hosts):
        """The nodes (node_desc() lists) that can come back of `hosts` (the round we were in):
        their current agents, less those that left, were lost or are quarantined (None when one
        of them is not known)."""
        nodes = []
        for h in hosts:
            node, gone = self.liveness.current_node(h)
            if gone or self.quarantine.get(h) is not None:
                continue
            if node is None:
                return None
            nodes.append(node)
        return nodes

    def _start_expediting(self):
        """On a restart, watches the round being formed and ends torch's last-call wait once
        every node that can come back has joined (a shrinking job would otherwise wait 30 s for
        nodes that are gone). Returns the event that stops the watch."""
        done = threading.Event()
        if self.round is None:
            return done
        rnd, world = self.round, self._world

        def watch():
            hosts = None  # the last round's hosts: read once, when first needed
            while not done.wait(0.5):
                try:
                    forming = compat.forming_round(self.inner)
                    if forming is None or not forming[1] or forming[0] < compat.min_nodes(self.inner):
                        continue  # no last call under way: nothing to end
                    hosts = hosts if hosts is not None else self.liveness.hosts_of_round(rnd, world)
                    expected = self._expected_back(hosts)
                    # Every node that can come back has joined (by identity, not by count: a
                    # spare or a newcomer is no stand-in for a survivor still on its way);
                    # expedite() checks that on the state it writes.
                    if expected is not None and compat.expedite(self.inner, expected):
                        self.events.write("rendezvous_expedited", joined=forming[0], expected=len(expected))
                        return
                except Exception as e:  # torch's own deadline still ends the wait
                    self.events.write("rendezvous_expedite_failed", error=str(e))
                    return

        threading.Thread(target=watch, name="trainsup-rendezvous-expedite", daemon=True).start()
        return done

    def _leave_if_quarantined(self):
        record = self.quarantine.get(self.node)
        if record is None:
            return
        self.events.write("quarantined_exit", reason=record.get("reason", ""), verdict=record.get("verdict", ""))
        try:
            compat.leave(self.inner)
        except Exception as e:  # our keep-alive expires anyway
            self.events.write("rendezvous_leave_failed", error=str(e))
        if self.services is not None:
            self.services.close()
        print(f"[trainsup] host {self.node} is quarantined ({record.get('reason', '')}); "
              f"its agent leaves the job (exit {EXIT_QUARANTINED})", flush=True)
        self._exit(EXIT_QUARANTINED)

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
        os._exit(code)

    def _order_local_abort(self, services, v):
        """The round is over: order our ranks to abort, as the coordinator does. When the
        coordinator was on the host that was lost, this is the only order they get (otherwise
        they would wait in a collective until their own watchdog gave up)."""
        try:
            services.monitor.abort_local_ranks(v["ranks"][0] if v.get("ranks") else -1, v["kind"],
                                               (v.get("hosts") or [""])[0])
            self.events.write("abort_relayed", round=self.round, kind=v["kind"], hosts=v.get("hosts", []))
        except Exception as e:
            self.events.write("agent_watch_error", error=f"abort order to local ranks: {e}")

    def _slow_hosts(self):
        """The hosts of our round whose agents report a slow link (for our coordinator). The
        round's hosts are read once, when all have registered; then one store read a second."""
        rnd, world = self.round, self._world
        if rnd is None:
            return []
        cached = self._round_hosts
        if cached is None or cached[0] != rnd or len(cached[1]) < world:
            cached = self._round_hosts = (rnd, self.liveness.hosts_of_round(rnd, world))
        return self.liveness.slow_hosts(cached[1])

    def _slow_link(self, host, median_s, baseline_s, slow):
        """This host's round trips to the store crossed the slow-link threshold (or came back):
        recorded and said, never quarantined (a slow host is a straggler, not a dead one)."""
        self.events.write("slow_link" if slow else "slow_link_recovered", slow_host=host,
                          round_trip_ms=round(median_s * 1000, 1), baseline_ms=round(baseline_s * 1000, 2))
        if slow:
            print(f"trainsup: {host}: round trips to the rendezvous store take {median_s * 1000:.0f} ms "
                  f"(median of the last {self.liveness._round_trips.maxlen}; {baseline_s * 1000:.1f} ms at best): "
                  "this host's network is slow; the job runs at its pace", file=sys.stderr, flush=True)

    def _host_lost(self, host, silent_s, desc, rnd):
        """HostLiveness found `host`'s agent silent: the host died outright. Names it (unless a
        verdict already explains the round; one that only says a rank failed is replaced: the
        vanished host explains it), quarantines it, and removes its node from the rendezvous so
        that the others do not wait out torch's keep-alive expiry."""
        with self._lost_lock:
            job_id = f"{self.get_run_id()}.{rnd}"
            self.events.write("agent_lost", round=rnd, lost_host=host, silent_s=round(silent_s, 3))
            try:
                table = rank_table(self.store, job_id)
            except Exception:
                table = []
            ranks = sorted(r[0] for r in table if r[2] == host)
            gpus = [r[3] for r in sorted(table) if r[2] == host]
            evidence = (f"host {host}'s agent stopped renewing its keep-alive {silent_s:.1f} s ago "
                        f"(timeout {self.settings['agent_timeout_s']:g} s): the host died with its ranks "
                        f"{', '.join(map(str, ranks)) or '(none known)'}")
            ours = {"kind": "dead_host", "ranks": ranks, "hosts": [host], "gpus": gpus, "section": "",
                    "evidence": evidence}
            held = publish_verdict(self.store, job_id, ours, replaces=("failed_rank",))
            if held == ours:
                self._handled_verdicts.add((job_id, json.dumps(ours, sort_keys=True)))
                self.events.write("verdict", round=rnd, kind="dead_host", ranks=ranks, hosts=[host], section="",
                                  evidence=evidence)
                services = self.services
                if services is not None and services.job_id == job_id:
                    self._order_local_abort(services, ours)
            # Two agents watch each host: the first to claim it quarantines (and runs the commands).
            claim = names.lost_claim_key(self.get_run_id(), host, desc)
            if self.quarantine.get(host) is None and compare_set(self.store, claim, "", self.node) == self.node.encode():
                self._quarantine(host, evidence, "dead_host", gpu=(gpus or [""])[0])
            if desc is not None:
                try:
                    present = compat.evict(self.inner, desc)
                    self.events.write("rendezvous_evicted", evicted_host=host, was_present=present)
                except Exception as e:  # torch's keep-alive expiry removes it anyway, later
                    self.events.write("rendezvous_evict_failed", evicted_host=host, error=str(e))

    def _classify_failures(self):
        """Classifies the previous attempt's worker output on this host (torchrun's log files);
        a GPU hardware fault quarantines this host by itself."""
        root = self.settings.get("worker_log_dir")
        if not root:
            return
        attempts = sorted(glob.glob(os.path.join(root, f"{self.get_run_id()}_*", "attempt_*")), key=os.path.getmtime)
        if not attempts:
            return
        for stderr in sorted(glob.glob(os.path.join(attempts[-1], "*", "stderr.log"))):
            cls, line = classify(tail(stderr))
            if cls == "unknown":
                continue
            local_rank = os.path.basename(os.path.dirname(stderr))
            self.events.write("worker_failure", round=self.round, local_rank=local_rank, error_class=cls, line=line)
            if cls == "gpu_hardware" and self.quarantine.get(self.node) is None:
                self._quarantine(self.node, line, "gpu_hardware")

    def _account_restart(self):
        """Called before each rendezvous after the first: counts restarts for the whole job."""
        if self.round is None:
            return
        key = f"restarts/{self.get_run_id()}"
        # Every agent of the failed round comes here; the first one counts the restart.
        n = int(self.store.add(f"{key}/count-{self.round}", 1))
        restarts = int(self.store.add(key, 1 if n == 1 else 0))
        step = newest_valid_step(self.settings["checkpoint_dir"])
        progress_key = f"{key}/progress"
        last = peek(self.store, progress_key)
        stuck_key = f"{key}/stuck"
        if n == 1:
            if last is not None and int(last) >= step:
                self.store.add(stuck_key, 1)
            else:
                self.store.set(stuck_key, "0")  # counters: set resets
            self.store.set(progress_key, str(step))
        stuck = int(peek(self.store, stuck_key) or 0)
        self.events.write("restart", restarts=restarts, newest_checkpoint_step=step, restarts_without_progress=stuck)
        cap, stuck_cap = self.settings["max_restarts"], self.settings["max_restarts_without_progress"]
        if restarts > cap or stuck > stuck_cap:
            why = (f"{restarts} restarts (cap {cap})" if restarts > cap
                   else f"{stuck} restarts without a newer checkpoint (cap {stuck_cap})")
            self.events.write("give_up", reason=why, code=EXIT_DO_NOT_REQUEUE)
            print(f"[trainsup] giving up after {why}: exit {EXIT_DO_NOT_REQUEUE} (do not requeue)", flush=True)
            try:
                compat.leave(self.inner)
            except Exception:
                pass
            self._exit(EXIT_DO_NOT_REQUEUE)

    def _watch_loop(self):
        """Acts on the round's first verdict. Nothing that goes wrong in one pass may end the
        thread: an agent that stopped watching would never leave when its own host is named."""
        while not self._stop.wait(0.2):
            try:
                self._watch_once()
            except Exception as e:
                self.events.write("agent_watch_error", error=f"{type(e).__name__}: {e}")  # never raises

    def _watch_once(self):
        services = self.services
        if services is None:
            return
        try:
            v = services.first_verdict()
        except Exception:
            return  # the store is away for a moment: the next pass asks again
        if v is None:
            return
        key = (services.job_id, json.dumps(v, sort_keys=True))
        if key in self._handled_verdicts:
            return
        self._handled_verdicts.add(key)
        self.events.write("verdict", round=self.round, kind=v["kind"], ranks=v["ranks"], hosts=v["hosts"],
                          section=v.get("section", ""), evidence=v.get("evidence", ""))
        culprits = v["hosts"][:1] if v["kind"] in QUARANTINE_KINDS else []
        if culprits and culprits[0] != self.node and self.liveness.isolated_from(culprits[0]):
            self.events.write("verdict_withheld", round=self.round, kind=v["kind"], hosts=v["hosts"],
                              reason="no other agent heard from: this host is likely the one cut off")
            culprits = []
        if v["kind"] not in QUARANTINE_KINDS or culprits:
            self._order_local_abort(services, v)
        for host in culprits:
            try:
                if self.quarantine.get(host) is None and (services.in_office or host == self.node):
                    self._quarantine(host, v.get("evidence", v["kind"]), v["kind"],
                                     gpu=(v.get("gpus") or [""])[0])
            finally:
                if host == self.node:
                    # Our worker may be stopped or stuck: end it now (even if the record could
                    # not be written) so that the agent restarts, finds the host quarantined and
                    # leaves.
                    for pid in _children():
                        for sig in (signal.SIGCONT, signal.SIGKILL):
                            try:
                                os.kill(pid, sig)
                            except (ProcessLookupError, PermissionError):
                                pass
                    self.events.write("workers_killed", reason="host quarantined")
