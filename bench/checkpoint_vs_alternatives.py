#!/usr/bin/env python3
"""trainsup's checkpoints beside torch.save and torch.distributed.checkpoint (DCP), on the same
state, the same disk, in one run (issue 11, docs/comparison.md).

The state: a model of Linear layers and its AdamW optimizer after one step (parameters plus two
moments: about --mib MiB in all), in one process on the CPU (in a gloo process group of one, as in a job). Each system saves it, in turn and
alternating over --reps rounds (the median is reported), into a fresh folder under --dir:

  torch.save          torch.save of {model, optimizer} state dicts to one file (no fsync: as
                      the tutorials write it, so not durable when the call returns)
  torch.save+fsync    the same, then fsync and an atomic rename (what durability costs)
  dcp.save            torch.distributed.checkpoint.save (its FileSystemWriter fsyncs)
  dcp.async_save      async_save with a DefaultStager kept across saves (DCP's docs): staging
                      copy in the call, write in a thread
  dcp.async_save+process  async_checkpointer_type=PROCESS (write in a background process), its
                      stager kept across saves with shared memory on
  dcp.async_save+stager   a kept DefaultStager with asynchronous staging (StagingOptions; pinned
                      memory off: this is the CPU)
  trainsup            Supervisor.checkpoint, blocking snapshot (copy in the call, write and
                      commit in the background)
  trainsup+overlapped checkpoint_snapshot="overlapped" (the copy runs beside the next
                      forward/backward; the optimizer step waits for it)

Figures per system:
  stall_s    what the training thread loses: the save call, plus, for the overlapped and
             async-staging kinds, the wait before the next optimizer step that exceeds a
             --compute-ms window of real compute done between them (a forward/backward stand-in)
  persist_s  from the save call to durable on disk (DCP: the future's result; trainsup: its
             checkpoint_committed event; torch.save: the call)
  restore_s  loading it back into the live model and optimizer (torch.load + load_state_dict,
             dcp.load + set_state_dict, Supervisor.restore); the page cache is warm for all

A system that fails here gets a row with its own error message. Last line: one JSON object with
the medians and the ratios trainsup / best alternative (stall, persist, restore).

  checkpoint_vs_alternatives.py [--mib 384] [--reps 3] [--dir /tmp/trainsup-ckpt-vs] [--compute-ms 200]
"""
import argparse
import json
import os
import pathlib
import shutil
import statistics
import sys
import tempfile
import time
import traceback

import torch
import torch.nn as nn

sys.path[:0] = [p for p in os.environ.get("TRAINSUP_PYTHONPATH", "").split(os.pathsep) if p]


