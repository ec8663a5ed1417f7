#!/usr/bin/env python3
"""Checkpoint stall, persist and restore of trainsup's DCP path against plain
torch.distributed.checkpoint on the same state, side by side in one run.

The state: examples/python/train_mesh.py's MLP (dim 1024, HIDDEN wide), FSDP2 x TP on a 1 x 2 mesh of 2 gloo ranks, with
AdamW state (each rank holds its shards: parameters and two moments). Each round saves it
three ways, in an order rotated per round, and restores it two ways:

  trainsup      sup.checkpoint(step, state): the stall is the call (DCP-style staging into a
                CPU copy kept across saves); persist is the writer thread's dcp.save plus
                trainsup's checksums, shard and commit (event checkpoint_committed, persist_s)
  dcp.async     dcp.async_save with one DefaultStager passed as async_stager and reused across
                saves (DCP's docs: a caller-provided stager is kept and closed after the last
                checkpoint; FileSystemWriter(cache_staged_state_dict=True) pins memory, which
                needs CUDA): the stall is the call, persist the future's wait
  dcp.save      dcp.save: the call is both the stall and the persist
  restore       sup.restore(state) (newest valid checkpoint found and agreed, every item verified)
                vs DCP's recipe on the same directory: get_state_dict, dcp.load, set_state_dict

One definition for all: stall = time the training thread is held by the save call; persist
throughput = the bytes of DCP data written / the time from the end of the stall until the
checkpoint is durable (dcp.save: its whole call). Ratios are trainsup / DCP per round; the
output gives their medians and ranges.

  PYTHONPATH=build/bindings/python .venv/bin/python bench/dcp_checkpoint_bench.py [ROUNDS] [HIDDEN]
"""
import datetime
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def rank_main(workdir, rounds, hidden):
    import warnings
    warnings.filterwarnings("ignore")
    import torch
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint import FileSystemWriter
    from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions
    from torch.distributed.checkpoint.state_dict import (get_model_state_dict, get_optimizer_state_dict,
                                                           set_model_state_dict, set_optimizer_state_dict)
    sys.path.insert(0, os.path.join(REPO, "examples", "python"))
    import train_mesh
    import trainsup

    trainsup.init_process_group("gloo")
    rank = dist.get_rank()
    # The example's model, wider: dim 1024, `hidden` wide.
    mesh, model = train_mesh.build_fsdp_tp(type("A", (), {"tp": 2})(), "cpu", hidden=hidden, dim=1024)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x, y = train_mesh.batch(0, 0, dim=1024)
    torch.nn.functional.mse_loss(model(x), y).backward()
    opt.step()
    state = {"model": model, "optimizer": opt, "next_step": 1}
    plain_group = dist.new_group(backend="gloo")  # DCP's collectives off the training's group, as trainsup does
    # One stager for every async_save, as DCP's docs say ("If you provide an async_stager, call
    # close() after the last checkpoint is saved"); its StateDictStager keeps the CPU copies.
    # Pinned and shared memory, async staging and non-blocking copies need an accelerator: off
    # here, as async_save's own default stager has them.
    stager = DefaultStager(StagingOptions(use_pinned_memory=torch.cuda.is_available(), use_shared_memory=False,
                                          use_async_staging=False, use_non_blocking_copy=torch.cuda.is_available()))
    rows = []

    def data_bytes(path):
        return sum(os.path.getsize(os.path.join(path, f)) for f in os.listdir(path) if f.endswith(".distcp"))

    with trainsup.Supervisor(checkpoint_dir=os.path.join(workdir, "ts"), checkpoint_interval_s=0, checkpoint_keep=2,
                             checkpoint_format="dcp", log_dir=os.path.join(workdir, "logs"), job_id="bench") as sup:
        events = sup.event_log
        for r in range(rounds + 1):  # round 0 warms every path up (allocations, the stager's cache)
            row = {}
            order = ["trainsup", "dcp.async", "dcp.save"]
            order = order[r % 3:] + order[:r % 3]
            for how in order:
                dist.barrier(group=plain_group)
                step = 10 * r + order.index(how) + 1
                if how == "trainsup":
                    t0 = time.perf_counter()
                    sup.checkpoint(step, state)
                    stall = time.perf_counter() - t0
                    committed = None
                    while committed is None:  # the writer thread's result, from the rank's event log
                        with open(events) as f:
                            for line in f:
                                e = json.loads(line)
                                if e["event"] in ("checkpoint_committed", "checkpoint_failed") and e.get("step") == step:
                                    committed = e
                        time.sleep(0.005)  # polls a file another thread writes; bounded by the persist
                    assert committed["event"] == "checkpoint_committed", committed
                    persist = committed["persist_s"]
                    nbytes = data_bytes(sup._sup.checkpoint_dir + "/" + trainsup._trainsup.checkpoint_dir_name(step))
                else:
                    sd = {"model": get_model_state_dict(model), "optimizer": get_optimizer_state_dict(model, opt),
                          "next_step": step}
                    path = os.path.join(workdir, f"{how}-{step}")
                    t0 = time.perf_counter()
                    if how == "dcp.save":
                        dcp.save(sd, checkpoint_id=path, process_group=plain_group)
                        stall = persist = time.perf_counter() - t0
                    else:
                        fut = dcp.async_save(sd, storage_writer=FileSystemWriter(path), async_stager=stager,
                                             process_group=plain_group)
                        stall = time.perf_counter() - t0
                        fut.result()
                        persist = time.perf_counter() - t0 - stall
                    nbytes = data_bytes(path)
                    dist.barrier(group=plain_group)
                    if rank == 0:
                        shutil.rmtree(path)
                row[how] = {"stall_s": stall, "persist_s": persist, "bytes": nbytes}
            # Restores of the newest trainsup checkpoint, every item verified, and plain dcp.load of it.
            dist.barrier(group=plain_group)
            t0 = time.perf_counter()
            sup.restore(state)
            row["restore_trainsup_s"] = time.perf_counter() - t0
            newest = trainsup.load_checkpoint(sup._sup.checkpoint_dir).path
            dist.barrier(group=plain_group)
            # What DCP's recipe does to load a model and optimizer (its AppState example:
            # get_state_dict, dcp.load, set_state_dict), timed as a whole as trainsup's is.
            t0 = time.perf_counter()
            sd = {"model": get_model_state_dict(model), "optimizer": get_optimizer_state_dict(model, opt), "next_step": 0}
            dcp.load(sd, checkpoint_id=newest, process_group=plain_group)
            set_model_state_dict(model, sd["model"])
            set_optimizer_state_dict(model, opt, sd["optimizer"])
            row["restore_dcp_s"] = time.perf_counter() - t0
            if r > 0:
                rows.append(row)
    stager.close()
    if rank == 0:
        print("ROWS " + json.dumps(rows), flush=True)
    dist.destroy_process_group()


