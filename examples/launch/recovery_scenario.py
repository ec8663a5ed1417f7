#!/usr/bin/env python3
"""End-to-end recovery on simulated hosts on this machine: trainsup-run agents (one worker each)
training examples/python/train_ddp.py on gloo with checkpoints every 50 steps.

  clean       hosts a, b (--nnodes=2:2), no fault: the reference.
  spare       hosts a, b active and c spare (--nnodes=2:2); host-b's worker is stopped with
              SIGSTOP; the job must name host-b, quarantine it (its agent exits 95) and finish
              on a + c from the newest valid checkpoint.
  shrink      hosts a, b (--nnodes=1:2), no spare; same fault; the job finishes on host-a alone.
  user_error  hosts a, b; every worker raises an exception at step 120 of every attempt: no
              host is quarantined and the job-wide restart cap ends it with 96 (do not requeue);
              with --no-progress-guard, the guard against restarts without a newer checkpoint.
  host_death  the etcd-v2 rendezvous (an etcd server started here, as on a cluster's service
              node); hosts a, b active and c spare; the host whose agent holds the coordinator
              dies outright (its agent and worker are SIGKILLed at once): the job must go on with
              the other host and the spare, from the newest valid checkpoint.
  preempt     hosts a, b (--nnodes=1:2); host-b's agent gets SIGTERM from outside (a scheduler
              taking the node back): it is not a fault, so no host is named or quarantined, and
              the job finishes on host-a.
  grow        --nnodes=1:3 with a restart cap of 1: host-a trains alone, host-b joins, then host-c
              (two rounds ended for nodes that joined: no restarts); then host-c's worker is
              killed (a real failure: the one restart) and the job finishes on a + b.
  sharded     as shrink, but the workers' checkpoints hold sharded state (restored by the same
              world size only): on host-a alone the restore fails, and host-a gives up (96) at
              once, saying why, instead of failing the same way until the restart cap.
  mesh_shrink examples/python/train_mesh.py, FSDP2 x TP on a dp x tp mesh, 2 workers per host,
              hosts a, b (--nnodes=1:2, mesh 2x2), no spare; both of host-b's workers are frozen
              (SIGSTOP): host-b is quarantined and the job resumes on host-a alone (mesh 1x2)
              from its torch.distributed.checkpoint checkpoint, resharded, and finishes.
  mesh_grow   the same job started on host-a alone (mesh 1x2); host-b joins at the next round
              and the job resumes on both (mesh 2x2) from the 1x2 checkpoint and finishes.
  mesh_desync the same job on hosts a, b (--nnodes=2:2); rank 1 issues two collectives in the
              wrong order at step 120 of every attempt: a desync, nobody quarantined, and after
              the same desync twice the job gives up (96) saying where, before the restart cap.

Prints a JSON summary line last. Used by tests/python/test_launcher.py, scripts/demo.sh and
bench/recovery_bench.py.

  recovery_scenario.py SCENARIO WORKDIR [--steps N]
"""
import argparse
import json
import os
import pathlib
import shutil
import signal
import socket
import subprocess
import sys
import time

from trainsup.ports import free_port

REPO = pathlib.Path(__file__).resolve().parent.parent.parent
TRAIN = REPO / "examples" / "python" / "train_ddp.py"
TRAIN_MESH = REPO / "examples" / "python" / "train_mesh.py"


