#!/usr/bin/env bash
# trainsup demo: two supervised ranks of the example trainer on two simulated hosts
# (node-a, node-b) on this machine. Rank 1 on node-b stalls inside step 40; its watchdog
# catches the stall as soon as the 2 s step budget runs out, writes the stack of every thread into its
# rank log, records the events and ends the process with exit code 91, while rank 0 on
# node-a trains to the end. Later issues grow this into detection across ranks, relaunch
# without the bad host and resume from a checkpoint.
#
# Installs missing Debian packages with apt, builds into ./build, writes logs under
# ${TRAINSUP_DEMO_DIR:-/tmp/trainsup-demo}.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
echo "== building (logs in build/demo-build.log)"
mkdir -p build
scripts/build.sh > build/demo-build.log 2>&1 || { tail -40 build/demo-build.log; exit 1; }

run_dir=${TRAINSUP_DEMO_DIR:-/tmp/trainsup-demo}
rm -rf "$run_dir"
mkdir -p "$run_dir"
trainer=build/examples/trainsup_example_train
common=(TRAINSUP_JOB_ID=demo TRAINSUP_LOG_DIR="$run_dir" TRAINSUP_SECTION_BUDGETS=step=2
        WORLD_SIZE=2 LOCAL_RANK=0 LOCAL_WORLD_SIZE=1 TRAINSUP_LOG_STDERR=0)

echo "== starting rank 0 on node-a and rank 1 on node-b (stall injected at step 40, step budget 2 s)"
env "${common[@]}" RANK=0 GROUP_RANK=0 TRAINSUP_NODE_NAME=node-a \
  "$trainer" --steps 300 --step-sleep-ms 20 > "$run_dir/stdout-r0.txt" 2>&1 &
pid0=$!
env "${common[@]}" RANK=1 GROUP_RANK=1 TRAINSUP_NODE_NAME=node-b \
  "$trainer" --steps 300 --step-sleep-ms 20 --stall-at-step 40 > "$run_dir/stdout-r1.txt" 2>&1 &
pid1=$!
rc1=0; wait $pid1 || rc1=$?
rc0=0; wait $pid0 || rc0=$?

echo
echo "== exit codes"
echo "rank 0 on node-a: $rc0 (0 = finished)"
echo "rank 1 on node-b: $rc1 (91 = stall caught by the watchdog; see docs/exit-codes.md)"
log1="$run_dir/demo-node-b-r1.log"
echo
echo "== rank 1's log ($log1), the stall and the stuck training loop's stack"
grep -m1 "STALL" "$log1"
grep -A8 "\[training loop\]" "$log1" | head -9
grep -m1 "after the stall was detected" "$log1"
echo
echo "== rank 1's event log ($run_dir/demo-node-b-r1.events.jsonl)"
/usr/bin/python3 - "$run_dir/demo-node-b-r1.events.jsonl" <<'PY'
import json, sys
events = [json.loads(l) for l in open(sys.argv[1])]
t0 = events[0]["mono_ns"]
injected = None
for e in events:
    extra = {k: v for k, v in e.items() if k in ("section", "step", "elapsed_s", "budget_s", "code", "threads", "kind")}
    print(f"  +{(e['mono_ns'] - t0) / 1e9:7.3f} s  {e['event']:<18} host={e['host']} rank={e['rank']} {json.dumps(extra)}")
    if e["event"] == "fault_injected":
        injected = e["mono_ns"]
    if e["event"] == "exit" and injected:
        print(f"  -> the process ended {(e['mono_ns'] - injected) / 1e9:.2f} s after the stall began (budget 2 s)")
PY
echo
if [[ $rc0 -eq 0 && $rc1 -eq 91 ]]; then
  echo "demo OK: the stalled rank was caught and named (host node-b, rank 1, section 'step', step 40)"
else
  echo "demo FAILED: unexpected exit codes (rank 0: $rc0, rank 1: $rc1)"; exit 1
fi
