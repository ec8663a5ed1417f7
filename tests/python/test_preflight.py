"""The health preflight's GPU checks (trainsup/launch/preflight.py) against a stand-in for the driver's
NVML (tests/python/fake_nvml), and a host whose GPU has uncorrectable ECC errors quarantining
itself with that GPU named before it joins the job."""
import json
import os
import subprocess
import sys

import pytest

from trainsup.launch import preflight

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture()
def fake_nvml(monkeypatch):
    path = os.environ.get("TRAINSUP_FAKE_NVML") or os.path.join(REPO, "build", "tests", "fake_nvml",
                                                                  "libnvidia-ml.so.1")
    assert os.path.exists(path), f"build the fake NVML first (target trainsup_fake_nvml): {path}"
    monkeypatch.setenv("TRAINSUP_NVML_LIBRARY", path)

    def state(spec):
        monkeypatch.setenv("FAKE_NVML", spec)

    return state


def test_healthy_gpus_pass_and_say_how_many_were_checked(fake_nvml):
    fake_nvml("count=4")
    assert preflight.gpu_checks() == ([], "4 GPU(s) checked", [])


def test_each_kind_of_fault_names_its_gpu(fake_nvml):
    fake_nvml("count=4 ecc1=3 retired_pending2 remap_failed3 remap_pending3")
    problems, note, bad = preflight.gpu_checks()
    assert note == "4 GPU(s) checked"
    assert problems == ["GPU 1 (GPU-fake-01): 3 uncorrectable ECC errors",
                        "GPU 2 (GPU-fake-02): retired pages pending (reset the GPU)",
                        "GPU 3 (GPU-fake-03): row remapping failed"]
    assert bad == ["GPU-fake-01", "GPU-fake-02", "GPU-fake-03"]


def test_records_carry_the_counters_read_and_none_where_the_gpu_cannot_say(fake_nvml):
    fake_nvml("count=2 ecc1=5 no_ecc0 remap_pending1")
    records, note = preflight.gpu_records()
    assert note == "2 GPU(s) checked"
    assert [r["uuid"] for r in records] == ["GPU-fake-00", "GPU-fake-01"]
    assert records[0]["ecc_uncorrected"] is None and records[1]["ecc_uncorrected"] == 5
    assert records[1]["remapped_rows"]["pending"] and not records[1]["remapped_rows"]["failed"]
    assert records[0]["retired_pages_pending"] is False
    assert preflight.problems_of(records[0]) == []
    collected = []
    healthy, _, bad = preflight.run(command="", records=collected)
    assert not healthy and bad == ["GPU-fake-01"] and collected == records


def test_a_gpu_without_ecc_is_not_a_fault_and_no_driver_is_a_normal_state(fake_nvml, monkeypatch):
    fake_nvml("count=2 no_ecc0 remap_pending1")
    assert preflight.gpu_checks()[0] == ["GPU 1 (GPU-fake-01): row remapping pending (reset the GPU)"]
    fake_nvml("init_fails")
    assert preflight.gpu_checks() == ([], "NVML present but no usable driver/device: GPU checks skipped", [])
    monkeypatch.setenv("TRAINSUP_NVML_LIBRARY", "/nonexistent/libnvidia-ml.so.1")
    assert preflight.gpu_checks() == ([], "no NVML (no NVIDIA driver): GPU checks skipped", [])


def test_a_host_with_ecc_errors_quarantines_itself_with_the_gpu_and_never_joins(fake_nvml, tmp_path):
    fake_nvml("count=2 ecc0=7")
    script = tmp_path / "never_runs.py"
    script.write_text("raise SystemExit('the worker must not start on an unhealthy host')\n")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p), TRAINSUP_NODE_NAME="host-ecc")
    run = tmp_path / "run"
    p = subprocess.run([sys.executable, "-m", "trainsup.run", "--standalone", "--nnodes=1", "--nproc_per_node=1",
                        "--run-dir", str(run), str(script)], env=env, capture_output=True, text=True, timeout=120)
    assert p.returncode == 95, p.stdout[-2000:] + p.stderr[-2000:]
    record = json.loads((run / "quarantine" / "host-ecc.json").read_text())
    assert record["verdict"] == "preflight" and record["gpu"] == "GPU-fake-00"
    assert "GPU 0 (GPU-fake-00): 7 uncorrectable ECC errors" in record["reason"]
    events = [json.loads(line) for line in (run / "agent-host-ecc.events.jsonl").read_text().splitlines()]
    assert not any(e["event"] == "rendezvous" for e in events)
    (pre,) = [e for e in events if e["event"] == "preflight"]
    assert [(g["uuid"], g["ecc_uncorrected"]) for g in pre["gpus"]] == [("GPU-fake-00", 7), ("GPU-fake-01", 0)]
