"""The GPU path of trainsup, proven on one real GPU (run through scripts/gpu-check.sh, which
builds trainsup first). Prints one JSON line; docs/gpu-validation.md explains each field.

Checks, each in a child process of its own with a time limit, so that a hang or a crash of one
is reported and the others still run:
  tracking  an all-reduce on an NCCL group of one rank, queued behind a long kernel, stays in
            flight in trainsup's collective tracker until the kernel ends, and its recorded
            duration covers the wait (ratio recorded / true, true = from the call until the
            kernel's own CUDA event is done, polled every 0.2 ms)
  abort     a rank whose tracked all-reduce is held on the device (queued behind an 8 s
            kernel) gets the coordinator's abort order (a communication_fault verdict over a
            fixed 3 s all-reduce budget); trainsup's ncclCommAbort runs on a registered NCCL
            communicator and succeeds, and the rank exits with EXIT_ABORTED (94) within a
            stated time. (A kernel waiting for a peer cannot be made on one GPU: see
            docs/gpu-validation.md.)
  nvml      the preflight reads the GPU's ECC, retired-page and row-remap counters, passes the
            healthy GPU, and the UUIDs it records, and the one the rank logs, are nvidia-smi's
  snapshot  a few GiB of CUDA state copied to pinned staging memory by a blocking checkpoint,
            at a rate compared with a plain device-to-host copy into pinned memory in the same
            run (target >= 0.9), and the training stall of an overlapped snapshot

--rehearse-cpu runs the same harness without a GPU (gloo; a second rank that holds back
stands in for the held kernel; CPU tensors): it proves the script, not the GPU path.
"""
import argparse
import ctypes
import json
import os
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

HERE = os.path.abspath(__file__)
LIMITS_S = {"tracking": 60, "abort": 90, "nvml": 60, "snapshot": 150, "warm": 60}  # 420 s in all, plus the build
ABORT_BUDGET_S = 3.0        # the fixed all-reduce budget the abort check's coordinator uses
ABORT_EXIT_WITHIN_S = 10.0  # stated: the rank exits this soon after the verdict
ABORT_KERNEL_S = 8.0        # the kernel the abort check's all-reduce waits behind (GPU)
SNAPSHOT_TARGET = 0.9       # trainsup's copy rate / plain cudaMemcpy into pinned memory


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def result(**fields):
    """A child's answer: one line the parent picks out of its output."""
    print("RESULT " + json.dumps(fields), flush=True)


def events_of(log_dir):
    out = []
    for root, _, files in os.walk(log_dir):
        for f in files:
            if f.endswith(".jsonl"):
                with open(os.path.join(root, f)) as fh:
                    out += [json.loads(line) for line in fh if line.strip()]
    return out


# ---------------------------------------------------------------- tracking
def sleep_cycles_per_s():
    """torch.cuda._sleep counts SM clock cycles: warm the clocks up (an idle GPU runs at a
    fraction of its boost clock), then time two 0.5 s kernels and take the faster rate, so that
    a kernel sized from it lasts at least as long as asked."""
    import torch
    torch.cuda._sleep(1_000_000_000)
    torch.cuda.synchronize()
    rates = []
    for _ in range(2):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        cycles = 1_000_000_000
        start.record()
        torch.cuda._sleep(cycles)
        end.record()
        end.synchronize()
        rates.append(cycles / (start.elapsed_time(end) / 1000.0))
    return max(rates)


