"""A rank of the snapshot tests (test_snapshots.py): a small model trained the same way on every
rank, restored from the newest snapshot or checkpoint, then trained to --steps; prints one JSON
line with the step restored and a digest of the parameters."""
import argparse
import json
import time

import torch
import torch.distributed as dist

import trainsup


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, required=True)
    p.add_argument("--step-s", type=float, default=0.1, help="the time a step's compute takes")
    a = p.parse_args()
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    model = torch.nn.Linear(64, 64)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    state = {"model": model, "optimizer": opt, "next_step": 0}
    with trainsup.Supervisor() as sup:
        restored = sup.restore(state)
        for step in range(state["next_step"], a.steps):
            with sup.step(step):
                x = torch.full((4, 64), float(step + 1) / 16)
                loss = model(x).square().mean()
                opt.zero_grad()
                loss.backward()
                opt.step()
                time.sleep(a.step_s)  # the rest of the step's compute
            state["next_step"] = step + 1
            sup.maybe_checkpoint(step, state)
        digest = sum(float(t.double().sum()) for t in model.state_dict().values())
        print(json.dumps({"rank": sup.rank, "restored": restored, "next_step": state["next_step"],
                          "digest": digest}), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
