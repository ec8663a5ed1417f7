"""Worker for test_torch_transparency.py: torch.distributed.checkpoint with trainsup's tracking
on the default group: an FSDP2 model's sharded state saved with dcp.save and dcp.async_save and
loaded into a fresh model, every shard equal. Prints one JSON line."""
import json
import sys

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.fsdp import fully_shard

import trainsup

out_dir = sys.argv[1]
trainsup.init_process_group("gloo")


def make(seed):
    torch.manual_seed(seed)
    m = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    for layer in m:
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer)
    fully_shard(m)
    return m


model = make(0)
opt = torch.optim.AdamW(model.parameters(), lr=0.01)
for step in range(2):
    x = torch.randn(16, 8, generator=torch.Generator().manual_seed(step * 10 + dist.get_rank()))
    model(x).sum().backward()
    opt.step()
    opt.zero_grad()
before = trainsup.collective_stats()["issued"]
dcp.save({"model": model.state_dict()}, checkpoint_id=f"{out_dir}/sync")
future = dcp.async_save({"model": model.state_dict()}, checkpoint_id=f"{out_dir}/async")
future.result()
results = {}
for kind in ("sync", "async"):
    fresh = make(1)
    sd = {"model": fresh.state_dict()}
    dcp.load(sd, checkpoint_id=f"{out_dir}/{kind}")
    fresh.load_state_dict(sd["model"])
    results[kind] = all(torch.equal(a.to_local(), b.to_local())
                        for a, b in zip(model.state_dict().values(), fresh.state_dict().values()))
print(json.dumps({"rank": dist.get_rank(), "equal": results, "backend": str(dist.get_backend()),
                  "tracked_during_dcp": trainsup.collective_stats()["issued"] - before}), flush=True)
dist.destroy_process_group()
