"""Worker for test_dcp_checkpoints.py's crash points: one process (world 1) checkpointing a
deterministic state through the DCP path (checkpoint_format="dcp"), or restoring and printing
what it restored.

  dcp_crash_worker.py save DIR STEP     the state of STEP, checkpointed as STEP (keep 1)
  dcp_crash_worker.py restore DIR...    prints [{"step": ..., "digest": ...}] (one per DIR)
  dcp_crash_worker.py digest STEP       prints the digest of STEP's state
"""
import hashlib
import json
import sys

import torch

import trainsup


def make_state(step):
    torch.manual_seed(step)
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 8))
    opt = torch.optim.AdamW(model.parameters(), lr=0.01)
    model(torch.randn(4, 64)).sum().backward()
    opt.step()
    return {"model": model, "optimizer": opt, "next_step": step + 1}


def digest(state):
    h = hashlib.sha256()
    for k, v in sorted(state["model"].state_dict().items()):
        h.update(k.encode() + v.numpy().tobytes())
    for p in state["model"].parameters():
        for k, v in sorted(state["optimizer"].state[p].items()):
            h.update(k.encode() + v.numpy().tobytes())
    h.update(str(state["next_step"]).encode())
    return h.hexdigest()


mode = sys.argv[1]
if mode == "digest":
    print(json.dumps({"digest": digest(make_state(int(sys.argv[2])))}))
    sys.exit(0)


def supervisor(d):
    return trainsup.Supervisor(checkpoint_dir=d + "/ckpt", log_dir=d + "/logs", checkpoint_keep=1, checkpoint_interval_s=0,
                               checkpoint_format="dcp", log_stderr=False, include_rng=False)


if mode == "save":
    with supervisor(sys.argv[2]) as sup:
        step = int(sys.argv[3])
        sup.checkpoint(step, make_state(step))
    print(json.dumps({"saved": step}))
else:
    out = []
    for d in sys.argv[2:]:
        with supervisor(d) as sup:
            state = make_state(999)  # another state: everything must come from the checkpoint
            step = sup.restore(state)
            out.append({"step": step, "digest": digest(state)})
    print(json.dumps(out))
