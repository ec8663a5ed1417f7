"""Worker for test_dcp_checkpoints.py: an FSDP2 x TP model (examples/python/train_mesh.py's MLP on
a dp x tp mesh) with AdamW, checkpointed through trainsup's DCP path, restored on another world
size or mesh shape, and compared bitwise with the full tensors saved. Prints one JSON line.

  reshard_worker.py save    DIR --tp T --steps N   train N steps, checkpoint, write DIR/ref.pt
  reshard_worker.py restore DIR --tp T             restore; compare with DIR/ref.pt
  reshard_worker.py plain   DIR --tp T             plain dcp.load of the newest step directory
  reshard_worker.py adopt   DIR --tp T             restore(adopt_dcp=DIR/plain-dcp) (see 'dcpsave')
  reshard_worker.py dcpsave DIR --tp T --steps N   plain dcp.save (no trainsup) + DIR/ref.pt
  reshard_worker.py stagefail DIR --tp T           rank 1 cannot stage step 1's save; then step 2
"""
import argparse
import errno
import json
import os
import sys
import time
import warnings

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict, get_optimizer_state_dict

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "examples", "python"))
import train_mesh  # noqa: E402

import trainsup  # noqa: E402

warnings.filterwarnings("ignore")
p = argparse.ArgumentParser()
p.add_argument("mode", choices=["save", "restore", "plain", "adopt", "dcpsave", "stagefail"])
p.add_argument("dir")
p.add_argument("--tp", type=int, default=2)
p.add_argument("--steps", type=int, default=3)
p.add_argument("--seed", type=int, default=0)
p.add_argument("--hidden", type=int, default=64)
a = p.parse_args()

trainsup.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
mesh_args = argparse.Namespace(tp=a.tp)
try:
    mesh, model = train_mesh.build_fsdp_tp(mesh_args, "cpu", seed=a.seed, hidden=a.hidden)
except train_mesh.LayoutError as e:
    print(json.dumps({"layout_error": str(e)}), flush=True)
    sys.exit(3)
opt = torch.optim.AdamW(model.parameters(), lr=0.01)
state = {"model": model, "optimizer": opt, "next_step": 0}


def train(n):
    dp_rank = mesh.get_local_rank("dp")
    for step in range(n):
        x, y = train_mesh.batch(dp_rank, step)
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
        opt.zero_grad()


def full():
    """Every tensor of the model and optimizer, whole (gathered), on CPU."""
    o = StateDictOptions(full_state_dict=True, cpu_offload=True)
    out = {f"model.{k}": v for k, v in get_model_state_dict(model, options=o).items()}
    for fqn, s in get_optimizer_state_dict(model, opt, options=o).get("state", {}).items():  # rank 0 only
        for k, v in s.items():
            if isinstance(v, torch.Tensor):
                out[f"optimizer.{fqn}.{k}"] = v
    return out


def compare(ref_path):
    now = full()  # collective: every rank
    if rank != 0:
        return None
    ref = torch.load(ref_path)
    diff = sorted(k for k in ref if k not in now or ref[k].shape != now[k].shape or not torch.equal(ref[k], now[k]))
    return {"tensors": len(ref), "differ": diff, "missing": sorted(set(ref) - set(now))}


result = {"rank": rank, "world": world, "mesh": list(mesh.shape)}
ckpt = os.path.join(a.dir, "ckpt")
# stagefail: a save waits for the previous one's end (busy policy wait), which must come long
# before the commit timeout.
extra = {"checkpoint_busy_policy": "wait", "checkpoint_commit_timeout_s": 120} if a.mode == "stagefail" else {}
with trainsup.Supervisor(checkpoint_dir=ckpt, checkpoint_interval_s=0, log_dir=os.path.join(a.dir, "logs"),
                         job_id=f"reshard-{a.mode}-{world}", **extra) as sup:
    if a.mode == "stagefail":
        import trainsup.dcp
        real_stage = trainsup.dcp.DcpCheckpoints.stage

        def stage(self, step, state_dict):
            if rank == 1 and step == 1:
                raise OSError(errno.ENOMEM, "injected: no memory for the staging copy")
            return real_stage(self, step, state_dict)

        trainsup.dcp.DcpCheckpoints.stage = stage
        train(1)
        state["next_step"] = 1
        t0 = time.monotonic()
        try:
            result["outcome1"] = sup.checkpoint(1, state)
        except Exception as e:  # this rank's own save failed: training goes on
            result["outcome1"] = f"{type(e).__name__}: {e}"
        train(1)
        state["next_step"] = 2
        result["outcome2"] = sup.checkpoint(2, state)  # after step 1's save has ended on this rank
        result["waited_s"] = round(time.monotonic() - t0, 3)
        ref = full()
        if rank == 0:
            torch.save(ref, os.path.join(a.dir, "ref.pt"))
    elif a.mode == "save":
        train(a.steps)
        state["next_step"] = a.steps
        result["outcome"] = sup.checkpoint(a.steps, state)
        ref = full()
        if rank == 0:
            torch.save(ref, os.path.join(a.dir, "ref.pt"))
    elif a.mode == "dcpsave":
        train(a.steps)
        sd = {"model": get_model_state_dict(model), "optimizer": get_optimizer_state_dict(model, opt),
              "next_step": a.steps}
        dcp.save(sd, checkpoint_id=os.path.join(a.dir, "plain-dcp"))
        ref = full()
        if rank == 0:
            torch.save(ref, os.path.join(a.dir, "ref.pt"))
    elif a.mode == "restore":
        try:
            result["step"] = sup.restore(state)
        except ValueError as e:
            result["error"] = str(e)
        else:
            result["next_step"] = state["next_step"]
            result["compare"] = compare(os.path.join(a.dir, "ref.pt"))
    elif a.mode == "adopt":
        result["step"] = sup.restore(state, adopt_dcp=os.path.join(a.dir, "plain-dcp"))
        result["next_step"] = state["next_step"]
        result["compare"] = compare(os.path.join(a.dir, "ref.pt"))
    elif a.mode == "plain":
        newest = trainsup.load_checkpoint(ckpt).path
        sd = {"model": get_model_state_dict(model), "optimizer": get_optimizer_state_dict(model, opt),
              "next_step": -1}
        dcp.load(sd, checkpoint_id=newest)  # torch's own reader: no trainsup involved
        from torch.distributed.checkpoint.state_dict import set_model_state_dict, set_optimizer_state_dict
        set_model_state_dict(model, sd["model"])
        set_optimizer_state_dict(model, opt, sd["optimizer"])
        result["next_step"] = sd["next_step"]
        result["compare"] = compare(os.path.join(a.dir, "ref.pt"))
print(json.dumps(result), flush=True)
dist.destroy_process_group()
