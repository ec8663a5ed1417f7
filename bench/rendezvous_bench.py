"""How torch's dynamic rendezvous (the c10d backend torchrun and trainsup.run use) grows with the
number of nodes, measured without the workers: N rendezvous handlers against one TCPStore.

    PYTHONPATH=build/bindings/python .venv/bin/python bench/rendezvous_bench.py --nodes 8,16,32,64,128

Why (issue 22): scale_bench.py restarts a whole job of simulated hosts on this 2-core machine,
where the workers' CPU contention hides the protocol's own cost past 8 hosts. Here only the
rendezvous runs: each node is a DynamicRendezvousHandler built as torchrun builds it
(C10dRendezvousBackend on a TCPStore client of its own, min = max = N nodes, so no last-call
wait), with trainsup.run's shortened polls, in three modes side by side (alternating, same
store): "torch" (torch's writes and reads as they are); "trainsup" (trainsup.run's pacing of
torch's protocol, its path when the fast restart falls back: the backoff after a lost write,
_compat.damp_rendezvous_contention, and the join counter that spares num_nodes_waiting a read
of the whole state, waiting.NodesWaiting); "fast" (as trainsup.run runs a restart after a fault:
that, plus the round written once by one survivor, launch/fast_round.py). The nodes live as
threads in --procs client processes; the store is a separate process, so its CPU time is its own.

Three phases per repeat, as a job sees them:
- "join": every node calls next_rendezvous at once (a job's start);
- "restart": every node restarts on the completed round (what every agent does when the job
  restarts after a fault: in torch's protocol its exit op, then its join op; in "fast" mode
  FastRestart, which must not fall back here);
- "steady": --steady-s seconds of training: each node asked every 0.1 s whether nodes wait.

Per round it counts the backend's operations (get_state; set_state, won or lost) and the bytes
each one moved, and times the round (the signal to the last node's return), the store
process's CPU and the clients' CPU. Past about 32 nodes the clients (128 handler threads on two
cores) are CPU-bound: the rounds measured there are this machine's, not the protocol's.

What the protocol does (torch's dynamic_rendezvous.py, read for this): the whole rendezvous
state (participants, wait list, heartbeats) is one pickled value that a node changes by
compare-and-set; a node whose write loses gets the current value back and tries again. N nodes
joining at once need N winning writes in sequence, each carrying and re-pickling the whole
state, which grows with N, while the others' writes lose. So the script also times the parts
(a compare-and-set of the state at k participants with its pickling: one link of the serial
chain; the state's size; the store's CPU per byte) and puts them into a model of a restart
round on separate hosts (see model() below), printed up to --extrapolate nodes (2,048: 16,384
GPUs at 8 per host), with power-law and quadratic fits of the measured rounds beside it.

The last line is one JSON object: {"bench": "rendezvous_bench", "rows": [...], "chain": {...},
"model": {...}, "fits": {...}, "ratios_over_torch": {...}}. `--out PATH` writes a scale
file for bench/goodput_model.py --scale-json: rendezvous_s per node count, the model's
(--scale-from estimate, the default, points marked "estimated") or the rounds measured here."""
import argparse
import json
import math
import os
import pickle
import statistics
import subprocess
import sys
import threading
import time

