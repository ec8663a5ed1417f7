"""Worker for test_tracker.py: DDP on gloo with trainsup's tracking, checks the tracker against
DDP's buckets."""
import json
import sys
import time

import torch
import torch.distributed as dist

import trainsup

steps = int(sys.argv[1])
out = sys.argv[2]
trainsup.init_process_group("gloo")
assert dist.get_backend() == "gloo", dist.get_backend()  # the job sees its own backend
wrapped = dist.distributed_c10d._get_default_group()._get_backend(torch.device("cpu"))
assert type(wrapped).__name__ == "TrackingBackend", type(wrapped)
assert type(trainsup.inner_backend()).__name__ == "ProcessGroupGloo", type(trainsup.inner_backend())
torch.manual_seed(0)
model = torch.nn.Sequential(*[torch.nn.Linear(512, 512, bias=False) for _ in range(4)], torch.nn.Linear(512, 1))
ddp = torch.nn.parallel.DistributedDataParallel(model, bucket_cap_mb=1)
start = trainsup.collective_stats()
for step in range(steps):
    ddp(torch.randn(16, 512)).sum().backward()
t = torch.ones(4)
dist.all_reduce(t)
# The watcher records a finished collective within a poll interval (1 ms) of its completion.
deadline = time.monotonic() + 10
while trainsup.collective_stats()["pending"] and time.monotonic() < deadline:
    time.sleep(0.001)
end = trainsup.collective_stats()
info = ddp._get_ddp_logging_data()
first = len(str(info["bucket_sizes"]).split(","))
rebuilt = len(str(info.get("rebuilt_bucket_sizes", info["bucket_sizes"])).split(","))
recent = trainsup.recent_collectives(5)
json.dump({
    "rank": dist.get_rank(),
    "allreduce": end["count"]["allreduce"] - start["count"]["allreduce"],
    "expected_ddp": first + (steps - 1) * rebuilt,
    "buckets_first": first, "buckets_rebuilt": rebuilt,
    "broadcast": end["count"]["broadcast"],
    "pending": end["issued"] - end["completed"],
    "last": recent[-1],
    "sum": t.tolist(),
}, open(f"{out}.{dist.get_rank()}", "w"))
dist.destroy_process_group()
