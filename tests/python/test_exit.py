"""Supervisors still open when the interpreter exits are closed by trainsup's atexit handler,
while the interpreter is intact (docs/python.md), not joined during interpreter shutdown."""
import os
import subprocess
import sys

SCRIPT = r'''
import atexit, os, sys

def check():  # registered before trainsup's handler, so it runs after it (atexit is LIFO)
    import trainsup
    open(os.environ["RESULT"], "w").write("open=%d" % len(trainsup._live))

atexit.register(check)
import trainsup
sup = trainsup.Supervisor(log_dir=sys.argv[1], node_name="exit-host", handle_signals=False)
with sup.step(0):
    pass
# no close(): the script just ends
'''


def test_open_supervisor_is_closed_at_exit(tmp_path):
    result = tmp_path / "result"
    env = dict(os.environ, RESULT=str(result), PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    p = subprocess.run([sys.executable, "-c", SCRIPT, str(tmp_path / "logs")], env=env, capture_output=True,
                       text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    assert result.read_text() == "open=0", "the supervisor was still open after trainsup's atexit handler"
    log = next((tmp_path / "logs").glob("*exit-host*.log")).read_text()
    assert "supervisor closed" in log


def test_every_exit_code_has_one_home_in_cpp():
    """The launcher's codes come from trainsup/exit_codes.h like the ranks' (none defined twice)."""
    import trainsup
    from trainsup import quarantine
    from trainsup.launch import restarts
    codes = {"stop_requested": trainsup.EXIT_STOP_REQUESTED, "stall": trainsup.EXIT_STALL,
             "watchdog_unresponsive": trainsup.EXIT_WATCHDOG_UNRESPONSIVE, "bad_config": trainsup.EXIT_BAD_CONFIG,
             "aborted_by_verdict": trainsup.EXIT_ABORTED, "quarantined": trainsup.EXIT_QUARANTINED,
             "do_not_requeue": trainsup.EXIT_DO_NOT_REQUEUE, "requeue": trainsup.EXIT_REQUEUE}
    assert {trainsup.exit_code_name(c): c for c in codes.values()} == codes
    assert sorted(codes.values()) == list(range(90, 98))
    assert quarantine.EXIT_QUARANTINED == 95 and restarts.EXIT_DO_NOT_REQUEUE == 96
    assert trainsup.exit_code_name(98) == "unknown"
