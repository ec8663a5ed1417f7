"""The second incident replayed on a real Slurm cluster (issue 23): Debian's slurmctld, three
slurmd (n1-n3) and munged on this machine (slurm_cluster.py), the job submitted with sbatch as
examples/launch/slurm/train.sbatch is, a job array whose elements train on 2 of the 3 nodes.
n2's GPU goes bad after a checkpoint (the stand-in NVML reports uncorrectable ECC errors and
the step fails with a CUDA error), or n2's rank freezes: trainsup must tie the fault to n2,
quarantine it, drain it in Slurm with a reason that says what and why, and the job must resume
from its newest valid checkpoint on n1 and n3, never on n2 again."""
import json
import os
import pathlib
import sys

import pytest

from slurm_cluster import SlurmCluster, missing_programs

REPO = pathlib.Path(__file__).resolve().parents[2]
SBATCH = REPO / "examples" / "launch" / "slurm" / "train.sbatch"
TRAIN = REPO / "examples" / "python" / "train_ddp.py"

pytestmark = pytest.mark.skipif(bool(missing_programs()) or os.geteuid() != 0,
                                reason=f"needs root and Slurm's programs (scripts/install-deps.sh installs "
                                       f"them); missing: {missing_programs()}")


def _fake_nvml():
    path = os.environ.get("TRAINSUP_FAKE_NVML") or str(REPO / "build" / "tests" / "fake_nvml" /
                                                       "libnvidia-ml.so.1")
    assert os.path.exists(path), f"the stand-in NVML is not built: {path}"
    return path


def _job_env(jobs):
    pythonpath = os.environ.get("TRAINSUP_PYTHONPATH") or str(REPO / "build" / "bindings" / "python")
    return {"TRAINSUP_PYTHON": sys.executable, "PYTHONPATH": pythonpath,
            "TRAINSUP_SHARED_DIR": str(jobs), "TRAINSUP_NVML_LIBRARY": _fake_nvml(),
            "FAKE_NVML": "count=1", "FAKE_NVML_FILE": str(jobs / "nvml-%h"),
            "TRAINSUP_LOG_STDERR": "1", "OMP_NUM_THREADS": "1"}


def _events(path):
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


FAULTS = {
    # n2's GPU goes bad after a checkpoint: the stand-in NVML reports it, the step fails.
    "gpu_ecc": (["--gpu-ecc-at-step", "150"], "gpu_hardware", ["CUDA error", "uncorrectable ECC"]),
    # n2's rank freezes in a step: n1's rank waits in the collective it never enters.
    "hang": (["--stall-at-step", "150"], None, ["rank"]),
}


