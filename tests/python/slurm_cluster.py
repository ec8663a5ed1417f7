"""A Slurm cluster on this machine for the suite (issue 23): munged, slurmctld and one slurmd per
node (n1, n2, n3 by default), from Debian's packages (Slurm 22.05), started and stopped by the
test itself, everything under one work directory.

The nodes share the loopback address: Debian's slurmd is built with multiple-slurmd support, so
each node is `slurmd -N nX` on a port of its own (NodeAddr=127.0.0.1, Port=...), started in a
UTS namespace of its own (`unshare --uts`) whose host name is nX: a job's processes on that node
see `hostname` = nX (srun's %N, trainsup's host name) as on a real cluster, and find a node's
address with `scontrol show node` (NodeAddr), since nX is in no resolver.

Settings that matter for the tests (facts found on this machine, issue 23):
- AuthInfo=...,cred_expire=5 and SchedulerParameters=bf_interval=1: a requeued job starts
  again in about 7 s instead of about 122 s;
- ReturnToService=1 (a node that was down comes back when its slurmd registers, not a drained one);
- no cgroup.conf: proctrack/pgid and task/none need no cgroups (`CgroupPlugin=disabled` is
  unknown in 22.05);
- SlurmdParameters=config_overrides: the nodes' CPUs and memory are the configuration's, not
  this machine's counted three times.

    with SlurmCluster(workdir) as c:
        job = c.sbatch(["--array=0-1%1", "script.sbatch"])
        c.wait_for(lambda: c.job_states(job) == {...}, 120, "...")
"""
import os
import pathlib
import shutil
import socket
import subprocess

from daemons import Daemons
from trainsup.ports import free_port

DAEMONS = ("munged", "slurmctld", "slurmd", "sbatch", "scontrol", "sinfo", "squeue", "srun")


def missing_programs():
    """The Slurm and munge programs this machine lacks (install: scripts/install-deps.sh)."""
    return [p for p in DAEMONS if shutil.which(p) is None and not os.path.exists(f"/usr/sbin/{p}")]


def _which(name):
    return shutil.which(name) or f"/usr/sbin/{name}"


