"""The bench job under NVIDIA Resiliency Extension's in-process restart (train.py --system
nvrx-inprocess): the training function wrapped in nvidia_resiliency_ext.inprocess.Wrapper, as
its examples/inprocess/basic_example.py does (--device cpu there means gloo): a TCPStore per
restart iteration on MASTER_PORT + 2 + iteration, the Wrapper's own store on MASTER_PORT + 1,
init_process_group with the ranks and world size the Wrapper assigns (its default rank
assignment: the surviving ranks shift down and the world shrinks), the state loaded from the
newest checkpoint on every iteration, the checkpoint written under call_wrapper.atomic().

Timeouts are the one threshold of the comparison (5 s): soft_timeout (progress), heartbeat_timeout
(a missing rank) and gloo's timeout (the usage guide's known issue: pending gloo collectives cannot
be aborted, "specify a short timeout for the gloo backend"); hard_timeout 10 s (> soft, as the
Wrapper requires). Processes are started by the harness itself with RANK, WORLD_SIZE,
MASTER_ADDR, MASTER_PORT (the usage guide: the scheduler must not end the job when one rank exits)."""
import datetime
import os
import time
from typing import Optional

import torch


def run_inprocess(a, log):
    from nvidia_resiliency_ext import inprocess
    from torch.nn.parallel import DistributedDataParallel as DDP
    from train import make_model, plain_checkpoint, plain_restore, train_step

    threshold = datetime.timedelta(seconds=a.threshold_s)
    base_port = int(os.environ["MASTER_PORT"])

    @inprocess.Wrapper(store_kwargs={"port": base_port + 1}, soft_timeout=threshold,
                       hard_timeout=2 * threshold, heartbeat_timeout=threshold)
    def train(call_wrapper: Optional[inprocess.CallWrapper] = None):  # the annotation has the Wrapper inject it
        import torch.distributed as dist
        rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
        store = dist.TCPStore(host_name=os.environ["MASTER_ADDR"], port=base_port + 2 + call_wrapper.iteration,
                              world_size=world, is_master=rank == 0, multi_tenant=True, wait_for_workers=True,
                              use_libuv=True)
        dist.init_process_group("gloo", store=store, rank=rank, world_size=world, timeout=threshold)
        model = make_model()
        ddp = DDP(model)
        opt = torch.optim.SGD(ddp.parameters(), lr=0.01, momentum=0.9)
        path = os.path.join(a.checkpoint_dir, "plain.pt")
        start = plain_restore(path, model, opt)
        log.write(event="start", pid=os.getpid(), rank=rank, world=world, attempt=call_wrapper.iteration,
                  resumed_from=start, t=time.time())
        for step in range(start, a.steps):
            train_step(ddp, opt, rank, step, a.step_ms)
            log.write(event="step", step=step, t=time.time(), world=world)
            if (step + 1) % a.checkpoint_every == 0:
                dist.barrier()
                if rank == 0:
                    with call_wrapper.atomic():
                        plain_checkpoint(path, model, opt, step)
                dist.barrier()
        dist.destroy_process_group()

    train()
