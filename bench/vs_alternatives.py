#!/usr/bin/env python3
"""trainsup beside what users would pick instead, on one job and the same faults, repeated runs
(issues 11 and 21; the tables and how to read them: docs/comparison.md).

The job (bench/alternatives/train.py): DDP on gloo, two simulated hosts of this machine
(host-a, host-b; one launcher and one rank each), --steps steps of --step-ms simulated compute,
a checkpoint every 50 steps, elastic 1..2 hosts where the system has that notion (so a lost host
can be left behind; no spare). Once both hosts are past --fault-step, and then a random part of
one step later (seeded: every system gets the same offsets), one fault hits host-b (rank 1):

  stop_rank   its rank's process gets SIGSTOP (a hung GPU, a deadlocked rank)
  kill_rank   its rank's process gets SIGKILL (a crash, an OOM kill)
  slow_rank   its rank is made 1.5x slower (stopped a third of every 60 ms), for the rest of the run
  stop_host   every process of the host (launcher and rank) gets SIGSTOP (a frozen node)

Systems, each set up as its own documentation and examples say (the reference is beside each
setting below, and in docs/comparison.md); where a threshold is chosen, it is 5 s for all:

  torchrun        torch's launcher with its defaults
  torchrun-tuned  init_process_group(timeout=5 s) and the c10d rendezvous' keep-alive settings
  torchrun-timer  torchelastic's per-worker FileTimer watchdog, 5 s around each step
  nvrx            NVIDIA Resiliency Extension's ft_launcher and rank heartbeat monitor (5 s)
  nvrx-inprocess  NVRx's in-process restart Wrapper (soft and heartbeat timeouts 5 s), no launcher
  torchft         Lighthouse + Manager as torchft's train_ddp.py, one replica group per host
  trainsup        trainsup-run with its defaults
  trainsup-snapshots  the same with in-memory snapshots every 5 steps (docs/snapshots.md)

Every system logs at INFO (LOGLEVEL=INFO for torchelastic, FT_LAUNCHER_LOGLEVEL=INFO for NVRx,
logging.basicConfig(INFO) in torchft's job as in its train_ddp.py, RUST_LOG=info for its
Lighthouse). Every torchrun-based system runs with TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1, the setting trainsup
sets for itself (trainsup/launch/_compat.py): without it plain torchrun 2.13 fails its first restart.

One definition of each figure for every system, from timestamped records. Every line a system
prints (launcher, workers, services, on every host) is stamped when the harness reads it
(PYTHONUNBUFFERED=1 for all); trainsup's events carry their own timestamps; the job's step log
(train.py) carries its own:

  detect_s     fault -> the earliest record, on any host, that names the fault or reacts to it
               (a launcher's worker-failure or restart line, a monitor's timeout, a collective
               error, a smaller quorum, a verdict; patterns per system below), or the first step
               of a survivor going on without the victim
  named        the earliest record that names a culprit rank, and whether it is the victim
               (rank 1, host-b) or a healthy rank
  next_step_s  fault -> the first training step completed after recovery, with world_after, the
               number of ranks that step had (2: the job kept both hosts; 1: it went on without one)
  replayed     steps completed before the fault and completed again after it

Each cell (system x fault) runs --runs times (the order of the systems rotated per run); the
summary gives medians and ranges. Last line: one JSON object with every row, the cells, and per
fault the ratios trainsup / best alternative (for next_step_s both against every alternative
and against those that recovered to the same world size).

  vs_alternatives.py [--systems torchrun,...] [--faults stop_rank,...] [--runs 3] [--seed 1]
                     [--cap-s 120] [--workdir DIR] [--rows-from EARLIER_OUTPUT]
"""
import argparse
import json
import os
import pathlib
import random
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time

from trainsup.ports import free_port

HERE = pathlib.Path(__file__).resolve().parent
TRAIN = HERE / "alternatives" / "train.py"
HOSTS = ("host-a", "host-b")
VICTIM, SURVIVOR = "host-b", "host-a"
THRESHOLD_S = 5  # the one threshold every system gets where a threshold is chosen
FAULTS = ("stop_rank", "kill_rank", "slow_rank", "stop_host")


def read_jsonl(path):
    try:
        with open(path) as f:
            return [json.loads(line) for line in f if line.strip().startswith("{")]
    except FileNotFoundError:
        return []


def read_stamped(path):
    """[(t, text)] of a file written by Pump."""
    out = []
    try:
        with open(path, errors="replace") as f:
            for line in f:
                t, _, text = line.rstrip("\n").partition(" ")
                try:
                    out.append((float(t), text))
                except ValueError:
                    pass
    except FileNotFoundError:
        pass
    return out