def child_tracking(cpu):
    import torch
    import torch.distributed as dist
    import trainsup

    world = 2 if cpu else 1
    rank = int(os.environ.get("RANK", "0"))
    if cpu and rank == 0 and "MASTER_PORT" not in os.environ:
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), WORLD_SIZE="2")
        peer = subprocess.Popen([sys.executable, HERE, "--child", "tracking", "--rehearse-cpu"],
                                env=dict(os.environ, RANK="1"))
    else:
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", str(free_port()))
        os.environ.setdefault("WORLD_SIZE", str(world))
        peer = None
    os.environ["RANK"] = str(rank)
    hold_s = 4.5
    if cpu:
        trainsup.init_process_group("gloo", rank=rank, world_size=world)
        t = torch.ones(1 << 16)
    else:
        torch.cuda.set_device(0)
        trainsup.init_process_group("nccl", rank=0, world_size=1, device_id=torch.device("cuda", 0))
        t = torch.ones(1 << 20, device="cuda")
    for _ in range(5):
        dist.all_reduce(t)
    if cpu and rank == 1:
        time.sleep(hold_s)  # the held peer: joins the measured all-reduce late
        dist.all_reduce(t)
        dist.destroy_process_group()
        return
    sleep_event = None
    if not cpu:
        torch.cuda.synchronize()
        cycles_per_s = sleep_cycles_per_s()
        begin, sleep_event = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        begin.record()
        torch.cuda._sleep(int(cycles_per_s * hold_s))
        sleep_event.record()
    t_call = time.monotonic_ns()
    work = dist.all_reduce(t, async_op=True)
    record = trainsup.recent_collectives(1)[-1]
    views = []
    for at in (0.5, 2.0, 3.5):
        while time.monotonic_ns() < t_call + at * 1e9:
            time.sleep(0.01)
        now = [r for r in trainsup.recent_collectives(4) if r["seq"] == record["seq"]][0]
        views.append({"at_s": at, "exit_ns": now["exit_ns"], "pending": trainsup.collective_stats()["pending"],
                      "work_completed": work.is_completed()})
    # The true end, seen independently of the Work the tracker polls: the held kernel's own CUDA
    # event (GPU), or the late peer's join as the Work reports it (CPU rehearsal).
    t_kernel_end = None
    if sleep_event is not None:
        while not sleep_event.query():
            time.sleep(0.0002)
        t_kernel_end = time.monotonic_ns()
    while not work.is_completed():
        time.sleep(0.0002)
    t_done = time.monotonic_ns()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        final = [r for r in trainsup.recent_collectives(4) if r["seq"] == record["seq"]][0]
        if final["exit_ns"] != 0:
            break
        time.sleep(0.001)
    kernel_s = None
    if sleep_event is not None:
        sleep_event.synchronize()
        kernel_s = begin.elapsed_time(sleep_event) / 1000.0
    recorded_s = (final["exit_ns"] - final["enter_ns"]) / 1e9 if final["exit_ns"] > 0 else None
    true_s = ((t_kernel_end or t_done) - t_call) / 1e9
    result(record=final, views=views, true_s=round(true_s, 4), recorded_s=recorded_s and round(recorded_s, 4),
           kernel_s=kernel_s and round(kernel_s, 4), hold_s=hold_s,
           work_done_after_kernel_ms=round((t_done - t_kernel_end) / 1e6, 3) if t_kernel_end else None,
           exit_lag_ms=round((final["exit_ns"] - t_done) / 1e6, 3) if final["exit_ns"] > 0 else None,
           ratio=round(recorded_s / true_s, 4) if recorded_s else None, sum=float(t[0]))
    dist.destroy_process_group()
    if peer is not None:
        peer.wait(timeout=30)


def judge_tracking(r):
    in_flight = all(v["exit_ns"] == 0 and v["pending"] >= 1 and not v["work_completed"] for v in r["views"])
    ratio = r.get("ratio")
    held = r.get("kernel_s") is None or r["kernel_s"] > 3.6  # the kernel outlasted the last read
    return in_flight and held and r["record"]["ok"] and ratio is not None and 0.9 <= ratio <= 1.1, \
        (f"in flight at 0.5/2.0/3.5 s: {in_flight}; kernel {r.get('kernel_s')} s, recorded {r.get('recorded_s')} s, "
         f"true {r.get('true_s')} s: recorded/true = {ratio}")


# ---------------------------------------------------------------- abort
class NcclUniqueId(ctypes.Structure):
    _fields_ = [("internal", ctypes.c_char * 128)]  # passed by value, as nccl.h declares it


def load_nccl():
    """The libnccl torch loaded (dlopen by soname finds it), else the nvidia-nccl wheel's."""
    try:
        return ctypes.CDLL("libnccl.so.2")
    except OSError:
        import glob
        import site
        for root in site.getsitepackages() + sys.path:
            for path in glob.glob(os.path.join(root, "nvidia", "**", "libnccl.so.2"), recursive=True):
                return ctypes.CDLL(path)
        raise