def build_state(mib):
    """A model whose parameters are mib/3 MiB, and AdamW after one step (two moments each)."""
    torch.manual_seed(0)
    width = 2048
    layer_bytes = width * width * 4
    layers = max(1, int(mib * 2**20 / 3 // layer_bytes))
    model = nn.Sequential(*[nn.Linear(width, width, bias=True) for _ in range(layers)])
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    loss = model(torch.randn(4, width)).sum()
    loss.backward()
    opt.step()
    nbytes = sum(p.numel() * p.element_size() for p in model.parameters()) * 3
    return model, opt, nbytes


def compute(model, ms):
    """Real work on the training thread for about `ms`: forward/backward passes, no grads kept."""
    if ms <= 0:
        return
    end = time.perf_counter() + ms / 1000
    x = torch.randn(2, model[0].in_features)
    while time.perf_counter() < end:
        with torch.no_grad():
            model(x)


def perturb(model):
    """Changes the live state after a save, so that a restore has something to put back."""
    with torch.no_grad():
        for p in model.parameters():
            p.add_(1.0)


def same(model, reference):
    return all(torch.equal(p, reference[k]) for k, p in model.state_dict().items())


# --- systems: each returns {"stall_s", "persist_s", "restore_s"} or raises ---

def torch_save(model, opt, folder, fsync, compute_ms):
    path = folder / "ckpt.pt"
    tmp = folder / "ckpt.pt.tmp"
    t0 = time.perf_counter()
    if fsync:
        with open(tmp, "wb") as f:
            torch.save({"model": model.state_dict(), "optimizer": opt.state_dict()}, f)
            f.flush()
            os.fsync(f.fileno())
        os.rename(tmp, path)
        dfd = os.open(folder, os.O_RDONLY)
        os.fsync(dfd)
        os.close(dfd)
    else:
        torch.save({"model": model.state_dict(), "optimizer": opt.state_dict()}, path)
    took = time.perf_counter() - t0
    reference = {k: v.clone() for k, v in model.state_dict().items()}
    perturb(model)
    t0 = time.perf_counter()
    sd = torch.load(path, weights_only=True)
    model.load_state_dict(sd["model"])
    opt.load_state_dict(sd["optimizer"])
    restore = time.perf_counter() - t0
    assert same(model, reference), "torch.load gave back other parameters"
    return {"stall_s": took, "persist_s": took, "restore_s": restore}


def _dcp_state(model, opt):
    from torch.distributed.checkpoint.state_dict import get_state_dict
    msd, osd = get_state_dict(model, opt)
    return {"model": msd, "optimizer": osd}


def _dcp_restore(model, opt, folder):
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import set_state_dict
    t0 = time.perf_counter()
    state = _dcp_state(model, opt)
    dcp.load(state, checkpoint_id=str(folder))
    set_state_dict(model, opt, model_state_dict=state["model"], optim_state_dict=state["optimizer"])
    return time.perf_counter() - t0


_STAGERS = {}


def _stager(mode):
    """One DefaultStager per mode, kept across saves and closed after the last (async_save's
    docs: "If you provide an async_stager, call close() after the last checkpoint is saved";
    a stager it makes itself is built and closed on every save, losing its cached CPU copies).
    Pinned memory and non-blocking copies need CUDA: off. thread: staging in the call (async_save's
    own default options); stager: asynchronous staging; process: shared memory on, as the
    process-based writer takes the staged state across processes (StagingOptions' docs)."""
    if mode not in _STAGERS:
        from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions
        _STAGERS[mode] = DefaultStager(StagingOptions(use_pinned_memory=False, use_shared_memory=mode == "process",
                                                      use_async_staging=mode == "stager",
                                                      use_non_blocking_copy=False))
    return _STAGERS[mode]


def dcp_save(model, opt, folder, mode, compute_ms):
    import torch.distributed.checkpoint as dcp
    stall_extra = 0.0
    t0 = time.perf_counter()
    state = _dcp_state(model, opt)
    if mode == "sync":
        dcp.save(state, checkpoint_id=str(folder))
        stall = persist = time.perf_counter() - t0
    else:
        from torch.distributed.checkpoint.state_dict_saver import AsyncCheckpointerType
        kwargs = {"async_stager": _stager(mode)}
        if mode == "process":
            kwargs["async_checkpointer_type"] = AsyncCheckpointerType.PROCESS
        result = dcp.async_save(state, checkpoint_id=str(folder), **kwargs)
        stall = time.perf_counter() - t0
        upload = result
        if hasattr(result, "staging_completion"):
            compute(model, compute_ms)
            w0 = time.perf_counter()
            result.staging_completion.result()  # before the optimizer step may change the state
            stall_extra = time.perf_counter() - w0
            upload = result.upload_completion
        upload.result()
        persist = time.perf_counter() - t0
    reference = {k: v.clone() for k, v in model.state_dict().items()}
    perturb(model)
    restore = _dcp_restore(model, opt, folder)
    assert same(model, reference), "dcp.load gave back other parameters"
    return {"stall_s": stall + stall_extra, "persist_s": persist, "restore_s": restore}


def _committed(event_log, step, timeout_s=600):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            with open(event_log) as f:
                for line in f:
                    e = json.loads(line)
                    if e.get("event") == "checkpoint_committed" and e.get("step") == step:
                        return e
                    if e.get("event") == "checkpoint_failed" and e.get("step") == step:
                        raise RuntimeError(f"trainsup checkpoint failed: {e}")
        except FileNotFoundError:
            pass
        time.sleep(0.002)  # polls the event log the writer thread appends to; bounded by the deadline
    raise TimeoutError(f"no checkpoint_committed for step {step} in {event_log}")


def trainsup_save(model, opt, folder, overlapped, compute_ms):
    import trainsup
    state = {"model": model, "optimizer": opt}
    settings = dict(checkpoint_dir=str(folder / "ckpt"), log_dir=str(folder / "logs"), checkpoint_interval_s=0,
                    checkpoint_snapshot="overlapped" if overlapped else "blocking", node_name="bench")
    with trainsup.Supervisor(include_rng=False, **settings) as sup:
        t0_ns = time.monotonic_ns()
        t0 = time.perf_counter()
        outcome = sup.checkpoint(1, state)
        stall = time.perf_counter() - t0
        assert outcome == "started", outcome
        if overlapped:
            compute(model, compute_ms)
            w0 = time.perf_counter()
            sup.await_snapshot()  # what guard_optimizer does before the optimizer step
            stall += time.perf_counter() - w0
        committed = _committed(sup.event_log, 1)
        persist = (committed["mono_ns"] - t0_ns) / 1e9
    reference = {k: v.clone() for k, v in model.state_dict().items()}
    perturb(model)
    with trainsup.Supervisor(include_rng=False, **settings) as sup:
        t0 = time.perf_counter()
        step = sup.restore(state)
        restore = time.perf_counter() - t0
    assert step == 1 and same(model, reference), "trainsup restore gave back other parameters"
    return {"stall_s": stall, "persist_s": persist, "restore_s": restore}


SYSTEMS = {
    "torch.save": lambda m, o, d, c: torch_save(m, o, d, False, c),
    "torch.save+fsync": lambda m, o, d, c: torch_save(m, o, d, True, c),
    "dcp.save": lambda m, o, d, c: dcp_save(m, o, d, "sync", c),
    "dcp.async_save": lambda m, o, d, c: dcp_save(m, o, d, "thread", c),
    "dcp.async_save+process": lambda m, o, d, c: dcp_save(m, o, d, "process", c),
    "dcp.async_save+stager": lambda m, o, d, c: dcp_save(m, o, d, "stager", c),
    "trainsup": lambda m, o, d, c: trainsup_save(m, o, d, False, c),
    "trainsup+overlapped": lambda m, o, d, c: trainsup_save(m, o, d, True, c),
}
OURS = ("trainsup", "trainsup+overlapped")
NOT_DURABLE = ("torch.save",)  # returns before the data is on disk: no persist ratio against it


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mib", type=float, default=384)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--dir", default=None, help="where to write (default: a new folder under /tmp)")
    ap.add_argument("--compute-ms", type=float, default=200)
    ap.add_argument("--only", default="", help="comma-separated systems (default: all)")
    a = ap.parse_args()
    torch.set_num_threads(1)
    # A process group of one, as a training job has: DCP's process-based async_save needs one (its
    # background process joins it), and every system then runs as it would in a job.
    import torch.distributed as dist
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    if "MASTER_PORT" not in os.environ:
        import socket
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            os.environ["MASTER_PORT"] = str(sock.getsockname()[1])
    dist.init_process_group("gloo", rank=0, world_size=1)
    root = pathlib.Path(a.dir or tempfile.mkdtemp(prefix="trainsup-ckpt-vs-"))
    root.mkdir(parents=True, exist_ok=True)
    names = [n for n in SYSTEMS if not a.only or n in a.only.split(",")]
    model, opt, nbytes = build_state(a.mib)
    print(f"state: {nbytes / 2**20:.0f} MiB ({len(model)} layers + AdamW), dir {root}, {a.reps} rounds", flush=True)
    runs = {n: [] for n in names}
    errors = {}
    # DCP's process-based writer leaves its background process running (for the next save): it
    # goes after every round of the others, so that it cannot slow them down.
    late = [n for n in names if n == "dcp.async_save+process"]
    early = [n for n in names if n not in late]
    plan = [n for rep in range(a.reps) for n in (early if rep % 2 == 0 else list(reversed(early)))] + late * a.reps
    for rep, name in enumerate(plan):
        if name in errors:
            continue
        folder = root / f"{name}-{rep}"
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir(parents=True)
        try:
            runs[name].append(SYSTEMS[name](model, opt, folder, a.compute_ms))
        except Exception as e:  # the row says why, in the system's own words
            errors[name] = f"{type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else ''}"
            traceback.print_exc(limit=3, file=sys.stderr)
        finally:
            shutil.rmtree(folder, ignore_errors=True)
    med = {n: {k: statistics.median(r[k] for r in runs[n]) for k in ("stall_s", "persist_s", "restore_s")}
           for n in names if runs[n]}
    gib = nbytes / 2**30
    print(f"\n{'system':26} {'stall s':>9} {'persist s':>10} {'GiB/s':>7} {'restore s':>10}")
    for n in names:
        if n in med:
            m = med[n]
            print(f"{n:26} {m['stall_s']:9.3f} {m['persist_s']:10.3f} {gib / m['persist_s']:7.2f} {m['restore_s']:10.3f}")
        else:
            print(f"{n:26} cannot run here: {errors.get(n, 'no result')}")
    summary = {"state_mib": round(nbytes / 2**20), "reps": a.reps, "compute_ms": a.compute_ms,
               "median": {n: {k: round(v, 4) for k, v in m.items()} for n, m in med.items()},
               "range": {n: {k: [round(min(r[k] for r in runs[n]), 4), round(max(r[k] for r in runs[n]), 4)]
                             for k in ("stall_s", "persist_s", "restore_s")} for n in med},
               "errors": errors}
    alts = {n: m for n, m in med.items() if n not in OURS}
    ours = {n: m for n, m in med.items() if n in OURS}
    if alts and ours:
        for k in ("stall_s", "persist_s", "restore_s"):
            pool = [n for n in alts if k != "persist_s" or n not in NOT_DURABLE] or list(alts)
            best_alt = min(pool, key=lambda n: alts[n][k])
            best_ours = min(ours, key=lambda n: ours[n][k])
            summary[f"{k[:-2]}_ratio"] = round(ours[best_ours][k] / max(alts[best_alt][k], 1e-9), 3)
            summary[f"{k[:-2]}_best_alternative"] = best_alt
    for stager in _STAGERS.values():
        stager.close()
    if a.dir is None:
        shutil.rmtree(root, ignore_errors=True)
    dist.destroy_process_group()
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