class Pump(threading.Thread):
    """Copies a process's output into a file, each line stamped with the time it was read."""

    def __init__(self, pipe, path):
        super().__init__(daemon=True)
        self.pipe, self.path = pipe, path
        self.start()

    def run(self):
        with open(self.path, "a") as out:
            for raw in iter(self.pipe.readline, b""):
                out.write(f"{time.time():.4f} {raw.decode(errors='replace').rstrip()}\n")
                out.flush()


def descendants(pid):
    """pid and every process below it (from /proc)."""
    children = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        children.setdefault(ppid, []).append(int(entry))
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo += children.get(p, [])
    return out


def signal_all(pids, sig):
    for p in pids:
        try:
            os.kill(p, sig)
        except (ProcessLookupError, PermissionError):
            pass


# --- systems ---------------------------------------------------------------------------------

class Record:
    """One timestamped record of a system's reaction: where it came from, its words, and the
    (rank, host) it names as the culprit, if it names one."""

    def __init__(self, t, source, text, rank=None, host=None):
        self.t, self.source, self.text, self.rank, self.host = t, source, text, rank, host

    def as_dict(self, fault_t):
        return {"after_s": round(self.t - fault_t, 2), "source": self.source, "text": self.text[-220:],
                "rank": self.rank, "host": self.host}


class System:
    """How to launch one host of the job, and which of its records react to a fault."""
    name = ""
    needs = ()  # Python modules the system needs (a row says so when one is missing)
    reaction = None  # regex: a line of its output that reacts to a fault

    def __init__(self, case_dir, args):
        self.dir = case_dir
        self.args = args
        self.port = free_port()

    def train_args(self):
        return [str(TRAIN), "--steps", str(self.args.steps), "--step-ms", str(self.args.step_ms),
                "--checkpoint-every", "50", "--checkpoint-dir", str(self.dir / "ckpt")]

    def env(self, host):
        # LOGLEVEL=INFO: torchelastic's launcher logs its workers' failures, restarts and timer
        # reaping at INFO (torch.distributed.elastic.utils.logging reads LOGLEVEL; default WARNING).
        return dict(os.environ, BENCH_HOST=host, BENCH_STEPS_DIR=str(self.dir / "steps"), OMP_NUM_THREADS="1",
                    PYTHONUNBUFFERED="1", LOGLEVEL="INFO",
                    PYTHONPATH=os.pathsep.join([str(HERE / "alternatives")] + [p for p in sys.path if p]))

    def command(self, host):
        raise NotImplementedError

    def services(self):
        """Processes the system needs besides the hosts' launchers (started first)."""
        return []

    fatal = None  # regex: a line saying the system itself gave up (shown in the row)

    def names(self, text, pids, source):
        """(rank, host) that a line names as failed, or None. pids: pid -> (rank, host) of every
        rank process started in the case; source: the host whose output the line is in."""
        m = re.search(r"\(pid: (\d+)\)", text) or re.search(r"worker_pid=\[?(\d+)", text)
        if m and int(m.group(1)) in pids:
            return pids[int(m.group(1))]
        return None

    def records(self, fault_t, pids):
        out = []
        sources = [(h, self.dir / f"{h}.out") for h in HOSTS] + [("services", self.dir / "services.out")]
        for source, path in sources:
            for t, text in read_stamped(path):
                if t < fault_t or not self.reaction or not re.search(self.reaction, text):
                    continue
                named = self.names(text, pids, source)
                out.append(Record(t, source, text, *(named or (None, None))))
        return out


# torchelastic's agent: a worker's failure, the group's restart, a rendezvous closing; a
# worker's collective error (gloo's timeout or a peer's closed connection).
TORCHRUN_REACTION = (r"failed \(exitcode|Worker group failed|WorkerState\.(FAILED|UNHEALTHY)|[Rr]estarting worker|"
                     r"Stopping worker group|closing the rendezvous|RendezvousClosedError|Detected .* failed|"
                     r"DistBackendError|Timed out|timed out|Connection closed by peer|Connection reset|"
                     r"expired timers|Reaping worker_pid")


