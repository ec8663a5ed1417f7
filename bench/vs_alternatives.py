#!/usr/bin/env python3
"""trainsup beside what users would pick instead, on one job and the same faults, in one run
(issue 11; the tables and how to read them: docs/comparison.md).

The job (bench/alternatives/train.py): DDP on gloo, two simulated hosts of this machine
(host-a, host-b; one launcher and one rank each), --steps steps of --step-ms simulated compute,
a checkpoint every 50 steps, elastic 1..2 hosts where the system has that notion (so a lost host
can be left behind; no spare). Once both hosts are past --fault-step, one fault is injected
into host-b (the victim, rank 1 at the start):

  stop_rank   its rank's process gets SIGSTOP (a hung GPU, a deadlocked rank)
  kill_rank   its rank's process gets SIGKILL (a crash, an OOM kill)
  slow_rank   its rank is made 1.5x slower (stopped a third of every 60 ms), for the rest of the run
  stop_host   every process of the host (launcher and rank) gets SIGSTOP (a frozen node)

Systems: torchrun (torch's defaults), torchrun-tuned (the shortest timeouts a user would set by
hand, as torch documents them: init_process_group(timeout=10 s), rendezvous keep-alive 1 s x 3,
last call 1 s), nvrx (NVIDIA Resiliency Extension's ft_launcher with its rank heartbeat
monitor), torchft (Lighthouse + Manager, one replica group per host) and trainsup (trainsup-run).

Per case, from the job's own step logs and the system's own logs and events:
  detect_s     fault -> the system acts on it (a process of the job is ended by the system, the
               survivors go on without the victim, or a verdict/report appears), capped
  named        whether the culprit rank and host are named, and the system's own words
  next_step_s  fault -> the first training step completed after the system recovered
  world_after  how many ranks that step had (2: the job kept both hosts; 1: it left one behind)
  replayed     steps done before the fault and done again after it (and their seconds)
  finished     whether the job completed all its steps (within the cap)

A wait is capped at --cap-s (default 180) and shown as ">180". A system that cannot run a case
here gets a row saying why, in its own words. Last line: one JSON object with every row and, per
fault, the ratios trainsup / best alternative for detect_s and next_step_s.

  vs_alternatives.py [--systems torchrun,torchrun-tuned,nvrx,torchft,trainsup]
                     [--faults stop_rank,kill_rank,slow_rank,stop_host] [--cap-s 180] [--workdir DIR]
"""
import argparse
import json
import os
import pathlib
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


def read_jsonl(path):
    try:
        with open(path) as f:
            return [json.loads(line) for line in f if line.strip().startswith("{")]
    except FileNotFoundError:
        return []


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


def alive(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def signal_all(pids, sig):
    for p in pids:
        try:
            os.kill(p, sig)
        except (ProcessLookupError, PermissionError):
            pass


# --- systems ---------------------------------------------------------------------------------

class System:
    """How to launch one host of the job, and how to read the system's verdict from its logs."""
    name = ""
    needs = ()  # Python modules the system needs (a row says so when one is missing)

    def __init__(self, case_dir, args):
        self.dir = case_dir
        self.args = args
        self.port = free_port()

    def train_args(self):
        return [str(TRAIN), "--steps", str(self.args.steps), "--step-ms", str(self.args.step_ms),
                "--checkpoint-every", "50", "--checkpoint-dir", str(self.dir / "ckpt")]

    def env(self, host):
        return dict(os.environ, BENCH_HOST=host, BENCH_STEPS_DIR=str(self.dir / "steps"), OMP_NUM_THREADS="1",
                    PYTHONPATH=os.pathsep.join([str(HERE / "alternatives")] + [p for p in sys.path if p]))

    def command(self, host):
        raise NotImplementedError

    def services(self):
        """Processes the system needs besides the hosts' launchers (started first)."""
        return []

    def verdict(self, fault_t, victim_rank, victim_pid):
        """(rank_named, host_named, quote, t) from the system's own output after the fault."""
        return False, False, "", None


def _agent_outputs(case_dir):
    out = {}
    for host in HOSTS:
        try:
            out[host] = (case_dir / f"{host}.out").read_text(errors="replace")
        except FileNotFoundError:
            out[host] = ""
    return out


class Torchrun(System):
    name = "torchrun"
    tuned = False

    def command(self, host):
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes=1:2", "--nproc_per_node=1",
               "--rdzv_backend=c10d", f"--rdzv_endpoint=127.0.0.1:{self.port}", "--rdzv_id=bench",
               "--max_restarts=3"]
        if self.tuned:
            cmd += ["--rdzv_conf=join_timeout=60,last_call_timeout=1,keep_alive_interval=1,keep_alive_max_attempt=3"]
        return cmd + self.train_args() + ["--system", "plain"] + (["--timeout-s", "10"] if self.tuned else [])

    def verdict(self, fault_t, victim_rank, victim_pid):
        outs = _agent_outputs(self.dir)
        # torchelastic's own words: "failed (exitcode: -9) local_rank: 0 (pid: N) of binary" from
        # the agent of the rank's node, and its "Root Cause" table (rank, host) when it gives up.
        for host, text in outs.items():
            for line in text.splitlines():
                if f"(pid: {victim_pid})" in line and "failed" in line:
                    return True, host == VICTIM, line.strip()[-200:], None
                if re.search(rf"\brank\s*:\s*{victim_rank}\b", line) and "local_rank" in line:
                    return True, host == VICTIM, line.strip()[-200:], None
        # A survivor's collective error: it names a peer's address at most, not a rank or host.
        for line in outs[SURVIVOR].splitlines():
            if re.search(r"Timed out|Connection closed by peer|Connection reset|DistBackendError", line):
                return False, False, line.strip()[-200:], None
        return False, False, "", None


