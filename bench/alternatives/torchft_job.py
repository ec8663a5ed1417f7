"""The bench job under torchft (train.py --system torchft): one replica group per simulated host,
each one process under torchrun, a Lighthouse beside them (started by bench/vs_alternatives.py).

Set up as torchft 0.2.0's own train_ddp.py does on a CPU: ProcessGroupGloo(timeout=5 s), a
PGTransport (timeout 10 s) for healing, Manager(min_replica_size=1, timeout=30 s, replica_id),
torchft's DistributedDataParallel and Optimizer wrapper (zero_grad at the top of the step starts
the quorum; its step(), written out here, applies the update only if the step commits). replica_id is the host's name
(train_ddp.py uses train_ddp_<REPLICA_GROUP_ID>) so that its logs could name the host. torchft
keeps no checkpoint of its own: a replica that comes back heals from a live peer."""
import os
import time
from datetime import timedelta

import torch
import torch.nn as nn


def run_torchft(a, log):
    import logging
    logging.basicConfig(level=logging.INFO)  # as train_ddp.py
    from torchft import DistributedDataParallel, Manager, Optimizer, ProcessGroupGloo
    from torchft.checkpointing.pg_transport import PGTransport
    from train import batch, compute, make_model

    group = int(os.environ.get("REPLICA_GROUP_ID", 0))
    model = make_model()
    inner = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)

    def state_dict():
        return {"model": model.state_dict(), "optim": inner.state_dict()}

    def load_state_dict(sd):
        model.load_state_dict(sd["model"])
        inner.load_state_dict(sd["optim"])

    pg = ProcessGroupGloo(timeout=timedelta(seconds=5))
    transport = PGTransport(pg, timeout=timedelta(seconds=10), device=torch.device("cpu"))
    manager = Manager(pg=pg, min_replica_size=1, load_state_dict=load_state_dict, state_dict=state_dict,
                      replica_id=os.environ.get("BENCH_REPLICA_ID", f"train_ddp_{group}"),
                      timeout=timedelta(seconds=30), checkpoint_transport=transport)
    ddp = DistributedDataParallel(manager, model)
    opt = Optimizer(manager, inner)  # its zero_grad() starts the quorum
    log.write(event="start", pid=os.getpid(), rank=group, world=int(os.environ.get("NUM_REPLICA_GROUPS", 2)),
              attempt=int(os.environ.get("TORCHELASTIC_RESTART_COUNT", 0)), resumed_from=manager.current_step(),
              t=time.time())
    while manager.current_step() < a.steps:
        compute(a.step_ms)
        x, y = batch(group, manager.current_step())
        opt.zero_grad()  # starts the quorum (train_ddp.py: "must be called at the beginning of each train loop")
        nn.functional.mse_loss(ddp(x), y).backward()
        # What torchft's Optimizer.step() does, written out to learn whether the step committed:
        # the update is applied only then, and the Manager's step (healed from a peer after a
        # restart) advances.
        if manager.should_commit():
            inner.step()
            log.write(event="step", step=manager.current_step() - 1, t=time.time(), world=manager.num_participants())
    manager.shutdown(wait=False)