class Torchrun(System):
    """torch.distributed.run (torchrun) with the c10d rendezvous, 1..2 nodes, 3 restarts
    (torch docs, "torchrun (Elastic Launch)": elastic min:max nodes, --max-restarts)."""
    name = "torchrun"
    reaction = TORCHRUN_REACTION

    def rdzv_conf(self):
        return []

    def command(self, host):
        return [sys.executable, "-m", "torch.distributed.run", "--nnodes=1:2", "--nproc_per_node=1",
                "--rdzv_backend=c10d", f"--rdzv_endpoint=127.0.0.1:{self.port}", "--rdzv_id=bench",
                "--max_restarts=3"] + self.rdzv_conf() + self.train_args() + self.job_args()

    def job_args(self):
        return ["--system", "plain"]

    def env(self, host):
        # The compat setting trainsup sets for itself (trainsup/launch/_compat.py).
        return dict(super().env(host), TORCH_DISABLE_SHARE_RDZV_TCP_STORE="1")


class TorchrunTuned(Torchrun):
    """The shortest detection a torchrun user sets by hand: init_process_group(timeout=5 s) (torch
    docs, torch.distributed.init_process_group: "timeout ... for operations executed against the
    process group"; gloo has no other) and the c10d rendezvous' keep-alive (torch docs,
    "Rendezvous": keep_alive_interval, keep_alive_max_attempt, last_call_timeout)."""
    name = "torchrun-tuned"

    def rdzv_conf(self):
        return ["--rdzv_conf=join_timeout=60,last_call_timeout=1,keep_alive_interval=1,keep_alive_max_attempt=3"]

    def job_args(self):
        return ["--system", "plain", "--timeout-s", str(THRESHOLD_S)]


class TorchrunTimer(Torchrun):
    """torchelastic's per-worker watchdog (torch docs, "Expiration Timers" and
    LocalElasticAgent: TORCHELASTIC_ENABLE_FILE_TIMER=1 starts a FileTimerServer in the agent,
    whose workers hold torch.distributed.elastic.timer.expires(after=5 s) around each step; an
    expired timer gets its worker killed, and the agent restarts the group)."""
    name = "torchrun-timer"

    def job_args(self):
        return ["--system", "plain", "--file-timer-s", str(THRESHOLD_S)]

    def env(self, host):
        return dict(super().env(host), TORCHELASTIC_ENABLE_FILE_TIMER="1")


class Trainsup(System):
    name = "trainsup"
    needs = ("trainsup",)
    EVENTS = ("verdict", "straggler", "worker_failure", "agent_lost", "workers_killed", "abort_relayed")

    def command(self, host):
        return [sys.executable, "-m", "trainsup.run", "--nnodes=1:2", "--nproc_per_node=1", "--rdzv_backend=c10d",
                f"--rdzv_endpoint=127.0.0.1:{self.port}", "--rdzv_id=bench", "--run-dir", str(self.dir / "run")] + \
            self.train_args() + ["--system", "trainsup"]

    def env(self, host):
        return dict(super().env(host), TRAINSUP_NODE_NAME=host, TRAINSUP_LOG_DIR=str(self.dir / "logs"),
                    TRAINSUP_LOG_STDERR="0", TRAINSUP_CHECKPOINT_DIR=str(self.dir / "ckpt"))

    def records(self, fault_t, pids):
        out = []
        for h in HOSTS:
            for e in read_jsonl(self.dir / "run" / f"agent-{h}.events.jsonl"):
                if e["event"] not in self.EVENTS or e["time"] < fault_t:
                    continue
                rank = host = None
                if e["event"] in ("verdict", "straggler"):
                    rank = e["ranks"][0] if e.get("ranks") else None
                    host = e["hosts"][0] if e.get("hosts") else None
                    text = f"{e.get('kind', e['event'])}: ranks {e.get('ranks')} hosts {e.get('hosts')}: " \
                           f"{str(e.get('evidence', ''))[:160]}"
                else:
                    text = json.dumps({k: v for k, v in e.items() if k not in ("time", "seq")})[:220]
                out.append(Record(e["time"], h, text, rank, host))
        return out


