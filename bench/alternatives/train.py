#!/usr/bin/env python3
"""The one training job of bench/vs_alternatives.py, written once for every system compared:
DDP on gloo, a small MLP on synthetic batches that are a function of (rank, step), --step-ms of
simulated compute per step, a checkpoint every --checkpoint-every steps, resumed on restart.

  --system plain     torch.distributed as a user writes it: init_process_group(timeout=...),
                     rank 0 torch.saves {model, optimizer, step} and renames it into place;
                     with --file-timer-s, torchelastic's expiration timer around each step
  --system nvrx      the same, plus NVIDIA Resiliency Extension's rank monitor client (one
                     heartbeat per step), under ft_launcher
  --system trainsup  trainsup.init_process_group + Supervisor (step sections, checkpoint and
                     restore), under trainsup-run
  --system nvrx-inprocess  the plain job inside NVRx's in-process restart Wrapper
                     (nvrx_inprocess_job.py), started by the harness without a launcher
  --system torchft   torchft's Manager, DDP and optimizer wrapper (one replica group per host;
                     a replica that comes back heals from a peer instead of a checkpoint)

Each rank appends JSON lines to $BENCH_STEPS_DIR/<host>.jsonl (BENCH_HOST names the simulated
host): {"event": "start", pid, rank, world, attempt, resumed_from} when it starts, and
{"event": "step", step, t (wall s), world} after each completed step. That file is all the
harness reads of the job itself; the systems' own verdicts come from their own logs.
"""
import argparse
import contextlib
import datetime
import json
import os
import time

import torch
import torch.nn as nn

HOST = os.environ.get("BENCH_HOST", "host")


class StepLog:
    def __init__(self):
        folder = os.environ.get("BENCH_STEPS_DIR", ".")
        os.makedirs(folder, exist_ok=True)
        self.f = open(os.path.join(folder, f"{HOST}.jsonl"), "a", buffering=1)

    def write(self, **fields):
        self.f.write(json.dumps(fields) + "\n")


def make_model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 1))


def batch(rank, step):
    g = torch.Generator().manual_seed(1_000_003 * rank + step)
    x = torch.randn(64, 64, generator=g)
    return x, x.sum(dim=1, keepdim=True) * 0.1


def compute(ms):
    time.sleep(ms / 1000)  # the simulated forward/backward of a real model


def train_step(ddp, opt, rank, step, step_ms):
    """One step of the job: the simulated compute, then a real forward/backward and update."""
    compute(step_ms)
    x, y = batch(rank, step)
    opt.zero_grad()
    nn.functional.mse_loss(ddp(x), y).backward()
    opt.step()


def plain_checkpoint(path, model, opt, step):
    tmp = path + ".tmp"
    torch.save({"model": model.state_dict(), "optimizer": opt.state_dict(), "next_step": step + 1}, tmp)
    os.replace(tmp, path)


def plain_restore(path, model, opt):
    if not os.path.exists(path):
        return 0
    sd = torch.load(path, weights_only=True)
    model.load_state_dict(sd["model"])
    opt.load_state_dict(sd["optimizer"])
    return sd["next_step"]


def run_plain(a, log, nvrx=False):
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP
    kwargs = {"timeout": datetime.timedelta(seconds=a.timeout_s)} if a.timeout_s else {}
    dist.init_process_group("gloo", **kwargs)
    rank, world = dist.get_rank(), dist.get_world_size()
    monitor = None
    if nvrx:
        from nvidia_resiliency_ext.fault_tolerance import RankMonitorClient
        monitor = RankMonitorClient()
        monitor.init_workload_monitoring()
    model = make_model()
    ddp = DDP(model)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.01, momentum=0.9)
    path = os.path.join(a.checkpoint_dir, "plain.pt")
    start = plain_restore(path, model, opt)
    log.write(event="start", pid=os.getpid(), rank=rank, world=world, attempt=int(os.environ.get("TORCHELASTIC_RESTART_COUNT", 0)),
              resumed_from=start, t=time.time())
    watchdog = contextlib.nullcontext
    if a.file_timer_s:
        # torch.distributed.elastic.timer's docs: the agent (TORCHELASTIC_ENABLE_FILE_TIMER=1)
        # serves TORCHELASTIC_TIMER_FILE; a worker configures a FileTimerClient on it and holds
        # expires(after=...) around what must not hang. An expired timer gets the worker killed.
        from torch.distributed.elastic import timer
        timer.configure(timer.FileTimerClient(file_path=os.environ["TORCHELASTIC_TIMER_FILE"]))
        watchdog = lambda: timer.expires(after=a.file_timer_s)  # noqa: E731
    for step in range(start, a.steps):
        with watchdog():
            train_step(ddp, opt, rank, step, a.step_ms)
        if monitor is not None:
            monitor.send_heartbeat()
        log.write(event="step", step=step, t=time.time(), world=world)
        if (step + 1) % a.checkpoint_every == 0:
            if rank == 0:
                plain_checkpoint(path, model, opt, step)
            dist.barrier()  # the checkpoint is complete before anyone moves on
    if monitor is not None:
        monitor.shutdown_workload_monitoring()
    dist.destroy_process_group()


def run_trainsup(a, log):
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP
    import trainsup
    trainsup.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    model = make_model()
    ddp = DDP(model)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.01, momentum=0.9)
    state = {"model": model, "optimizer": opt, "next_step": 0}
    with trainsup.Supervisor(checkpoint_replicated=True, checkpoint_every_steps=a.checkpoint_every) as sup:
        sup.guard_optimizer(opt)
        sup.restore(state)
        start = state["next_step"]
        log.write(event="start", pid=os.getpid(), rank=rank, world=world,
                  attempt=int(os.environ.get("TORCHELASTIC_RESTART_COUNT", 0)), resumed_from=start, t=time.time())
        for step in range(start, a.steps):
            with sup.step(step):
                with sup.section("forward"):
                    compute(a.step_ms)
                x, y = batch(rank, step)
                opt.zero_grad()
                nn.functional.mse_loss(ddp(x), y).backward()
                opt.step()
            log.write(event="step", step=step, t=time.time(), world=world)
            state["next_step"] = step + 1
            sup.maybe_checkpoint(step, state)  # due at every multiple of --checkpoint-every
    dist.destroy_process_group()


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--system", required=True, choices=["plain", "nvrx", "nvrx-inprocess", "trainsup", "torchft"])
    p.add_argument("--steps", type=int, default=600)
    p.add_argument("--step-ms", type=float, default=20)
    p.add_argument("--checkpoint-every", type=int, default=50)
    p.add_argument("--checkpoint-dir", default="checkpoints")
    p.add_argument("--timeout-s", type=float, default=0, help="init_process_group timeout (0: torch's default)")
    p.add_argument("--threshold-s", type=float, default=5, help="nvrx-inprocess: its soft and heartbeat timeouts")
    p.add_argument("--file-timer-s", type=float, default=0, help="torchelastic expiration timer per step (0: none)")
    a = p.parse_args()
    torch.set_num_threads(1)
    os.makedirs(a.checkpoint_dir, exist_ok=True)
    log = StepLog()
    if a.system in ("plain", "nvrx"):
        run_plain(a, log, nvrx=a.system == "nvrx")
    elif a.system == "trainsup":
        run_trainsup(a, log)
    elif a.system == "nvrx-inprocess":
        from nvrx_inprocess_job import run_inprocess
        run_inprocess(a, log)
    else:
        from torchft_job import run_torchft
        run_torchft(a, log)


if __name__ == "__main__":
    main()