def start_etcd(workdir, port, address="127.0.0.1", prefix=()):
    """A one-member etcd with the v2 API (what torch's etcd-v2 backend speaks) serving clients on
    address:port, its data and log in workdir; `prefix` runs it elsewhere (e.g. ip netns exec).
    Returns the process once it answers."""
    workdir = pathlib.Path(workdir)
    peer = free_port()
    log = open(workdir / "etcd.log", "w")
    proc = subprocess.Popen([*prefix, "etcd", "--name", "scenario", "--data-dir", str(workdir / "etcd"),
                             "--enable-v2=true",
                             "--listen-client-urls", f"http://{address}:{port}",
                             "--advertise-client-urls", f"http://{address}:{port}",
                             "--listen-peer-urls", f"http://{address}:{peer}",
                             "--initial-advertise-peer-urls", f"http://{address}:{peer}",
                             "--initial-cluster", f"scenario=http://{address}:{peer}"],
                            stdout=log, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 30
    while True:
        try:
            with socket.create_connection((address, port), timeout=1) as conn:
                conn.sendall(b"GET /v2/keys/ HTTP/1.0\r\n\r\n")
                if b"200 OK" in conn.recv(200):
                    return proc
        except OSError:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise RuntimeError(f"etcd did not start (see {workdir / 'etcd.log'})")
        time.sleep(0.1)  # polls the server's port; bounded by the deadline


def read_events(path):
    try:
        with open(path) as f:
            return [json.loads(line) for line in f if line.strip()]
    except FileNotFoundError:
        return []


class Cluster:
    def __init__(self, workdir, nnodes, steps, extra_train=(), env=None, backend="c10d", train=TRAIN, nproc=1,
                 snapshot_every=0):
        self.dir = pathlib.Path(workdir)
        self.snapshot_every = snapshot_every
        self.dir.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.backend = backend
        self.etcd = start_etcd(self.dir, self.port) if backend == "etcd-v2" else None
        self.nnodes = nnodes
        self.steps = steps
        self.extra_train = list(extra_train)
        self.train, self.nproc = train, nproc
        self.env = dict(os.environ, PYTHONFAULTHANDLER="1", TRAINSUP_CHECKPOINT_DIR=str(self.dir / "ckpt"),
                        TRAINSUP_LOG_DIR=str(self.dir / "logs"), TRAINSUP_LOG_STDERR="0", OMP_NUM_THREADS="1",
                        PYTHONPATH=os.pathsep.join(p for p in sys.path if p), **(env or {}))
        if snapshot_every:
            # In-memory snapshots every N steps, held by the agents in shared memory (a directory
            # of this run's own under /dev/shm); the disk keeps its default 10-minute interval.
            self.shm = pathlib.Path("/dev/shm") / f"trainsup-scenario-{self.port}"
            self.env.update(TRAINSUP_SNAPSHOT_EVERY_STEPS=str(snapshot_every), TRAINSUP_SNAPSHOT_MEMORY=str(self.shm))
        self.agents = {}

    def start(self, host, rdzv_conf=None):
        out = open(self.dir / f"agent-{host}.out", "w")
        cmd = [sys.executable, "-m", "trainsup.run", f"--nnodes={self.nnodes}", f"--nproc_per_node={self.nproc}",
               f"--rdzv_backend={self.backend}", f"--rdzv_endpoint=127.0.0.1:{self.port}", "--rdzv_id=scenario",
               *([f"--rdzv_conf={rdzv_conf}"] if rdzv_conf else []),
               "--run-dir", str(self.dir / "run"), str(self.train), "--steps", str(self.steps),
               *([] if self.snapshot_every else ["--checkpoint-every", "50"]), "--step-sleep-ms", "20",
               *self.extra_train]
        self.agents[host] = subprocess.Popen(cmd, env=dict(self.env, TRAINSUP_NODE_NAME=host), stdout=out,
                                             stderr=subprocess.STDOUT)

    def rank_events(self, host):
        return [e for p in sorted((self.dir / "logs").glob(f"*-{host}-r*.events.jsonl")) for e in read_events(p)]

    def agent_events(self, host):
        return read_events(self.dir / "run" / f"agent-{host}.events.jsonl")

    def wait_until(self, pred, timeout, what):
        deadline = time.monotonic() + timeout
        while not pred():
            if time.monotonic() > deadline:
                raise TimeoutError(what)
            for host, p in self.agents.items():
                if p.poll() is not None and what.startswith("training"):
                    raise RuntimeError(f"agent {host} exited with {p.returncode} while waiting for {what}")
            time.sleep(0.1)  # polls files written by other processes; bounded by the deadline

    def wait_spare(self, host, timeout=120):
        """Waits until host's agent is in the rendezvous's wait list behind the running round (its
        event rendezvous_waiting, written once the stored state lists it): a spare."""
        self.wait_until(lambda: any(e["event"] == "rendezvous_waiting" for e in self.agent_events(host)), timeout,
                        f"{host} waiting as a spare")

    def training_at(self, host, step):
        return any(e["event"] in ("checkpoint_committed", "snapshot_committed") and e.get("step", -1) >= step for e in self.rank_events(host))

    def start_a_then_b(self, step, timeout):
        """Starts host-a, and host-b once host-a's agent is up (so that host-a serves the c10d
        store), then waits until both have trained past `step`."""
        self.start("host-a")
        self.wait_until(lambda: any(e["event"] == "agent_start" for e in self.agent_events("host-a")), 60,
                        "host-a's agent to start")
        self.start("host-b")
        self.wait_until(lambda: self.training_at("host-a", step) and self.training_at("host-b", step), timeout,
                        "training on host-a and host-b")

    def coordinator_host(self, hosts=("host-a", "host-b")):
        """The host whose agent was elected coordinator last."""
        elected = [e for h in hosts for e in self.agent_events(h) if e["event"] == "coordinator_elected"]
        return max(elected, key=lambda e: e["time"])["host"]

    def worker_pid(self, host):
        return self.worker_pids(host)[-1]

    def worker_pids(self, host):
        """The pids of host's workers of the current round (the newest start of each)."""
        starts = sorted((e for e in self.rank_events(host) if e["event"] == "supervisor_start"), key=lambda e: e["wall_s"])
        return [e["pid"] for e in starts[-self.nproc:]]

    def wait_agents(self, timeout):
        deadline = time.monotonic() + timeout
        return {h: p.wait(timeout=max(1, deadline - time.monotonic())) for h, p in self.agents.items()}

    def kill_all(self):
        for p in self.agents.values():
            if p.poll() is None:
                p.kill()
                p.wait()
        for host in ("host-a", "host-b", "host-c"):
            for e in self.rank_events(host):
                if e["event"] == "supervisor_start":
                    for sig in (signal.SIGCONT, signal.SIGKILL):
                        try:
                            os.kill(e["pid"], sig)
                        except (ProcessLookupError, PermissionError):
                            pass
        if self.etcd is not None and self.etcd.poll() is None:
            self.etcd.terminate()
            self.etcd.wait()
        if self.snapshot_every:
            shutil.rmtree(self.shm, ignore_errors=True)  # what agents killed above could not free


def clean_scenario(workdir, steps):
    c = Cluster(workdir, "2:2", steps, extra_train=["--out", str(pathlib.Path(workdir) / "final.pt")])
    try:
        c.start("host-a")
        c.start("host-b")
        return c, c.wait_agents(600)
    finally:
        c.kill_all()


def fault_scenario(workdir, steps, spare, sharded=False, snapshot_every=0):
    c = Cluster(workdir, "2:2" if spare else "1:2", steps,
                extra_train=["--out", str(pathlib.Path(workdir) / "final.pt")] + (["--sharded-checkpoints"] if sharded
                                                                                  else []),
                snapshot_every=snapshot_every)
    try:
        c.start("host-a")
        c.start("host-b")
        c.wait_until(lambda: c.training_at("host-a", 100) and c.training_at("host-b", 100), 180,
                     "training on host-a and host-b")
        if spare:
            c.start("host-c")
            c.wait_spare("host-c")
        # Let the job pass one more checkpoint, then stop host-b's worker mid-interval.
        c.wait_until(lambda: c.training_at("host-a", 200), 120, "training to step 200")
        time.sleep(0.4)
        victim = c.worker_pid("host-b")
        fault_wall = time.time()
        os.kill(victim, signal.SIGSTOP)
        # A fault marker for `trainsup report` (real faults leave none; the report then counts
        # detection from the verdict).
        with open(c.dir / "run" / "faults.jsonl", "a") as f:
            f.write(json.dumps({"event": "fault_injected", "time": fault_wall, "host": "host-b", "kind": "SIGSTOP",
                                "pid": victim}) + "\n")
        codes = c.wait_agents(600)
        return c, fault_wall, codes
    finally:
        c.kill_all()


def host_death_scenario(workdir, steps):
    c = Cluster(workdir, "2:2", steps, extra_train=["--out", str(pathlib.Path(workdir) / "final.pt")],
                backend="etcd-v2")
    try:
        c.start("host-a")
        c.start("host-b")
        c.wait_until(lambda: c.training_at("host-a", 100) and c.training_at("host-b", 100), 180,
                     "training on host-a and host-b")
        c.start("host-c")
        c.wait_until(lambda: c.training_at("host-a", 200), 120, "training to step 200")
        time.sleep(0.4)
        victim = c.coordinator_host()  # the host that is worst to lose
        worker = c.worker_pid(victim)
        fault_wall = time.time()
        c.agents[victim].kill()
        os.kill(worker, signal.SIGKILL)
        c.agents[victim].wait()
        with open(c.dir / "run" / "faults.jsonl", "a") as f:
            f.write(json.dumps({"event": "fault_injected", "time": fault_wall, "host": victim, "kind": "host_death",
                                "pid": worker}) + "\n")
        codes = c.wait_agents(600)
        return c, fault_wall, codes, victim
    finally:
        c.kill_all()


def preempt_scenario(workdir, steps):
    c = Cluster(workdir, "1:2", steps, extra_train=["--out", str(pathlib.Path(workdir) / "final.pt")])
    try:
        # host-a first, so that it serves the c10d store (with c10d, the store's host must not go).
        c.start_a_then_b(150, 180)
        signal_wall = time.time()
        c.agents["host-b"].send_signal(signal.SIGTERM)
        codes = c.wait_agents(600)
        return c, signal_wall, codes
    finally:
        c.kill_all()


def grow_scenario(workdir, steps):
    # One restart allowed: growing twice must not use it up (torchrun does not count a round
    # ended for nodes that joined); the real failure afterwards takes it.
    # Long enough for two hosts to join and train before the fault (each join restarts the round).
    c = Cluster(workdir, "1:3", max(steps, 1500), extra_train=["--out", str(pathlib.Path(workdir) / "final.pt")],
                env={"TRAINSUP_MAX_RESTARTS": "1"})
    conf = "last_call_timeout=2"  # a round of fewer than 3 nodes forms 2 s after the first has enough
    try:
        c.start("host-a", rdzv_conf=conf)
        c.wait_until(lambda: c.training_at("host-a", 50), 180, "training on host-a")
        c.start("host-b", rdzv_conf=conf)
        c.wait_until(lambda: c.training_at("host-b", 100), 180, "training on host-b after it joined")
        c.start("host-c", rdzv_conf=conf)
        c.wait_until(lambda: any(e["event"] == "checkpoint_committed" for e in c.rank_events("host-c")), 180,
                     "training on host-c after it joined")
        victim = c.worker_pid("host-c")
        fault_wall = time.time()
        os.kill(victim, signal.SIGKILL)
        codes = c.wait_agents(600)
        return c, fault_wall, codes
    finally:
        c.kill_all()


def mesh_cluster(workdir, steps, nnodes="1:2", extra=()):
    return Cluster(workdir, nnodes, steps, train=TRAIN_MESH, nproc=2,
                   extra_train=["--tp", "2", "--out", str(pathlib.Path(workdir) / "final.pt"), *extra])


def mesh_desync_scenario(workdir, steps):
    # Rank 1 issues two collectives in the wrong order at step 120, in every attempt (the
    # checkpoint of step 100 comes before it).
    c = mesh_cluster(workdir, steps, "2:2", ["--fault", "wrong_order", "--fault-rank", "1", "--fault-step", "120"])
    try:
        c.start_a_then_b(0, 240)
        return c, c.wait_agents(600)
    finally:
        c.kill_all()


def mesh_shrink_scenario(workdir, steps):
    c = mesh_cluster(workdir, steps)
    try:
        c.start_a_then_b(100, 240)  # host-a first: it serves the c10d store
        c.wait_until(lambda: c.training_at("host-a", 150), 180, "training to step 150")
        time.sleep(0.4)
        fault_wall = time.time()
        for pid in c.worker_pids("host-b"):  # the whole host frozen
            os.kill(pid, signal.SIGSTOP)
        return c, fault_wall, c.wait_agents(600)
    finally:
        c.kill_all()


def mesh_grow_scenario(workdir, steps):
    c = mesh_cluster(workdir, steps)
    conf = "last_call_timeout=2"
    try:
        c.start("host-a", rdzv_conf=conf)
        c.wait_until(lambda: c.training_at("host-a", 100), 240, "training on host-a alone")
        join_wall = time.time()
        c.start("host-b", rdzv_conf=conf)
        return c, join_wall, c.wait_agents(600)
    finally:
        c.kill_all()


def user_error_scenario(workdir, steps, no_progress_guard=False):
    # The restart cap (2) ends the job; or, with --no-progress-guard, a generous cap (20) and the
    # guard against restarts that never get past the same checkpoint (1 allowed).
    env = ({"TRAINSUP_MAX_RESTARTS": "20", "TRAINSUP_MAX_RESTARTS_WITHOUT_PROGRESS": "1"} if no_progress_guard
           else {"TRAINSUP_MAX_RESTARTS": "2"})
    c = Cluster(workdir, "2:2", steps, extra_train=["--raise-at-step", "120"], env=env)
    try:
        c.start("host-a")
        c.start("host-b")
        codes = c.wait_agents(600)
        return c, codes
    finally:
        c.kill_all()


def main():
    p = argparse.ArgumentParser()
    p.add_argument("scenario", choices=["clean", "spare", "shrink", "user_error", "host_death", "preempt", "grow",
                                        "sharded", "mesh_shrink", "mesh_grow", "mesh_desync"])
    p.add_argument("workdir")
    p.add_argument("--steps", type=int, default=600)
    p.add_argument("--no-progress-guard", action="store_true",
                   help="user_error: end the job by the no-progress guard instead of the restart cap")
    p.add_argument("--snapshot-every", type=int, default=0,
                   help="spare, shrink: in-memory snapshots every N steps (held by the agents, copied to a peer "
                        "host), and disk checkpoints at their default 10-minute interval instead of every 50 steps")
    a = p.parse_args()
    summary = {"scenario": a.scenario}
    if a.scenario == "user_error":
        c, codes = user_error_scenario(a.workdir, a.steps, a.no_progress_guard)
        summary["agent_exit_codes"] = codes
    elif a.scenario == "host_death":
        c, fault_wall, codes, victim = host_death_scenario(a.workdir, a.steps)
        summary.update(agent_exit_codes=codes, fault_time=fault_wall, victim=victim)
    elif a.scenario == "preempt":
        c, signal_wall, codes = preempt_scenario(a.workdir, a.steps)
        summary.update(agent_exit_codes=codes, signal_time=signal_wall)
    elif a.scenario == "clean":
        c, codes = clean_scenario(a.workdir, a.steps)
        summary["agent_exit_codes"] = codes
    elif a.scenario == "grow":
        c, fault_wall, codes = grow_scenario(a.workdir, a.steps)
        summary.update(agent_exit_codes=codes, fault_time=fault_wall)
    elif a.scenario == "mesh_desync":
        c, codes = mesh_desync_scenario(a.workdir, a.steps)
        summary["agent_exit_codes"] = codes
    elif a.scenario in ("mesh_shrink", "mesh_grow"):
        run = mesh_shrink_scenario if a.scenario == "mesh_shrink" else mesh_grow_scenario
        c, wall, codes = run(a.workdir, a.steps)
        restores = [{k: e.get(k) for k in ("step", "world_size", "rank", "wall_s")} for h in ("host-a", "host-b")
                    for e in c.rank_events(h) if e["event"] == "checkpoint_restored"]
        summary.update(agent_exit_codes=codes, fault_time=wall, restores=sorted(restores, key=lambda r: r["wall_s"]),
                       finished=(pathlib.Path(a.workdir) / "final.pt").exists())
    else:
        c, fault_wall, codes = fault_scenario(a.workdir, a.steps, spare=a.scenario == "spare",
                                              sharded=a.scenario == "sharded", snapshot_every=a.snapshot_every)
        summary["agent_exit_codes"] = codes
        summary["fault_time"] = fault_wall
    summary["quarantine"] = sorted(x.name[:-5] for x in (c.dir / "run" / "quarantine").glob("*.json"))
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
