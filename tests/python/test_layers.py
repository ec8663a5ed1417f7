"""libsupervisor's layering check (tests/layers/check_layers.py) passes on the tree and names
the file, line and rule when a layer includes one it may not use."""
import os
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


def test_clang_refuses_a_guarded_member_touched_without_its_lock(tmp_path):
    """The annotations of trainsup/mutex.h are live under Clang (the thread-safety test would
    pass vacuously if they expanded to nothing): an unlocked write is an error, a locked one is not."""
    import pytest
    clang = shutil.which("clang++") or shutil.which("clang++-14")
    if clang is None:
        pytest.skip("no clang++")
    unit = tmp_path / "unit.cc"
    unit.write_text('''#include "trainsup/mutex.h"
struct Counter {
  trainsup::Mutex mu;
  int value TRAINSUP_GUARDED_BY(mu) = 0;
  void locked() { trainsup::MutexLock lock(mu); ++value; }
  void waits(trainsup::CondVar& cv) { trainsup::MutexLock lock(mu); cv.wait(mu, [&] { mu.assertHeld(); return value > 0; }); }
  void unlocked() { ++value; }
};
''')
    r = subprocess.run([clang, "-std=c++17", "-fsyntax-only", "-Wthread-safety", "-Werror=thread-safety",
                        "-I", str(ROOT / "libsupervisor" / "base" / "include"), str(unit)], capture_output=True, text=True)
    assert r.returncode == 1
    errors = [line for line in r.stderr.splitlines() if "error:" in line]
    assert len(errors) == 1 and "unit.cc:7:" in errors[0] and "requires holding mutex 'mu'" in errors[0], r.stderr


def test_a_training_process_never_loads_the_agent_layer(tmp_path):
    """What a rank imports (trainsup, its checkpoints, collectives and Supervisor) maps
    libtrainsup but not libtrainsup_agent with the coordinator's servers; the launcher's modules
    do map it (so the check below can see the library when it is there)."""
    script = tmp_path / "rank.py"
    script.write_text('''
import sys
import trainsup, trainsup.checkpoint, trainsup.distributed
def mapped():
    with open("/proc/self/maps") as f:
        return {line.split()[-1].rsplit("/", 1)[-1].split(".so")[0] for line in f if ".so" in line}
with trainsup.Supervisor(rank=0, world_size=1, log_dir=sys.argv[1]):
    rank = mapped()
import trainsup.launch.node_services, trainsup.run
agent = mapped()
print(sorted(n for n in rank if n.startswith(("libtrainsup", "_trainsup"))))
print(sorted(n for n in agent if n.startswith(("libtrainsup", "_trainsup"))))
''')
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    r = subprocess.run([sys.executable, str(script), str(tmp_path / "logs")], capture_output=True, text=True,
                       timeout=120, env=env)
    assert r.returncode == 0, r.stderr
    rank_libs, agent_libs = (eval(line) for line in r.stdout.strip().splitlines()[-2:])
    assert "libtrainsup" in rank_libs and "libtrainsup_agent" not in rank_libs, rank_libs
    assert not any(n.startswith("_trainsup_agent") for n in rank_libs), rank_libs
    assert "libtrainsup_agent" in agent_libs, agent_libs
