"""Network faults between simulated hosts with networks of their own (one Linux network
namespace per host: examples/launch/network_scenario.py). Needs root and iproute2 (and
iptables for the lossy cases). Runs every case and prints a line of figures for each, then one
JSON line: what was named, how soon, whether the job finished, and whether any healthy host was
blamed.

  PYTHONPATH=build/bindings/python .venv/bin/python bench/network_bench.py [--steps 500]
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCENARIO = os.path.join(REPO, "examples", "launch", "network_scenario.py")

CASES = [  # (name, scenario, extra args, the hosts a right verdict may name)
    ("link_cut", "link_cut", [], {"host-b"}),
    ("coordinator_cut (etcd-v2)", "coordinator_cut", [], None),  # the victim is whichever host ran it
    ("store_cut (c10d)", "store_cut", [], set()),
    ("heal 2 s", "heal", ["--fault-s", "2"], set()),
    ("heal 4 s", "heal", ["--fault-s", "4"], set()),
    # host-b's outgoing packets: the share lost, the rest delayed 200 ms (netshape.py). The host
    # whose link is lossy may be named (its NIC, cable or port is the fault); no other.
    ("lossy 10%", "lossy", ["--fault-s", "20", "--loss-pct", "10"], {"host-b"}),
    ("lossy 30%", "lossy", ["--fault-s", "20", "--loss-pct", "30"], {"host-b"}),
    ("lossy 30% both ways", "lossy", ["--fault-s", "20", "--loss-pct", "30", "--both-ways"], {"host-b"}),
    ("lossy 30% for 45 s, spare", "lossy", ["--fault-s", "45", "--loss-pct", "30", "--spare"], {"host-b"}),
]


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=500)
    p.add_argument("--only", help="comma-separated case names")
    a = p.parse_args()
    results = []
    for name, scenario, extra, allowed in CASES:
        if a.only and name.split()[0] not in a.only.split(","):
            continue
        workdir = tempfile.mkdtemp(prefix=f"netbench-{scenario}-")
        out = subprocess.run([sys.executable, SCENARIO, scenario, workdir, "--steps", str(a.steps), *extra],
                             capture_output=True, text=True, timeout=900)
        if out.returncode != 0:
            print(f"{name}: FAILED to run: {out.stderr[-800:]}")
            results.append({"case": name, "error": out.stderr[-300:]})
            continue
        s = json.loads(out.stdout.strip().splitlines()[-1])
        allowed = {s["victim"]} if allowed is None else allowed
        # A communication_fault names the participants of a collective, not a culprit host: it
        # blames the network (no quarantine follows). Host-naming verdicts and quarantines count.
        blamed = {h for v in s["verdicts"] if v["kind"] != "communication_fault" for h in v["hosts"]}
        blamed |= set(s["quarantine"])
        wrong = sorted(blamed - allowed)
        first = s["verdicts"][0] if s["verdicts"] else None
        line = (f"{name}: verdict {first['kind'] + ' ' + ','.join(first['hosts']) + ' after ' + str(first['after_s']) + ' s' if first else 'none'}; "
                f"quarantined {s['quarantine'] or 'nobody'}; next round {s['next_round_after_s']} s; "
                f"finished {s['finished']}; wrongly blamed {wrong or 'nobody'}")
        slow = [x for x in s.get("slow_links", []) if not x["recovered"]]
        if slow:
            line += f"; slow link {slow[0]['host']} after {slow[0]['after_s']} s ({slow[0]['round_trip_ms']} ms)"
        if s.get("stragglers"):
            line += f"; straggler reports {len(s['stragglers'])}"
        if "steps_per_s_during_fault" in s:
            line += f"; steps/s {s.get('steps_per_s_before_fault')} before, {s['steps_per_s_during_fault']} during ({s['impairment']})"
        print(line, flush=True)
        results.append({"case": name, "verdicts": s["verdicts"], "quarantine": s["quarantine"],
                        "next_round_after_s": s["next_round_after_s"], "finished": s["finished"], "wrong": wrong,
                        "agent_exit_codes": s["agent_exit_codes"], "slow_links": s.get("slow_links", []),
                        "stragglers": s.get("stragglers", []),
                        "steps_per_s": [s.get("steps_per_s_before_fault"), s.get("steps_per_s_during_fault")]})
    print(json.dumps({"network_cases": len(results), "wrongly_blamed": sum(len(r.get("wrong", [])) for r in results),
                      "results": results}))


if __name__ == "__main__":
    main()
