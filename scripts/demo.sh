#!/usr/bin/env bash
# trainsup demo: a supervised DDP training (gloo, 2 workers) on three simulated hosts of this
# machine, each with a `python3 -m trainsup.run` agent: host-a and host-b train, host-c waits as
# a spare. Checkpoints every 50 steps. The worker on host-b is stopped with SIGSTOP between two
# checkpoints. The job coordinator names host-b from the rhythm of the collectives within
# seconds, every rank is told to abort, host-b is quarantined and its agent leaves (exit 95),
# and the job resumes on host-a and the spare host-c from the newest checkpoint that verifies,
# finishing with parameters bitwise equal to a run that never failed. A timeline and the time
# the incident cost are printed at the end.
#
# Installs what is missing (scripts/install-deps.sh: Debian packages, the venv with torch 2.13),
# installs trainsup into the venv with pip as a user would (`pip install .`, scikit-build-core;
# incremental builds in build/pip), and runs everything with the venv's python and no PYTHONPATH,
# under ${TRAINSUP_DEMO_DIR:-/tmp/trainsup-demo}. (examples/cpp/stall_demo.sh shows the
# single-rank watchdog of the C++ library.)
set -euo pipefail
cd "$(dirname "$0")/.."
python=$(scripts/install-deps.sh)
echo "== pip install . into $(dirname "$(dirname "$python")") (log in build/demo-install.log)"
mkdir -p build
"$python" -m pip install --no-build-isolation --no-deps --config-settings=build-dir=build/pip . \
  > build/demo-install.log 2>&1 || { tail -40 build/demo-install.log; exit 1; }
unset PYTHONPATH
dir=${TRAINSUP_DEMO_DIR:-/tmp/trainsup-demo}
rm -rf "$dir"
mkdir -p "$dir"

echo "== reference: the same job without a fault (host-a + host-b, 500 steps)"
"$python" examples/launch/recovery_scenario.py clean "$dir/reference" --steps 500 > "$dir/reference.json"
echo "== the job: host-a + host-b active, host-c spare, in-memory snapshots every 5 steps (disk every 10 min);"
echo "   host-b's worker is stopped after step ~200"
"$python" examples/launch/recovery_scenario.py spare "$dir/job" --steps 500 --snapshot-every 5 > "$dir/job.json"
"$python" - "$dir" <<'PY'
import json, pathlib, sys
import torch
d = pathlib.Path(sys.argv[1])
job = json.loads((d / "job.json").read_text().splitlines()[-1])
fault = job["fault_time"]
def events(p):
    return [json.loads(l) for l in open(p) if l.strip()]
agent = sorted((e for p in (d / "job" / "run").glob("agent-*.events.jsonl") for e in events(p)), key=lambda e: e["time"])
ranks = sorted((e for p in (d / "job" / "logs").glob("*.events.jsonl") for e in events(p)), key=lambda e: e["wall_s"])
show_agent = {"rendezvous", "coordinator_elected", "coordinator_takeover", "verdict", "quarantine",
              "workers_killed", "quarantined_exit", "store_kept", "restart", "give_up", "agent_stop"}
show_rank = {"abort_ordered", "exit", "checkpoint_restored", "first_step", "stack_dump"}
rows = [(e["time"], e["host"], "agent", e) for e in agent if e["event"] in show_agent]
rows += [(e["wall_s"], e["host"], f"rank {e['rank']}", e) for e in ranks if e["event"] in show_rank and e["wall_s"] > fault - 1]
rows.append((fault, "host-b", "demo", {"event": "FAULT: SIGSTOP of host-b's worker"}))
keep = ("round", "group_rank", "kind", "ranks", "hosts", "section", "quarantined_host", "code", "step", "verdict",
        "culprit_host", "restarts", "newest_checkpoint_step", "restore_s", "tier", "source")
print("\n== timeline (seconds from the fault)")
for t, host, who, e in sorted(rows, key=lambda r: r[0]):
    if t < fault - 1 and e["event"] not in ("rendezvous", "coordinator_elected"):
        continue
    extra = {k: e[k] for k in keep if k in e}
    print(f"   {t - fault:+8.2f}  {host:<7} {who:<7} {e['event']:<22} {json.dumps(extra) if extra else ''}")
verdict = min((e for e in agent if e["event"] == "verdict"), key=lambda e: e["time"])
restored = min((e for e in ranks if e["event"] == "checkpoint_restored" and e["wall_s"] > fault), key=lambda e: e["wall_s"])
first = min(e["wall_s"] for e in ranks if e["event"] == "first_step" and e["wall_s"] > fault)
# Replayed work starts at the restored step's snapshot (its commit may land after the fault).
committed = min(e["wall_s"] for e in ranks if e["event"] == "checkpoint_snapshot" and e["step"] == restored["step"] and e["wall_s"] < fault)
print(f"\n   detection {verdict['time'] - fault:.2f} s ({verdict['kind']} naming {verdict['hosts'][0]}), "
      f"recovery (fault to first step after resume) {first - fault:.2f} s, replayed work {fault - committed:.2f} s "
      f"(resumed from step {restored['step']} " +
      (f"in memory; {restored.get('ranks_from_peers', 0)} rank(s) took a peer host's copy)"
       if restored.get("tier") == "memory" else "on disk)"))
ref = torch.load(d / "reference" / "final.pt")
got = torch.load(d / "job" / "final.pt")
same = all(torch.equal(ref["model"][k], got["model"][k]) for k in ref["model"])
codes = job["agent_exit_codes"]
ok = same and codes == {"host-a": 0, "host-b": 95, "host-c": 0} and job["quarantine"] == ["host-b"]
print(f"   agent exit codes {codes} (95 = host quarantined), quarantine {job['quarantine']}, "
      f"final parameters {'bitwise equal to' if same else 'DIFFERENT from'} the run without a fault")
print("\ndemo OK" if ok else "\ndemo FAILED")
sys.exit(0 if ok else 1)
PY
echo
echo "== trainsup report $dir/job/run (the full timeline is in its output and HTML page)"
"$python" -m trainsup report "$dir/job/run" | grep -E "^run:|^incident|^  detection|^HTML" | sed 's/^/   /'
