"""Checkpoints from Python: state round trips, a DDP job on gloo interrupted and resumed ends
bitwise equal to an uninterrupted one, and checkpoints of the C++ example are readable."""
import os
import random
import subprocess
import sys

import numpy
import pytest
import torch

import trainsup
from ranks import Ranks

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TRAIN_DDP = os.path.join(REPO, "examples", "python", "train_ddp.py")


def _net():
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.BatchNorm1d(16), torch.nn.Linear(16, 2))


def _train(model, opt, sched, steps):
    for _ in range(steps):
        opt.zero_grad()
        model(torch.randn(4, 8)).pow(2).mean().backward()
        opt.step()
        sched.step()


def test_state_round_trip_including_rng(tmp_path):
    torch.manual_seed(0)
    model = _net()
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5)
    _train(model, opt, sched, 5)
    state = {"model": model, "optimizer": opt, "scheduler": sched, "epoch": 3, "notes": {"a": [1, 2]}}
    with trainsup.Supervisor(log_dir=str(tmp_path), checkpoint_dir=str(tmp_path / "ckpt"),
                             handle_signals=False) as sup:
        assert sup.checkpoint(5, state) == "started"
    saved = {k: v.clone() for k, v in model.state_dict().items()}
    next_values = (torch.randn(3), random.random(), numpy.random.rand())

    # A new process image, in effect: other objects, other RNG states.
    torch.manual_seed(123)
    random.seed(5)
    numpy.random.seed(5)
    model2 = _net()
    opt2 = torch.optim.Adam(model2.parameters(), lr=1e-2)
    sched2 = torch.optim.lr_scheduler.StepLR(opt2, step_size=2, gamma=0.5)
    state2 = {"model": model2, "optimizer": opt2, "scheduler": sched2, "epoch": 0, "notes": None}
    with trainsup.Supervisor(log_dir=str(tmp_path), checkpoint_dir=str(tmp_path / "ckpt"),
                             handle_signals=False) as sup:
        assert sup.restore(state2) == 5
    for k, v in model2.state_dict().items():
        assert torch.equal(v, saved[k]), k
    assert state2["epoch"] == 3 and state2["notes"] == {"a": [1, 2]}
    assert sched2.last_epoch == sched.last_epoch
    assert torch.equal(torch.randn(3), next_values[0])
    assert random.random() == next_values[1] and numpy.random.rand() == next_values[2]
    # Optimizer moments restored: training on gives identical parameters.
    torch.manual_seed(9)
    _train(model, opt, sched, 2)
    torch.manual_seed(9)
    _train(model2, opt2, sched2, 2)
    for a, b in zip(model.parameters(), model2.parameters()):
        assert torch.equal(a, b)


def test_no_checkpoint_restores_step_zero_and_mismatch_raises(tmp_path):
    model = _net()
    with trainsup.Supervisor(log_dir=str(tmp_path), checkpoint_dir=str(tmp_path / "ckpt"),
                             handle_signals=False) as sup:
        assert sup.restore({"model": model}) == 0
        sup.checkpoint(1, {"model": model})
    with trainsup.Supervisor(log_dir=str(tmp_path), checkpoint_dir=str(tmp_path / "ckpt"),
                             handle_signals=False) as sup:
        with pytest.raises(ValueError):
            sup.restore({"model": torch.nn.Linear(3, 3)})


def _run_ddp(tmp_path, tag, world, extra, expect_kill=False, snapshot="blocking"):
    env = dict(TRAINSUP_LOG_DIR=str(tmp_path / tag / "logs"), TRAINSUP_CHECKPOINT_DIR=str(tmp_path / tag / "ckpt"),
               TRAINSUP_JOB_ID=tag, TRAINSUP_LOG_STDERR="0", TRAINSUP_CHECKPOINT_SNAPSHOT=snapshot)
    with Ranks(world, [sys.executable, TRAIN_DDP] + extra, env=env,
               rank_env=lambda r: {"TRAINSUP_NODE_NAME": f"host{r}"}) as job:
        outs = job.communicate(timeout=300)
    if expect_kill:
        # The crashing rank dies by SIGKILL; its peer then fails in a collective or is left alone.
        assert any(rc == -9 for rc, _ in outs), outs
    else:
        for rc, out in outs:
            assert rc == 0, out
    return outs


@pytest.mark.parametrize("snapshot", ["blocking", "overlapped"])
def test_ddp_interrupted_and_resumed_equals_uninterrupted(tmp_path, snapshot):
    world = 2
    _run_ddp(tmp_path, "clean", world, ["--steps", "30", "--checkpoint-every", "10", "--out", str(tmp_path / "clean.pt")])
    # Kill both ranks after step 24 (rank 0 by its own SIGKILL; the job then dies), then rerun.
    # Overlapped: the copy runs beside the next step and the guarded optimizer step waits for it.
    port_run = ["--steps", "30", "--checkpoint-every", "10"]
    _run_ddp(tmp_path, "crashed", world, port_run + ["--crash-at-step", "24"], expect_kill=True, snapshot=snapshot)
    _run_ddp(tmp_path, "crashed", world, port_run + ["--out", str(tmp_path / "resumed.pt")], snapshot=snapshot)
    logs = tmp_path / "crashed" / "logs"
    if snapshot == "overlapped":
        events = (logs / "crashed-host0-r0.events.jsonl").read_text()
        assert '"mode":"overlapped"' in events, events[-2000:]
    log0 = (logs / "crashed-host0-r0.log").read_text()
    assert "resumed at step 21" in log0 or "resumed at step 11" in log0, log0
    clean = torch.load(tmp_path / "clean.pt")
    resumed = torch.load(tmp_path / "resumed.pt")
    for k in clean["model"]:
        assert torch.equal(clean["model"][k], resumed["model"][k]), k
    # Optimizer state too: every momentum buffer, bit for bit; and the scheduler.
    a, b = clean["optimizer"]["state"], resumed["optimizer"]["state"]
    assert a.keys() == b.keys() and len(a) > 0
    for i in a:
        assert torch.equal(a[i]["momentum_buffer"], b[i]["momentum_buffer"]), i
    assert clean["scheduler"] == resumed["scheduler"]
    ck = trainsup.load_checkpoint(str(tmp_path / "crashed" / "ckpt"))
    assert ck.world_size == world and len(ck.shards) == world


