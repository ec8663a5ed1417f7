#!/usr/bin/env python3
"""DDP on a small model with synthetic data and gloo, supervised and checkpointed by trainsup.

Launch with torchrun (4 local ranks):
    torchrun --nproc_per_node=4 -r 1 -t 1 examples/python/train_ddp.py --steps 200
or with RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT set by any launcher (the tests do that).
The batch of each step is a function of (rank, step), so a run that is interrupted and resumed
from a checkpoint ends with parameters bitwise equal to an uninterrupted one.
(`-r 1 -t 1`: torchrun 1.13 on Python 3.11 crashes at start without them; trainsup's own
launcher, issue 6, will not need them.)
"""
import argparse
import os
import random
import signal
import socket
import sys
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

import trainsup


def train_step(ddp, optimizer, scheduler, rank, step):
    g = torch.Generator().manual_seed(1_000_003 * rank + step)
    x = torch.randn(64, 32, generator=g)
    y = x.sum(dim=1, keepdim=True) * 0.1
    optimizer.zero_grad()
    loss = torch.nn.functional.mse_loss(ddp(x), y)
    loss.backward()
    optimizer.step()
    scheduler.step()
    return loss


WARMUP_STEPS = 50  # excluded from step_time_s: DDP's bucket rebuild, start-up skew between ranks