class RawNccl:
    """A one-rank NCCL communicator of our own (ctypes), registered with trainsup's abort list
    so that the abort path's ncclCommAbort runs on a real communicator. (A kernel that waits for
    a peer cannot be parked on one GPU: NCCL refuses a receive from self without a matching send
    with ncclInvalidUsage, on the host.)"""

    def __init__(self, device):
        import torch
        self.lib = load_nccl()
        self.lib.ncclGetUniqueId.argtypes = [ctypes.POINTER(NcclUniqueId)]
        uid = NcclUniqueId()
        self._check(self.lib.ncclGetUniqueId(ctypes.byref(uid)), "ncclGetUniqueId")
        self.comm = ctypes.c_void_p()
        init = self.lib.ncclCommInitRank
        init.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_int, NcclUniqueId, ctypes.c_int]
        self._check(init(ctypes.byref(self.comm), 1, uid, 0), "ncclCommInitRank")

    def _check(self, rc, what):
        if rc != 0:
            self.lib.ncclGetErrorString.restype = ctypes.c_char_p
            raise RuntimeError(f"{what}: {self.lib.ncclGetErrorString(rc).decode()} ({rc})")



def child_abort_rank(cpu):
    """The supervised rank: its tracked all-reduce is held (GPU: queued behind an 8 s kernel;
    CPU: by a peer that never joins) until the coordinator's abort order ends the process."""
    import torch
    import torch.distributed as dist
    import trainsup

    probe_file = os.environ["GPU_CHECK_PROBE"]
    rank = int(os.environ["RANK"])
    probe = {"rank": rank}
    sup = trainsup.Supervisor(abort_grace_s=15, handle_signals=False)
    if not cpu:
        torch.cuda.set_device(0)
        probe["nccl_status"] = trainsup._trainsup._nccl_status()
        try:
            raw = RawNccl(torch.device("cuda", 0))
            trainsup._trainsup._register_nccl_communicator(raw.comm.value)
            probe["raw_comm"] = "ok"
        except Exception as e:  # reported: the judge then finds no nccl_abort event
            probe["raw_comm"] = f"{type(e).__name__}: {e}"

    def on_abort(section, step):
        # Runs after trainsup's ncclCommAbort of the registered communicators, before torch's
        # own abort (registered later, by init_process_group).
        probe["abort_callback_at_mono_ns"] = time.monotonic_ns()
        with open(probe_file, "w") as f:
            json.dump(probe, f)

    sup.add_abort_callback("gpu-check-probe", on_abort)
    if cpu:
        trainsup.init_process_group("gloo")
        t = torch.ones(1 << 16)
    else:
        trainsup.init_process_group("nccl", device_id=torch.device("cuda", 0))
        t = torch.ones(1 << 20, device="cuda")
    for _ in range(25):
        dist.all_reduce(t)
    if cpu and rank == 1:
        print("holding", flush=True)
        time.sleep(3600)  # never joins: the coordinator's abort order ends this process
    if not cpu:
        torch.cuda.synchronize()
        cycles_per_s = sleep_cycles_per_s()
        # Long enough to outlast detection (the 3 s budget), short enough that the aborts that
        # wait for the device (ncclCommAbort frees device memory) return within the stated time.
        torch.cuda._sleep(int(cycles_per_s * ABORT_KERNEL_S))
        probe["held_by"] = f"a {ABORT_KERNEL_S:g} s kernel"
    with open(probe_file, "w") as f:
        json.dump(probe, f)
    print("blocked", flush=True)
    dist.all_reduce(t)
    if not cpu:
        torch.cuda.synchronize()
    # Released: by the kernel's end, while the abort path is exiting the process with
    # EXIT_ABORTED, or by nothing, which the parent reports. This thread does not close the
    # Supervisor under the abort path's feet.
    print("released", flush=True)
    time.sleep(300)


