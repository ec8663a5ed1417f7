"""The host's zygote: a process that has imported torch (and trainsup) once, and forks each
worker from there, so that a restarted worker does not pay for its interpreter and imports
again (issue 22 measured 1.3 s of a 2 s worker start in `import torch` on this machine).

    python -m trainsup.launch.zygote SOCKET [--imports torch,torch.distributed,...]

The launcher agent starts it before its first round (trainsup.run --warm-workers, on by
default) and points torchrun's entrypoint at warm_client.py, which asks for a worker here. The
zygote is single-threaded and initialises nothing (no CUDA, no thread pool, no process group)
so that fork() is safe; each worker then applies its own environment, working directory,
argv and standard streams before it runs the training script as `__main__`, exactly as
`python -u SCRIPT ARGS` would.

What a warm worker cannot change: settings read when a library is loaded, before the worker's
environment exists. The zygote is started with the agent's environment plus
OMP_NUM_THREADS as torchrun sets it for workers (libgomp reads it at load time); LD_PRELOAD,
LD_LIBRARY_PATH and PYTHON* variables other than PYTHONUNBUFFERED, and any module in the
imports list, come from the zygote. Turn warm starts off (--warm-workers 0) where that matters.

Lifetime: the zygote dies with its agent (PR_SET_PDEATHSIG), and each worker with the zygote,
or when its warm_client's connection closes (torchrun killed it): SIGKILL.
"""
import argparse
import array
import ctypes
import gc
import importlib
import io
import json
import os
import select
import signal
import socket
import sys
from typing import Dict, Optional, Tuple

__all__ = ["serve", "main", "DEFAULT_IMPORTS"]

DEFAULT_IMPORTS = ("torch,torch.distributed,torch.nn,torch.nn.parallel,torch.optim,torch._dynamo,"
                   "torch.distributed.checkpoint,trainsup,trainsup.checkpoint,trainsup.distributed")
_PR_SET_PDEATHSIG = 1


def _die_with_parent(sig=signal.SIGKILL):
    try:
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, int(sig), 0, 0, 0)
    except (OSError, AttributeError):
        pass


def _recv_request(conn):
    """(request, [fd0, fd1, fd2]) from a warm_client."""
    fds = array.array("i")
    data, anc, _, _ = conn.recvmsg(65536, socket.CMSG_SPACE(3 * fds.itemsize))
    for level, kind, payload in anc:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fds.frombytes(payload[:len(payload) - len(payload) % fds.itemsize])
    if len(data) < 8:
        raise ConnectionError("short request")
    size = int.from_bytes(data[:8], "big")
    body = data[8:]
    while len(body) < size:
        chunk = conn.recv(size - len(body))
        if not chunk:
            raise ConnectionError("request cut short")
        body += chunk
    return json.loads(body), list(fds)