def test_cpp_example_checkpoint_is_readable(tmp_path):
    trainer = os.environ.get("TRAINSUP_EXAMPLE_TRAIN")
    if not trainer or not os.path.exists(trainer):
        pytest.skip("the C++ example trainer was not built (TRAINSUP_WITH_TORCH=OFF)")
    # busy policy "wait": steps take microseconds, so with "skip" the step-20 checkpoint is skipped
    # whenever step 10's persist is still running (seen on CI); the saved steps must not depend on timing.
    env = dict(os.environ, TRAINSUP_LOG_DIR=str(tmp_path), TRAINSUP_CHECKPOINT_DIR=str(tmp_path / "ckpt"),
               TRAINSUP_LOG_STDERR="0", TRAINSUP_CHECKPOINT_BUSY_POLICY="wait")
    subprocess.run([trainer, "--steps", "21", "--checkpoint-every", "10", "--hidden", "32"], env=env, check=True,
                   capture_output=True, timeout=120)
    ck = trainsup.load_checkpoint(str(tmp_path / "ckpt"))
    assert ck.step == 20 and ck.world_size == 1
    assert ck.metadata["data.next_step"] == "21"
    tensors = ck.tensors()
    assert tensors["model.fc1.weight"].shape == (32, 64)
    assert tensors["model.fc1.weight"].dtype == torch.float32
    assert tensors["optim"].dtype == torch.uint8 and tensors["optim"].numel() > 0  # torch-archived optimizer
    assert ck.state() is None  # not a Python state


def test_train_ddp_under_torchrun_with_four_ranks(tmp_path):
    """The example as users launch it: torchrun, 4 local ranks, checkpoints, then a resume."""
    env = dict(os.environ, TRAINSUP_LOG_DIR=str(tmp_path / "logs"), TRAINSUP_CHECKPOINT_DIR=str(tmp_path / "ckpt"),
               TRAINSUP_LOG_STDERR="0", OMP_NUM_THREADS="1", PYTHONPATH=os.pathsep.join(p for p in sys.path if p),
               TRAINSUP_CHECKPOINT_BUSY_POLICY="wait")  # steps take ms: the saved steps must not depend on timing
    # -r 1 -t 1: torchrun 1.13 on Python 3.11 crashes at start without them (issue 6 removes the need).
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=4", "-r", "1", "-t", "1",
           TRAIN_DDP, "--checkpoint-every", "10"]
    first = subprocess.run(cmd + ["--steps", "25"], env=env, capture_output=True, text=True, timeout=300)
    assert first.returncode == 0, first.stdout + first.stderr
    ck = trainsup.load_checkpoint(str(tmp_path / "ckpt"))
    assert ck.step == 20 and ck.world_size == 4
    second = subprocess.run(cmd + ["--steps", "30"], env=env, capture_output=True, text=True, timeout=300)
    assert second.returncode == 0, second.stdout + second.stderr
    # --standalone picks a new run id (the job id in file names) for each launch.
    logs = list((tmp_path / "logs").glob("*-r3.log"))
    assert len(logs) == 2 and any("resumed at step 21" in p.read_text() for p in logs), logs


def test_a_broken_newest_checkpoint_is_no_checkpoint_anywhere(tmp_path):
    """One definition of valid: load_checkpoint and the launcher's restart guard skip a newest
    checkpoint whose shard was truncated, as restore does, and say why."""
    from trainsup.launch.restarts import newest_valid_step
    root = tmp_path / "ckpt"
    with trainsup.Supervisor(log_dir=str(tmp_path), checkpoint_dir=str(root), handle_signals=False,
                             checkpoint_keep=3, checkpoint_busy_policy="wait") as sup:
        for step in (10, 20):
            assert sup.checkpoint(step, {"w": torch.full((1000,), float(step))}) == "started"
    assert newest_valid_step(str(root)) == 20 and trainsup.load_checkpoint(str(root)).step == 20
    newest = root / trainsup._trainsup.checkpoint_dir_name(20)
    shard = next(newest.glob("shard-*.tsc"))
    shard.write_bytes(shard.read_bytes()[:-100])  # the manifest and the file are still there
    assert newest_valid_step(str(root)) == 10
    assert trainsup.load_checkpoint(str(root)).step == 10
    with pytest.raises(trainsup.CorruptionError, match="size mismatch"):
        trainsup.load_checkpoint(str(newest))
    shard.unlink()
    with pytest.raises(trainsup.NotFoundError, match="missing shard"):
        trainsup.load_checkpoint(str(newest))
    for d in root.iterdir():
        (d / "MANIFEST.json").unlink()
    with pytest.raises(trainsup.NotFoundError, match="step-00000000000000000010: missing manifest"):
        trainsup.load_checkpoint(str(root))
    assert newest_valid_step(str(root)) == -1