def _cpu_s(pid):
    """user + system CPU seconds of a process, from /proc."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


# ---------------------------------------------------------------------------------------------
# the store process


def serve_store():
    """Hosts the TCPStore; prints its port; exits when stdin closes."""
    import datetime
    from torch.distributed import TCPStore
    store = TCPStore("127.0.0.1", 0, None, True, datetime.timedelta(seconds=300), wait_for_workers=False)
    print(store.port, flush=True)
    sys.stdin.read()


# ---------------------------------------------------------------------------------------------
# a client process: `count` rendezvous nodes as threads


class _Counts:
    def __init__(self):
        self.lock = threading.Lock()
        self.reset()

    def reset(self):
        self.get = self.set_won = self.set_lost = 0
        self.bytes = 0

    def add(self, kind, nbytes):
        with self.lock:
            setattr(self, kind, getattr(self, kind) + 1)
            self.bytes += nbytes

    def snapshot(self):
        return {"get": self.get, "set_won": self.set_won, "set_lost": self.set_lost, "bytes": self.bytes}


def _counting_backend(store, run_id, counts):
    from torch.distributed.elastic.rendezvous.c10d_rendezvous_backend import C10dRendezvousBackend

    class Counting(C10dRendezvousBackend):
        def get_state(self):
            result = super().get_state()
            counts.add("get", len(result[0]) if result else 0)
            return result

        def set_state(self, state, token=None):
            result = super().set_state(state, token)
            won = bool(result and result[2])
            counts.add("set_won" if won else "set_lost", len(state) + (len(result[0]) if result else 0))
            return result

    return Counting(store, run_id)


def client(port, first, count, nodes, run_id, mode):
    """Runs nodes first..first+count-1 of a rendezvous of `nodes` (mode "torch": torch's
    handler with trainsup's shortened polls; "trainsup": as trainsup.run's agents run it, plus
    the backoff after a lost write, _compat.damp_rendezvous_contention, and the join counter
    that gates num_nodes_waiting, waiting.NodesWaiting); reads commands from stdin
    ("round NAME" or "steady NAME SECONDS"), answers one JSON line per command."""
    import datetime
    from torch.distributed import TCPStore
    from torch.distributed.elastic.rendezvous import RendezvousParameters
    from torch.distributed.elastic.rendezvous.dynamic_rendezvous import create_handler
    from torch.distributed import PrefixStore
    from trainsup.launch import _compat
    from trainsup.launch.fast_round import FastRestart
    from trainsup.launch.waiting import NodesWaiting

    _compat.prepare_environment()  # as trainsup.run's agents run it
    counts = _Counts()
    handlers, gates, fasts = [], [], []
    gate_store = PrefixStore("trainsup/", TCPStore("127.0.0.1", port, None, False, datetime.timedelta(seconds=300)))
    for i in range(first, first + count):
        store = TCPStore("127.0.0.1", port, None, False, datetime.timedelta(seconds=300))
        backend = _counting_backend(store, run_id, counts)
        params = RendezvousParameters(backend="c10d", endpoint=f"127.0.0.1:{port}", run_id=run_id,
                                      min_nodes=nodes, max_nodes=nodes, local_addr="127.0.0.1",
                                      join_timeout="600")
        handler = create_handler(store, backend, params)
        _compat.shorten_rendezvous_polls(handler)
        if mode in ("trainsup", "fast"):
            _compat.damp_rendezvous_contention(handler)
            gates.append(NodesWaiting(handler, gate_store, run_id))
        if mode == "fast":  # made with the handler, as the agent makes it
            fasts.append(FastRestart(handler, run_id))
        handlers.append(handler)
    go_store = TCPStore("127.0.0.1", port, None, False, datetime.timedelta(seconds=300))
    print(json.dumps({"ready": True}), flush=True)

    for line in sys.stdin:
        cmd = line.split()
        if not cmd or cmd[0] not in ("round", "steady"):
            break
        name = cmd[1]
        steady_s = float(cmd[2]) if cmd[0] == "steady" else 0.0
        counts.reset()
        ends = [0.0] * count
        errors = []
        go = threading.Event()

        def run(k):
            go.wait()
            try:
                if steady_s:
                    # torchrun's agent loop while its workers are healthy: a look every
                    # --monitor-interval (0.1 s), each followed by num_nodes_waiting(). The
                    # handler's keep-alive thread runs meanwhile, as in a job.
                    ask = gates[k] if gates else handlers[k].num_nodes_waiting
                    end = time.monotonic() + steady_s
                    while time.monotonic() < end:
                        if ask():
                            raise RuntimeError("a node waits in a complete round")
                        time.sleep(0.1)  # the monitor interval: pacing, not synchronisation
                else:
                    if gates:
                        gates[k].announce()
                    result = None
                    if mode == "fast" and name == "restart":
                        f = fasts[k]
                        result = f()
                        if sum(f.phases.values()) > 1.0:
                            print(f"slow fast restart on node{first + k}: {f.phases}", file=sys.stderr, flush=True)
                        if result is None:
                            raise RuntimeError(f"the fast restart fell back: {f.last}")
                    if result is None:
                        result = handlers[k].next_rendezvous()
                    _compat.unpack_rendezvous(result)
            except Exception as e:  # reported, the round then fails
                errors.append(f"node{first + k}: {type(e).__name__}: {e}")
            ends[k] = time.time()

        threads = [threading.Thread(target=run, args=(k,), daemon=True) for k in range(count)]
        for t in threads:
            t.start()
        print(json.dumps({"armed": name}), flush=True)  # every node's thread is started
        cpu0 = time.process_time()
        go_store.wait([f"go/{run_id}/{name}"])  # every client starts on the same signal
        go.set()
        for t in threads:
            t.join()
        print(json.dumps({"round": name, "ends": ends, "errors": errors, "counts": counts.snapshot(),
                          "cpu_s": time.process_time() - cpu0}), flush=True)
    for h in handlers:
        try:
            h._stop_heartbeats()
        except Exception:
            pass
    os._exit(0)


# ---------------------------------------------------------------------------------------------
# the serial chain's parts


def _state_at(k):
    """torch's rendezvous state as it is with k participants (and their heartbeats)."""
    from datetime import datetime, timezone
    from torch.distributed.elastic.rendezvous import dynamic_rendezvous as dr
    st = dr._RendezvousState()
    now = datetime.now(timezone.utc)
    for i in range(k):
        node = dr._NodeDesc(f"node{i}.cluster.example.com", 100000 + i, 0)
        st.participants[node] = i
        st.last_heartbeats[node] = now
    return st