def child_abort(cpu):
    """The agent side: the node services (node monitor + coordinator) and the rank(s)."""
    from trainsup.launch.node_services import NodeServices
    import trainsup

    world = 2 if cpu else 1
    work = tempfile.mkdtemp(prefix="gpu-check-abort-")
    services = NodeServices(None, "gpu-check", socket.gethostname(), world, os.path.join(work, "sock"),
                            hang_floor_s=1.0, collective_budgets=f"allreduce={ABORT_BUDGET_S:g}")
    port = free_port()
    procs = []
    for rank in range(world):
        env = dict(os.environ, RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank),
                   LOCAL_WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
                   TRAINSUP_LOG_DIR=os.path.join(work, "logs"), TRAINSUP_LOG_STDERR="0", TRAINSUP_JOB_ID="gpu-check",
                   GPU_CHECK_PROBE=os.path.join(work, f"probe-{rank}.json"), **services.rank_env)
        env.pop("NCCL_DEBUG", None)  # NCCL's own prints would share the pipe the harness reads
        procs.append(subprocess.Popen([sys.executable, HERE, "--child", "abort_rank"] + (["--rehearse-cpu"] if cpu else []),
                                      env=env, stdout=subprocess.PIPE, bufsize=0))
    t_blocked = None
    said = b""
    fd = procs[0].stdout.fileno()
    deadline = time.monotonic() + 90
    while t_blocked is None and time.monotonic() < deadline:
        ready, _, _ = select.select([fd], [], [], max(0.0, deadline - time.monotonic()))
        if not ready:
            continue
        chunk = os.read(fd, 4096)
        if not chunk:
            break  # the rank ended before it was blocked
        said += chunk
        if b"blocked\n" in said:
            t_blocked = time.monotonic()
    codes = [None] * world
    verdict = None
    deadline = time.monotonic() + 60
    gone_at = None
    while time.monotonic() < deadline:
        verdict = verdict or services.first_verdict()
        codes = [p.poll() for p in procs]
        if None not in codes:
            gone_at = gone_at or time.monotonic()
            # The verdict is published within a tick (0.2 s) of being reached: 2 s is plenty.
            if verdict is not None or time.monotonic() - gone_at > 2:
                break
        time.sleep(0.005)
    for i, p in enumerate(procs):
        if codes[i] is None:
            p.kill()
            p.wait()
            codes[i] = p.returncode
    t_exit = time.monotonic()
    rest = (said + procs[0].stdout.read()).decode(errors="replace")
    services.close()
    probe = {}
    try:
        with open(os.path.join(work, "probe-0.json")) as f:
            probe = json.load(f)
    except (OSError, ValueError):
        pass
    events = [e for e in events_of(os.path.join(work, "logs")) if e.get("rank", 0) == 0]
    picked = {e["event"]: {k: v for k, v in e.items() if k not in ("host", "pid", "job")}
              for e in events if e["event"] in ("abort_ordered", "nccl_abort", "abort_callback", "exit")}
    # Times on the one monotonic clock of this host: the parent's (time.monotonic) and the rank's
    # event log (mono_ns) are both CLOCK_MONOTONIC.
    ordered = picked.get("abort_ordered", {}).get("mono_ns")
    exited = picked.get("exit", {}).get("mono_ns")
    result(world=world, blocked=t_blocked is not None, verdict=verdict and {k: verdict.get(k) for k in
                                                                             ("kind", "ranks", "hosts", "evidence")},
           detect_s=round(ordered / 1e9 - t_blocked, 3) if ordered and t_blocked else None,
           exit_after_order_s=round((exited - ordered) / 1e9, 4) if ordered and exited else None,
           process_gone_after_order_s=round(t_exit - ordered / 1e9, 3) if ordered else None,
           exit_codes=codes, expected_code=trainsup.EXIT_ABORTED, probe=probe, events=picked,
           rank_output_tail=rest[-500:])
    shutil.rmtree(work, ignore_errors=True)


def judge_abort(r, cpu):
    import trainsup
    gone = r["process_gone_after_order_s"]
    ok = (r["blocked"] and r["verdict"] is not None and r["exit_codes"][0] == trainsup.EXIT_ABORTED
          and gone is not None and gone <= ABORT_EXIT_WITHIN_S)
    why = (f"verdict {r['verdict'] and r['verdict']['kind']}, abort order {r['detect_s']} s after the block "
           f"(budget {ABORT_BUDGET_S:g} s); rank exit codes {r['exit_codes']}; exit event {r['exit_after_order_s']} s "
           f"and process gone {gone} s after the order (stated: <= {ABORT_EXIT_WITHIN_S:g} s, "
           f"code {trainsup.EXIT_ABORTED})")
    if not cpu:
        nccl = r["events"].get("nccl_abort", {})
        ok = ok and nccl.get("aborted", 0) >= 1 and nccl.get("failed", 1) == 0
        why += (f"; held by {r['probe'].get('held_by')}; trainsup's ncclCommAbort of a registered communicator: "
                f"{ {k: nccl.get(k) for k in ('aborted', 'failed', 'error')} if nccl else 'not called'}; "
                f"NCCL: {r['probe'].get('nccl_status')}, communicator: {r['probe'].get('raw_comm')}")
    return ok, why


