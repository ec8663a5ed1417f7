"""Worker for test_tracker.py: rank 0 issues an all-reduce that rank 1 joins only when the test
says so; the tracker must show it in flight until then, and its duration must cover the wait.
Protocol on stdin/stdout, one line each: rank 0 prints "issued", reads "check", prints its view
of the record; rank 1 reads "go", then joins; both print "done" records at the end."""
import json
import sys
import time

import torch
import torch.distributed as dist

import trainsup


def newest():
    return trainsup.recent_collectives(1)[-1]


def say(**kw):
    print(json.dumps(kw), flush=True)


trainsup.init_process_group("gloo")
rank = dist.get_rank()
dist.barrier()
# The barrier's record ends when the completion watcher next polls it (every 1 ms): let it, so
# that the all-reduce below is the only collective pending when the test looks.
deadline = time.monotonic() + 10
while trainsup.collective_stats()["pending"] and time.monotonic() < deadline:
    time.sleep(0.001)
t = torch.ones(1024)
if rank == 0:
    work = dist.all_reduce(t, async_op=True)
    issued = time.monotonic_ns()
    say(state="issued")
    assert sys.stdin.readline().strip() == "check"
    held_ns = time.monotonic_ns() - issued
    say(state="held", record=newest(), completed=work.is_completed(), held_ns=held_ns,
        pending=trainsup.collective_stats()["pending"])
    work.wait()
else:
    say(state="waiting")
    assert sys.stdin.readline().strip() == "go"
    dist.all_reduce(t)
deadline = time.monotonic() + 10
while trainsup.collective_stats()["pending"] and time.monotonic() < deadline:
    time.sleep(0.001)
say(state="done", record=newest(), sum=float(t[0]))
dist.destroy_process_group()