class TorchrunTuned(Torchrun):
    name = "torchrun-tuned"
    tuned = True


class Trainsup(System):
    name = "trainsup"
    needs = ("trainsup",)

    def command(self, host):
        return [sys.executable, "-m", "trainsup.run", "--nnodes=1:2", "--nproc_per_node=1", "--rdzv_backend=c10d",
                f"--rdzv_endpoint=127.0.0.1:{self.port}", "--rdzv_id=bench", "--run-dir", str(self.dir / "run")] + \
            self.train_args() + ["--system", "trainsup"]

    def env(self, host):
        return dict(super().env(host), TRAINSUP_NODE_NAME=host, TRAINSUP_LOG_DIR=str(self.dir / "logs"),
                    TRAINSUP_LOG_STDERR="0", TRAINSUP_CHECKPOINT_DIR=str(self.dir / "ckpt"))

    def verdict(self, fault_t, victim_rank, victim_pid):
        events = [e for h in HOSTS for e in read_jsonl(self.dir / "run" / f"agent-{h}.events.jsonl")
                  if e["event"] in ("verdict", "straggler") and e["time"] >= fault_t - 1]
        if not events:
            return False, False, "", None
        v = min(events, key=lambda e: e["time"])
        return (victim_rank in v["ranks"], VICTIM in v["hosts"],
                f"{v.get('kind', v['event'])}: ranks {v['ranks']} hosts {v['hosts']}: {v['evidence'][:160]}", v["time"])


class Nvrx(System):
    """ft_launcher (NVIDIA Resiliency Extension 0.4.1, a fork of torchrun) with its rank monitor:
    one heartbeat per step; the timeouts a user who wants fast detection sets on its command line
    (5 s between heartbeats, as trainsup's default; checked every 0.5 s)."""
    name = "nvrx"
    needs = ("nvidia_resiliency_ext",)

    def command(self, host):
        launcher = shutil.which("ft_launcher", path=os.path.dirname(sys.executable)) or "ft_launcher"
        return [launcher, "--nnodes=1:2", "--nproc-per-node=1", "--rdzv-backend=c10d",
                f"--rdzv-endpoint=127.0.0.1:{self.port}", "--rdzv-id=bench", "--max-restarts=3",
                f"--rdzv-conf=is_host={int(host == HOSTS[0])},last_call_timeout=1",
                "--ft-initial-rank-heartbeat-timeout=60", "--ft-rank-heartbeat-timeout=5",
                "--ft-workload-check-interval=0.5", "--ft-enable-nic-monitor=false"] + \
            self.train_args() + ["--system", "nvrx"]

    def env(self, host):
        return dict(super().env(host), FT_LAUNCHER_LOGLEVEL="INFO")

    def verdict(self, fault_t, victim_rank, victim_pid):
        outs = _agent_outputs(self.dir)
        for host, text in outs.items():
            for line in text.splitlines():
                # The rank monitor's timeout names the rank it watches (its own host's rank).
                m = re.search(r"RankMonServer\d+@[^:]+:(\d+)\].*(Did not get|has been open|Was out of section)", line)
                if m:
                    return int(m.group(1)) == victim_rank, host == VICTIM, line.strip()[-200:], None
                if f"(pid: {victim_pid})" in line and "failed" in line:
                    return True, host == VICTIM, line.strip()[-200:], None
        return False, False, "", None