class Nvrx(System):
    """ft_launcher (NVIDIA Resiliency Extension, a fork of torchrun) with its rank monitor and one
    heartbeat per step (its docs: fault_tolerance/integration/heartbeats.rst, and the example
    examples/fault_tolerance/train_ddp_heartbeats_api.py). Timeouts are "to be adjusted for each
    workload" (heartbeats.rst): rank_heartbeat_timeout 5 s, the initial one 60 s (startup), the
    monitor checking every 0.5 s (FaultToleranceConfig.workload_check_interval; default 5 s);
    --max-restarts=3 and the restart policy any-failed (the only one in 0.7.0); its barrier
    rendezvous (0.7.0's default, --ft-rdzv-impl), where --nnodes=MIN:MAX means MIN active nodes
    and MAX - MIN hot spares (usage_guide.rst, "--nnodes=6:8 ... Nodes 6-7: Hot spares"): this
    job's two active nodes and no spare are --nnodes=2:2, so NVRx does not go on with one node;
    the NIC checks off (no InfiniBand here)."""
    name = "nvrx"
    needs = ("nvidia_resiliency_ext",)
    reaction = (TORCHRUN_REACTION + r"|Did not get subsequent heartbeat|has been open|Was out of section|"
                r"[Hh]eartbeat timeout|hang detected|[Tt]erminat(ing|ed) (rank|worker)|RankMonitor.*(timeout|fail)")

    def command(self, host):
        launcher = shutil.which("ft_launcher", path=os.path.dirname(sys.executable)) or "ft_launcher"
        return [launcher, "--nnodes=2:2", "--nproc-per-node=1", "--rdzv-backend=c10d",
                f"--rdzv-endpoint=127.0.0.1:{self.port}", "--rdzv-id=bench", "--max-restarts=3",
                f"--rdzv-conf=is_host={int(host == HOSTS[0])}",
                "--ft-restart-policy=any-failed",
                "--ft-initial-rank-heartbeat-timeout=60", f"--ft-rank-heartbeat-timeout={THRESHOLD_S}",
                "--ft-workload-check-interval=0.5", "--ft-enable-nic-monitor=false",
                "--ft-enable-nic-healthcheck=false"] + self.train_args() + ["--system", "nvrx"]

    def env(self, host):
        # Two launchers on one machine are two simulated hosts: NVRx's barrier rendezvous closes
        # on that unless told ("If this is intentional simulation, set
        # NVRX_ENABLE_MULTI_LAUNCHERS_PER_NODE=1", its own error message).
        return dict(super().env(host), FT_LAUNCHER_LOGLEVEL="INFO", NVRX_ENABLE_MULTI_LAUNCHERS_PER_NODE="1")

    def names(self, text, pids, source):
        named = super().names(text, pids, source)
        if named:
            return named
        # A rank monitor runs beside each rank and speaks of that rank: its timeout line names
        # the rank of its own host.
        if re.search(r"Did not get subsequent heartbeat|has been open|Was out of section", text):
            ranks = sorted({r for (r, h) in pids.values() if h == source})
            if len(ranks) == 1:
                return ranks[0], source
        return None


class NvrxInprocess(System):
    """NVRx's in-process restart (nvidia_resiliency_ext.inprocess.Wrapper; its usage guide and
    examples/inprocess/basic_example.py, set up in bench/alternatives/nvrx_inprocess_job.py): the
    ranks are started by the harness (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT), as a scheduler
    that does not end the job when one rank exits; no launcher restarts a process."""
    name = "nvrx-inprocess"
    needs = ("nvidia_resiliency_ext",)
    # The Wrapper's own records (wrap.py: fn_ex, term_ex, health_ex, exit_ex, RankShouldRestart,
    # Interruption...); not the c10d "waitForInput ... likely a timeout" warnings its store
    # waits print all the time (its usage guide, "Known issues").
    reaction = r"fn_ex:|term_ex:|health_ex:|exit_ex:|RankShouldRestart|Interruption\.|[Tt]erminat(ed|ing) rank"

    def command(self, host):
        return [sys.executable] + self.train_args() + ["--system", "nvrx-inprocess", "--threshold-s", str(THRESHOLD_S)]

    def env(self, host):
        rank = HOSTS.index(host)
        # No LOCAL_RANK: the ranks are started as a scheduler does, not by torchrun (its usage
        # guide: the Wrapper is "not fully compatible with torch.distributed.run"), and on this
        # CPU host a LOCAL_RANK would not name a GPU. With it set, the Wrapper chains its GPU,
        # NVLink and NIC health checks (wrap.py, _construct_restart_health_check), which need
        # NVML and end the job at its first restart on a host without a GPU
        # (HealthCheckError ... NVMLError_LibraryNotFound).
        return dict(super().env(host), RANK=str(rank), WORLD_SIZE=str(len(HOSTS)),
                    MASTER_ADDR="127.0.0.1", MASTER_PORT=str(self.port))

    fatal = r"exit_ex:|HealthCheckError\(|health_ex:"

    def names(self, text, pids, source):
        # "Interruption.EXCEPTION affecting ranks {0}, Interruption.TERMINATED affecting ranks {1}":
        # the ranks of a kind other than EXCEPTION (an exception is what the others see of a
        # fault) are the culprits; a single rank named is a culprit named.
        found = re.findall(r"Interruption\.(\w+) affecting ranks \{([\d, ]+)\}", text)
        causes = [ranks for kind, ranks in found if kind != "EXCEPTION"] or [ranks for _, ranks in found]
        ranks = sorted({int(x) for group in causes for x in group.split(",") if x.strip()})
        if len(ranks) == 1:
            return ranks[0], next((h for (r, h) in pids.values() if r == ranks[0]), None)
        return None