def chain_step_s(k, port, store_pid, reps=30):
    """One link of the serial chain at k participants: pickle the state, compare-and-set it
    through the backend (the store's round trip with the blob both ways), unpickle the answer.
    Returns the median of `reps`, the state's size, and the store process's CPU seconds per
    byte it moved (received and sent) over the reps."""
    import datetime
    from torch.distributed import TCPStore
    from torch.distributed.elastic.rendezvous.c10d_rendezvous_backend import C10dRendezvousBackend
    store = TCPStore("127.0.0.1", port, None, False, datetime.timedelta(seconds=60))
    backend = C10dRendezvousBackend(store, f"chain-{k}")
    st = _state_at(k)
    token = None
    times, moved = [], 0
    cpu0 = _cpu_s(store_pid)
    for _ in range(reps):
        t0 = time.perf_counter()
        bits = pickle.dumps(st)
        result = backend.set_state(bits, token)
        pickle.loads(result[0])
        token = result[1]
        times.append(time.perf_counter() - t0)
        moved += len(bits) + len(result[0])
    return statistics.median(times), len(pickle.dumps(st)), (_cpu_s(store_pid) - cpu0) / moved


def fit(xs, ys):
    """Least squares y = a + b x, y = a + b x**2, and y = a x**b (in logs): each with its rms
    residual in y."""
    out = {}
    for name, f in (("linear", lambda x: x), ("quadratic", lambda x: x * x), ("power", math.log)):
        fx = [f(x) for x in xs]
        fy = [math.log(max(y, 1e-12)) for y in ys] if name == "power" else ys
        n = len(xs)
        mx, my = sum(fx) / n, sum(fy) / n
        sxx = sum((v - mx) ** 2 for v in fx)
        b = sum((v - mx) * (y - my) for v, y in zip(fx, fy)) / sxx if sxx else 0.0
        a = my - b * mx
        if name == "power":
            a = math.exp(a)
        entry = {"a": a, "b": b, "f": name}
        entry["rms"] = math.sqrt(sum((_eval(entry, x) - y) ** 2 for x, y in zip(xs, ys)) / n)
        out[name] = entry
    return out


def _eval(fitted, x):
    if fitted["f"] == "power":
        return fitted["a"] * x ** fitted["b"]
    return fitted["a"] + fitted["b"] * (x * x if fitted["f"] == "quadratic" else x)


# ---------------------------------------------------------------------------------------------


