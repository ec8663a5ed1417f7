#!/usr/bin/env python3
"""Detection figures, from the test scenarios timed in one run (4 DDP ranks on gloo, 2 simulated
hosts with node monitors, default detector settings), and the coordinator's capacity:

  hang_detect_s        rank 2 stopped with SIGSTOP -> verdict naming it          (target <= 10)
  compute_hang_s       rank 2 sleeping in section "forward" -> verdict with it   (target <= 10)
  kill_detect_s        rank 2 killed with SIGKILL -> verdict naming it           (target <= 5)
  straggler_detect_s   rank 2 at 1.5x step time -> straggler verdict, from start (target <= 60)
  false_verdicts       verdicts in healthy runs (all ranks slowed together; +-30% jitter,
                       400 steps each) plus verdicts naming a wrong rank first     (target 0)
  coordinator_ranks_per_core  from trainsup_bench_coordinator                    (target >= 16384)

Usage (from the repository root, after scripts/build.sh):
  PYTHONPATH=build/bindings/python /usr/bin/python3 bench/detection_bench.py [build_dir=build]
"""
import json
import os
import pathlib
import signal
import subprocess
import sys
import tempfile
import time

REPO = pathlib.Path(__file__).resolve().parent.parent
BUILD = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else REPO / "build").resolve()
os.environ.setdefault("TRAINSUP_COORDINATOR_BIN", str(BUILD / "tools" / "trainsup_coordinator"))
os.environ.setdefault("TRAINSUP_NODE_MONITOR_BIN", str(BUILD / "tools" / "trainsup_node_monitor"))
sys.path.insert(0, str(REPO / "tests" / "python"))
import detection_harness as dh  # noqa: E402

ENDLESS = ["--steps", "1000000"]
false_verdicts = 0


def scenario(name, train_args, fault, limit):
    """Runs a job, applies `fault(job)` (returns the time it took effect), waits for the first
    verdict; returns seconds from the fault to it, and counts a wrong first culprit."""
    global false_verdicts
    with tempfile.TemporaryDirectory() as d:
        job = dh.Job(pathlib.Path(d), train_args)
        try:
            t0 = fault(job)
            t, v = job.wait_for(lambda v: True, limit + 20)
            if v is None:
                print(f"  {name}: no verdict within {limit + 20} s")
                return None
            if v["ranks"] != [2]:
                false_verdicts += 1
            took = t - t0
            print(f"  {name}: {v['kind']} ranks {v['ranks']} hosts {v['hosts']} section '{v.get('section', '')}' "
                  f"after {took:.2f} s")
            return round(took, 3)
        finally:
            job.close()


def signal_rank(sig):
    def fault(job):
        job.wait_for_log("step 50 loss")
        job.ranks[2].send_signal(sig)
        return time.monotonic()
    return fault


def stall_started(job):
    job.wait_for_log("step 50 loss")
    events = next((job.workdir / "logs").glob("*-host-b-r2.events.jsonl"))
    deadline = time.monotonic() + 60
    while "stall_in_section" not in events.read_text():
        if time.monotonic() > deadline:
            raise RuntimeError("stall not injected")
        time.sleep(0.05)
    return time.monotonic()


def training_started(job):
    job.wait_for_log("step 0 loss")
    return time.monotonic()


def healthy(name, extra):
    global false_verdicts
    with tempfile.TemporaryDirectory() as d:
        job = dh.Job(pathlib.Path(d), ["--steps", "400", "--step-sleep-ms", "20"] + extra)
        try:
            codes = job.wait_ranks(300)
            time.sleep(1.0)  # a departure is judged at once: a (wrong) verdict would be written well within 1 s
            n = len(job.all_verdicts())
            false_verdicts += n + sum(1 for c in codes if c != 0)
            print(f"  {name}: exit codes {codes}, {n} verdicts")
        finally:
            job.close()


def main():
    if not dh.available():
        sys.exit(f"build the tools first: {os.environ['TRAINSUP_COORDINATOR_BIN']}")
    print("detection benchmark: 4 DDP ranks on gloo, hosts host-a (ranks 0,1) and host-b (ranks 2,3)")
    hang = scenario("SIGSTOP rank 2", ENDLESS, signal_rank(signal.SIGSTOP), 10)
    compute = scenario("rank 2 sleeps in 'forward'", ENDLESS + ["--step-sleep-ms", "2", "--stall-at-step", "300",
                                                                 "--stall-section", "forward", "--fault-rank", "2"],
                       stall_started, 10)
    kill = scenario("SIGKILL rank 2", ENDLESS, signal_rank(signal.SIGKILL), 5)
    straggler = scenario("rank 2 at 1.5x", ENDLESS + ["--step-sleep-ms", "20", "--slow-ranks", "2",
                                                      "--slow-factor", "1.5"], training_started, 60)
    healthy("all ranks slowed 1.5x together", ["--slow-ranks", "all", "--slow-factor", "1.5", "--slow-from-step", "150"])
    healthy("+-30% jitter", ["--jitter", "0.3"])
    out = subprocess.run([str(BUILD / "bench" / "trainsup_bench_coordinator"), "16384", "5"],
                         capture_output=True, text=True, check=False)
    print(out.stdout, end="")
    capacity = json.loads(out.stdout.strip().splitlines()[-1])["coordinator_ranks_per_core"]
    print(json.dumps({"bench": "detection", "hang_detect_s": hang, "compute_hang_s": compute,
                      "kill_detect_s": kill, "straggler_detect_s": straggler, "false_verdicts": false_verdicts,
                      "coordinator_ranks_per_core": capacity}))


if __name__ == "__main__":
    main()
