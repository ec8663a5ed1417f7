"""Worker for test_checkpoint_torch2.py: trains the state torch 2.x users hold, checkpointed by
trainsup, and writes its final parameters (each rank its own shard) for a bitwise comparison.

  --model compile   a torch.compile'd MLP (one rank), AdamW, OneCycleLR
  --model fsdp      an MLP under FSDP2 (fully_shard) on gloo (RANK/WORLD_SIZE/MASTER_* set),
                    AdamW (DTensor state), LambdaLR; every collective through trainsup's tracker
  --load-plain      with compile: restore into the plain (uncompiled) module instead
"""
import argparse
import os

import torch
import torch.distributed as dist

import trainsup

p = argparse.ArgumentParser()
p.add_argument("--model", choices=["compile", "fsdp"], required=True)
p.add_argument("--steps", type=int, default=12)
p.add_argument("--checkpoint-every", type=int, default=8)
p.add_argument("--out", required=True)
p.add_argument("--load-plain", action="store_true")
args = p.parse_args()

distributed = args.model == "fsdp"
if distributed:
    trainsup.init_process_group("gloo")
rank = dist.get_rank() if distributed else 0
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.ReLU(), torch.nn.Linear(64, 64), torch.nn.ReLU(),
                            torch.nn.Linear(64, 1))
if args.model == "fsdp":
    from torch.distributed.fsdp import fully_shard
    for layer in model:
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer)
    fully_shard(model)
    run = model
    scheduler_fn = lambda opt: torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0 / (1 + s))  # noqa: E731
else:
    run = model if args.load_plain else torch.compile(model)
    scheduler_fn = lambda opt: torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=0.01, total_steps=100)  # noqa: E731
optimizer = torch.optim.AdamW(model.parameters(), lr=0.01)
scheduler = scheduler_fn(optimizer)
state = {"model": run, "optimizer": optimizer, "scheduler": scheduler, "next_step": 0}

with trainsup.Supervisor(checkpoint_every_steps=args.checkpoint_every, checkpoint_interval_s=3600) as sup:
    restored = sup.restore(state)
    for step in range(state["next_step"], args.steps):
        with sup.step(step):
            g = torch.Generator().manual_seed(1_000_003 * rank + step)
            x = torch.randn(32, 16, generator=g)
            loss = torch.nn.functional.mse_loss(run(x), x.sum(dim=1, keepdim=True) * 0.1)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            scheduler.step()
        state["next_step"] = step + 1
        sup.maybe_checkpoint(step, state)

params = {}
for name, t in model.state_dict().items():
    local = t.to_local() if hasattr(t, "to_local") else t
    params[name] = local.detach().clone()
    if hasattr(t, "to_local"):
        params[name + ".placements"] = str(t.placements)
torch.save({"params": params, "restored": restored, "lr": scheduler.get_last_lr(),
            "optim_steps": [int(s["step"]) if torch.is_tensor(s["step"]) and s["step"].numel() == 1
                            and not hasattr(s["step"], "to_local") else int(s["step"].full_tensor())
                            if hasattr(s["step"], "full_tensor") else int(s["step"])
                            for s in optimizer.state.values()]},
           f"{args.out}.{rank}")
if distributed:
    dist.destroy_process_group()
