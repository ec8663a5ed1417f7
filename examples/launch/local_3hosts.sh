#!/usr/bin/env bash
# Three simulated hosts on this machine (TRAINSUP_NODE_NAME), two active and one spare, each
# running one trainsup-run agent with one worker of examples/python/train_ddp.py:
#
#   examples/launch/local_3hosts.sh [run dir=/tmp/trainsup-3hosts] [steps=600]
#
# Stop host-b's worker (kill -STOP <pid>, the pid is in its event log) to watch the job name
# host-b, quarantine it, and resume on host-a and the spare host-c from the newest checkpoint.
# Ends when the job ends; each agent's output is in <run dir>/agent-<host>.out. Uses the python3
# on PATH (set PYTHON to choose another), which must have trainsup installed (pip install .).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
run_dir="${1:-/tmp/trainsup-3hosts}"
steps="${2:-600}"
python="${PYTHON:-python3}"
port="$("$python" -c 'from trainsup.ports import free_port; print(free_port())')"
mkdir -p "$run_dir"
export TRAINSUP_CHECKPOINT_DIR="$run_dir/ckpt" TRAINSUP_LOG_DIR="$run_dir/logs" TRAINSUP_LOG_STDERR=0
export OMP_NUM_THREADS=1
agent() {  # host, extra env...
  local host="$1"
  TRAINSUP_NODE_NAME="$host" "$python" -m trainsup.run --nnodes=2:2 --nproc_per_node=1 \
    --rdzv_backend=c10d --rdzv_endpoint="127.0.0.1:$port" --rdzv_id=local3 --run-dir "$run_dir/run" \
    "$repo/examples/python/train_ddp.py" --steps "$steps" --checkpoint-every 50 --step-sleep-ms 20 \
    > "$run_dir/agent-$host.out" 2>&1 &
  echo $!
}
pids=("$(agent host-a)" "$(agent host-b)")
sleep 5  # the spare comes last, so the first round is host-a + host-b (illustration only)
pids+=("$(agent host-c)")
echo "agents: host-a ${pids[0]}, host-b ${pids[1]}, host-c ${pids[2]} (spare); logs in $run_dir"
status=0
for p in "${pids[@]}"; do wait "$p" || status=$?; done
exit "$status"