def summarize(rows, hidden):
    def ratios(f):
        values = sorted(f(r) for r in rows)
        return round(statistics.median(values), 3), [round(values[0], 3), round(values[-1], 3)]

    def thr(r, how):
        return r[how]["bytes"] / r[how]["persist_s"]

    stall_async = ratios(lambda r: r["trainsup"]["stall_s"] / r["dcp.async"]["stall_s"])
    stall_sync = ratios(lambda r: r["trainsup"]["stall_s"] / r["dcp.save"]["stall_s"])
    persist_async = ratios(lambda r: thr(r, "trainsup") / thr(r, "dcp.async"))
    persist_sync = ratios(lambda r: thr(r, "trainsup") / thr(r, "dcp.save"))
    restore = ratios(lambda r: r["restore_trainsup_s"] / r["restore_dcp_s"])
    med = lambda how, k: round(statistics.median(r[how][k] for r in rows), 4)  # noqa: E731
    return {"bench": "dcp_checkpoint", "ranks": 2, "mesh": "1x2 (dp, tp)", "hidden": hidden, "rounds": len(rows),
            "data_bytes_per_checkpoint": rows[0]["trainsup"]["bytes"],
            "stall_ratio_vs_async_save": stall_async[0], "stall_ratio_vs_async_save_range": stall_async[1],
            "stall_ratio_vs_save": stall_sync[0], "stall_ratio_vs_save_range": stall_sync[1],
            "persist_throughput_ratio_vs_async_save": persist_async[0],
            "persist_throughput_ratio_vs_async_save_range": persist_async[1],
            "persist_throughput_ratio_vs_save": persist_sync[0], "persist_throughput_ratio_vs_save_range": persist_sync[1],
            "restore_time_ratio_vs_dcp_load": restore[0], "restore_time_ratio_vs_dcp_load_range": restore[1],
            "median_s": {**{how: {"stall": med(how, "stall_s"), "persist": med(how, "persist_s")}
                            for how in ("trainsup", "dcp.async", "dcp.save")},
                         "restore": {how: round(statistics.median(r[f"restore_{how}_s"] for r in rows), 4)
                                     for how in ("trainsup", "dcp")}}}


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "--rank":
        return rank_main(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 7
    hidden = int(sys.argv[2]) if len(sys.argv) > 2 else 8192
    import torch.distributed as dist
    store = dist.TCPStore("127.0.0.1", 0, 3, True, timeout=datetime.timedelta(seconds=600), wait_for_workers=False)
    workdir = tempfile.mkdtemp(prefix="dcp-bench-")
    procs = []
    for r in range(2):
        env = dict(os.environ, RANK=str(r), WORLD_SIZE="2", LOCAL_RANK=str(r), MASTER_ADDR="127.0.0.1",
                   MASTER_PORT=str(store.port), TORCHELASTIC_USE_AGENT_STORE="True", OMP_NUM_THREADS="1", LOCAL_WORLD_SIZE="2",
                   TRAINSUP_LOG_STDERR="0", PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
        procs.append(subprocess.Popen([sys.executable, __file__, "--rank", workdir, str(rounds), str(hidden)], env=env,
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    outs = [p.communicate(timeout=1800)[0] for p in procs]
    shutil.rmtree(workdir, ignore_errors=True)
    failed = [f"rank {r} exited {p.returncode}:\n{out[-3000:]}" for r, (p, out) in enumerate(zip(procs, outs))
              if p.returncode != 0]
    if failed:
        sys.exit("dcp_checkpoint_bench: " + "\n".join(failed))
    rows = json.loads(next(line for line in outs[0].splitlines() if line.startswith("ROWS "))[5:])
    print(json.dumps(summarize(rows, hidden)))


if __name__ == "__main__":
    main()