class Torchft(System):
    """torchft as its train_ddp.py and README set it up: a Lighthouse
    (`torchft_lighthouse --min_replicas 1 --quorum_tick_ms 100 --join_timeout_ms 10000`), one
    replica group per host under torchrun, the Manager with ProcessGroupGloo(timeout=5 s) (the
    example's CPU setting), min_replica_size=1, timeout=30 s, PGTransport(timeout=10 s) for healing,
    replica_id set to the host (so that its logs could name it), torchft's Optimizer wrapper
    (zero_grad starts the quorum at the top of the step). torchrun --max_restarts=3 brings a
    killed replica back (it heals from a live peer)."""
    name = "torchft"
    needs = ("torchft",)
    # A step that does not commit, a Manager error, a worker's failure (torchrun under it), a
    # collective error; and (below) a Lighthouse quorum with fewer members. Not its per-step INFO
    # lines (quorum requests, should_commit=true), which it prints on every step.
    reaction = (r"should_commit=[Ff]alse|errored=(?!None)|\[ERROR\]|ERROR:|Traceback|Connection closed|"
                r"Connection reset|[Tt]imed out|failed \(exitcode|[Hh]ealing")

    def __init__(self, case_dir, args):
        super().__init__(case_dir, args)
        self.lighthouse_port = free_port()
        self.master_ports = {h: free_port() for h in HOSTS}

    def services(self):
        lighthouse = shutil.which("torchft_lighthouse", path=os.path.dirname(sys.executable)) or "torchft_lighthouse"
        return [([lighthouse, "--min_replicas", "1", "--quorum_tick_ms", "100", "--join_timeout_ms", "10000",
                  "--bind", f"[::]:{self.lighthouse_port}"], dict(os.environ, RUST_LOG="info"))]

    def command(self, host):
        return [sys.executable, "-m", "torch.distributed.run", "--nnodes=1", "--nproc_per_node=1",
                f"--master_port={self.master_ports[host]}", "--max_restarts=3"] + \
            self.train_args() + ["--system", "torchft"]

    def env(self, host):
        return dict(super().env(host), REPLICA_GROUP_ID=str(HOSTS.index(host)), NUM_REPLICA_GROUPS="2",
                    BENCH_REPLICA_ID=host, TORCHFT_LIGHTHOUSE=f"http://localhost:{self.lighthouse_port}")

    def records(self, fault_t, pids):
        out = super().records(fault_t, pids)
        for t, text in read_stamped(self.dir / "services.out"):
            if t >= fault_t and "Quorum! " in text and text.count("QuorumMember") < len(HOSTS):
                out.append(Record(t, "lighthouse", text))
        return out


class TrainsupSnapshots(Trainsup):
    """trainsup with in-memory snapshots every 5 steps held by the agents (docs/snapshots.md),
    beside the disk checkpoints every 50 steps that every system has here."""
    name = "trainsup-snapshots"

    def env(self, host):
        return dict(super().env(host), TRAINSUP_SNAPSHOT_EVERY_STEPS="5",
                    TRAINSUP_SNAPSHOT_MEMORY=f"/dev/shm/trainsup-vs-{self.port}")


SYSTEMS = {s.name: s for s in (Torchrun, TorchrunTuned, TorchrunTimer, Nvrx, NvrxInprocess, Torchft, Trainsup,
                               TrainsupSnapshots)}


# --- one case ----------------------------------------------------------------------------------

