"""In-memory snapshots (issue 22, docs/snapshots.md): each rank's snapshot is held by its host's
agent, copied to a peer host's agent and verified before it counts; a restart takes each shard
from this host's memory, else from the peer's copy, else falls back to disk and says why.

The agents' snapshot services run in this test process (one per simulated host), over a real
TCPStore; the ranks are real processes (snapshot_worker.py) with two ranks per host."""
import datetime
import glob
import json
import os
import sys

import pytest
import torch.distributed as dist

from ranks import Ranks

from trainsup.launch.snapshots import SnapshotService

HERE = os.path.dirname(os.path.abspath(__file__))
WORKER = os.path.join(HERE, "snapshot_worker.py")
JOB = "snapjob"


class Cluster:
    """Snapshot services of simulated hosts, sharing one store; rounds of 4 ranks on 2 or 4 hosts."""

    def __init__(self, tmp_path, max_bytes=None):
        self.tmp = tmp_path
        self.store_server = dist.TCPStore("127.0.0.1", 0, 1, True, timeout=datetime.timedelta(seconds=60),
                                          wait_for_workers=False)
        self.store = dist.PrefixStore("trainsup/", self.store_server)
        self.events = []
        self.services = {}
        self.max_bytes = max_bytes or {}

    def host(self, name):
        if name not in self.services:
            self.services[name] = SnapshotService(
                self.store, JOB, name, "127.0.0.1", "127.0.0.1", memory=str(self.tmp / "shm"),
                max_bytes=self.max_bytes.get(name, 0),
                on_event=lambda event, _h=name, **f: self.events.append(dict(f, event=event, host=_h)))
        return self.services[name]

    def lose(self, name):
        """The host is gone, with its memory."""
        self.services.pop(name).close()

    def run(self, round_, hosts, steps, extra_env=None, argv=None):
        for g, h in enumerate(hosts):
            self.host(h).joined_round(round_, g, len(hosts))

        per_host = 4 // len(hosts)

        def rank_env(r):
            svc = self.services[hosts[r // per_host]]
            return dict(svc.rank_env, TRAINSUP_NODE_NAME=svc.node, LOCAL_RANK=str(r % per_host),
                        LOCAL_WORLD_SIZE=str(per_host), GROUP_RANK=str(r // per_host), TRAINSUP_RESTART_COUNT=str(round_))

        env = {"TRAINSUP_JOB_ID": JOB, "TRAINSUP_LOG_DIR": str(self.tmp / "logs"),
               "TRAINSUP_CHECKPOINT_DIR": str(self.tmp / "disk"), "TRAINSUP_SNAPSHOT_EVERY_STEPS": "2",
               "TRAINSUP_WATCHDOG_HEARTBEAT_TIMEOUT_S": "120", "TRAINSUP_LOG_STDERR": "0"}
        env.update(extra_env or {})
        with Ranks(4, argv or [sys.executable, WORKER, "--steps", str(steps)], env=env, rank_env=rank_env) as job:
            outs = job.communicate(timeout=240)
        results = []
        for rc, out in outs:
            assert rc == 0, out
            if argv is None:
                results.append(json.loads([line for line in out.splitlines() if line.startswith("{")][-1]))
        return results

    def worker_events(self, name):
        found = []
        for path in glob.glob(str(self.tmp / "logs" / "*.events.jsonl")):
            with open(path) as f:
                for line in f:
                    e = json.loads(line)
                    if e.get("event") == name:
                        found.append(e)
        return found

    def close(self):
        for s in list(self.services.values()):
            s.close()


@pytest.fixture
def cluster(tmp_path):
    c = Cluster(tmp_path)
    yield c
    c.close()


def reference_digest(tmp_path, steps):
    """The digest of the same training without any interruption, on one rank."""
    out = Ranks(1, [sys.executable, WORKER, "--steps", str(steps)],
                env={"TRAINSUP_LOG_DIR": str(tmp_path / "ref-logs"), "TRAINSUP_CHECKPOINT_DIR": str(tmp_path / "ref"),
                     "TRAINSUP_LOG_STDERR": "0"}).communicate(timeout=120)
    assert out[0][0] == 0, out[0][1]
    return json.loads([line for line in out[0][1].splitlines() if line.startswith("{")][-1])["digest"]


def test_a_lost_host_is_restored_from_its_peers_copy(cluster, tmp_path):
    first = cluster.run(0, ["ha", "hb"], steps=9)
    assert all(r["restored"] == 0 for r in first)
    # A snapshot due while the previous one is still being copied is skipped (the training never
    # waits for a copy): the newest committed one is what the events say.
    newest = max(e["step"] for e in cluster.worker_events("snapshot_committed"))
    assert newest >= 4
    # Each host holds its own shards and its peer's copies of the newest snapshot only, and the
    # manifest names where each shard and its copy are.
    for h in ("ha", "hb"):
        held = sorted(os.path.basename(p) for p in glob.glob(os.path.join(cluster.services[h].dir, "step-*", "*")))
        assert held == ["MANIFEST.json"] + [f"shard-r0000{r}-of-00004.tsc" for r in range(4)], (h, held)
        steps = [os.path.basename(p) for p in glob.glob(os.path.join(cluster.services[h].dir, "step-*"))]
        assert steps == ["step-%020d" % newest], steps
    manifest = json.load(open(glob.glob(os.path.join(cluster.services["ha"].dir, "step-*", "MANIFEST.json"))[0]))
    assert json.loads(manifest["metadata"]["trainsup.placement"]) == [["ha", "hb"], ["ha", "hb"], ["hb", "ha"],
                                                                       ["hb", "ha"]]
    replicated = [e for e in cluster.events if e["event"] == "snapshot_replicated"]
    assert {e["host"] for e in replicated} == {"ha", "hb"}

    # Host hb dies with its memory; a spare, hc, takes its ranks (2 and 3) and fetches their
    # shards from ha, which held hb's copies. Nothing is replayed from disk: no disk checkpoint
    # exists (the disk interval is the default 10 minutes).
    cluster.lose("hb")
    second = cluster.run(1, ["ha", "hc"], steps=12)
    assert [r["restored"] for r in second] == [newest] * 4
    assert [r["next_step"] for r in second] == [12] * 4
    expected = reference_digest(tmp_path, 12)
    assert all(r["digest"] == pytest.approx(expected, rel=1e-12) for r in second)
    restored = cluster.worker_events("checkpoint_restored")
    assert {e["tier"] for e in restored} == {"memory"}
    assert {e["ranks_from_peers"] for e in restored} == {2}
    fetched = [e for e in cluster.events if e["event"] == "snapshot_fetched"]
    assert sorted((e["host"], e["source"], os.path.basename(e["file"])) for e in fetched
                  if e["file"].endswith(".tsc")) == [("hc", "ha", "shard-r00002-of-00004.tsc"),
                                                     ("hc", "ha", "shard-r00003-of-00004.tsc")]
    assert not cluster.worker_events("snapshot_restore_fallback")


def test_a_corrupt_last_copy_is_skipped_and_the_restore_falls_back_to_disk(cluster, tmp_path):
    cluster.run(0, ["ha", "hb"], steps=9, extra_env={"TRAINSUP_CHECKPOINT_EVERY_STEPS": "5"})
    newest = max(e["step"] for e in cluster.worker_events("snapshot_committed"))
    assert newest > 5, "the newest snapshot must be newer than the disk checkpoint for this test"
    # hb dies, and ha's copy of rank 2's shard is damaged: no verified copy of rank 2 is left.
    cluster.lose("hb")
    victim = glob.glob(os.path.join(cluster.services["ha"].dir, "step-*", "shard-r00002-of-00004.tsc"))[0]
    with open(victim, "r+b") as f:
        f.seek(200)
        byte = f.read(1)
        f.seek(200)
        f.write(bytes([byte[0] ^ 0xFF]))
    second = cluster.run(1, ["ha", "hc"], steps=12, extra_env={"TRAINSUP_CHECKPOINT_EVERY_STEPS": "5"})
    # Disk step 5, never the damaged copy; then trained on to the same result.
    assert [r["restored"] for r in second] == [5] * 4
    expected = reference_digest(tmp_path, 12)
    assert all(r["digest"] == pytest.approx(expected, rel=1e-12) for r in second)
    skipped = [e for e in cluster.events if e["event"] == "snapshot_copy_skipped"]
    assert skipped and all("checksum mismatch" in e["reason"] for e in skipped), skipped
    fallback = cluster.worker_events("snapshot_restore_fallback")
    assert len(fallback) == 4 and all("shard-r00002-of-00004.tsc" in e["reason"] and "checksum mismatch" in e["reason"]
                                      for e in fallback), fallback
    restored = cluster.worker_events("checkpoint_restored")
    assert [e.get("tier") for e in restored] == [None] * 4  # the disk tier's event has no tier


def test_two_hosts_lost_at_once_leave_a_shard_without_a_copy_and_the_restore_falls_back_to_disk(cluster, tmp_path):
    # Four hosts of one rank each; each copies its shard to the next (ha -> hb -> hc -> hd -> ha).
    disk = {"TRAINSUP_CHECKPOINT_EVERY_STEPS": "5"}
    cluster.run(0, ["ha", "hb", "hc", "hd"], steps=9, extra_env=disk)
    newest = max(e["step"] for e in cluster.worker_events("snapshot_committed"))
    assert newest > 5, "the newest snapshot must be newer than the disk checkpoint for this test"
    manifest = json.load(open(glob.glob(os.path.join(cluster.services["ha"].dir, "step-*", "MANIFEST.json"))[0]))
    assert json.loads(manifest["metadata"]["trainsup.placement"]) == [["ha", "hb"], ["hb", "hc"], ["hc", "hd"],
                                                                       ["hd", "ha"]]
    # hb and its peer hc die together: rank 1's shard and its only copy are gone. Ranks 0 and 3
    # (on ha and hd) still have theirs, and rank 2's copy is on hd; the step is unusable as a
    # whole, so every rank restores the disk's step 5, and says why.
    cluster.lose("hb")
    cluster.lose("hc")
    second = cluster.run(1, ["ha", "hd", "he", "hf"], steps=12, extra_env=disk)
    assert [r["restored"] for r in second] == [5] * 4
    expected = reference_digest(tmp_path, 12)
    assert all(r["digest"] == pytest.approx(expected, rel=1e-12) for r in second)
    fallback = cluster.worker_events("snapshot_restore_fallback")
    assert len(fallback) == 4, fallback
    assert all("shard-r00001-of-00004.tsc" in e["reason"] for e in fallback), fallback
    assert not [e for e in cluster.events if e["event"] == "snapshot_copy_skipped"]


def test_a_peer_out_of_snapshot_memory_fails_that_snapshot_not_the_job(tmp_path):
    c = Cluster(tmp_path, max_bytes={"hb": 1})
    try:
        results = c.run(0, ["ha", "hb"], steps=5, extra_env={"TRAINSUP_CHECKPOINT_EVERY_STEPS": "4"})
    finally:
        c.close()
    assert [r["next_step"] for r in results] == [5] * 4  # training went on
    failed = c.worker_events("snapshot_failed")
    assert failed and any("snapshot memory cap (TRAINSUP_SNAPSHOT_MAX_BYTES=1)" in e["reason"] for e in failed), failed
    assert not c.worker_events("snapshot_committed")
    assert len(c.worker_events("checkpoint_committed")) == 4  # the disk checkpoint of step 4


TRAIN_MESH = os.path.join(os.path.dirname(os.path.dirname(HERE)), "examples", "python", "train_mesh.py")


def test_sharded_state_fsdp2_x_tp_is_restored_from_memory_on_a_spare(cluster, tmp_path):
    """FSDP2 x TP on a 2 x 2 mesh: each rank's snapshot holds its DTensors' local shards; the
    spare's ranks take the lost host's shards from the peer copy, and the job ends with the
    same parameters as one that never failed."""
    import torch

    def mesh(steps, out=None):
        return [sys.executable, TRAIN_MESH, "--steps", str(steps), "--tp", "2", "--step-sleep-ms", "50",
                *(["--out", str(out)] if out else [])]

    cluster.run(0, ["ha", "hb"], steps=9, argv=mesh(9))
    newest = max(e["step"] for e in cluster.worker_events("snapshot_committed"))
    cluster.lose("hb")
    cluster.run(1, ["ha", "hc"], steps=12, argv=mesh(12, tmp_path / "final.pt"))
    restored = [e for e in cluster.worker_events("checkpoint_restored") if e["restart"] == 1]
    assert [(e["step"], e["tier"]) for e in restored] == [(newest, "memory")] * 4
    assert {e["ranks_from_peers"] for e in restored} == {2}
    with Ranks(4, mesh(12, tmp_path / "reference.pt"), env={"TRAINSUP_LOG_DIR": str(tmp_path / "ref-logs"),
                                                            "TRAINSUP_CHECKPOINT_DIR": str(tmp_path / "ref"),
                                                            "TRAINSUP_LOG_STDERR": "0"}) as job:
        assert all(rc == 0 for rc, _ in job.communicate(timeout=240))
    got, ref = torch.load(tmp_path / "final.pt"), torch.load(tmp_path / "reference.pt")
    assert got.keys() == ref.keys()
    assert all(torch.equal(got[k], ref[k]) for k in ref), "resumed parameters differ from the uninterrupted run"


def test_the_report_says_where_each_incident_was_restored_from():
    from trainsup.tools import report
    agents = [{"event": "verdict", "time": 10.0, "round": 0, "kind": "silent_rank", "hosts": ["hb"], "host": "ha"},
              {"event": "verdict", "time": 30.0, "round": 1, "kind": "silent_rank", "hosts": ["hc"], "host": "ha"}]
    ranks = [{"event": "checkpoint_snapshot", "time": 9.5, "step": 95, "host": "ha", "rank": 0},
             {"event": "checkpoint_restored", "time": 10.6, "step": 95, "tier": "memory", "source": "peer",
              "ranks_from_peers": 1, "host": "hc", "rank": 1},
             {"event": "first_step", "time": 10.7, "step": 96, "host": "ha", "rank": 0},
             {"event": "checkpoint_snapshot", "time": 20.0, "step": 100, "host": "ha", "rank": 0},
             {"event": "snapshot_restore_fallback", "time": 30.5, "host": "ha", "rank": 0,
              "reason": "step-00000000000000000295: no verified copy of shard-r00001-of-00002.tsc"},
             {"event": "checkpoint_restored", "time": 30.6, "step": 100, "host": "ha", "rank": 0},
             {"event": "first_step", "time": 30.7, "step": 101, "host": "ha", "rank": 0}]
    a = report.analyse(agents, ranks, [])
    first, second = a["incidents"]
    assert (first["restored_from"], first["ranks_from_peers"], first["memory_fallback"]) == ("memory", 1, None)
    assert second["restored_from"] == "disk" and "no verified copy of shard-r00001" in second["memory_fallback"]
    text = report.text_report(a, report.timeline(agents, ranks, []))
    assert "restored from memory (1 rank(s) from a peer host's copy)" in text
    assert "restored from disk, not memory: step-00000000000000000295: no verified copy" in text


def test_a_cpp_trainer_resumes_from_its_hosts_memory_after_a_crash(tmp_path):
    """C++ trainers get the memory tier from the same settings (Supervisor::maybeCheckpoint and
    restore): the example trainer, killed (-9) mid-run with no disk checkpoint yet, resumes from
    the newest snapshot in its host's memory."""
    import subprocess
    trainer = os.environ.get("TRAINSUP_EXAMPLE_TRAIN")
    if not trainer or not os.path.exists(trainer):
        pytest.skip("the C++ example trainer was not built (TRAINSUP_WITH_TORCH=OFF)")
    env = dict(os.environ, TRAINSUP_LOG_DIR=str(tmp_path / "logs"), TRAINSUP_CHECKPOINT_DIR=str(tmp_path / "ckpt"),
               TRAINSUP_LOG_STDERR="0", TRAINSUP_SNAPSHOT_EVERY_STEPS="5", TRAINSUP_SNAPSHOT_DIR=str(tmp_path / "shm"),
               TRAINSUP_SNAPSHOT_REPLICAS="0", TRAINSUP_JOB_ID="cpp")
    crashed = subprocess.run([trainer, "--steps", "40", "--hidden", "32", "--step-sleep-ms", "20", "--crash-at-step",
                              "23"], env=env, capture_output=True, text=True, timeout=120)
    assert crashed.returncode == -9, crashed.stderr[-2000:]
    events = [json.loads(line) for p in glob.glob(str(tmp_path / "logs" / "*.events.jsonl")) for line in open(p)]
    newest = max(e["step"] for e in events if e["event"] == "snapshot_committed")
    assert newest >= 15 and not os.path.exists(tmp_path / "ckpt" / ("step-%020d" % newest))
    again = subprocess.run([trainer, "--steps", "40", "--hidden", "32"], env=env, capture_output=True, text=True,
                           timeout=120)
    assert again.returncode == 0, again.stderr[-2000:]
    events = [json.loads(line) for p in glob.glob(str(tmp_path / "logs" / "*.events.jsonl")) for line in open(p)]
    restored = [e for e in events if e["event"] == "checkpoint_restored"]
    assert [(e["step"], e["tier"], e["source"]) for e in restored] == [(newest, "memory", "local")]


def test_an_agent_killed_outright_leaves_no_snapshot_memory_behind(tmp_path):
    """The janitor (a child the kernel signals when the agent dies) frees the host's snapshot
    memory: a killed agent must not leave gigabytes in /dev/shm until the next reboot."""
    import subprocess
    import time
    code = ("import sys, torch.distributed as dist\n"
            "from trainsup.launch.snapshots import SnapshotService\n"
            "s = SnapshotService(dist.PrefixStore('trainsup/', dist.HashStore()), 'job', 'hx', '127.0.0.1', "
            "'127.0.0.1', memory=sys.argv[1])\n"
            "open(s.dir + '/held', 'w').write('x' * 4096)\n"
            "print(s.dir, flush=True)\n"
            "sys.stdin.read()\n")
    from ranks import python_path
    agent = subprocess.Popen([sys.executable, "-c", code, str(tmp_path / "shm")], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True, env=dict(os.environ, PYTHONPATH=python_path()))
    held = agent.stdout.readline().strip()
    assert os.path.exists(os.path.join(held, "held"))
    agent.kill()
    agent.wait()
    deadline = time.monotonic() + 30
    # The janitor is another process: poll for its last effect (it removes the host's directory,
    # then the run's), bounded by the deadline. CI once looked between the two.
    while os.path.exists(os.path.dirname(held)) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not os.path.exists(held)
    assert not os.path.exists(os.path.dirname(held))  # the run's directory too, as no host is left


def test_memory_left_by_a_job_killed_outright_is_freed_by_the_next_agent_on_the_host(tmp_path):
    """A scheduler that kills every process of a job at once (agent and janitor together)
    leaves the host's snapshot memory behind. The next agent on the host frees it (its owner's
    lock is no longer held), and leaves alone what a live agent holds or what is not trainsup's."""
    import subprocess
    import signal
    import torch.distributed as dist
    from trainsup.launch.snapshots import SnapshotService
    shm = tmp_path / "shm"
    code = ("import sys, torch.distributed as dist\n"
            "from trainsup.launch.snapshots import SnapshotService\n"
            "s = SnapshotService(dist.PrefixStore('trainsup/', dist.HashStore()), sys.argv[2], 'hx', '127.0.0.1', "
            "'127.0.0.1', memory=sys.argv[1])\n"
            "open(s.dir + '/held', 'w').write('x' * 4096)\n"
            "print(s.dir, s._janitor.pid, flush=True)\n"
            "sys.stdin.read()\n")
    from ranks import python_path
    env = dict(os.environ, PYTHONPATH=python_path())
    dead = subprocess.Popen([sys.executable, "-c", code, str(shm), "dead-job"], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True, env=env)
    live = subprocess.Popen([sys.executable, "-c", code, str(shm), "live-job"], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True, env=env)
    try:
        dead_dir, dead_janitor = dead.stdout.readline().split()
        live_dir, _ = live.stdout.readline().split()
        os.kill(int(dead_janitor), signal.SIGKILL)  # the whole job at once: the janitor first
        dead.kill()
        dead.wait()
        assert os.path.exists(os.path.join(dead_dir, "held"))  # left behind, as the docs warn
        foreign = shm / "someone-else" / "hz"
        foreign.mkdir(parents=True)
        (foreign / "data").write_text("not trainsup's")
        events = []
        service = SnapshotService(dist.PrefixStore("trainsup/", dist.HashStore()), "next-job", "hx", "127.0.0.1",
                                  "127.0.0.1", memory=str(shm), on_event=lambda name, **f: events.append((name, f)))
        try:
            assert not os.path.exists(dead_dir) and not os.path.exists(os.path.dirname(dead_dir))
            assert os.path.exists(os.path.join(live_dir, "held"))  # its agent is alive
            assert (foreign / "data").exists()  # no owner lock: not ours to judge
            swept = [f for name, f in events if name == "snapshot_memory_swept"]
            assert swept == [{"paths": [dead_dir], "bytes": 4096}]
        finally:
            service.close()
        assert os.path.exists(os.path.join(live_dir, "held"))
    finally:
        for p in (dead, live):
            if p.poll() is None:
                p.kill()
                p.wait()


def test_an_overlapped_snapshot_keeps_what_it_copies_alive_until_awaited(tmp_path, monkeypatch):
    """With TRAINSUP_CHECKPOINT_SNAPSHOT=overlapped the memory tier copies after save() returns,
    from buffers the Python collect made (RNG states, the skeleton): they must stay referenced
    until await_snapshot(), and the snapshot restores what was saved."""
    import torch
    import trainsup
    monkeypatch.setenv("TRAINSUP_LOG_DIR", str(tmp_path / "logs"))
    monkeypatch.setenv("TRAINSUP_LOG_STDERR", "0")
    settings = dict(snapshot_every_steps=1, snapshot_dir=str(tmp_path / "shm"), snapshot_replicas=0,
                    checkpoint_snapshot="overlapped", checkpoint_interval_s=0, checkpoint_dir=str(tmp_path / "disk"),
                    job_id="overlap")
    w = torch.arange(1 << 20, dtype=torch.float32)
    with trainsup.Supervisor(**settings) as sup:
        state = {"w": w.clone(), "next_step": 4}
        sup.maybe_checkpoint(3, state)  # its outcome is the disk tier's (not due); the snapshot is taken
        assert sup._sup.snapshot_outstanding and sup._snapshot_alive is not None
        sup.await_snapshot()
        assert not sup._sup.snapshot_outstanding and sup._snapshot_alive is None
    with trainsup.Supervisor(**settings) as sup:
        restored = {"w": torch.zeros_like(w), "next_step": 0}
        assert sup.restore(restored) == 3
        assert torch.equal(restored["w"], w) and restored["next_step"] == 4
