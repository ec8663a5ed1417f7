"""A supervised 4-rank DDP job on gloo with its telemetry path, as a test harness runs it before
the launcher exists: one trainsup_coordinator, one trainsup_node_monitor per simulated host
(2 hosts x 2 ranks), ranks of examples/python/train_ddp.py talking to their host's monitor over
a Unix socket. Used by test_detection.py and bench/detection_bench.py."""
import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import threading
import time
from ranks import Ranks

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TRAIN_DDP = os.path.join(REPO, "examples", "python", "train_ddp.py")
TRAIN_MESH = os.path.join(REPO, "examples", "python", "train_mesh.py")
COORDINATOR = os.environ.get("TRAINSUP_COORDINATOR_BIN")
NODE_MONITOR = os.environ.get("TRAINSUP_NODE_MONITOR_BIN")
HOSTS = ["host-a", "host-a", "host-b", "host-b"]  # rank -> host


def available():
    return all(p and os.path.exists(p) for p in (COORDINATOR, NODE_MONITOR))


class Job:
    def __init__(self, workdir, train_args=(), env=None, world=4, script=TRAIN_DDP):
        self.workdir = workdir
        self.token = secrets.token_hex(16)
        self.started = time.monotonic()
        # No --hosts: the coordinator learns each rank's host from its hello.
        self.coord = subprocess.Popen([COORDINATOR, "--world", str(world), "--token", self.token],
                                      stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        first = json.loads(self.coord.stdout.readline())
        assert first["event"] == "listening", first
        self.verdicts = []
        self.lock = threading.Lock()
        threading.Thread(target=self._read, daemon=True).start()
        self.monitors = {}
        for host in sorted(set(HOSTS[:world])):
            sock = os.path.join(str(workdir), f"{host}.sock")
            m = subprocess.Popen([NODE_MONITOR, "--socket", sock, "--coordinator", f"127.0.0.1:{first['port']}",
                                  "--token", self.token], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
            line = json.loads(m.stdout.readline())
            assert line["event"] == "listening", line
            self.monitors[host] = (m, sock)
        def rank_env(r):
            host = HOSTS[r]
            return dict(LOCAL_RANK=str(HOSTS[:r].count(host)), LOCAL_WORLD_SIZE=str(HOSTS[:world].count(host)),
                        TRAINSUP_NODE_NAME=host, TRAINSUP_COORDINATOR=f"unix:{self.monitors[host][1]}",
                        **(env or {}))

        self.job = Ranks(world, [sys.executable, script, *train_args], rank_env=rank_env,
                         env=dict(TRAINSUP_LOG_DIR=str(workdir / "logs"), TRAINSUP_CHECKPOINT_DIR=str(workdir / "ckpt"),
                                  TRAINSUP_LOG_STDERR="0", TRAINSUP_JOB_TOKEN=self.token),
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, text=False)
        self.ranks = self.job.procs

    def _read(self):
        for line in self.coord.stdout:
            with self.lock:
                self.verdicts.append((time.monotonic(), json.loads(line)))

    def all_verdicts(self):
        with self.lock:
            return [(t, v) for t, v in self.verdicts if v.get("event") == "verdict"]

    def wait_for(self, pred, timeout):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self.lock:
                for t, v in self.verdicts:
                    if v.get("event") == "verdict" and pred(v):
                        return t, v
            time.sleep(0.05)  # polls the reader thread's list; bounded by the deadline
        return None, None

    def logs(self):
        return sorted((self.workdir / "logs").glob("*.log"))

    def wait_for_log(self, text, timeout=120):
        """Until every rank's log contains `text` (training under way)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            logs = self.logs()
            if len(logs) == len(self.ranks) and all(text in p.read_text() for p in logs):
                return
            for r, p in enumerate(self.ranks):
                assert p.poll() is None, f"rank {r} exited with {p.returncode} before '{text}'"
            time.sleep(0.1)
        raise AssertionError(f"not every rank logged '{text}' within {timeout} s")

    def wait_ranks(self, timeout):
        deadline = time.monotonic() + timeout
        codes = []
        for p in self.ranks:
            codes.append(p.wait(timeout=max(0.1, deadline - time.monotonic())))
        return codes

    def close(self):
        for p in self.ranks:
            if p.poll() is None:
                try:
                    p.send_signal(signal.SIGCONT)
                except ProcessLookupError:
                    pass
                p.kill()
            p.wait()
        for m, _ in self.monitors.values():
            m.stdin.close()
            m.wait(timeout=30)
        self.coord.stdin.close()
        self.coord.wait(timeout=30)
        with self.lock:  # the coordinator's last line: what it received
            self.stopped = next((v for _, v in self.verdicts if v.get("event") == "stopped"), None)