def _become_worker(listener, conn, request, fds, inherited):
    """In the forked child: set up as `python -u SCRIPT ARGS` would be, run the script as
    __main__, and end through the interpreter's own exit (SystemExit, tracebacks, atexit and
    finalisation as usual): nothing above this frame catches."""
    gc.enable()  # off in the zygote (serve): the objects it imported stay frozen
    listener.close()
    conn.close()
    for pidfd, (_, other) in inherited.items():  # the other workers' handles are not this one's
        os.close(pidfd)
        if other is not None:
            other.close()
    _die_with_parent()
    os.setsid()  # a session of its own, as torchrun gives its workers
    for target, fd in enumerate(fds[:3]):
        os.dup2(fd, target)
    for fd in fds:
        if fd > 2:
            os.close(fd)
    for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGCHLD):
        signal.signal(sig, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    os.environ.clear()
    os.environ.update(request["env"])
    os.chdir(request["cwd"])
    argv = request["argv"]
    sys.argv = list(argv)
    script = os.path.abspath(argv[0])
    sys.path[0] = os.path.dirname(script)
    for stream in (sys.stdout, sys.stderr):
        if isinstance(stream, io.TextIOWrapper):
            stream.reconfigure(write_through=True)  # python -u
    import runpy
    runpy.run_path(script, run_name="__main__")
    sys.exit(0)


def _cuda_driver_loaded() -> str:
    """The CUDA driver library's path if this process has loaded it, else ""."""
    try:
        with open("/proc/self/maps") as f:
            for line in f:
                if "libcuda.so" in line:
                    return line.split()[-1]
    except OSError:
        pass
    return ""


def serve(path, imports):
    # Listening before the imports: a worker asked for meanwhile waits in the backlog for them
    # (no longer than a cold start would take), and the agent knows the socket is there.
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(64)
    print("listening", flush=True)
    # A process that has initialised the CUDA driver cannot fork workers that use CUDA. Nothing
    # here should (importing torch does not); torch.cuda.is_available(), which an imported module
    # may call, asks NVML instead of the driver with this set.
    os.environ["PYTORCH_NVML_BASED_CUDA_CHECK"] = "1"
    # Python's own recipe for processes that fork without exec (gc module, gc.freeze): collection
    # off while the imports build their objects (no freed holes among them), then every object
    # so far moved to the permanent generation, and collection back on in each worker. A
    # worker's collections then never walk torch's ~290,000 objects: a full collection in a
    # worker forked without this took 0.14 s and wrote to every page of them (copy-on-write).
    gc.disable()
    for name in filter(None, imports.split(",")):
        try:
            importlib.import_module(name.strip())
        except Exception as e:  # the worker imports it itself, cold
            print(f"[trainsup] zygote: could not import {name}: {e}", file=sys.stderr, flush=True)
    loaded = _cuda_driver_loaded()
    if loaded:
        # Refuse rather than fork broken workers: each worker's client then starts it cold.
        print(f"[trainsup] zygote: the CUDA driver ({loaded}) was loaded while importing {imports}; "
              "forked workers could not use CUDA, so workers start cold", file=sys.stderr, flush=True)
        listener.close()
        os.unlink(path)
        return
    gc.freeze()
    # pidfd -> (pid, the client's connection, or None once it is gone)
    running: Dict[int, Tuple[int, Optional[socket.socket]]] = {}
    while True:
        clients: Dict[int, Tuple[int, socket.socket]] = {c.fileno(): (pidfd, c) for pidfd, (_, c) in running.items()
                                                          if c is not None}
        readable, _, _ = select.select([listener.fileno(), *clients, *running], [], [])
        for r in readable:
            if r == listener.fileno():
                conn, _ = listener.accept()
                try:
                    request, fds = _recv_request(conn)
                except (OSError, ValueError) as e:
                    print(f"[trainsup] zygote: bad request: {e}", file=sys.stderr, flush=True)
                    conn.close()
                    continue
                pid = os.fork()
                if pid == 0:
                    _become_worker(listener, conn, request, fds, running)
                for fd in fds:
                    os.close(fd)
                pidfd = os.pidfd_open(pid)
                running[pidfd] = (pid, conn)
                try:
                    conn.sendall(json.dumps({"pid": pid}).encode() + b"\n")
                except OSError:
                    os.kill(pid, signal.SIGKILL)
            elif r in running:  # a worker ended: tell its client how
                pid, client = running.pop(r)
                os.close(r)
                _, status = os.waitpid(pid, 0)
                end = ({"signal": os.WTERMSIG(status)} if os.WIFSIGNALED(status)
                       else {"code": os.WEXITSTATUS(status)})
                if client is not None:
                    try:
                        client.sendall(json.dumps(end).encode() + b"\n")
                    except OSError:
                        pass
                    client.close()
            elif r in clients:  # a client's connection is readable only when it closed
                pidfd, gone = clients[r]
                if pidfd in running:
                    try:
                        signal.pidfd_send_signal(pidfd, signal.SIGKILL)
                    except ProcessLookupError:
                        pass
                    running[pidfd] = (running[pidfd][0], None)  # its end is reaped through the pidfd
                gone.close()


def main():
    p = argparse.ArgumentParser(description="trainsup's zygote: forks pre-imported workers")
    p.add_argument("socket")
    p.add_argument("--imports", default=os.environ.get("TRAINSUP_WARM_IMPORTS", DEFAULT_IMPORTS))
    a = p.parse_args()
    _die_with_parent(signal.SIGTERM)
    signal.signal(signal.SIGTERM, lambda *_: os._exit(0))
    serve(a.socket, a.imports)


if __name__ == "__main__":
    main()
