"""scripts/gpu_check.py, the GPU check, on a machine without a GPU: it must say so plainly (one
JSON line with gpu_found false, exit status 3) instead of passing anything it did not check."""
import json
import os
import subprocess
import sys

import pytest
import torch

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU: run scripts/gpu-check.sh")
def test_without_a_gpu_the_check_says_so_and_passes_nothing():
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    p = subprocess.run([sys.executable, os.path.join(REPO, "scripts", "gpu_check.py")], env=env,
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 3, p.stdout + p.stderr
    line = json.loads(p.stdout.strip().splitlines()[-1])
    assert line["gpu_found"] is False and line["passed"] is False
    assert "no CUDA device" in line["reason"]
    assert "NO GPU FOUND" in p.stderr