class Case:
    def __init__(self, system_cls, fault, run, root, args):
        self.fault, self.run_index = fault, run
        self.dir = root / f"run{run}-{system_cls.name}-{fault}"
        shutil.rmtree(self.dir, ignore_errors=True)
        (self.dir / "steps").mkdir(parents=True)
        self.system = system_cls(self.dir, args)
        self.args = args
        self.procs = {}
        self.extra = []
        self._stop_slow = threading.Event()
        # The same offsets into the step for every system: seeded by run and fault only.
        self.rng = random.Random(f"{args.seed}/{run}/{fault}")

    def steps(self, host):
        return read_jsonl(self.dir / "steps" / f"{host}.jsonl")

    def last_start(self, host):
        starts = [e for e in self.steps(host) if e["event"] == "start"]
        return starts[-1] if starts else None

    def progressed(self, step):
        return all(any(e["event"] == "step" and e["step"] >= step for e in self.steps(h)) for h in HOSTS)

    def spawn(self, cmd, env, out):
        p = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
        Pump(p.stdout, out)
        return p

    def start(self):
        for cmd, env in self.system.services():
            self.extra.append(self.spawn(cmd, env, self.dir / "services.out"))
        for host in HOSTS:
            self.procs[host] = self.spawn(self.system.command(host), self.system.env(host), self.dir / f"{host}.out")
            if host == HOSTS[0]:
                time.sleep(0.5)  # host-a first: it serves the c10d store, like a job's first node

    def wait(self, pred, timeout):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if pred():
                return True
            time.sleep(0.05)  # polls the job's step logs; bounded by the deadline
        return False

    def slow_loop(self):
        """1.5x slower: stopped 20 ms of every 60 ms, following the victim's current rank."""
        while not self._stop_slow.is_set():
            st = self.last_start(VICTIM)
            if st is None:
                time.sleep(0.06)
                continue
            signal_all([st["pid"]], signal.SIGSTOP)
            time.sleep(0.02)
            signal_all([st["pid"]], signal.SIGCONT)
            time.sleep(0.04)

    def inject(self, step_s):
        time.sleep(self.rng.uniform(0, step_s))  # a random point in the step, the same for every system
        victim = self.last_start(VICTIM)
        t = time.time()
        if self.fault == "stop_rank":
            signal_all([victim["pid"]], signal.SIGSTOP)
        elif self.fault == "kill_rank":
            signal_all([victim["pid"]], signal.SIGKILL)
        elif self.fault == "slow_rank":
            threading.Thread(target=self.slow_loop, daemon=True).start()
        elif self.fault == "stop_host":
            signal_all(descendants(self.procs[VICTIM].pid), signal.SIGSTOP)
        return t, victim

    def stop_all(self):
        self._stop_slow.set()
        for p in list(self.procs.values()) + self.extra:
            pids = descendants(p.pid)
            signal_all(pids, signal.SIGCONT)
            signal_all(pids, signal.SIGKILL)
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass

    def run(self):
        cap = self.args.cap_s
        row = {"system": self.system.name, "fault": self.fault, "run": self.run_index}
        try:
            self.start()
            if not self.wait(lambda: self.progressed(self.args.fault_step), 120):
                row["error"] = "the job did not reach step %d within 120 s (see %s)" % (self.args.fault_step, self.dir)
                return row
            before = [e for e in self.steps(SURVIVOR) if e["event"] == "step"]
            step_s = statistics.median(b["t"] - a["t"] for a, b in zip(before[-60:], before[-59:]))
            fault_t, victim = self.inject(step_s)
            last_done = max(e["step"] for h in HOSTS for e in self.steps(h) if e["event"] == "step" and e["t"] <= fault_t)
            # Watch until the job ends (but a frozen host's launcher) or the cap passes.
            deadline = time.monotonic() + cap
            while time.monotonic() < deadline:
                if all(p.poll() is not None for h, p in self.procs.items()
                       if not (self.fault == "stop_host" and h == VICTIM)):
                    break
                time.sleep(0.1)  # polls process state; bounded by the cap
            end_t = time.time()
            time.sleep(0.3)  # lets the pumps write the last lines (they stamp at read, not now)
            pids = {e["pid"]: (e["rank"], h) for h in HOSTS for e in self.steps(h) if e["event"] == "start"}
            records = sorted(self.system.records(fault_t, pids), key=lambda r: r.t)
            # A survivor going on with fewer ranks, without a restart (torchft's way), is a record too.
            for e in self.steps(SURVIVOR):
                if e["event"] == "step" and e["t"] > fault_t and e.get("world", 2) < victim.get("world", 2):
                    records.append(Record(e["t"], SURVIVOR, f"step {e['step']} with world {e['world']}"))
                    break
            records.sort(key=lambda r: r.t)
            if self.fault == "slow_rank":  # nothing stops: only a record naming a rank counts
                records = [r for r in records if r.rank is not None]
            row["detect_s"] = round(records[0].t - fault_t, 2) if records else None
            row["first_record"] = records[0].as_dict(fault_t) if records else None
            naming = [r for r in records if r.rank is not None]
            row["named"] = ("victim" if naming[0].rank == victim["rank"] else "healthy rank") if naming else "none"
            row["naming_record"] = naming[0].as_dict(fault_t) if naming else None
            row["host_named"] = bool(naming) and naming[0].host == VICTIM
            right = [r for r in naming if r.rank == victim["rank"]]
            wrong = [r for r in naming if r.rank != victim["rank"]]
            row["victim_named_s"] = round(right[0].t - fault_t, 2) if right else None
            row["healthy_named_s"] = round(wrong[0].t - fault_t, 2) if wrong else None
            if self.system.fatal:
                fatal = [(t, text) for h in HOSTS for t, text in read_stamped(self.dir / f"{h}.out")
                         if t >= fault_t and re.search(self.system.fatal, text)]
                if fatal:
                    row["system_gave_up"] = min(fatal)[1][-220:]
            # Recovery: the first step after the fault by a rank (re)started after it, or by the
            # survivor once it goes on with fewer ranks.
            after = []
            for h in HOSTS:
                starts = [e for e in self.steps(h) if e["event"] == "start" and e["t"] > fault_t]
                first_new = min((e["t"] for e in starts), default=None)
                for e in self.steps(h):
                    if e["event"] == "step" and e["t"] > fault_t and (
                            (first_new is not None and e["t"] >= first_new)
                            or e.get("world", 2) < victim.get("world", 2)):
                        after.append(e)
            if self.fault != "slow_rank" and after:
                first = min(after, key=lambda e: e["t"])
                row["next_step_s"] = round(first["t"] - fault_t, 2)
                row["world_after"] = first.get("world")
                redone = [e["step"] for h in HOSTS for e in self.steps(h) if e["event"] == "step" and e["t"] > fault_t]
                row["replayed_steps"] = max(0, last_done + 1 - min(redone)) if redone else 0
                row["replayed_s"] = round(row["replayed_steps"] * step_s, 2)
            elif self.fault != "slow_rank":
                row["next_step_s"] = None
            row["finished"] = any(e["event"] == "step" and e["step"] == self.args.steps - 1
                                  for h in HOSTS for e in self.steps(h))
            row["exit_codes"] = {h: p.poll() for h, p in self.procs.items()}
            row["wall_s"] = round(end_t - fault_t, 1)
            return row
        finally:
            self.stop_all()