# ---------------------------------------------------------------- nvml
def child_nvml(cpu):
    from trainsup.launch import preflight
    import trainsup

    records, note = preflight.gpu_records()
    healthy, details, bad = preflight.run(command="")
    smi = []
    try:
        text = subprocess.run(["nvidia-smi", "--query-gpu=index,uuid,pci.bus_id,name,driver_version",
                               "--format=csv,noheader"], capture_output=True, text=True, timeout=30).stdout
        smi = [dict(zip(("index", "uuid", "pci_bus_id", "name", "driver"), (x.strip() for x in line.split(","))))
               for line in text.splitlines() if line.strip()]
    except (OSError, subprocess.TimeoutExpired) as e:
        note += f"; nvidia-smi: {e}"
    # The GPU identity a rank logs (describeLocalGpu through the CUDA runtime).
    logs = tempfile.mkdtemp(prefix="gpu-check-nvml-")
    env = dict(os.environ, TRAINSUP_LOG_DIR=logs, TRAINSUP_LOG_STDERR="0", RANK="0", WORLD_SIZE="1", LOCAL_RANK="0")
    subprocess.run([sys.executable, "-c", "import trainsup; trainsup.Supervisor(handle_signals=False).close()"],
                   env=env, timeout=60, check=False)
    start = [e for e in events_of(logs) if e["event"] == "supervisor_start"]
    shutil.rmtree(logs, ignore_errors=True)
    rank_gpu = {k: start[0].get(k) for k in ("gpu_index", "gpu_uuid", "gpu_pci_bus_id", "gpu_status")} if start else {}
    result(records=records, note=note, healthy=healthy, details=details, bad=bad, smi=smi, rank_gpu=rank_gpu,
           version=trainsup.__version__)


def judge_nvml(r, cpu):
    if cpu:  # no GPU: the preflight must say it skipped, pass the host, and the rank must say why
        ok = r["healthy"] and not r["records"] and "skipped" in r["note"] and r["rank_gpu"].get("gpu_status", "ok") != "ok"
        return ok, f"no GPU: preflight note '{r['note']}', rank's GPU status '{r['rank_gpu'].get('gpu_status')}'"
    smi_uuids = {g["uuid"] for g in r["smi"]}
    rec_uuids = {g["uuid"] for g in r["records"]}
    read = all(g.get("ecc_uncorrected") is not None or g.get("remapped_rows") is not None for g in r["records"])
    ok = (r["healthy"] and r["records"] and rec_uuids == smi_uuids and read
          and r["rank_gpu"].get("gpu_uuid") in smi_uuids)
    return bool(ok), (f"{len(r['records'])} GPU(s), healthy={r['healthy']}, counters read={read}, preflight UUIDs == "
                      f"nvidia-smi's: {rec_uuids == smi_uuids}, rank's UUID {r['rank_gpu'].get('gpu_uuid')} in them: "
                      f"{r['rank_gpu'].get('gpu_uuid') in smi_uuids}")


