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
# The compiled client (bindings/python/src/warm_client.cc) that trainsup.run prefers.
NATIVE = os.path.join(os.path.dirname(CLIENT), "trainsup-warm-client")


@pytest.fixture(params=["python", "native"])
def client(request):
    """The command that starts a worker through a client: `client(socket, script, *args)`."""
    if request.param == "native":
        assert os.access(NATIVE, os.X_OK), f"{NATIVE}: not built"
        return lambda sock, *rest: [NATIVE, sys.executable, sock, *map(str, rest)]
    return lambda sock, *rest: [sys.executable, CLIENT, sock, *map(str, rest)]


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
def test_the_client_ends_as_its_worker_did(zygote_socket, tmp_path, body, want, client):
    script = tmp_path / "w.py"
    script.write_text(body + "\n")
    p = subprocess.run(client(zygote_socket, script), capture_output=True, text=True, timeout=60)
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


def test_the_worker_gets_the_clients_arguments_environment_directory_and_streams(zygote_socket, tmp_path, client):
    script = tmp_path / "w.py"
    script.write_text("import json, os, sys\n"
                      "print(json.dumps([sys.argv, os.environ.get('TRAINSUP_TEST_X'), os.getcwd()]))\n"
                      "print('to stderr', file=sys.stderr)\n")
    here = tmp_path / "cwd"
    here.mkdir()
    p = subprocess.run(client(zygote_socket, script, "--x", "a b", "é"), capture_output=True, text=True, timeout=60,
                       cwd=here, env=dict(os.environ, TRAINSUP_TEST_X="value=with=equals"))
    assert p.returncode == 0, p.stderr
    import json
    argv, x, cwd = json.loads(p.stdout)
    assert argv == [str(script), "--x", "a b", "é"] and x == "value=with=equals" and cwd == str(here), p.stdout
    assert p.stderr.strip() == "to stderr"


def test_a_signal_to_the_client_reaches_the_worker(zygote_socket, tmp_path, client):
    """torchrun stops a worker by signalling its child, the client: the worker must get it."""
    script = tmp_path / "w.py"
    script.write_text("import signal, sys\n"
                      "signal.signal(signal.SIGTERM, lambda *a: sys.exit(5))\n"
                      "print('ready', flush=True)\n"
                      "signal.pause()\n")
    p = subprocess.Popen(client(zygote_socket, script), stdout=subprocess.PIPE, text=True)
    assert p.stdout.readline().strip() == "ready"
    p.send_signal(signal.SIGTERM)
    assert p.wait(60) == 5


def test_without_a_zygote_the_client_runs_the_script_cold(tmp_path, client):
    script = tmp_path / "w.py"
    script.write_text("import sys; sys.exit(4 if 'torch' not in sys.modules else 9)\n")
    p = subprocess.run(client(str(tmp_path / "nobody.sock"), script), capture_output=True, text=True, timeout=60)
    assert p.returncode == 4, p.stderr
    assert "warm start unavailable" in p.stderr and "starting" in p.stderr, p.stderr