def train_plain(args, ddp, optimizer, scheduler, rank):
    """The same loop without trainsup, for the overhead benchmark."""
    t0 = None
    for step in range(args.steps):
        if step == min(WARMUP_STEPS, args.steps - 1):
            t0 = time.perf_counter()
        train_step(ddp, optimizer, scheduler, rank, step)
    if rank == 0:
        print(f"step_time_s={(time.perf_counter() - t0) / max(1, args.steps - WARMUP_STEPS):.6f}", flush=True)
    dist.destroy_process_group()


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--checkpoint-every", type=int, default=None, help="checkpoint every N steps")
    p.add_argument("--crash-at-step", type=int, default=-1, help="fault injection: SIGKILL itself after step N")
    p.add_argument("--stall-at-step", type=int, default=-1, help="fault injection: sleep forever in step N")
    p.add_argument("--out", default=None, help="rank 0 writes the final parameters here (torch.save)")
    p.add_argument("--plain", action="store_true", help="no trainsup at all (the benchmark's baseline)")
    p.add_argument("--hidden", type=int, default=64)
    # Timing scenarios for the detection tests: a simulated compute phase (section "forward")
    # of --step-sleep-ms per step, slowed by --slow-factor on --slow-ranks ("all" or a list)
    # from --slow-from-step, with independent +-jitter on each rank.
    p.add_argument("--step-sleep-ms", type=float, default=0.0)
    p.add_argument("--progress-every", type=int, default=0,
                   help="write a progress event (step, wall time) to the rank's event log every N steps")
    p.add_argument("--slow-ranks", default="", help='"all" or comma-separated ranks')
    p.add_argument("--slow-factor", type=float, default=1.0)
    p.add_argument("--slow-from-step", type=int, default=0)
    p.add_argument("--jitter", type=float, default=0.0, help="e.g. 0.3: each step's compute x U(0.7, 1.3)")
    p.add_argument("--raise-at-step", type=int, default=-1,
                   help="fault injection: raise an exception (a user-code error) in step N of every attempt")
    p.add_argument("--fault-rank", type=int, default=-1, help="the rank that injects the faults above (-1: every rank)")
    p.add_argument("--fault-host", default="",
                   help="only this host injects faults (its TRAINSUP_NODE_NAME, else its host name): a rank's "
                        "number changes between attempts, a host does not")
    p.add_argument("--gpu-ecc-at-step", type=int, default=-1,
                   help="fault injection: after step N (and its checkpoint) this host's GPU goes bad as one hit by "
                        "an uncorrectable ECC error does: the stand-in NVML (FAKE_NVML_FILE, %%h = host) reports "
                        "the error from now on and the step fails with a CUDA error")
    p.add_argument("--sharded-checkpoints", action="store_true",
                   help="checkpoints as a sharded job (FSDP, TP) writes them: restored only by the same world size")
    p.add_argument("--stall-section", default=None,
                   help="with --stall-at-step: stall inside this section, before the step's collective")
    args = p.parse_args()
    if args.fault_rank >= 0 and int(os.environ.get("RANK", "0")) != args.fault_rank:
        args.stall_at_step = args.crash_at_step = args.gpu_ecc_at_step = -1
    host = os.environ.get("TRAINSUP_NODE_NAME") or socket.gethostname()
    if args.fault_host and host != args.fault_host:
        args.stall_at_step = args.crash_at_step = args.gpu_ecc_at_step = args.raise_at_step = -1

    if args.plain:
        dist.init_process_group("gloo")
    else:
        trainsup.init_process_group("gloo")  # gloo, with every collective tracked
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)  # same initial parameters on every rank
    model = torch.nn.Sequential(torch.nn.Linear(32, args.hidden), torch.nn.ReLU(), torch.nn.Linear(args.hidden, 1))
    ddp = DDP(model)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=0.01, momentum=0.9)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=50, gamma=0.5)
    state = {"model": model, "optimizer": optimizer, "scheduler": scheduler, "next_step": 0}

    if args.plain:
        return train_plain(args, ddp, optimizer, scheduler, rank)
    # DDP keeps the same model and optimizer state on every rank: a checkpoint then restores on
    # any number of ranks (the job may shrink when a host is lost and no spare is left).
    settings = {"checkpoint_replicated": not args.sharded_checkpoints}
    if args.checkpoint_every is not None:
        settings["checkpoint_every_steps"] = args.checkpoint_every
    slow = set(range(world)) if args.slow_ranks == "all" else \
        {int(r) for r in args.slow_ranks.split(",") if r.strip()}
    jitter_rng = random.Random(7919 * rank + 1)  # not the training's RNG: resumes stay bitwise equal

    def compute_phase(step):
        if args.stall_section and step == args.stall_at_step:
            with sup.section(args.stall_section):
                sup.event("fault_injected", kind="stall_in_section", section=args.stall_section, step=step)
                time.sleep(3600)
        if args.step_sleep_ms <= 0:
            return
        ms = args.step_sleep_ms
        if rank in slow and step >= args.slow_from_step:
            ms *= args.slow_factor
        if args.jitter:
            ms *= jitter_rng.uniform(1 - args.jitter, 1 + args.jitter)
        with sup.section("forward"):
            time.sleep(ms / 1000)

    with trainsup.Supervisor(**settings) as sup:
        # With TRAINSUP_CHECKPOINT_SNAPSHOT=overlapped the snapshot copy runs beside the next
        # forward/backward; the guarded optimizer step waits for it before changing parameters.
        sup.guard_optimizer(optimizer)
        sup.restore(state)
        start = state["next_step"]
        if start:
            sup.log(f"resumed at step {start}")
        t0 = time.perf_counter()
        timed_from = start
        for step in range(start, args.steps):
            if step == min(start + WARMUP_STEPS, args.steps - 1):
                t0, timed_from = time.perf_counter(), step
            if sup.stop_requested:
                sup.checkpoint(step - 1, state)  # preemption: save where we are
                sup.log(f"stop requested: checkpointed step {step - 1}")
                sup.close()
                sys.exit(trainsup.EXIT_STOP_REQUESTED)
            with sup.step(step):
                compute_phase(step)
                if step == args.raise_at_step:
                    raise RuntimeError(f"injected user-code error at step {step}")
                loss = train_step(ddp, optimizer, scheduler, rank, step)
                if step == args.stall_at_step and not args.stall_section:
                    sup.event("fault_injected", kind="stall_sleep", step=step)
                    time.sleep(3600)
            state["next_step"] = step + 1
            sup.maybe_checkpoint(step, state)
            if step == args.gpu_ecc_at_step:
                sup.event("fault_injected", kind="gpu_ecc", step=step, host=host)
                nvml = os.environ.get("FAKE_NVML_FILE", "")
                if nvml:
                    with open(nvml.replace("%h", host), "w") as f:
                        f.write("count=1 ecc0=1\n")
                raise RuntimeError("CUDA error: unspecified launch failure\n"
                                   "CUDA kernel errors might be asynchronously reported at some other API call")
            if step == args.crash_at_step:
                sup.event("fault_injected", kind="crash", step=step)
                os.kill(os.getpid(), signal.SIGKILL)
            if args.progress_every > 0 and step % args.progress_every == 0:
                sup.event("progress", step=step)
            if step % 50 == 0:
                sup.log(f"step {step} loss {loss.item():.5f}")
        if rank == 0:
            print(f"step_time_s={(time.perf_counter() - t0) / max(1, args.steps - timed_from):.6f}", flush=True)
        if rank == 0 and args.out:
            torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                        "scheduler": scheduler.state_dict()}, args.out)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
