"""Checkpoints of the state torch 2.x users hold restore bitwise: a torch.compile'd model (also
into the plain module), and an FSDP2 (fully_shard) model on gloo whose parameters and AdamW
state are DTensors, each rank saving and restoring its own shard; optimizers and LR schedulers
with them. Each case compares a run interrupted after its checkpoint and resumed in new
processes with a run that never stopped."""
import os
import subprocess
import sys

import torch
from ranks import Ranks

HERE = os.path.dirname(os.path.abspath(__file__))
WORKER = os.path.join(HERE, "torch2_state_worker.py")
STEPS, EVERY = 12, 8  # one checkpoint, at step 8; the resumed run does steps 9..11


def _run(tmp_path, tag, model, world, ckpt_dir, extra=(), steps=STEPS):
    env = dict(TRAINSUP_CHECKPOINT_DIR=str(ckpt_dir), TRAINSUP_LOG_DIR=str(tmp_path / "logs"), TRAINSUP_LOG_STDERR="0",
               TRAINSUP_CHECKPOINT_BUSY_POLICY="wait",  # which steps are saved must not depend on timing
               TORCHINDUCTOR_CACHE_DIR=str(tmp_path / "inductor"))
    cmd = [sys.executable, WORKER, "--model", model, "--steps", str(steps), "--checkpoint-every", str(EVERY),
           "--out", str(tmp_path / tag)] + list(extra)
    with Ranks(world, cmd, env=env) as job:
        for rc, out in job.communicate(timeout=600):
            assert rc == 0, out[-4000:]
    return [torch.load(tmp_path / f"{tag}.{r}") for r in range(world)]


def _assert_bitwise(a, b):
    assert a["params"].keys() == b["params"].keys()
    for k in a["params"]:
        if k.endswith(".placements"):
            assert a["params"][k] == b["params"][k], k
        else:
            assert torch.equal(a["params"][k], b["params"][k]), k
    assert a["lr"] == b["lr"]
    assert a["optim_steps"] == b["optim_steps"]


def _resume_case(tmp_path, model, world):
    full = _run(tmp_path, "full", model, world, tmp_path / "ckpt-full")
    # The interrupted run: stops after the checkpoint of step 8 (its last step), then resumes.
    first = _run(tmp_path, "first", model, world, tmp_path / "ckpt", steps=EVERY + 1)
    assert all(r["restored"] == 0 for r in first)
    resumed = _run(tmp_path, "resumed", model, world, tmp_path / "ckpt")
    assert all(r["restored"] == EVERY for r in resumed), [r["restored"] for r in resumed]
    for a, b in zip(full, resumed):
        _assert_bitwise(a, b)
    return full, first


def test_compiled_model_optimizer_and_scheduler_resume_bitwise_and_load_into_the_plain_module(tmp_path):
    _, first = _resume_case(tmp_path, "compile", 1)
    # The same checkpoint restored into the module the compiled one wraps: exactly the state of
    # step 8 (eager and compiled kernels round differently, so no training is compared here).
    plain = _run(tmp_path, "plain", "compile", 1, tmp_path / "ckpt", extra=["--load-plain"], steps=EVERY + 1)
    assert plain[0]["restored"] == EVERY
    _assert_bitwise(first[0], plain[0])


def test_fsdp2_sharded_state_resumes_bitwise_on_every_rank(tmp_path):
    full, _ = _resume_case(tmp_path, "fsdp", 2)
    # Sharded: each rank holds (and saved) half of every parameter, not the whole.
    w0 = full[0]["params"]["0.weight"]
    assert w0.shape == (32, 16) and "Shard(dim=0)" in full[0]["params"]["0.weight.placements"]
    assert not torch.equal(full[0]["params"]["0.weight"], full[1]["params"]["0.weight"])