def missing_module(names):
    import importlib.util
    for n in names:
        if importlib.util.find_spec(n) is None:
            return n
    return None


def versions():
    import importlib.metadata as md
    out = {}
    for dist in ("torch", "nvidia-resiliency-ext", "torchft"):
        try:
            out[dist] = md.version(dist)
        except md.PackageNotFoundError:
            out[dist] = None
    return out


def summarize_cell(rows, cap):
    """Medians and ranges of a cell's runs; a run that never detected / recovered counts as
    above the cap (it sorts last)."""
    def stat(key):
        values = [r.get(key) for r in rows if key in r]
        if not values:
            return None
        missing = sum(v is None for v in values)
        got = sorted(v for v in values if v is not None)
        if missing * 2 >= len(values):
            return {"median": None, "range": [got[0] if got else None, None], "missed": missing, "n": len(values)}
        padded = got + [float("inf")] * missing
        med = statistics.median(padded)
        return {"median": round(med, 2), "range": [got[0], got[-1] if not missing else None],
                "missed": missing, "n": len(values)}
    return {
        "runs": len(rows),
        "errors": [r["error"] for r in rows if "error" in r],
        "detect_s": stat("detect_s"),
        "next_step_s": stat("next_step_s"),
        "world_after": [r.get("world_after") for r in rows if "next_step_s" in r],
        "replayed_steps": [r.get("replayed_steps") for r in rows if "replayed_steps" in r],
        "named": {k: sum(r.get("named") == k for r in rows) for k in ("victim", "healthy rank", "none")},
        "victim_named_s": stat("victim_named_s"),
        "healthy_named": sum(r.get("healthy_named_s") is not None for r in rows),
        "gave_up": sorted({r["system_gave_up"] for r in rows if r.get("system_gave_up")})[:2],
        "host_named": sum(bool(r.get("host_named")) for r in rows),
        "finished": sum(bool(r.get("finished")) for r in rows),
    }


def fmt_stat(s, cap):
    if s is None:
        return "—"
    if s["median"] is None:
        return f">{cap:g} ({s['missed']}/{s['n']} none)"
    lo, hi = s["range"]
    return f"{s['median']:g} [{lo:g}–{hi:g}]" if hi is not None else f"{s['median']:g} [{lo:g}–>{cap:g}]"


