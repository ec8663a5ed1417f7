"""Sharded checkpoints on torch.distributed.checkpoint (trainsup/dcp.py), on gloo: FSDP2 x TP
state saved on N ranks restores on M ranks and on another mesh shape with every tensor bitwise
equal; plain dcp.load reads trainsup's checkpoint; a job adopting trainsup restores from its
existing DCP checkpoint; a corrupt item or .metadata is skipped for the older checkpoint with a
reason naming the file; a state that does not fit names the key and both shapes; a TP degree
larger than the world is refused before any state exists."""
import json
import os
import pathlib
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
WORKER = os.path.join(HERE, "reshard_worker.py")


def _run(world, *args, timeout=300, expect_rc=0):
    from ranks import Ranks
    with Ranks(world, [sys.executable, WORKER, *map(str, args)], env={"TRAINSUP_LOG_STDERR": "0"}) as job:
        outs = job.communicate(timeout=timeout)
    results = []
    for rc, out in outs:
        assert rc == expect_rc, out[-4000:]
        results.append(json.loads(out.strip().splitlines()[-1]))
    return results


def _equal(results):
    cmp = results[0]["compare"]
    assert cmp["tensors"] >= 10 and cmp["differ"] == [] and cmp["missing"] == [], cmp


def _events(root, name):
    out = []
    for f in pathlib.Path(root, "logs").glob("*.events.jsonl"):
        out += [json.loads(line) for line in f.read_text().splitlines() if f'"{name}"' in line]
    return out


@pytest.mark.parametrize("saved, restored", [((4, 2), (2, 2)),   # shrink: 2x2 -> 1x2 (a host lost)
                                             ((2, 2), (4, 2)),   # grow: 1x2 -> 2x2 (a spare joins)
                                             ((4, 2), (4, 1))])  # another mesh shape: 2x2 -> 4x1