@pytest.mark.parametrize("fault", sorted(FAULTS))
def test_a_fault_on_n2_drains_it_and_the_array_resumes_on_n1_and_n3(tmp_path, fault):
    flags, verdict, said = FAULTS[fault]
    with SlurmCluster(tmp_path / "cluster") as c:
        jobs = c.dir / "jobs"
        # n3 is held back until the first element runs, so that it lands on n1 and n2.
        c.scontrol("update", "NodeName=n3", "State=DRAIN", "Reason=held for the test")
        job = c.sbatch(["--nodes=2", "--array=0-1%1", f"--job-name={fault}", str(SBATCH), str(TRAIN),
                        "--steps", "400", "--checkpoint-every", "20", "--step-sleep-ms", "20",
                        "--fault-host", "n2", *flags, "--out", str(jobs / "final.pt")],
                       cwd=jobs, env=_job_env(jobs))
        c.wait_for(lambda: any(r[1] == "0" and r[2] == "RUNNING" for r in c.jobs(job)), 60, "element 0 running")
        first = [r for r in c.jobs(job) if r[1] == "0"][0]
        assert first[3] == "n[1-2]", first
        c.scontrol("update", "NodeName=n3", "State=RESUME")

        def finished():
            rows = c.jobs(job)
            done = [r for r in rows if r[2] in ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL")]
            return rows if len(done) == 2 else None
        rows = c.wait_for(finished, 420, f"both elements of array job {job} ended")
        by_task = {r[1]: r for r in rows}
        logs = "\n".join(f"== {p.name}\n{p.read_text()[-3000:]}" for p in sorted(jobs.glob("*.out")))

        # n2 is drained, with a reason that says what and why.
        reasons = c.drain_reasons()
        assert "n2" in reasons, (reasons, logs)
        assert all(s in reasons["n2"] for s in said), reasons["n2"]
        assert c.node_states()["n2"].startswith("drain"), c.node_states()
        # The first element ended without finishing; the second ran on n1 and n3 and finished.
        assert by_task["0"][2] == "FAILED", (rows, logs)
        assert by_task["1"][2] == "COMPLETED" and by_task["1"][3] == "n[1,3]", (rows, logs)
        assert (jobs / "final.pt").exists(), logs

        # The fault is tied to n2 in the agents' events, and n2 quarantined.
        run_dirs = sorted((jobs / "trainsup-runs").iterdir())
        first_run = [d for d in run_dirs if (d / "agent-n2.events.jsonl").exists()]
        assert first_run, (run_dirs, logs)
        # (by n2's own agent, or by n1's when the coordinator's verdict reached it first)
        n2 = _events(first_run[0] / "agent-n2.events.jsonl")
        both = n2 + _events(first_run[0] / "agent-n1.events.jsonl")
        quarantine = [e for e in both if e["event"] == "quarantine"]
        assert quarantine and quarantine[0]["quarantined_host"] == "n2", both
        assert verdict is None or quarantine[0]["verdict"] == verdict, quarantine[0]
        assert [e for e in n2 if e["event"] == "quarantined_exit"], n2
        drain = [e for e in both if e["event"] == "quarantine_command"]
        assert drain and drain[0]["exit_code"] == 0 and "State=DRAIN" in drain[0]["command"], n2
        assert "raise " not in reasons["n2"], reasons["n2"]
        assert reasons["n2"].startswith(f"trainsup {quarantine[0]['verdict']}: "), reasons["n2"]
        # The array's next element was told not to go to n2 (what a user without operator rights
        # relies on), besides n2 being drained.
        assert "will not run on n2" in logs, logs
        # n1's agent did not wait for a host that could not come: it asked for the requeue.
        n1 = _events(first_run[0] / "agent-n1.events.jsonl")
        requeue = [e for e in n1 if e["event"] == "requeue"]
        assert requeue and "n2 (quarantined)" in requeue[0]["reason"], n1

        # The second element resumed from the first's checkpoints (a step past 100), not step 0.
        second_run = [d for d in run_dirs if d not in first_run]
        assert second_run, run_dirs
        second_job = by_task["1"][0]
        rank_logs = "\n".join(p.read_text() for p in jobs.glob(f"{fault}-{second_job}-n[13].out"))
        resumed = [int(line.rsplit("resumed at step ", 1)[1].split()[0]) for line in rank_logs.splitlines()
                   if "resumed at step " in line]
        assert resumed and min(resumed) > 100, (resumed, logs)


def test_a_single_job_is_requeued_without_the_drained_host_and_resumes(tmp_path):
    """Not an array: with n2 drained the script requeues the job itself (`scontrol requeue`),
    and Slurm places it again on n1 and n3, where it resumes from the checkpoint."""
    with SlurmCluster(tmp_path / "cluster") as c:
        jobs = c.dir / "jobs"
        c.scontrol("update", "NodeName=n3", "State=DRAIN", "Reason=held for the test")
        job = c.sbatch(["--nodes=2", "--job-name=requeue", str(SBATCH), str(TRAIN),
                        "--steps", "400", "--checkpoint-every", "20", "--step-sleep-ms", "20",
                        "--fault-host", "n2", "--gpu-ecc-at-step", "150", "--out", str(jobs / "final.pt")],
                       cwd=jobs, env=_job_env(jobs))
        c.wait_for(lambda: c.jobs(job) and c.jobs(job)[0][2] == "RUNNING", 60, "the job running")
        assert c.jobs(job)[0][3] == "n[1-2]", c.jobs(job)
        c.scontrol("update", "NodeName=n3", "State=RESUME")
        c.wait_for(lambda: c.jobs(job)[0][2] in ("COMPLETED", "FAILED", "CANCELLED"), 420, f"job {job} ended")
        logs = "\n".join(f"== {p.name}\n{p.read_text()[-3000:]}" for p in sorted(jobs.glob("*.out")))
        row = c.jobs(job)[0]
        assert row[2] == "COMPLETED" and row[3] == "n[1,3]", (row, logs)
        show = c.scontrol("-o", "show", "job", job).stdout
        assert "Restarts=1" in show, show
        assert "requeueing job" in logs and c.node_states()["n2"].startswith("drain"), logs
        assert (jobs / "final.pt").exists(), logs
        # Both attempts append to the same per-node files (the script's --open-mode=append).
        full = "\n".join(p.read_text() for p in jobs.glob(f"requeue-{job}-n*.out"))
        resumed = [int(line.rsplit("resumed at step ", 1)[1].split()[0]) for line in full.splitlines()
                   if "resumed at step " in line]
        assert resumed and min(resumed) > 100, (resumed, logs)
