"""What torchrun starts as each worker when warm starts are on (trainsup/launch/zygote.py,
docs/snapshots.md "A faster restart"): a small process that has the host's zygote, which has
imported torch already, fork the real worker, and stands in for it towards torchrun.

    python -u warm_client.py SOCKET SCRIPT [ARGS...]

It sends the zygote its argv, environment and working directory, and its standard streams
(SCM_RIGHTS); the zygote forks a worker that becomes `python -u SCRIPT ARGS` with them. This
process relays the signals torchrun sends (SIGTERM, SIGINT, SIGHUP, SIGQUIT) to the worker and
ends the way the worker ended (the same exit code, or killed by the same signal). If it is
killed itself, the zygote sees the connection close and kills the worker. When no zygote
answers, it runs the script itself (os.execv), as torchrun would have.

Standalone on purpose: it imports nothing of trainsup or torch (its own start-up is the cost
that remains, ~30 ms).
"""
import array
import json
import os
import signal
import socket
import sys

__all__ = ["main"]


def _fallback(script, args, why):
    sys.stderr.write(f"[trainsup] warm start unavailable ({why}); starting {script} cold\n")
    sys.stderr.flush()
    os.execv(sys.executable, [sys.executable, "-u", script, *args])


def main():
    if len(sys.argv) < 3:
        sys.exit("usage: warm_client.py SOCKET SCRIPT [ARGS...]")
    path, script, args = sys.argv[1], sys.argv[2], sys.argv[3:]
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        s.connect(path)
    except OSError as e:
        _fallback(script, args, f"{path}: {e}")
    request = json.dumps({"argv": [script, *args], "env": dict(os.environ), "cwd": os.getcwd()}).encode()
    fds = array.array("i", [0, 1, 2])
    try:
        s.sendmsg([len(request).to_bytes(8, "big"), request], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, fds)])
        answer = b""
        while not answer.endswith(b"\n"):
            chunk = s.recv(4096)
            if not chunk:
                raise ConnectionError("the zygote closed the connection")
            answer += chunk
        pid = json.loads(answer)["pid"]
    except (OSError, ValueError, KeyError) as e:
        s.close()
        _fallback(script, args, str(e))

    def relay(signum, frame):
        try:
            os.kill(pid, signum)
        except ProcessLookupError:
            pass

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2):
        signal.signal(sig, relay)
    # The zygote writes the worker's wait status when it ends.
    status = b""
    while not status.endswith(b"\n"):
        try:
            chunk = s.recv(4096)
        except InterruptedError:
            continue
        if not chunk:
            sys.stderr.write("[trainsup] the zygote went away before the worker ended\n")
            os._exit(1)
        status += chunk
    end = json.loads(status)
    if end.get("signal"):
        try:
            signal.signal(end["signal"], signal.SIG_DFL)
        except (OSError, ValueError):
            pass  # SIGKILL and SIGSTOP take no handler: their default is all they have
        os.kill(os.getpid(), end["signal"])
    os._exit(int(end.get("code", 1)))


if __name__ == "__main__":
    main()