# ---------------------------------------------------------------- snapshot
def child_snapshot(cpu):
    import torch
    import trainsup

    gib = float(os.environ.get("GPU_CHECK_SNAPSHOT_GIB", "0.25" if cpu else "4"))
    device = torch.device("cpu") if cpu else torch.device("cuda", 0)
    if not cpu:
        torch.cuda.set_device(0)
    n_tensors = 16
    per = int(gib * (1 << 30) / n_tensors / 4)
    state = {f"w{i}": torch.randn(per, device=device) for i in range(n_tensors)}
    total = per * 4 * n_tensors
    shm = "/dev/shm"
    base = shm if os.path.isdir(shm) and shutil.disk_usage(shm).free > 3 * total else tempfile.gettempdir()
    ckpt = tempfile.mkdtemp(prefix="gpu-check-ckpt-", dir=base)
    logs = tempfile.mkdtemp(prefix="gpu-check-logs-")
    os.environ.update(TRAINSUP_LOG_DIR=logs, TRAINSUP_LOG_STDERR="0", RANK="0", WORLD_SIZE="1", LOCAL_RANK="0")

    def sync():
        if not cpu:
            torch.cuda.synchronize()

    # Plain copies into pinned memory (one cudaMemcpy per tensor, like the checkpointer's), in this run.
    pinned = torch.empty(total, dtype=torch.uint8, pin_memory=not cpu)
    plain = []
    for _ in range(3):
        sync()
        t0 = time.perf_counter()
        off = 0
        for t in state.values():
            nb = t.numel() * 4
            pinned[off:off + nb].copy_(t.view(torch.uint8))
            off += nb
        sync()
        plain.append(time.perf_counter() - t0)
    del pinned

    # Blocking snapshots: the first pins its staging memory; later ones reuse it.
    stalls = []
    with trainsup.Supervisor(checkpoint_dir=ckpt, checkpoint_keep=1, checkpoint_busy_policy="wait",
                             checkpoint_snapshot="blocking", handle_signals=False, include_rng=False) as sup:
        for step in (1, 2, 3):
            sup.checkpoint(step, state)
        log = sup.event_log
    ev = events_of(logs)
    snaps = [e for e in ev if e["event"] == "checkpoint_snapshot"]
    staging = [e for e in ev if e["event"] == "checkpoint_staging"]
    stalls = [e["stall_s"] for e in snaps]

    # Overlapped: training steps (matmuls, or a CPU loop) run while the copy proceeds.
    shutil.rmtree(logs, ignore_errors=True)
    logs = tempfile.mkdtemp(prefix="gpu-check-logs-")
    os.environ["TRAINSUP_LOG_DIR"] = logs
    n = 8192 if not cpu else 512
    a = torch.randn(n, n, device=device, dtype=torch.bfloat16 if not cpu else torch.float32)
    b = torch.randn_like(a)

    def train_step():
        for _ in range(40 if not cpu else 4):  # ~50 ms on an H100/H200
            c = a @ b
        sync()
        return c

    for _ in range(3):
        train_step()
    base_steps = []
    for _ in range(10):
        t0 = time.perf_counter()
        train_step()
        base_steps.append(time.perf_counter() - t0)
    with trainsup.Supervisor(checkpoint_dir=ckpt, checkpoint_keep=1, checkpoint_busy_policy="wait",
                             checkpoint_snapshot="overlapped", handle_signals=False, include_rng=False) as sup:
        sup.checkpoint(10, state)  # pins the staging memory; not measured
        sup.await_snapshot()
        committed = os.path.join(ckpt, trainsup._trainsup.checkpoint_dir_name(10))
        deadline = time.monotonic() + 60
        while not os.path.isdir(committed) and time.monotonic() < deadline:
            time.sleep(0.01)  # the persist of step 10, so that step 11's copy runs alone
        # As with guard_optimizer: the save at the step boundary, the next step's forward and
        # backward (here: its matmuls) overlapping the copy, then the optimizer step waits for it.
        t0 = time.perf_counter()
        sup.checkpoint(11, state)
        save_call_s = time.perf_counter() - t0
        t1 = time.perf_counter()
        train_step()
        during = [time.perf_counter() - t1]
        t1 = time.perf_counter()
        sup.await_snapshot()
        await_s = time.perf_counter() - t1
    ev = [e for e in events_of(logs) if e["event"] == "checkpoint_snapshot" and e.get("step") == 11]
    shutil.rmtree(logs, ignore_errors=True)
    shutil.rmtree(ckpt, ignore_errors=True)
    med = sorted(base_steps)[len(base_steps) // 2]
    extra = sum(max(0.0, d - med) for d in during)
    waited = ev[0].get("waited_s", 0.0) if ev else 0.0  # the end of step 10's persist, not the copy
    best_plain = min(plain)
    steady = min(stalls[1:]) if len(stalls) > 1 else None
    result(bytes=total, checkpoint_dir_base=base, plain_copy_s=[round(x, 4) for x in plain],
           plain_gb_s=round(total / best_plain / 1e9, 2),
           staging=[{k: e.get(k) for k in ("bytes", "pinned")} for e in staging],
           blocking_stall_s=[round(x, 4) for x in stalls],
           trainsup_gb_s=round(total / steady / 1e9, 2) if steady else None,
           ratio=round(best_plain / steady, 3) if steady else None,
           overlapped={"save_call_s": round(save_call_s, 4), "await_s": round(await_s, 4),
                       "step_s_median": round(med, 4),
                       "extra_step_s": round(extra, 4), "waited_s": round(waited, 4),
                       "stall_s": round(save_call_s - waited + await_s + extra, 4),
                       "event": ev[0] if ev else None})


def judge_snapshot(r, cpu):
    ok = r["ratio"] is not None and r["ratio"] >= SNAPSHOT_TARGET and (cpu or all(s["pinned"] for s in r["staging"]))
    return ok, (f"{r['bytes'] / 2**30:.2f} GiB: trainsup {r['trainsup_gb_s']} GB/s vs plain copy {r['plain_gb_s']} "
                f"GB/s, ratio {r['ratio']} (target >= {SNAPSHOT_TARGET}); staging pinned: "
                f"{[s['pinned'] for s in r['staging']]}; overlapped stall {r['overlapped']['stall_s']} s "
                f"(blocking {min(r['blocking_stall_s'][1:] or [0])} s)")


# ---------------------------------------------------------------- harness
# ---------------------------------------------------------------- warm worker start
WARM_WORKER = """
import json, os, sys, time
import torch
out = {"pid": os.getpid(), "cuda": torch.cuda.is_available()}
if out["cuda"]:
    x = torch.ones(1 << 20, device="cuda")
    out["sum"] = float(x.sum())
    out["device"] = torch.cuda.get_device_name(0)
print("WARM " + json.dumps(out), flush=True)
"""


def child_warm(cpu):
    """A worker forked from trainsup-run's zygote (trainsup/launch/zygote.py), which imported
    torch, torch._dynamo and trainsup first, must be able to use CUDA: the zygote must not have
    initialised the CUDA driver. Also times the warm start against a cold one."""
    from trainsup.launch import zygote as _z
    d = tempfile.mkdtemp(prefix="gpu-check-warm-")
    sock = os.path.join(d, "z.sock")
    script = os.path.join(d, "worker.py")
    with open(script, "w") as f:
        f.write(WARM_WORKER)
    z = subprocess.Popen([sys.executable, "-m", "trainsup.launch.zygote", sock], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, start_new_session=True)
    client = os.path.join(os.path.dirname(os.path.abspath(_z.__file__)), "warm_client.py")
    try:
        ready = z.stdout.readline().strip()
        runs = {}
        # The first warm start also waits for the zygote's imports; the second is the one timed.
        for kind, cmd in (("first", [sys.executable, "-u", client, sock, script]),
                          ("warm", [sys.executable, "-u", client, sock, script]),
                          ("cold", [sys.executable, "-u", script])):
            t0 = time.monotonic()
            p = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
            took = time.monotonic() - t0
            line = [x for x in p.stdout.splitlines() if x.startswith("WARM ")]
            runs[kind] = {"rc": p.returncode, "seconds": round(took, 3),
                          "out": json.loads(line[-1][5:]) if line else None, "stderr": p.stderr[-800:]}
        z.kill()
        zygote_err = z.communicate(timeout=10)[1][-800:]
    finally:
        if z.poll() is None:
            z.kill()
        shutil.rmtree(d, ignore_errors=True)
    result(ready=ready, runs=runs, zygote_stderr=zygote_err, cold_fallback="start cold" in runs["warm"]["stderr"])


def judge_warm(r, cpu):
    w, c = r["runs"]["warm"], r["runs"]["cold"]
    ok = r["ready"] == "listening" and w["rc"] == 0 and c["rc"] == 0 and w["out"] and not r["cold_fallback"]
    if not cpu:
        ok = ok and w["out"].get("cuda") and w["out"].get("sum") == float(1 << 20)
    return bool(ok), (f"warm worker rc {w['rc']} in {w['seconds']} s (cold {c['seconds']} s), CUDA in the forked "
                      f"worker: {w['out'] and w['out'].get('cuda')}, fell back to cold: {r['cold_fallback']}; "
                      f"zygote said: {r['zygote_stderr'].strip()[-200:]}")


CHILDREN = {"tracking": child_tracking, "abort": child_abort, "abort_rank": child_abort_rank, "nvml": child_nvml,
            "snapshot": child_snapshot, "warm": child_warm}
JUDGES = {"tracking": lambda r, cpu: judge_tracking(r), "abort": judge_abort, "nvml": judge_nvml,
          "snapshot": judge_snapshot, "warm": judge_warm}


def run_child(name, cpu, out):
    """Runs one check in a process group of its own; past its limit the whole group is killed,
    so that no rank of a hung check holds the GPU for the next one."""
    cmd = [sys.executable, HERE, "--child", name] + (["--rehearse-cpu"] if cpu else [])
    t0 = time.monotonic()
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        text, _ = p.communicate(timeout=LIMITS_S[name])
        rc = p.returncode
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        text, _ = p.communicate()
        rc = f"killed at its limit of {LIMITS_S[name]} s"
    else:
        try:
            os.killpg(p.pid, signal.SIGKILL)  # anything it left behind
        except ProcessLookupError:
            pass
    took = round(time.monotonic() - t0, 1)
    if out:
        with open(os.path.join(out, f"gpu-check-{name}.log"), "w") as f:
            f.write(text)
    lines = [line[len("RESULT "):] for line in text.splitlines() if line.startswith("RESULT ")]
    if not lines:
        return {"passed": False, "why": f"no result (exit {rc}); output tail: {text[-1500:]}", "seconds": took}
    r = json.loads(lines[-1])
    try:
        passed, why = JUDGES[name](r, cpu)
    except Exception as e:  # a judge that cannot read the result is a failed check, said so
        passed, why = False, f"judging failed: {type(e).__name__}: {e}"
    return {"passed": bool(passed), "why": why, "seconds": took, "result": r}


def environment(cpu):
    import torch
    env = {"date": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "host": socket.gethostname(), "python": sys.version.split()[0],
           "torch": torch.__version__, "torch_cuda": torch.version.cuda}
    try:
        import trainsup
        env["trainsup"] = trainsup.__version__
        env["tracking_layer"] = trainsup.distributed.tracking_available()
    except Exception as e:
        env["trainsup"] = f"import failed: {e}"
    if not cpu:
        env["gpu"] = torch.cuda.get_device_name(0)
        try:
            v = torch.cuda.nccl.version()
            env["nccl"] = ".".join(map(str, v)) if isinstance(v, tuple) else str(v)
        except Exception as e:
            env["nccl"] = f"unknown: {e}"
        try:
            env["driver"] = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                                           capture_output=True, text=True, timeout=30).stdout.strip()
        except (OSError, subprocess.TimeoutExpired) as e:
            env["driver"] = str(e)
    return env


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--child")
    ap.add_argument("--rehearse-cpu", action="store_true")
    ap.add_argument("--out")
    ap.add_argument("--build-seconds", type=float)
    ap.add_argument("--only", help="comma-separated checks to run (default: all)")
    a = ap.parse_args()
    if a.child:
        CHILDREN[a.child](a.rehearse_cpu)
        return 0
    import torch
    if not a.rehearse_cpu and not torch.cuda.is_available():
        line = {"gpu_found": False, "passed": False,
                "reason": f"torch {torch.__version__} sees no CUDA device: nothing of the GPU path was checked"}
        print("[gpu-check] NO GPU FOUND", file=sys.stderr)
        print(json.dumps(line))
        return 3
    t0 = time.monotonic()
    report = {"mode": "cpu-rehearsal (proves the script, not the GPU path)" if a.rehearse_cpu else "gpu",
              "gpu_found": not a.rehearse_cpu, "environment": environment(a.rehearse_cpu),
              "build_s": a.build_seconds, "checks": {}}
    names = a.only.split(",") if a.only else ["nvml", "tracking", "abort", "snapshot", "warm"]
    for name in names:
        print(f"[gpu-check] {name} ...", file=sys.stderr, flush=True)
        report["checks"][name] = run_child(name, a.rehearse_cpu, a.out)
        c = report["checks"][name]
        print(f"[gpu-check] {name}: {'PASS' if c['passed'] else 'FAIL'} ({c['seconds']} s): {c['why']}",
              file=sys.stderr, flush=True)
        report["checks_s"] = round(time.monotonic() - t0, 1)
        report["passed"] = len(report["checks"]) == len(names) and all(c["passed"] for c in report["checks"].values())
        line = json.dumps(report)
        if a.out:  # after every check: a run cut short still leaves what it found
            with open(os.path.join(a.out, "gpu-check.json"), "w") as f:
                f.write(line + "\n")
    print(line)
    return 0 if report["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
