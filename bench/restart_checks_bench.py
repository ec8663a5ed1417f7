"""What an agent's checks cost while a restart round forms, per poll, at 16 to 1,024 hosts.

    PYTHONPATH=build/bindings/python .venv/bin/python bench/restart_checks_bench.py --hosts 16,64,256,1024

While a round forms, every agent asks at each poll of the rendezvous which of the last round's
hosts can come back (launch/expedite.py expected_back, also FastRestart's survivors) and whether
the allocation still has enough hosts (launcher._allocation_exhausted): both look at each host's
quarantine record and its agent's liveness keys. Asked host by host (Quarantine.get,
HostLiveness.current_node: a file open and up to three store reads per host) that is O(hosts)
store reads per agent per poll, O(hosts^2) on the job's one store. Batched
(Quarantine.records, HostLiveness.current_nodes) each costs one store read and one stat while
nothing changes. Both ways are measured side by side here, alternating, on one TCPStore served
by a process of its own, with hosts registered as the agents register themselves and two of them
quarantined (records on disk and in the store).

Per host count: store operations and wall time of one poll's checks (both functions) in each
way (median of --reps), and the job's store load if every agent polls at the rendezvous's pace
(trainsup.run's: min(1, max(0.1, hosts / 1000)) s). The last line is one JSON object:
{"bench": "restart_checks_bench", "rows": [...]}."""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import torch.distributed as dist

from trainsup.launch.liveness import HostLiveness
from trainsup.ports import free_port
from trainsup.quarantine import Quarantine

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "python"))
from counting_store import CountingStore  # noqa: E402  (shared with the tests)


def serve(port):
    store = dist.TCPStore("127.0.0.1", port, is_master=True, wait_for_workers=False, use_libuv=True)
    sys.stdin.read()  # until the bench closes our stdin
    del store


def poll_s(hosts):
    return min(1.0, max(0.1, hosts / 1000.0))


def measure(n, reps, port):
    run = f"bench-{n}-{time.monotonic_ns()}"
    base = dist.TCPStore("127.0.0.1", port, is_master=False, wait_for_workers=False, use_libuv=True)
    store = CountingStore(base)
    hosts = [f"h{i:04d}" for i in range(n)]
    for i, h in enumerate(hosts[1:], 1):  # the other agents register (node key, counter, agent list)
        HostLiveness(base, run, h, [h, i, 0], lambda *a: None, start=False)
    me = HostLiveness(store, run, hosts[0], [hosts[0], 0, 0], lambda *a: None, start=False)
    with tempfile.TemporaryDirectory() as d:
        q = Quarantine(d, store)
        for h in hosts[1:3]:
            q.add(h, reason="bench", verdict="hung_rank")
        past = time.time() - 10
        os.utime(d, (past, past))  # the directory's last change is settled (as between faults)
        others = hosts[1:]

        def per_host():
            # expected_back + _allocation_exhausted, host by host
            for group in (hosts, others):
                [me.current_node(h) for h in group]
                [q.get(h) for h in group]

        def batched():
            for group in (hosts, others):
                me.current_nodes(group)
                q.records(group)

        batched()  # first call fills the caches (as the first poll of a restart does)
        rows = {"per_host": ([], []), "batched": ([], [])}
        for _ in range(reps):
            for name, fn in (("per_host", per_host), ("batched", batched)):
                before, t = store.ops, time.perf_counter()
                fn()
                rows[name][1].append(time.perf_counter() - t)
                rows[name][0].append(store.ops - before)
    out = {"hosts": n, "poll_s": poll_s(n)}
    for name, (ops, secs) in rows.items():
        out[f"{name}_ops_per_poll"] = statistics.median(ops)
        out[f"{name}_s_per_poll"] = round(statistics.median(secs), 6)
        out[f"{name}_s_range"] = [round(min(secs), 6), round(max(secs), 6)]
        out[f"{name}_job_store_ops_per_s"] = round(n * statistics.median(ops) / poll_s(n))
    out["ops_ratio_batched_over_per_host"] = round(out["batched_ops_per_poll"] / out["per_host_ops_per_poll"], 5)
    out["time_ratio_batched_over_per_host"] = round(out["batched_s_per_poll"] / out["per_host_s_per_poll"], 4)
    return out


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--hosts", default="16,64,256,1024")
    p.add_argument("--reps", type=int, default=7)
    args = p.parse_args()
    port = free_port()
    server = subprocess.Popen([sys.executable, __file__, "--serve", str(port)], stdin=subprocess.PIPE)
    try:
        rows = []
        for n in [int(x) for x in args.hosts.split(",")]:
            r = measure(n, args.reps, port)
            rows.append(r)
            print(f"{n:5d} hosts: per poll, host by host {r['per_host_ops_per_poll']:6.0f} store ops "
                  f"{r['per_host_s_per_poll'] * 1e3:8.2f} ms; batched {r['batched_ops_per_poll']:3.0f} ops "
                  f"{r['batched_s_per_poll'] * 1e3:6.3f} ms (x{r['time_ratio_batched_over_per_host']:.4f}); "
                  f"the job's store at {r['poll_s']:.2f} s polls: {r['per_host_job_store_ops_per_s']:,} vs "
                  f"{r['batched_job_store_ops_per_s']:,} ops/s", flush=True)
        print(json.dumps({"bench": "restart_checks_bench", "rows": rows}))
    finally:
        server.stdin.close()
        server.wait(30)


if __name__ == "__main__":
    if sys.argv[1:2] == ["--serve"]:
        serve(int(sys.argv[2]))
    else:
        main()
