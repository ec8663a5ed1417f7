"""An LLM-style job on a DeviceMesh, supervised by trainsup: FSDP2 x tensor parallelism on a 2-D
mesh (dp x tp), or a 2-stage pipeline (plain point-to-point, as pipeline schedules issue it), on
gloo (CPU) or NCCL.

Launch with torchrun (4 local ranks, mesh 2 x 2):
    torchrun --nproc_per_node=4 examples/python/train_mesh.py --steps 100 --tp 2
or with RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT set by any launcher (the tests do that).

Nothing in the model code knows about trainsup: ``trainsup.init_process_group`` tracks every
group the job creates, so ``init_device_mesh``'s dp and tp groups (and the pipeline's sends and
receives) are tracked and judged per group by the job coordinator.

Fault injection (on --fault-rank only, at --fault-step):
  --fault tp_never_enters   the rank stays alive and heart-beating but never enters the tp
                            all-reduce of that step: it has all-gathered its FSDP shards and
                            sleeps in the forward of the row-parallel layer
  --fault wrong_order       the rank issues the step's two collectives of the whole job in the
                            other order
  --fault stall_before_send (pipeline) stage 0 sleeps before its send: stage 1 waits in recv
"""
import argparse
import contextlib
import os
import random
import sys
import time
import warnings

import torch
import torch.distributed as dist

import trainsup


class MLP(torch.nn.Module):
    def __init__(self, dim=32, hidden=64):
        super().__init__()
        self.up = torch.nn.Linear(dim, hidden)
        self.down = torch.nn.Linear(hidden, dim)

    def forward(self, x):
        return self.down(torch.relu(self.up(x)))


def batch(rank_in_dp, step, dim=32):
    g = torch.Generator().manual_seed(1_000_003 * rank_in_dp + step)
    x = torch.randn(16, dim, generator=g)
    return x, x.roll(1, dims=1) * 0.5


class LayoutError(ValueError):
    """The world cannot hold the requested mesh."""


def mesh_shape(world, tp):
    """(dp, tp) for `world` ranks with tensor-parallel degree `tp`, or LayoutError saying why
    not: checked before any model or state exists, so a restore onto a world too small for the
    layout fails before it touches anything."""
    if tp < 1 or tp > world:
        raise LayoutError(f"train_mesh: tensor-parallel degree {tp} does not fit a world of {world} rank(s) "
                          f"(it needs 1 <= tp <= world; run with --tp {min(max(tp, 1), world)} or more ranks)")
    if world % tp:
        raise LayoutError(f"train_mesh: world size {world} is not a multiple of the tensor-parallel degree {tp}")
    return world // tp, tp


