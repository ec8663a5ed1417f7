"""The bench job under torchft (train.py --system torchft): one replica group per simulated host,
each one process under torchrun, a Lighthouse beside them (started by bench/vs_alternatives.py).
As torchft's own train_ddp.py: a Manager on ProcessGroupGloo, torchft's DistributedDataParallel;
the optimizer steps only when the Manager says the step commits. A replica that comes back
heals from a live peer (torchft keeps no checkpoint of its own; none is needed here)."""
import os
import time
from datetime import timedelta

import torch
import torch.nn as nn


def run_torchft(a, log):
    from torchft import DistributedDataParallel, Manager, ProcessGroupGloo
    from train import batch, compute, make_model

    group = int(os.environ.get("REPLICA_GROUP_ID", 0))
    model = make_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)

    def state_dict():
        return {"model": model.state_dict(), "optimizer": opt.state_dict()}

    def load_state_dict(sd):
        model.load_state_dict(sd["model"])
        opt.load_state_dict(sd["optimizer"])

    # torchft's defaults, but for min_replica_size=1 (a survivor may go on alone) and a gloo
    # timeout of 10 s (as the tuned torchrun: torchft's default is 60 s).
    manager = Manager(pg=ProcessGroupGloo(timeout=timedelta(seconds=10)), load_state_dict=load_state_dict,
                      state_dict=state_dict, min_replica_size=1, replica_id=f"bench_{group}")
    ddp = DistributedDataParallel(manager, model)
    log.write(event="start", pid=os.getpid(), rank=group, world=int(os.environ.get("NUM_REPLICA_GROUPS", 2)),
              attempt=int(os.environ.get("TORCHELASTIC_RESTART_COUNT", 0)), resumed_from=manager.current_step(),
              t=time.time())
    while manager.current_step() < a.steps:
        step = manager.current_step()
        compute(a.step_ms)
        x, y = batch(group, step)
        manager.start_quorum()
        opt.zero_grad()
        nn.functional.mse_loss(ddp(x), y).backward()
        if manager.should_commit():
            opt.step()
            log.write(event="step", step=manager.current_step() - 1, t=time.time(), world=manager.num_participants())
    manager.shutdown(wait=False)