class Torchft(System):
    """torchft 0.2.0: a Lighthouse (min_replicas 1, so that a survivor may go on alone; its other
    settings torchft's defaults but a 10 s first-quorum wait) and one replica group per host, each
    under torchrun --max-restarts=3 so that a killed replica comes back and heals from its peer."""
    name = "torchft"
    needs = ("torchft",)

    def __init__(self, case_dir, args):
        super().__init__(case_dir, args)
        self.lighthouse_port = free_port()
        self.master_ports = {h: free_port() for h in HOSTS}

    def services(self):
        lighthouse = shutil.which("torchft_lighthouse", path=os.path.dirname(sys.executable)) or "torchft_lighthouse"
        return [([lighthouse, "--min_replicas", "1", "--join_timeout_ms", "10000",
                  "--bind", f"[::]:{self.lighthouse_port}"], dict(os.environ, RUST_LOG="info"))]

    def command(self, host):
        return [sys.executable, "-m", "torch.distributed.run", "--nnodes=1", "--nproc_per_node=1",
                f"--master_port={self.master_ports[host]}", "--max_restarts=3"] + \
            self.train_args() + ["--system", "torchft"]

    def env(self, host):
        return dict(super().env(host), REPLICA_GROUP_ID=str(HOSTS.index(host)), NUM_REPLICA_GROUPS="2",
                    TORCHFT_LIGHTHOUSE=f"http://localhost:{self.lighthouse_port}")

    def verdict(self, fault_t, victim_rank, victim_pid):
        # torchft names no failed replica: it forms a quorum of those still heartbeating. The
        # lighthouse's quorum line lists the survivors; report it as its account of the fault.
        import datetime
        try:
            text = (self.dir / "services.out").read_text(errors="replace")
        except FileNotFoundError:
            text = ""
        for line in text.splitlines():
            m = re.match(r"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d+)?)", line)
            if not m or not ("Quorum!" in line or "quorum change" in line):
                continue
            t = datetime.datetime.fromisoformat(m.group(1)).replace(tzinfo=datetime.timezone.utc).timestamp()
            if t > fault_t:
                return False, False, line.strip()[:200], None
        return False, False, "", None


SYSTEMS = {s.name: s for s in (Torchrun, TorchrunTuned, Nvrx, Torchft, Trainsup)}


# --- one case ----------------------------------------------------------------------------------