def earlier_rows(path):
    """The rows of an earlier run: its last line (the summary object), or its per-case lines."""
    lines = read_jsonl(path)
    if not lines:
        raise SystemExit(f"--rows-from {path}: no JSON lines there (missing or empty)")
    return lines[-1]["rows"] if lines[-1].get("bench") == "vs_alternatives" else lines


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--systems", default=",".join(SYSTEMS))
    ap.add_argument("--faults", default=",".join(FAULTS))
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--cap-s", type=float, default=120)
    ap.add_argument("--steps", type=int, default=700)
    ap.add_argument("--step-ms", type=float, default=20)
    ap.add_argument("--fault-step", type=int, default=230)
    ap.add_argument("--workdir", default=None, help="keep every case's logs here (default: a temporary folder)")
    ap.add_argument("--rows-from", default=None,
                    help="an earlier run's output: its rows of the cells (system x fault) not run now join this "
                         "run's in the summary and the ratios (to rerun one system after a change)")
    a = ap.parse_args()
    root = pathlib.Path(a.workdir or tempfile.mkdtemp(prefix="trainsup-vs-"))
    systems = a.systems.split(",")
    faults = a.faults.split(",")
    rows = []
    for run in range(a.runs):
        order = systems[run % len(systems):] + systems[:run % len(systems)]
        for fault in faults:
            for name in order:
                cls = SYSTEMS[name]
                missing = missing_module(cls.needs)
                if missing:
                    row = {"system": name, "fault": fault, "run": run,
                           "error": f"No module named '{missing}' (bash bench/install-alternatives.sh)"}
                else:
                    row = Case(cls, fault, run, root, a).run()
                rows.append(row)
                print(json.dumps(row), flush=True)
    if a.rows_from:
        earlier = earlier_rows(a.rows_from)
        ran = {(r["system"], r["fault"]) for r in rows}
        rows += [r for r in earlier if (r["system"], r["fault"]) not in ran]
        systems = [s for s in SYSTEMS if any(r["system"] == s for r in rows)]
        faults = [f for f in FAULTS if any(r["fault"] == f for r in rows)]
    cells = {f"{fault}/{name}": summarize_cell([r for r in rows if r["system"] == name and r["fault"] == fault], a.cap_s)
             for fault in faults for name in systems}
    print("\nfault | system | detect s, median [range] | first naming: victim/healthy/none | victim named s | "
          "runs naming a healthy rank | host named | next step s | world after | replayed steps | finished")
    for key, c in cells.items():
        fault, name = key.split("/")
        print(f"{fault} | {name} | {fmt_stat(c['detect_s'], a.cap_s)} | "
              f"{c['named']['victim']}/{c['named']['healthy rank']}/{c['named']['none']} | "
              f"{fmt_stat(c['victim_named_s'], a.cap_s)} | {c['healthy_named']}/{c['runs']} | {c['host_named']}/{c['runs']} | "
              f"{fmt_stat(c['next_step_s'], a.cap_s) if fault != 'slow_rank' else 'n/a'} | {c['world_after']} | "
              f"{c['replayed_steps']} | {c['finished']}/{c['runs']}" + (f"  (errors: {c['errors']})" if c["errors"] else "")
              + (f"  (gave up: {c['gave_up']})" if c["gave_up"] else ""))
    ratios = {}
    for fault, ours_name in ((f, n) for n in ("trainsup", "trainsup-snapshots") for f in faults):
        ours = cells.get(f"{fault}/{ours_name}")
        prefix = "" if ours_name == "trainsup" else "snapshots."
        if not ours:
            continue
        for k in ("detect_s", "next_step_s"):
            mine = (ours.get(k) or {}).get("median")
            if mine is None:
                continue
            alts = [(name, cells[f"{fault}/{name}"]) for name in systems if not name.startswith("trainsup")
                    and f"{fault}/{name}" in cells]
            best = [(c[k]["median"], name) for name, c in alts if c.get(k) and c[k]["median"] is not None]
            if best:
                v, who = min(best)
                ratios[f"{prefix}{fault}.{k}"] = {"ratio": round(mine / max(v, 1e-3), 3), "best_alternative": who}
            if k == "next_step_s":
                world = statistics.median([w for w in ours["world_after"] if w is not None] or [0])
                same = [(c[k]["median"], name) for name, c in alts if c.get(k) and c[k]["median"] is not None
                        and statistics.median([w for w in c["world_after"] if w is not None] or [0]) == world]
                if same:
                    v, who = min(same)
                    ratios[f"{prefix}{fault}.{k}.same_world"] = {"ratio": round(mine / max(v, 1e-3), 3), "best_alternative": who,
                                                         "world": world}
    if a.workdir is None:
        shutil.rmtree(root, ignore_errors=True)
    print(json.dumps({"bench": "vs_alternatives", "versions": versions(), "runs": a.runs, "seed": a.seed,
                      "cap_s": a.cap_s, "threshold_s": THRESHOLD_S, "cells": cells, "ratios": ratios, "rows": rows}))


if __name__ == "__main__":
    main()
