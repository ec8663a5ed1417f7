"""libsupervisor's layering check (tests/layers/check_layers.py) passes on the tree and names
the file, line and rule when a layer includes one it may not use."""
import pathlib
import shutil
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]
CHECK = ROOT / "tests" / "layers" / "check_layers.py"


def run_check(root):
    return subprocess.run([sys.executable, str(CHECK), str(root)], capture_output=True, text=True)


def test_the_tree_keeps_its_layers():
    r = run_check(ROOT)
    assert r.returncode == 0, r.stdout
    assert "0 violation(s)" in r.stdout


def test_a_rank_that_includes_the_agent_layer_is_named(tmp_path):
    shutil.copytree(ROOT / "libsupervisor", tmp_path / "libsupervisor")
    supervisor = tmp_path / "libsupervisor" / "rank" / "supervisor.cc"
    lines = supervisor.read_text().splitlines()
    lines.insert(1, '#include "trainsup/coordinator.h"')
    supervisor.write_text("\n".join(lines) + "\n")
    public = tmp_path / "libsupervisor" / "agent" / "include" / "trainsup" / "node_monitor.h"
    public.write_text(public.read_text().replace('#include "trainsup/job_token.h"',
                                                 '#include "telemetry/telemetry_wire.h"'))
    r = run_check(tmp_path)
    assert r.returncode == 1
    assert "libsupervisor/rank/supervisor.cc:2: layer rank may not include agent's trainsup/coordinator.h" in r.stdout
    assert "node_monitor.h" in r.stdout and "public header includes internal telemetry/telemetry_wire.h" in r.stdout
