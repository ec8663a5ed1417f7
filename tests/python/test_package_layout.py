"""The Python package mirrors the layers (docs/architecture.md): the rank side in trainsup/, the
launcher agent in trainsup/launch/, operator tools in trainsup/tools/; and an operator's tools
run on a login node without torch. `trainsup quarantine list` imported torch (1.5 s, 225 MB) and
failed wherever the exact torch build was missing (issue 19)."""
import json
import os
import subprocess
import sys
import time

import trainsup

PACKAGE = os.path.dirname(os.path.abspath(trainsup.__file__))
BUILD_PATH = os.path.dirname(PACKAGE)

# Every module a login node or the agent may import without torch; launcher (the rendezvous
# handler subclasses torch's) is the one that needs it at import.
TORCH_FREE = ["trainsup", "trainsup.errors", "trainsup.events", "trainsup.names", "trainsup.quarantine",
              "trainsup.ports", "trainsup.launch", "trainsup.launch.run", "trainsup.launch.store",
              "trainsup.launch.node_services", "trainsup.launch.verdict_watch", "trainsup.launch.liveness",
              "trainsup.launch.restarts", "trainsup.launch.quarantine_policy", "trainsup.launch.preflight",
              "trainsup.launch.gpu_faults", "trainsup.launch.classify", "trainsup.launch.agent_events",
              "trainsup.launch.expedite", "trainsup.launch.waiting", "trainsup.launch._compat", "trainsup.tools", "trainsup.tools.cli",
              "trainsup.tools.report"]


def _no_torch(*args, code=None):
    """This interpreter without its site-packages (python -S): no torch, as on a login node
    that has Python and trainsup's build but not the training environment."""
    env = dict(os.environ, PYTHONPATH=BUILD_PATH)
    cmd = [sys.executable, "-S"] + (["-c", code] if code is not None else list(args))
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)


def test_the_package_is_folded_by_process():
    here = {os.path.relpath(os.path.join(d, f), PACKAGE) for d, _, fs in os.walk(PACKAGE) for f in fs
            if f.endswith(".py")}
    assert {"launch/launcher.py", "launch/run.py", "launch/liveness.py", "launch/node_services.py",
            "launch/verdict_watch.py", "launch/restarts.py", "launch/quarantine_policy.py", "launch/classify.py",
            "launch/preflight.py", "launch/_compat.py", "tools/cli.py", "tools/report.py"} <= here, here
    for module in ("checkpoint.py", "distributed.py", "__init__.py", "_compat.py"):
        assert module in here  # the rank side
    for agent_only in ("launcher.py", "liveness.py", "telemetry.py", "verdict_watch.py", "report.py"):
        assert agent_only not in here, f"{agent_only} is the launcher's or a tool's, not the rank's"
    # Each module's docstring says which process runs it.
    for sub in ("launch/__init__.py", "tools/__init__.py"):
        with open(os.path.join(PACKAGE, sub)) as f:
            assert "process" in f.read(400).lower(), sub


def test_the_operator_tools_and_the_agents_modules_need_no_torch(tmp_path):
    assert "No module named 'torch'" in _no_torch(code="import torch").stderr  # the login node indeed
    imports = "; ".join(f"import {m}" for m in TORCH_FREE)
    p = _no_torch(code=f"import sys; {imports}; print('torch' in sys.modules)")
    assert p.returncode == 0, p.stderr[-3000:]
    assert p.stdout.strip() == "False"
    # The commands themselves: quarantine records and a run's report.
    qdir = tmp_path / "q"
    t0 = time.monotonic()
    added = _no_torch("-m", "trainsup", "quarantine", "add", "node7", "--reason", "ECC", "--dir", str(qdir))
    took = time.monotonic() - t0
    assert added.returncode == 0, added.stderr[-3000:]
    listed = _no_torch("-m", "trainsup", "quarantine", "list", "--dir", str(qdir))
    assert listed.returncode == 0 and json.loads(listed.stdout)["host"] == "node7", listed.stderr[-3000:]
    run = tmp_path / "run"
    run.mkdir()
    (run / "agent-host-a.events.jsonl").write_text(json.dumps(
        {"ts": "2026-12-04T10:00:00Z", "wall_s": 1.0, "time": 1.0, "host": "host-a", "event": "agent_start"}) + "\n")
    report = _no_torch("-m", "trainsup", "report", str(run))
    assert report.returncode == 0, report.stderr[-3000:]
    print(f"[measure] `trainsup quarantine add` without torch: {took:.2f} s")


def test_importing_the_tools_where_torch_is_installed_loads_none_of_it():
    code = ("import sys, time; t = time.monotonic(); import trainsup.tools.cli, trainsup.launch.liveness; "
            "print(json.dumps({'torch': 'torch' in sys.modules, 's': time.monotonic() - t}))")
    p = subprocess.run([sys.executable, "-c", "import json; " + code], capture_output=True, text=True, timeout=120,
                       env=dict(os.environ, PYTHONPATH=os.pathsep.join(q for q in sys.path if q)))
    assert p.returncode == 0, p.stderr[-3000:]
    r = json.loads(p.stdout)
    print(f"[measure] importing trainsup's tools: {r['s']:.2f} s, torch loaded: {r['torch']}")
    assert r["torch"] is False


def test_every_module_says_what_it_exports_and_has_it():
    import importlib
    for name in TORCH_FREE + ["trainsup.checkpoint", "trainsup.distributed", "trainsup.launch.launcher"]:
        module = importlib.import_module(name)
        if name in ("trainsup.launch", "trainsup.tools") or name.rsplit(".", 1)[-1].startswith("_"):
            continue  # packages of modules; private modules
        exported = getattr(module, "__all__", None)
        assert exported, f"{name} has no __all__"
        missing = [n for n in exported if not hasattr(module, n)]
        assert not missing, f"{name}.__all__ names what it lacks: {missing}"
