"""Warm worker starts (trainsup/launch/zygote.py, warm_client.py): torchrun's child is the warm
client, and torchrun reads the worker's end from it, so the client must end as the worker did:
its exit code, or death by its signal. A SIGKILLed worker's client raised instead (signal()
refuses SIGKILL) and exited 1: the agent classified a killed worker as a Python error (CI)."""
import os
import signal
import subprocess
import sys

import pytest

import trainsup.launch.warm_client as warm_client

CLIENT = warm_client.__file__


@pytest.fixture(scope="module")
def zygote_socket(tmp_path_factory):
    sock = str(tmp_path_factory.mktemp("zygote") / "z.sock")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    z = subprocess.Popen([sys.executable, "-m", "trainsup.launch.zygote", sock, "--imports", "json"],
                         stdout=subprocess.PIPE, text=True, env=env)
    assert z.stdout.readline().strip() == "listening"
    yield sock
    z.terminate()
    z.wait(10)


@pytest.mark.parametrize("body, want", [
    ("raise SystemExit(3)", 3),
    ("import os, signal; os.kill(os.getpid(), signal.SIGKILL)", -signal.SIGKILL),
    ("import os, signal; os.kill(os.getpid(), signal.SIGTERM)", -signal.SIGTERM),
    ("print('fine')", 0),
])
def test_the_client_ends_as_its_worker_did(zygote_socket, tmp_path, body, want):
    script = tmp_path / "w.py"
    script.write_text(body + "\n")
    p = subprocess.run([sys.executable, CLIENT, zygote_socket, str(script)], capture_output=True, text=True,
                       timeout=60)
    assert p.returncode == want, (p.returncode, p.stderr)
    assert "Traceback" not in p.stderr, p.stderr


def test_a_worker_collects_its_own_objects_and_leaves_the_zygotes_frozen(zygote_socket, tmp_path):
    """Python's recipe for fork without exec (gc.freeze): the zygote's imports are frozen, so a
    worker's full collection does not walk them (nor write to their pages), and the worker's
    collector is on."""
    script = tmp_path / "w.py"
    script.write_text("import gc, sys\n"
                      "assert gc.isenabled(), 'collection is off in the worker'\n"
                      "assert gc.get_freeze_count() > 1000, gc.get_freeze_count()\n"
                      "class Cycle: pass\n"
                      "c = Cycle(); c.me = c; del c\n"
                      "sys.exit(0 if gc.collect() >= 1 else 7)\n")
    p = subprocess.run([sys.executable, CLIENT, zygote_socket, str(script)], capture_output=True, text=True,
                       timeout=60)
    assert p.returncode == 0, p.stderr