def measure(nodes, mode, procs, rep, port, store_pid, steady_s):
    rows = []
    if True:
        run_id = f"bench-{nodes}-{mode}-{rep}"
        per = [nodes // procs + (1 if i < nodes % procs else 0) for i in range(procs)]
        clients, first = [], 0
        for count in per:
            if count == 0:
                continue
            clients.append(subprocess.Popen(
                [sys.executable, __file__, "--client", str(port), str(first), str(count), str(nodes), run_id, mode],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True))
            first += count
        for c in clients:
            ready = c.stdout.readline()
            if not ready:
                raise SystemExit(f"rendezvous_bench: a client of {nodes} nodes did not start")
        import datetime
        from torch.distributed import TCPStore
        signal = TCPStore("127.0.0.1", port, None, False, datetime.timedelta(seconds=300))
        for name in ("join", "restart", "steady"):
            for c in clients:
                c.stdin.write(f"steady {name} {steady_s}\n" if name == "steady" else f"round {name}\n")
                c.stdin.flush()
            for c in clients:
                armed = c.stdout.readline()
                if not armed:
                    raise SystemExit(f"rendezvous_bench: a client of {nodes} nodes ended before round {name}")
            cpu_store0 = _cpu_s(store_pid)
            cpu_clients0 = sum(_cpu_s(c.pid) for c in clients)
            t0 = time.time()
            signal.set(f"go/{run_id}/{name}", "1")
            answers = [json.loads(c.stdout.readline()) for c in clients]
            errors = [e for a in answers for e in a["errors"]]
            if errors:
                raise SystemExit(f"rendezvous_bench: round {name} at {nodes} nodes failed: {errors[:3]}")
            end = max(max(a["ends"]) for a in answers)
            counts = {k: sum(a["counts"][k] for a in answers) for k in ("get", "set_won", "set_lost", "bytes")}
            rows.append({"nodes": nodes, "mode": mode, "repeat": rep, "round": name, "round_s": round(end - t0, 4),
                         "store_cpu_s": round(_cpu_s(store_pid) - cpu_store0, 4),
                         "clients_cpu_s": round(sum(_cpu_s(c.pid) for c in clients) - cpu_clients0, 4),
                         **counts})
        for c in clients:
            c.stdin.close()
            c.wait(timeout=60)
    return rows


def _print_rows(rows, n, modes):
    for mode in modes:
        sel = [r for r in rows if r["nodes"] == n and r["mode"] == mode and r["round"] == "steady"]
        med = lambda k: statistics.median(r[k] / r["round_s"] for r in sel)  # noqa: E731
        print(f"nodes {n:5d} {mode:8s} steady   per second: store ops {med('get') + med('set_won') + med('set_lost'):8.1f}"
              f"  moved MB {med('bytes') / 1e6:8.3f}  store cpu {med('store_cpu_s'):6.3f} s"
              f" (medians over {len(sel)} runs of {statistics.median(r['round_s'] for r in sel):.0f} s of training)",
              flush=True)
        for name in ("join", "restart"):
            sel = [r for r in rows if r["nodes"] == n and r["mode"] == mode and r["round"] == name]
            med = lambda k: statistics.median(r[k] for r in sel)  # noqa: E731
            print(f"nodes {n:5d} {mode:8s} {name:8s} round {med('round_s'):7.3f} s "
                  f"[{min(r['round_s'] for r in sel):.3f}-{max(r['round_s'] for r in sel):.3f}]  "
                  f"set won {med('set_won'):6.0f} lost {med('set_lost'):7.0f} get {med('get'):6.0f}  "
                  f"moved MB {med('bytes') / 1e6:8.2f}  store cpu {med('store_cpu_s'):6.3f} s  "
                  f"clients cpu {med('clients_cpu_s'):6.2f} s", flush=True)


def _measure_all(args, modes):
    """The rounds at every --nodes count (modes side by side) and the chain's parts."""
    store = subprocess.Popen([sys.executable, __file__, "--serve-store"], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True)
    port = int(store.stdout.readline())
    try:
        rows = []
        for n in [int(v) for v in args.nodes.split(",")]:
            for rep in range(args.repeats):
                for mode in modes:  # side by side, alternating
                    rows += measure(n, mode, min(args.procs, n), rep, port, store.pid, args.steady_s)
            _print_rows(rows, n, modes)
        chain = {}
        ks = sorted(int(v) for v in args.chain_nodes.split(","))
        for k in ks:
            # The largest point also times the store's CPU per byte: enough writes to move
            # about 300 MB, so that the kernel's 10 ms CPU ticks do not matter.
            reps = args.chain_reps if k != ks[-1] else max(args.chain_reps, math.ceil(3e8 / (2 * len(pickle.dumps(_state_at(k))))))
            step, size, per_byte = chain_step_s(k, port, store.pid, reps=reps)
            chain[k] = {"link_s": step, "state_bytes": size, "store_cpu_s_per_byte": per_byte, "reps": reps}
            print(f"chain link at {k:5d} participants: {step * 1e3:7.3f} ms (state {size} bytes)", flush=True)
        return rows, chain
    finally:
        store.stdin.close()
        store.wait(timeout=30)


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "--serve-store":
        return serve_store()
    if len(sys.argv) > 1 and sys.argv[1] == "--client":
        port, first, count, nodes, run_id, mode = sys.argv[2:8]
        return client(int(port), int(first), int(count), int(nodes), run_id, mode)
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nodes", default="8,16,32,64,128", help="node counts, comma-separated")
    ap.add_argument("--procs", type=int, default=4, help="client processes the nodes are spread over")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--chain-nodes", default="16,64,256,1024,2048",
                    help="node counts at which the serial chain's link is timed")
    ap.add_argument("--extrapolate", type=int, default=2048, help="nodes to extrapolate to")
    ap.add_argument("--steady-s", type=float, default=10.0,
                    help="seconds of the steady phase (nodes in a complete round, asked every 0.1 s "
                         "whether nodes wait, as torchrun's agent asks)")
    ap.add_argument("--chain-reps", type=int, default=100, help="timed links per --chain-nodes point")
    ap.add_argument("--scale-from", choices=("measured", "estimate"), default="estimate",
                    help="what --out's rendezvous_s is: the restart rounds measured on this machine, or "
                         "the separate-hosts estimate (max of serial chain and store time)")
    ap.add_argument("--scale-mode", choices=("torch", "trainsup", "fast"), default="torch",
                    help="which mode's figures --out writes (torch: the protocol's contention as it is; "
                         "trainsup: with --scale-from estimate, an ideal backoff, which trainsup's does not reach; "
                         "fast: the restart round written once, launch/fast_round.py)")
    ap.add_argument("--from-json", help="analyse the measurements of an earlier run (its output, with the "
                                        "JSON line) instead of measuring")
    ap.add_argument("--out", help="write a scale file for goodput_model.py --scale-json ({mode} in the "
                                  "path: one file per mode)")
    args = ap.parse_args()

    modes = ("torch", "trainsup", "fast")
    if args.from_json:  # the analysis again, on the measurements of an earlier run
        with open(args.from_json) as f:
            earlier = [json.loads(line) for line in f if line.startswith('{"bench": "rendezvous_bench"')][-1]
        rows = earlier["rows"]
        chain = {int(k): v for k, v in earlier["chain"]["links"].items()}
        for n in sorted({r["nodes"] for r in rows}):
            _print_rows(rows, n, modes)
    else:
        rows, chain = _measure_all(args, modes)
    ks = sorted(chain)

    n_x = args.extrapolate
    # The serial chain: a restart round needs two winning writes per node (leave, then join),
    # each one link at the participants of its time; links fitted linearly in k (a round trip
    # plus pickling a blob that grows with k). A lower bound on separate hosts, either mode.
    link_fit = fit(ks, [chain[k]["link_s"] for k in ks])["linear"]

    def chain_s(n):
        return 2 * sum(max(_eval(link_fit, k), 0.0) for k in range(1, n + 1))

    # The store's own time: the bytes a restart round moves through it (measured, extrapolated
    # by a power law) times its CPU per byte (timed on the largest blob). Lost writes are
    # undercounted here (two cores run fewer contenders at once than separate hosts would), so
    # this too is low.
    per_byte = chain[ks[-1]]["store_cpu_s_per_byte"]
    measured_ns = sorted({r["nodes"] for r in rows})

    def med(mode, name, key, n):
        sel = [r for r in rows if r["nodes"] == n and r["mode"] == mode and r["round"] == name]
        if key == "ops":
            return statistics.median(r["set_won"] + r["set_lost"] + r["get"] for r in sel)
        return statistics.median(r[key] for r in sel)

    fits = {}
    for mode in modes:
        for name in ("join", "restart"):
            fits.setdefault(mode, {})[name] = {
                key: {kind: {**v, f"at_{n_x}": _eval(v, n_x)}
                      for kind, v in fit(measured_ns, [med(mode, name, key, n) for n in measured_ns]).items()}
                for key in ("round_s", "ops", "bytes")}
    grid = sorted(set(measured_ns) | {g for g in (128, 256, 512, 1024) if g < n_x} | {n_x})

    # The separate-hosts model of a restart round (every node leaves, then joins), from the
    # constants measured above: the state's size S(k) and a link's time at k participants,
    # and the store's CPU per byte b. Two phases of N winning writes each; the i-th write of a
    # phase carries S(k_i) both ways, and
    # - "torch": every node still waiting to write tries at once, so the i-th win comes with
    #   the N - i others' lost writes, each also carrying the state both ways (O(N^3) bytes);
    # - "trainsup" (an ideal backoff): one lost write and one read per win (O(N^2) bytes), the best a
    #   backoff can do without changing the protocol (measured here it does less: see ratios).
    # Meanwhile the waiting nodes read the whole state every poll interval
    # (shorten_rendezvous_polls: min(1, max(0.1, N / 1000)) s), a load u = N S(N) b / poll of the
    # store's time that stretches the store's part by 1 / (1 - u); u >= 1 saturates the store.
    # round = fixed part (the smallest measured restart round: waits, thread starts)
    #         + max(serial chain, store time).
    # The state's size, pickled exactly at powers of two and interpolated between them.
    size_at = {k: len(pickle.dumps(_state_at(k))) for k in [2 ** i for i in range(0, 13)] + [n_x]}
    size_ks = sorted(size_at)
    size_fit = fit(size_ks, [size_at[k] for k in size_ks])["linear"]

    def size(k):
        lo = max([x for x in size_ks if x <= k], default=size_ks[0])
        hi = min([x for x in size_ks if x >= k], default=size_ks[-1])
        if hi == lo:
            return float(size_at[lo]) if k == lo else _eval(size_fit, k)
        return size_at[lo] + (size_at[hi] - size_at[lo]) * (k - lo) / (hi - lo)

    def model(mode, n):
        base_s = min(med(mode, "restart", "round_s", m) for m in measured_ns)
        poll_s = min(1.0, max(0.1, n / 1000.0))
        u = n * size(n) * per_byte / poll_s
        if mode == "fast":
            # One write of the new round (its read and compare-and-set), then every node reads
            # it once; the announcements and the done key are a few bytes each. No chain: one
            # link, and no node polls the whole state while it waits (the store notifies).
            moved = (n + 3) * size(n)
            store_s = moved * per_byte
            return {"round_s": base_s + max(max(_eval(link_fit, n), 0.0), store_s), "store_s": store_s,
                    "written_bytes": moved, "poll_load": 0.0}
        per_win = {"torch": lambda i: (n - i + 1) * 2 * size(i), "trainsup": lambda i: 5 * size(i)}[mode]
        written = 2 * sum(per_win(i) for i in range(1, n + 1))
        store_s = math.inf if u >= 1 else written * per_byte / (1 - u)
        return {"round_s": base_s + max(chain_s(n), store_s), "store_s": store_s, "written_bytes": written,
                "poll_load": u}

    def estimate_s(mode, n):
        m = model(mode, n)
        return m["round_s"], m["store_s"]

    print(f"\nlink fit: {link_fit['a'] * 1e3:.3f} ms + {link_fit['b'] * 1e6:.3f} us per participant; "
          f"store CPU {per_byte * 1e9:.2f} ns per byte moved")
    for mode in modes:
        for name in ("join", "restart"):
            for key, unit in (("round_s", "s"), ("ops", "store ops"), ("bytes", "bytes")):
                p, q = fits[mode][name][key]["power"], fits[mode][name][key]["quadratic"]
                print(f"{mode:7s} {name:8s} {key:8s} ~ N^{p['b']:.2f} (power fit, rms {p['rms']:.3g}): at {n_x} "
                      f"nodes {p[f'at_{n_x}']:.4g} {unit}; quadratic fit {q[f'at_{n_x}']:.4g} {unit} (rms {q['rms']:.3g})")
    print(f"\nstate {size_fit['a']:.0f} + {size_fit['b']:.1f} bytes per participant")
    print("restart round on separate hosts (model: smallest measured round + max(serial chain, store time); "
          "trainsup's backoff as an ideal one):")
    for n in grid:
        cells = []
        for mode in modes:
            total, store_s = estimate_s(mode, n)
            here = f", measured here {med(mode, 'restart', 'round_s', n):.3f}" if n in measured_ns else ""
            cells.append(f"{mode} {total:9.3f} s (store {store_s:8.3f}{here})")
        print(f"  {n:5d} nodes: chain {chain_s(n):8.3f} s, polls take {model('torch', n)['poll_load']:.0%} of the store; "
              + "; ".join(cells))
    ratios = {}
    for n in measured_ns:
        for mode in modes[1:]:
            r = {key: round(med(mode, "restart", key, n) / max(med("torch", "restart", key, n), 1e-9), 3)
                 for key in ("round_s", "ops", "bytes")}
            ratios.setdefault(str(n), {})[mode] = r
            print(f"{mode} / torch at {n:5d} nodes (restart round, medians): round {r['round_s']:.3f}, "
                  f"store ops {r['ops']:.3f}, bytes {r['bytes']:.3f}")

    # Steady state: the store's load while the job trains. Each node reads the whole state
    # r(N) times a second to answer num_nodes_waiting (torch mode: the holder's cache, which
    # trainsup.run shortened to max(0.1, min(1, N / 1000)) s; trainsup mode: NodesWaiting's
    # refresh, max(1, N / 64) s, plus a counter read of a few bytes) and sends its keep-alive
    # (torch's keep_alive_interval, 5 s by default): a read, then a write with the state both
    # ways. Lost keep-alive writes are left out: the model is low where nodes contend. The model is
    # printed beside the measurement at the measured node counts.
    def steady(mode, n):
        sel = [r for r in rows if r["nodes"] == n and r["mode"] == mode and r["round"] == "steady"]
        return statistics.median(r["bytes"] / r["round_s"] for r in sel)

    def steady_model(mode, n):
        reads = 1 / max(0.1, min(1.0, n / 1000)) if mode == "torch" else 1 / max(1.0, n / 64)  # trainsup, fast
        return n * (reads * size(n) + 3 * size(n) / 5.0)

    print("\nsteady state (training), bytes through the store a second, model (measured) and the store's CPU:")
    for n in grid:
        cells = []
        for mode in modes:
            bps = steady_model(mode, n)
            here = f" ({steady(mode, n) / 1e6:.3f} measured)" if n in measured_ns else ""
            cells.append(f"{mode} {bps / 1e6:9.3f} MB/s{here} = {bps * per_byte:6.3f} cores")
        print(f"  {n:5d} nodes: " + "; ".join(cells))
        if n in measured_ns:
            ratios.setdefault(str(n), {})["steady_bytes_trainsup"] = round(steady("trainsup", n) / max(steady("torch", n), 1e-9), 3)

    result = {"bench": "rendezvous_bench", "rows": rows,
              "steady_model_bytes_per_s": {mode: {str(n): steady_model(mode, n) for n in grid} for mode in modes},
              "chain": {"link_fit_a_s": link_fit["a"], "link_fit_b_s": link_fit["b"],
                        "links": {str(k): v for k, v in chain.items()},
                        "bound_s": {str(n): chain_s(n) for n in grid}},
              "store_cpu_s_per_byte": per_byte, "ratios_over_torch": ratios,
              "model": {mode: {str(n): model(mode, n) for n in grid} for mode in modes},
              "state_bytes_fit": size_fit,
              "fits": fits, "extrapolate": n_x}
    if args.out:
        # "{mode}" in the path writes one file per mode; otherwise --scale-mode's.
        for mode in (modes if "{mode}" in args.out else (args.scale_mode,)):
            points = []
            if args.scale_from == "estimate":  # the model's figures over the grid, up to --extrapolate
                for n in grid:
                    points.append({"hosts": n, "rendezvous_s": round(estimate_s(mode, n)[0], 4), "estimated": True})
            else:
                for n in measured_ns:
                    points.append({"hosts": n, "rendezvous_s": med(mode, "restart", "round_s", n),
                                   "store_ops_per_round": med(mode, "restart", "ops", n)})
            with open(args.out.replace("{mode}", mode), "w") as f:
                json.dump({"measured_hosts": 2, "source": f"rendezvous_bench ({mode}, {args.scale_from})",
                           "points": points}, f, indent=1)
    print(json.dumps(result))

if __name__ == "__main__":
    main()