def test_fsdp2_tp_state_reshards_bitwise(tmp_path, saved, restored):
    results = _run(saved[0], "save", tmp_path, "--tp", saved[1], "--steps", 3)
    assert all(r["outcome"] == "started" for r in results), results
    step_dir = next((tmp_path / "ckpt").glob("step-*"))
    names = sorted(p.name for p in step_dir.iterdir())
    # A DCP checkpoint (one data file per rank, .metadata) with trainsup's shards and manifest.
    assert ".metadata" in names and "MANIFEST.json" in names, names
    assert sum(n.endswith(".distcp") for n in names) == saved[0] and sum(n.endswith(".tsc") for n in names) == saved[0]
    results = _run(restored[0], "restore", tmp_path, "--tp", restored[1], "--seed", 1)
    assert all(r["step"] == 3 and r["next_step"] == 3 for r in results), results
    assert results[0]["mesh"] == [restored[0] // restored[1], restored[1]]
    _equal(results)


def test_plain_dcp_load_reads_a_trainsup_checkpoint(tmp_path):
    _run(2, "save", tmp_path, "--tp", 2)
    results = _run(2, "plain", tmp_path, "--tp", 2, "--seed", 1)
    assert results[0]["next_step"] == 3
    _equal(results)


def test_a_job_adopting_trainsup_restores_its_existing_dcp_checkpoint(tmp_path):
    _run(2, "dcpsave", tmp_path, "--tp", 2, "--steps", 4)
    results = _run(2, "adopt", tmp_path, "--tp", 2, "--seed", 1)
    assert results[0]["next_step"] == 4
    _equal(results)
    assert _events(tmp_path, "checkpoint_adopted")


def _save_twice(tmp_path):
    """Checkpoints of steps 3 and 5 (the older one kept by retention)."""
    _run(2, "save", tmp_path, "--tp", 2, "--steps", 3)
    older = tmp_path / "older-ref.pt"
    (tmp_path / "ref.pt").rename(older)
    _run(2, "save", tmp_path, "--tp", 2, "--steps", 5)
    older.replace(tmp_path / "ref.pt")  # what a restore of step 3 must give
    steps = sorted((tmp_path / "ckpt").glob("step-*"))
    assert len(steps) == 2, steps
    return steps[-1]


@pytest.mark.parametrize("damage", ["item", "metadata", "missing_file"])
def test_a_corrupt_dcp_checkpoint_is_skipped_for_the_older_one(tmp_path, damage):
    newest = _save_twice(tmp_path)
    if damage == "item":
        data = newest / "__1_0.distcp"
        raw = bytearray(data.read_bytes())
        raw[len(raw) // 2] ^= 0xFF
        data.write_bytes(bytes(raw))
    elif damage == "metadata":
        meta = newest / ".metadata"
        raw = bytearray(meta.read_bytes())
        raw[-10] ^= 0xFF
        meta.write_bytes(bytes(raw))
    else:
        (newest / "__0_0.distcp").unlink()
    results = _run(2, "restore", tmp_path, "--tp", 2, "--seed", 1)
    assert all(r["step"] == 3 for r in results), results
    _equal(results)
    skipped = _events(tmp_path, "checkpoint_skipped")
    assert skipped, "no checkpoint_skipped event"
    reason = skipped[0]["reason"]
    print(f"[measure] {damage}: skipped for step 3 because: {reason}")
    expected = {"item": ("__1_0.distcp", "checksum mismatch"), "metadata": (".metadata", "checksum mismatch"),
                "missing_file": ("__0_0.distcp", "missing file")}[damage]
    assert all(x in reason for x in expected), reason


def test_a_state_that_does_not_fit_names_the_key_and_both_shapes(tmp_path):
    _run(2, "save", tmp_path, "--tp", 2)
    # The same mesh, another model: MLP(hidden=48) instead of 64.
    results = _run(2, "restore", tmp_path, "--tp", 2, "--hidden", 48)
    err = results[0]["error"]
    assert "'model.up.weight'" in err and "[64, 32]" in err and "[48, 32]" in err, err


def test_a_tp_degree_larger_than_the_world_is_refused_before_any_state(tmp_path):
    _run(2, "save", tmp_path, "--tp", 2)
    results = _run(1, "restore", tmp_path, "--tp", 2, expect_rc=3)
    assert "tensor-parallel degree 2 does not fit a world of 1 rank" in results[0]["layout_error"], results


MESH = os.path.join(HERE, "..", "..", "examples", "python", "train_mesh.py")


def test_the_stop_signal_saves_one_step_on_every_rank_and_the_job_resumes_from_it(tmp_path):
    """SIGTERM to one rank of a 2-rank FSDP2 x TP job: both ranks save the same step through the
    DCP path and exit EXIT_STOP_REQUESTED; the next run resumes at the step after it."""
    import signal
    import time
    import trainsup
    from ranks import Ranks
    env = {"TRAINSUP_CHECKPOINT_DIR": str(tmp_path / "ckpt"), "TRAINSUP_LOG_DIR": str(tmp_path / "logs"),
           "TRAINSUP_LOG_STDERR": "0", "TRAINSUP_JOB_ID": "stop"}
    argv = [sys.executable, MESH, "--tp", "2", "--step-sleep-ms", "20"]
    with Ranks(2, argv + ["--steps", "100000", "--checkpoint-every", "25"], env=env) as job:
        deadline = time.monotonic() + 120
        while not _events(tmp_path, "checkpoint_committed"):
            assert time.monotonic() < deadline, "no checkpoint within 120 s"
            time.sleep(0.1)  # polls the ranks' event logs; bounded by the deadline
        job.procs[1].send_signal(signal.SIGTERM)
        outs = job.communicate(timeout=120)
    assert [rc for rc, _ in outs] == [trainsup.EXIT_STOP_REQUESTED] * 2, [o[-2000:] for _, o in outs]
    ckpt = trainsup.load_checkpoint(str(tmp_path / "ckpt"))
    assert ckpt.metadata.get("trainsup.layout") == "dcp" and ckpt.world_size == 2
    committed = {e["rank"]: e["step"] for e in _events(tmp_path, "checkpoint_committed") if e["step"] == ckpt.step}
    assert committed == {0: ckpt.step, 1: ckpt.step}, committed
    with Ranks(2, argv + ["--steps", str(ckpt.step + 4)], env=env) as job:
        outs = job.communicate(timeout=120)
    assert all(rc == 0 for rc, _ in outs), [o[-2000:] for _, o in outs]
    log = (tmp_path / "logs").glob("stop-*-r0.log")
    assert any(f"resumed at step {ckpt.step + 1}" in p.read_text() for p in log), "rank 0 did not resume after the stop"



CRASH = os.path.join(HERE, "dcp_crash_worker.py")


def _worker(*args, prefix=()):
    import subprocess
    from ranks import python_path
    out = subprocess.run([*prefix, sys.executable, CRASH, *map(str, args)], capture_output=True, text=True, timeout=300,
                         env=dict(os.environ, PYTHONPATH=python_path()))
    return out.returncode, out.stdout.strip().splitlines()[-1:] and json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(not __import__("shutil").which("strace"), reason="needs strace (fault injection)")
@pytest.mark.parametrize("syscall", ["fsync", "rename", "unlink"])
def test_a_dcp_save_killed_at_each_persist_point_restores_the_old_or_the_new_checkpoint(tmp_path, syscall):
    """The crash-point test of the DCP path: step 1 committed, then the save of step 2 SIGKILLed
    before its k-th fsync / rename / unlink (strace's fault injection; every one the process
    makes: DCP's data and .metadata, trainsup's shard and manifest, retention deleting step 1),
    for every k until a save runs to its end. Each time the directory restores step 2 if its
    manifest was renamed into place, else step 1, bitwise; never a damaged checkpoint."""
    import shutil
    template = tmp_path / "template"
    assert _worker("save", template, 1)[0] == 0
    digests = {s: _worker("digest", s)[1]["digest"] for s in (1, 2)}
    runs = []
    syscalls = {"fsync": "fsync,fdatasync", "rename": "rename,renameat,renameat2", "unlink": "unlink,unlinkat,rmdir"}[syscall]

    def killed_at(k):
        work = tmp_path / f"k{k}"
        shutil.copytree(template, work)
        rc, _ = _worker("save", work, 2, prefix=("strace", "-f", "-qq", "-o", "/dev/null", "-e", f"trace={syscalls}",
                                                 "-e", f"inject={syscalls}:signal=SIGKILL:when={k}"))
        return k, rc, (work / "ckpt" / "step-00000000000000000002" / "MANIFEST.json").exists(), str(work)

    # Two kill points at a time (each run is a process that mostly imports torch; each has its
    # own directory and strace counts its own calls), in order, up to the first save that ran
    # to its end without reaching its k-th call.
    from concurrent.futures import ThreadPoolExecutor
    with ThreadPoolExecutor(2) as pool:
        for first in range(1, 40, 2):
            for run in pool.map(killed_at, (first, first + 1)):
                runs.append(run)
                if run[1] == 0:
                    break
            if runs[-1][1] == 0:
                break
    kills = sum(1 for r in runs if r[1] != 0)
    rc, restored = _worker("restore", *[r[3] for r in runs])
    assert rc == 0, restored
    outcomes = []
    for (k, rc, committed, _), got in zip(runs, restored):
        expected = 2 if committed else 1
        assert got == {"step": expected, "digest": digests[expected]}, (syscall, k, committed, got)
        outcomes.append((k, rc, expected))
    print(f"[measure] dcp save killed before each of {kills} {syscall} calls: restored {outcomes}")
    assert kills >= 2 and outcomes[-1][1] == 0, outcomes


def test_a_rank_that_cannot_stage_fails_that_save_on_every_rank_at_once(tmp_path):
    """Rank 1's staging of step 1 fails (no memory): DCP's save is collective, so the ranks that
    did stage must not wait in it for rank 1 until the commit timeout (120 s here) with every
    later save held up. Step 1 fails on every rank, naming rank 1's error; step 2 commits and
    is what a restore finds."""
    results = _run(4, "stagefail", tmp_path, "--tp", 2, timeout=400)
    print(f"[measure] step 1 failed and step 2 saved in {max(r['waited_s'] for r in results):.2f} s")
    assert results[1]["outcome1"].startswith("IoError: collecting the state: OSError") and "injected: no memory" in results[1]["outcome1"], results
    assert all(r["outcome2"] == "started" for r in results), results
    assert max(r["waited_s"] for r in results) < 30, results  # the commit timeout is 120 s
    failed = _events(tmp_path, "checkpoint_failed")
    assert sorted({e["rank"] for e in failed if e["step"] == 1}) == [0, 1, 2, 3], failed
    rank0 = [e for e in failed if e["rank"] == 0][0]
    assert "rank 1" in rank0["reason"] and "injected: no memory" in rank0["reason"], rank0
    assert sorted(p.name for p in (tmp_path / "ckpt").glob("step-*")) == ["step-00000000000000000002"]
    results = _run(4, "restore", tmp_path, "--tp", 2, "--seed", 1)
    assert all(r["step"] == 2 and r["next_step"] == 2 for r in results), results
    cmp = results[0]["compare"]
    assert cmp["tensors"] > 0 and cmp["differ"] == [] and cmp["missing"] == [], cmp
