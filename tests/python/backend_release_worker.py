"""Worker for test_tracker.py: the last reference to trainsup's backend wrapper goes away in
Python while the real gloo backend's worker thread is still busy (an all-reduce that rank 1
never joins, held until gloo's 3 s timeout). ~ProcessGroupGloo joins that thread, which frees
the collective's tensors and needs the GIL for it: the wrapper's destructor must run without
the GIL. Rank 0 prints how long the release took and how far a Python thread got meanwhile;
rank 1 only waits for a line on stdin."""
import datetime
import json
import os
import sys
import threading
import time

import torch
import torch.distributed as dist

import trainsup

rank, init_file = int(sys.argv[1]), sys.argv[2]
dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=2,
                        timeout=datetime.timedelta(seconds=3))
if rank == 1:
    sys.stdin.readline()  # stays connected, never joins the all-reduce
    os._exit(0)
trainsup.track_process_group()
backend = dist.distributed_c10d._get_default_group()._get_backend(torch.device("cpu"))
assert type(backend).__name__ == "TrackingBackend"
t = torch.ones(1024)
work = dist.all_reduce(t, async_op=True)
del t, work  # the work, in gloo's worker thread, now holds the tensor's last reference
dist.destroy_process_group()  # the wrapper's last reference is `backend`

ticks = 0
running, stop = threading.Event(), threading.Event()


def tick():
    global ticks
    running.set()
    while not stop.is_set():
        ticks += 1
        time.sleep(0.001)


threading.Thread(target=tick, daemon=True).start()
running.wait()
before, t0 = ticks, time.monotonic()
del backend  # ~TrackingBackend -> ~ProcessGroupGloo: joins the worker once the all-reduce times out
took = time.monotonic() - t0
print(json.dumps({"release_s": took, "ticks": ticks - before}), flush=True)
stop.set()
os._exit(0)