class SlurmCluster(Daemons):
    def __init__(self, workdir, nodes=("n1", "n2", "n3"), cpus=2, memory_mb=2048):
        self.dir = pathlib.Path(workdir).resolve()
        self.nodes = list(nodes)
        self.cpus, self.memory_mb = cpus, memory_mb
        self.procs = {}
        self.log_dir = self.dir / "log"
        self.conf = self.dir / "slurm.conf"
        self.munge_socket = self.dir / "munge" / "munge.socket"
        self.env = dict(os.environ, SLURM_CONF=str(self.conf))

    # --- setup ---
    def _write_config(self):
        d = self.dir
        for sub in ("munge", "state", "spool", "log", "jobs"):
            (d / sub).mkdir(parents=True, exist_ok=True)
        ctld_port, node_ports = free_port(), {n: free_port() for n in self.nodes}
        host = socket.gethostname()  # slurmctld must run on the host SlurmctldHost names
        lines = [
            "ClusterName=trainsup-test",
            f"SlurmctldHost={host}(127.0.0.1)",
            f"SlurmctldPort={ctld_port}",
            "SlurmUser=root",
            "SlurmdUser=root",
            "AuthType=auth/munge",
            "CredType=cred/munge",
            f"AuthInfo=socket={self.munge_socket},cred_expire=5",
            f"StateSaveLocation={d / 'state'}",
            f"SlurmdSpoolDir={d / 'spool'}/%n",
            f"SlurmctldPidFile={d / 'slurmctld.pid'}",
            f"SlurmdPidFile={d / 'spool'}/slurmd-%n.pid",
            f"SlurmctldLogFile={d / 'log' / 'slurmctld.log'}",
            f"SlurmdLogFile={d / 'log'}/slurmd-%n.log",
            "SlurmctldDebug=info",
            "SlurmdDebug=info",
            "ProctrackType=proctrack/pgid",
            "TaskPlugin=task/none",
            "JobAcctGatherType=jobacct_gather/none",
            "AccountingStorageType=accounting_storage/none",
            "MpiDefault=none",
            "SwitchType=switch/none",
            "MailProg=/bin/true",
            "SchedulerType=sched/backfill",
            "SchedulerParameters=bf_interval=1,sched_interval=1",
            "SelectType=select/cons_tres",
            "SelectTypeParameters=CR_CPU",
            "ReturnToService=1",
            "SlurmdParameters=config_overrides",
            "SlurmctldTimeout=30",
            "SlurmdTimeout=30",
            "InactiveLimit=0",
            "MinJobAge=300",
            "KillWait=5",
            "Waittime=0",
        ]
        for n, port in node_ports.items():
            lines.append(f"NodeName={n} NodeHostname={n} NodeAddr=127.0.0.1 Port={port} "
                         f"CPUs={self.cpus} RealMemory={self.memory_mb} State=UNKNOWN")
        lines.append(f"PartitionName=test Nodes={','.join(self.nodes)} Default=YES MaxTime=INFINITE State=UP")
        self.conf.write_text("\n".join(lines) + "\n")
        key = d / "munge" / "munge.key"
        if not key.exists():
            key.write_bytes(os.urandom(1024))
            key.chmod(0o400)

    def _start(self, name, cmd, log):
        out = open(self.dir / "log" / log, "ab")
        self.procs[name] = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=self.env,
                                            start_new_session=True)
        out.close()

    def start(self):
        self._write_config()
        m = self.dir / "munge"
        self._start("munged", [_which("munged"), "--foreground", "--force", f"--socket={self.munge_socket}",
                               f"--key-file={m / 'munge.key'}", f"--pid-file={m / 'munged.pid'}",
                               f"--log-file={m / 'munged.log'}", f"--seed-file={m / 'munged.seed'}"], "munged.out")
        self._until(lambda: self.munge_socket.exists(), 30, "munged's socket")
        self._start("slurmctld", [_which("slurmctld"), "-D", "-i", "-f", str(self.conf)], "slurmctld.out")
        self._until(lambda: self.scontrol("ping", check=False).returncode == 0, 60, "slurmctld answering")
        for n in self.nodes:
            # A UTS namespace of its own: the node's processes see `hostname` = its name (srun's
            # %N in file names, trainsup's host name), while the network stays this machine's.
            self._start(f"slurmd-{n}", ["unshare", "--uts", "sh", "-c", f'hostname "$0" && exec "$@"', n,
                                        _which("slurmd"), "-D", "-N", n, "-f", str(self.conf)], f"slurmd-{n}.out")
        self._until(lambda: all(s.startswith("idle") for s in self.node_states().values()) and
                    len(self.node_states()) == len(self.nodes), 60, "every node idle")
        return self

    def stop(self):
        # Jobs first (their steps are the slurmds' children), then the daemons.
        if self.procs.get("slurmctld") is not None and self.procs["slurmctld"].poll() is None:
            subprocess.run(["scancel", "--full", "--quiet", "--user=root"], env=self.env, capture_output=True,
                           timeout=30)
        order = [k for k in self.procs if k.startswith("slurmd-")] + ["slurmctld", "munged"]
        for name in order:
            p = self.procs.get(name)
            if p is not None and p.poll() is None:
                p.terminate()
        for name in order:
            p = self.procs.get(name)
            if p is None:
                continue
            try:
                p.wait(15)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, 9)
                p.wait(5)
        # A job step's slurmstepd runs in a session of its own and outlives its slurmd when a job
        # was still ending (seen after a test timed out): this cluster's are ended here.
        for pid in self._own_stepds():
            try:
                os.kill(pid, 9)
            except ProcessLookupError:
                pass

    def _own_stepds(self):
        """Pids of the slurmstepd processes started for this cluster (their SLURM_CONF is ours)."""
        mine = f"SLURM_CONF={self.conf}".encode()
        pids = []
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                with open(f"/proc/{entry}/cmdline", "rb") as f:
                    if not f.read().startswith(b"slurmstepd"):
                        continue
                with open(f"/proc/{entry}/environ", "rb") as f:
                    if mine in f.read().split(b"\0"):
                        pids.append(int(entry))
            except OSError:
                continue
        return pids

    # --- the CLI ---
    def run(self, cmd, check=True, timeout=60, **kw):
        return subprocess.run(cmd, env=kw.pop("env", self.env), capture_output=True, text=True, timeout=timeout,
                              check=check, **kw)

    def scontrol(self, *args, check=True):
        return self.run(["scontrol", *args], check=check)

    def sbatch(self, args, cwd=None, env=None):
        """Submits; returns the job id (of the array, for an array)."""
        out = self.run(["sbatch", "--parsable", *args], cwd=cwd or self.dir / "jobs",
                       env=dict(self.env, **(env or {})))
        return out.stdout.strip().split(";")[0]

    def node_states(self):
        """{node: state} as sinfo reports it (lower case, e.g. "idle", "alloc", "drain")."""
        out = self.run(["sinfo", "-h", "-N", "-o", "%N %T"], check=False)
        return dict(line.split() for line in out.stdout.splitlines() if len(line.split()) == 2)

    def drain_reasons(self):
        """{node: reason} of `sinfo -R`."""
        out = self.run(["sinfo", "-h", "-R", "-o", "%N|%E"], check=False)
        return {n: r for n, r in (line.split("|", 1) for line in out.stdout.splitlines() if "|" in line)}

    def jobs(self, job_id):
        """[(job id, array task, state, nodes, reason)] of every element of `job_id`, finished or not."""
        out = self.run(["scontrol", "-o", "show", "job", str(job_id)], check=False)
        rows = []
        for line in out.stdout.splitlines():
            f = dict(kv.split("=", 1) for kv in line.split() if "=" in kv)
            rows.append((f.get("JobId"), f.get("ArrayTaskId"), f.get("JobState"), f.get("NodeList"), f.get("Reason")))
        return rows