class Case:
    def __init__(self, system_cls, fault, root, args):
        self.fault = fault
        self.dir = root / f"{system_cls.name}-{fault}"
        shutil.rmtree(self.dir, ignore_errors=True)
        (self.dir / "steps").mkdir(parents=True)
        self.system = system_cls(self.dir, args)
        self.args = args
        self.procs = {}
        self.extra = []
        self._stop_slow = threading.Event()

    def steps(self, host):
        return read_jsonl(self.dir / "steps" / f"{host}.jsonl")

    def last_start(self, host):
        starts = [e for e in self.steps(host) if e["event"] == "start"]
        return starts[-1] if starts else None

    def progressed(self, step):
        return all(any(e["event"] == "step" and e["step"] >= step for e in self.steps(h)) for h in HOSTS)

    def start(self):
        for cmd, env in self.system.services():
            self.extra.append(subprocess.Popen(cmd, env=env, stdout=open(self.dir / "services.out", "a"),
                                               stderr=subprocess.STDOUT, start_new_session=True))
        for host in HOSTS:
            self.procs[host] = subprocess.Popen(self.system.command(host), env=self.system.env(host),
                                                stdout=open(self.dir / f"{host}.out", "w"),
                                                stderr=subprocess.STDOUT, start_new_session=True)
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

    def inject(self):
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
        row = {"system": self.system.name, "fault": self.fault}
        try:
            self.start()
            if not self.wait(lambda: self.progressed(self.args.fault_step), 120):
                row["error"] = "the job did not reach step %d within 120 s (see %s)" % (self.args.fault_step, self.dir)
                return row
            survivor = self.last_start(SURVIVOR)
            before = [e for e in self.steps(SURVIVOR) if e["event"] == "step"]
            step_s = statistics.median(b["t"] - a["t"] for a, b in zip(before[-60:], before[-59:]))
            fault_t, victim = self.inject()
            last_done = max(e["step"] for h in HOSTS for e in self.steps(h) if e["event"] == "step" and e["t"] <= fault_t)
            # Watch until the job ends or the cap passes.
            reaction_t = None
            deadline = time.monotonic() + cap
            while time.monotonic() < deadline:
                now = time.time()
                if reaction_t is None and not alive(survivor["pid"]):
                    reaction_t = now
                if self.fault == "kill_rank" and reaction_t is None and self.last_start(VICTIM)["pid"] != victim["pid"]:
                    reaction_t = now  # the system restarted the killed rank
                if all(p.poll() is not None for h, p in self.procs.items()
                       if not (self.fault == "stop_host" and h == VICTIM)):
                    break
                time.sleep(0.05)  # polls process state; bounded by the cap
            end_t = time.time()
            rank_named, host_named, quote, verdict_t = self.system.verdict(fault_t, victim["rank"], victim["pid"])
            # Fewer ranks going on without a restart (torchft's way) also counts as acting.
            for e in self.steps(SURVIVOR):
                if e["event"] == "step" and e["t"] > fault_t and e.get("world", 2) < victim.get("world", 2):
                    reaction_t = min(reaction_t or e["t"], e["t"])
                    break
            if self.fault == "slow_rank":
                reaction_t = None  # nothing must stop: only a report counts (processes end with the job)
            times = [t for t in (reaction_t, verdict_t) if t is not None]
            row["detect_s"] = (round(min(times) - fault_t, 2) if times else
                               "none" if self.fault == "slow_rank" else f">{cap:g}")
            row["rank_named"], row["host_named"], row["evidence"] = rank_named, host_named, quote
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
            if self.fault == "slow_rank":
                row["next_step_s"] = "n/a (no stop)"
            elif after:
                first = min(after, key=lambda e: e["t"])
                row["next_step_s"] = round(first["t"] - fault_t, 2)
                row["world_after"] = first.get("world")  # ranks training after recovery (2: none lost)
                # Work replayed: steps completed before the fault and completed again after it.
                redone = [e["step"] for h in HOSTS for e in self.steps(h)
                          if e["event"] == "step" and e["t"] > fault_t]
                replay = max(0, last_done + 1 - min(redone)) if redone else 0
                row["replayed_steps"] = replay
                row["replayed_s"] = round(replay * step_s, 2)
            else:
                row["next_step_s"] = f">{cap:g}"
            done = any(e["event"] == "step" and e["step"] == self.args.steps - 1 for h in HOSTS for e in self.steps(h))
            row["finished"] = done
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


def fmt(v):
    if isinstance(v, bool):
        return "yes" if v else "no"
    return str(v)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--systems", default=",".join(SYSTEMS))
    ap.add_argument("--faults", default="stop_rank,kill_rank,slow_rank,stop_host")
    ap.add_argument("--cap-s", type=float, default=180)
    ap.add_argument("--steps", type=int, default=1200)
    ap.add_argument("--step-ms", type=float, default=20)
    ap.add_argument("--fault-step", type=int, default=230)
    ap.add_argument("--workdir", default=None, help="keep every case's logs here (default: a temporary folder)")
    a = ap.parse_args()
    root = pathlib.Path(a.workdir or tempfile.mkdtemp(prefix="trainsup-vs-"))
    rows = []
    for fault in a.faults.split(","):
        for name in a.systems.split(","):
            cls = SYSTEMS[name]
            missing = missing_module(cls.needs)
            if missing:
                row = {"system": name, "fault": fault, "error": f"No module named '{missing}' (pip install -r bench/requirements.txt)"}
            else:
                row = Case(cls, fault, root, a).run()
            rows.append(row)
            print(json.dumps(row), flush=True)
    cols = ("system", "fault", "detect_s", "rank_named", "host_named", "next_step_s", "world_after",
            "replayed_steps", "finished")
    print("\n" + " | ".join(cols))
    for r in rows:
        print(" | ".join(fmt(r.get(c, "")) for c in cols) + (f"  ({r['error']})" if "error" in r else ""))
    summary = {"rows": rows, "ratios": {}}
    for fault in a.faults.split(","):
        ours = next((r for r in rows if r["system"] == "trainsup" and r["fault"] == fault), None)
        for k in ("detect_s", "next_step_s"):
            alts = [r[k] for r in rows if r["fault"] == fault and r["system"] != "trainsup"
                    and isinstance(r.get(k), (int, float))]
            if ours and isinstance(ours.get(k), (int, float)) and alts:
                summary["ratios"][f"{fault}.{k}"] = round(ours[k] / max(min(alts), 1e-3), 3)
    if a.workdir is None:
        shutil.rmtree(root, ignore_errors=True)
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