def build_fsdp_tp(args, device, seed=0, hidden=64, dim=32):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module
    shape = mesh_shape(dist.get_world_size(), args.tp)
    mesh = init_device_mesh(device, shape, mesh_dim_names=("dp", "tp"))
    torch.manual_seed(seed)  # same initial parameters on every rank
    model = MLP(dim=dim, hidden=hidden)
    parallelize_module(model, mesh["tp"], {"up": ColwiseParallel(), "down": RowwiseParallel()})
    fully_shard(model, mesh=mesh["dp"])
    return mesh, model


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--tp", type=int, default=2, help="tensor-parallel degree (the mesh's inner dimension)")
    p.add_argument("--pipeline", action="store_true", help="a 2-stage pipeline instead of FSDP x TP")
    p.add_argument("--microbatches", type=int, default=2)
    p.add_argument("--step-sleep-ms", type=float, default=0.0, help="compute time per step")
    p.add_argument("--jitter", type=float, default=0.0, help="e.g. 0.3: each step's compute x U(0.7, 1.3)")
    p.add_argument("--fault", choices=["", "tp_never_enters", "wrong_order", "stall_before_send"], default="")
    p.add_argument("--fault-rank", type=int, default=-1)
    p.add_argument("--fault-step", type=int, default=-1)
    p.add_argument("--plain", action="store_true", help="no trainsup at all (the benchmark's baseline)")
    p.add_argument("--checkpoint-every", type=int, default=None,
                   help="checkpoint every N steps (default: TRAINSUP_CHECKPOINT_* settings; FSDP2 x TP only). "
                        "The checkpoints are torch.distributed.checkpoint ones: a job that lost a host resumes "
                        "from them on a smaller mesh, one that gained a host on a larger one")
    p.add_argument("--out", default=None, help="FSDP2 x TP: rank 0 writes the final full state here (torch.save)")
    args = p.parse_args()
    # FSDP2 warns that the TP output is a view (in-place ops on it would skip a hook); none here.
    warnings.filterwarnings("ignore", message="FSDP2-wrapped module")

    backend = "nccl" if torch.cuda.is_available() else "gloo"
    device = "cuda" if backend == "nccl" else "cpu"
    if device == "cuda":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    if args.plain:
        dist.init_process_group(backend)
    else:
        trainsup.init_process_group(backend)  # every group the job creates is tracked
    rank, world = dist.get_rank(), dist.get_world_size()
    faulty = rank == args.fault_rank
    jitter_rng = random.Random(7919 * rank + 1)

    def compute(sup, step):
        ms = args.step_sleep_ms * (jitter_rng.uniform(1 - args.jitter, 1 + args.jitter) if args.jitter else 1.0)
        with sup.section("forward"):
            if faulty and step == args.fault_step and args.fault == "stall_before_send":
                sup.event("fault_injected", kind=args.fault, step=step)
                time.sleep(3600)  # alive, heart-beating, never reaching the next collective
            if ms > 0:
                time.sleep(ms / 1000)

    settings = {} if args.checkpoint_every is None else {"checkpoint_every_steps": args.checkpoint_every}
    with (NoSupervisor() if args.plain else trainsup.Supervisor(**settings)) as sup:
        t0 = time.perf_counter()
        if args.pipeline:
            run_pipeline(args, sup, compute, rank, world, device)
        else:
            t0 = run_fsdp_tp(args, sup, compute, rank, device, faulty)
        if rank == 0 and t0 is not None and args.steps > WARMUP_STEPS:
            print(f"step_time_s={(time.perf_counter() - t0) / (args.steps - WARMUP_STEPS):.6f}", flush=True)
        sup.log("finished")
    dist.destroy_process_group()


WARMUP_STEPS = 20  # not timed: FSDP's and DTensor's first-step set-up, start-up skew


class NoSupervisor:
    """The Supervisor's calls as no-ops, for the benchmark's baseline without trainsup."""

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def step(self, n):
        return contextlib.nullcontext()

    def section(self, name):
        return contextlib.nullcontext()

    def log(self, msg):
        print(msg, flush=True)

    def event(self, name, **fields):
        pass


def run_fsdp_tp(args, sup, compute, rank, device, faulty):
    mesh, model = build_fsdp_tp(args, device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    dp_rank = mesh.get_local_rank("dp")
    state = {"model": model, "optimizer": optimizer, "next_step": 0}
    if not args.plain:
        # The newest checkpoint that verifies, whatever mesh wrote it (DCP reshards it).
        if sup.restore(state):
            sup.log(f"resumed at step {state['next_step']} on mesh {tuple(mesh.shape)}")
    current = {"step": -1}
    if faulty and args.fault == "tp_never_enters":
        def hang_before_tp_allreduce(module, inputs):
            if current["step"] == args.fault_step:
                sup.event("fault_injected", kind="tp_never_enters", step=current["step"])
                time.sleep(3600)
        model.down.register_forward_pre_hook(hang_before_tp_allreduce)
    t0 = None
    for step in range(state["next_step"], args.steps):
        if step == WARMUP_STEPS:
            t0 = time.perf_counter()
        current["step"] = step
        with sup.step(step):
            compute(sup, step)
            x, y = batch(dp_rank, step)
            with sup.section("forward"):
                out = model(x.to(device))
            loss = torch.nn.functional.mse_loss(out, y.to(device))
            with sup.section("backward"):
                loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            # Two small collectives of the whole job per step (a loss average and a broadcast
            # of a flag): the wrong-order fault swaps them on one rank.
            a, b = torch.ones(1024, device=device), torch.ones(1024, device=device)
            if faulty and step == args.fault_step and args.fault == "wrong_order":
                sup.event("fault_injected", kind="wrong_order", step=step)
                dist.broadcast(b, src=0)
                dist.all_reduce(a)
            else:
                dist.all_reduce(a)
                dist.broadcast(b, src=0)
        state["next_step"] = step + 1
        if not args.plain:
            sup.maybe_checkpoint(step, state)
            if sup.stop_requested:  # preemption (SIGTERM): every rank saves this step, then stops
                sup.checkpoint(step, state)
                sup.log(f"stop requested: checkpointed step {step}")
                sup.close()
                sys.exit(trainsup.EXIT_STOP_REQUESTED)
        if step % 20 == 0:
            sup.log(f"step {step} loss {loss.item():.5f}")
    if args.out:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
        full = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        if rank == 0:
            torch.save(full, args.out)
    return t0


def run_pipeline(args, sup, compute, rank, world, device):
    """Stage s = rank % 2 of a 2-stage pipeline; pairs (0,1), (2,3), ... are the pipelines,
    their stage-0 and stage-1 ranks form dp groups that all-reduce gradients."""
    if world % 2:
        raise SystemExit("train_mesh --pipeline: needs an even world size")
    stage = rank % 2
    peer = rank + 1 if stage == 0 else rank - 1
    dp_groups = [dist.new_group(list(range(s, world, 2)), group_desc=f"pp_stage{s}_dp") for s in (0, 1)]
    dp = dp_groups[stage]
    torch.manual_seed(stage)
    layer = torch.nn.Linear(32, 32).to(device)
    optimizer = torch.optim.SGD(layer.parameters(), lr=0.01)
    for step in range(args.steps):
        with sup.step(step):
            compute(sup, step)
            acts = []
            for mb in range(args.microbatches):
                x, y = batch(rank // 2, step * args.microbatches + mb)
                if stage == 0:
                    out = layer(x.to(device))
                    dist.batch_isend_irecv([dist.P2POp(dist.isend, out.detach().contiguous(), peer)])[0].wait()
                    acts.append(out)
                else:
                    buf = torch.empty(16, 32, device=device)
                    dist.batch_isend_irecv([dist.P2POp(dist.irecv, buf, peer)])[0].wait()
                    loss = torch.nn.functional.mse_loss(layer(buf), y.to(device))
                    loss.backward()
                    acts.append(torch.ones(16, 32, device=device) * loss.detach())
            # All forwards, then all backwards (GPipe): the gradients go back in order.
            for held in acts:
                if stage == 0:
                    grad = torch.empty(16, 32, device=device)
                    dist.recv(grad, peer)
                    held.backward(grad)
                else:
                    dist.send(held, peer)
            for param in layer.parameters():
                if param.grad is not None:
                    dist.all_reduce(param.grad, group=dp)
            optimizer.step()
            optimizer.zero_grad()
        if step % 20 == 0:
            sup.log(f"step {step} stage {stage}")


if __name__ == "__main__":
    sys.exit(main())
