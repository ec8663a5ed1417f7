"""python3 -m trainsup.run — torchrun with trainsup's hooks (also installed as `trainsup-run`).

Accepts torchrun's flags (`python3 -m torch.distributed.run --help`) and these of its own, each
also settable by its environment variable (docs/configuration.md):

  --run-dir DIR             TRAINSUP_RUN_DIR (default ./trainsup-run): agent event logs, sockets,
                            and quarantine records unless --quarantine-dir says otherwise
  --quarantine-dir DIR      TRAINSUP_QUARANTINE_DIR (default <run dir>/quarantine; put it on
                            storage shared by the hosts)
  --quarantine-ttl-s S      TRAINSUP_QUARANTINE_TTL_S (default 86400)
  --max-job-restarts N      TRAINSUP_MAX_RESTARTS (default 3): restarts of the whole job
  --max-restarts-without-progress N
                            TRAINSUP_MAX_RESTARTS_WITHOUT_PROGRESS (default 2)
  --coordinator-bind ADDR   TRAINSUP_COORDINATOR_BIND (default 127.0.0.1; 0.0.0.0 across hosts)
  --coordinator-advertise H TRAINSUP_COORDINATOR_ADVERTISE (default: the bind address, or the
                            host name when binding 0.0.0.0)
  --hang-floor-s S          TRAINSUP_HANG_FLOOR_S (default 5): no collective's budget is shorter
  --collective-budgets LIST TRAINSUP_COLLECTIVE_BUDGETS (default: learned), fixed budgets by op,
                            e.g. allreduce=30,broadcast=120
  --network-grace-s S       TRAINSUP_NETWORK_GRACE_S (default 3): a collective that every rank
                            entered gets this long past its budget for the network to recover
                            before anyone is named
  --rank-silence-s S        TRAINSUP_RANK_SILENCE_S (default 5): telemetry silence that names a rank
  --snapshot-memory DIR     TRAINSUP_SNAPSHOT_MEMORY (default /dev/shm/trainsup): the tmpfs where this
                            host's agent holds in-memory snapshots (<DIR>/<run id>/<host>)
  --snapshot-max-bytes N    TRAINSUP_SNAPSHOT_MAX_BYTES (default 0: no cap but the file system's):
                            the most bytes of peer copies this host's agent takes
  --warm-workers 0|1        TRAINSUP_WARM_WORKERS (default 1): start workers by forking them from
                            this host's zygote, a process that has imported torch already
                            (trainsup/launch/zygote.py); 0: torchrun's own cold start
  --metrics-port PORT       TRAINSUP_METRICS_PORT (default: off): serve /metrics (Prometheus) and
                            /status (JSON) on this port, 0 for any free one (docs/metrics.md)
  --metrics-bind ADDR       TRAINSUP_METRICS_BIND (default 0.0.0.0): the address it listens on

Differences from plain torchrun: the rendezvous backend must be elastic (c10d, the default here
with --standalone, or etcd-v2); --max-restarts defaults to 100 per agent because the job-wide
cap above governs; --monitor-interval defaults to 0.02 s instead of torch's 0.1 s (a worker's
exit is seen within 0.02 s: a restart's first phase; the rendezvous is still asked about waiting
nodes at most once a second, launch/waiting.py); Python 3.11's enum change that makes
torch 1.13's torchrun crash at start is patched, so `-r 1 -t 1` is not needed.
"""
import argparse
import hashlib
import math
import os
import socket
import sys
import uuid
from typing import Any, Dict, List, Optional, Sequence

from . import _compat as compat
from .. import kube, names
from .._trainsup_agent import DETECTOR_DEFAULTS, check_collective_budgets
from .allocation import allocation_hosts
from ..ports import free_port

__all__ = ["main", "OUR_FLAGS"]

OUR_FLAGS = {
    "--run-dir": ("TRAINSUP_RUN_DIR", "trainsup-run"),
    "--quarantine-dir": ("TRAINSUP_QUARANTINE_DIR", None),
    "--quarantine-ttl-s": ("TRAINSUP_QUARANTINE_TTL_S", "86400"),
    "--max-job-restarts": ("TRAINSUP_MAX_RESTARTS", "3"),
    "--max-restarts-without-progress": ("TRAINSUP_MAX_RESTARTS_WITHOUT_PROGRESS", "2"),
    "--coordinator-bind": ("TRAINSUP_COORDINATOR_BIND", "127.0.0.1"),
    "--coordinator-advertise": ("TRAINSUP_COORDINATOR_ADVERTISE", None),
    "--hang-floor-s": ("TRAINSUP_HANG_FLOOR_S", str(DETECTOR_DEFAULTS["hang_floor_s"])),
    "--collective-budgets": ("TRAINSUP_COLLECTIVE_BUDGETS", ""),
    "--network-grace-s": ("TRAINSUP_NETWORK_GRACE_S", str(DETECTOR_DEFAULTS["network_grace_s"])),
    "--rank-silence-s": ("TRAINSUP_RANK_SILENCE_S", str(DETECTOR_DEFAULTS["heartbeat_timeout_s"])),
    "--snapshot-memory": ("TRAINSUP_SNAPSHOT_MEMORY", "/dev/shm/trainsup"),
    "--snapshot-max-bytes": ("TRAINSUP_SNAPSHOT_MAX_BYTES", "0"),
    "--warm-workers": ("TRAINSUP_WARM_WORKERS", "1"),
    "--metrics-port": ("TRAINSUP_METRICS_PORT", None),
    "--metrics-bind": ("TRAINSUP_METRICS_BIND", "0.0.0.0"),
}


# How often torchrun's agent loop looks at its workers (its --monitor-interval; torch's default
# 0.1 s). A look is a waitpid per worker; 50 a second did not change the agent's CPU time
# measurably (7-9% of a core either way, 2 workers, mostly imports and services).
MONITOR_INTERVAL_S = 0.02


def _has(argv: Sequence[str], *flags: str) -> bool:
    return any(a == f or a.startswith(f + "=") for a in argv for f in flags)


def _setting(args: Any, flag: str) -> Any:
    env, default = OUR_FLAGS[flag]
    value = getattr(args, "trainsup_" + flag[2:].replace("-", "_"))
    return value or os.environ.get(env) or default


def _seconds(args: Any, flag: str, positive: bool = True) -> float:
    """A number of seconds from a flag or its variable; a bad one ends the launcher naming both."""
    env = OUR_FLAGS[flag][0]
    text = _setting(args, flag)
    try:
        value = float(text)
        ok = math.isfinite(value) and (value > 0 if positive else value >= 0)
    except ValueError:
        ok = False
    if not ok:
        sys.exit(f"trainsup.run: {flag} / {env} = {text!r}: must be a {'positive' if positive else 'non-negative'} "
                 "number of seconds")
    return value


def _byte_count(args: Any, flag: str) -> int:
    env = OUR_FLAGS[flag][0]
    text = str(_setting(args, flag))
    if not text.isdigit():
        sys.exit(f"trainsup.run: {flag} / {env} = {text!r}: must be a whole number of bytes (0: no cap)")
    return int(text)


def _warm_start(args: Any, settings: Dict[str, Any]) -> None:
    """Starts this host's zygote (trainsup/launch/zygote.py) and makes torchrun start each worker
    through trainsup-warm-client (or warm_client.py where it is missing), which has the zygote
    fork it. Torchrun's own OMP_NUM_THREADS default
    for workers is applied to the zygote first (libgomp reads it when torch is loaded)."""
    import atexit
    import subprocess
    from .launcher import node_name
    os.makedirs(settings["socket_dir"], mode=0o700, exist_ok=True)
    sock = os.path.join(settings["socket_dir"], f"zygote-{hashlib.sha1(node_name().encode()).hexdigest()[:8]}.sock")
    env = dict(os.environ)
    if "OMP_NUM_THREADS" not in env and int(args.nproc_per_node) > 1:
        env["OMP_NUM_THREADS"] = "1"
    # A session of its own, as torchrun gives each worker: a signal to the job's process group
    # (a scheduler's SIGTERM) reaches the agent, which stops its workers as it always does, and
    # not the zygote, whose end would kill every worker at once. It ends with the agent.
    zygote = subprocess.Popen([sys.executable, "-m", "trainsup.launch.zygote", sock], env=env,
                              stdout=subprocess.PIPE, text=True, start_new_session=True)
    atexit.register(zygote.kill)
    # It says "listening" once its socket exists (before its imports): a worker asked for from
    # then on waits in its backlog. Anything else (it failed to start): workers start cold.
    if zygote.stdout is None or zygote.stdout.readline().strip() != "listening":
        print("[trainsup] the zygote did not start; workers start cold", file=sys.stderr, flush=True)
        return
    here = os.path.dirname(os.path.abspath(__file__))
    native = os.path.join(here, "trainsup-warm-client")
    if os.access(native, os.X_OK) and not getattr(args, "run_path", False):
        # The compiled client (bindings/python/src/warm_client.cc): torchrun runs it directly
        # (its --no-python), and it runs the script with torchrun's interpreter if no zygote answers.
        python = os.getenv("PYTHON_EXEC", sys.executable)
        args.training_script_args = [python, sock, args.training_script, *args.training_script_args]
        args.training_script = native
        args.no_python = True
    else:
        args.training_script_args = [sock, args.training_script, *args.training_script_args]
        args.training_script = os.path.join(here, "warm_client.py")


def main(argv: Optional[Sequence[str]] = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    compat.fix_std_parsing()
    compat.prepare_environment()
    compat.prompt_log_tailing()
    # torchrun's own parser, with our flags added (they must come before the training script).
    parser = compat.torchrun_parser()
    parser.prog = "python3 -m trainsup.run"
    for flag in OUR_FLAGS:
        parser.add_argument(flag, dest="trainsup_" + flag[2:].replace("-", "_"), default=None)
    defaults: List[str] = []
    if not _has(argv, "--max_restarts", "--max-restarts"):
        defaults += ["--max_restarts", "100"]
    if not _has(argv, "--monitor_interval", "--monitor-interval"):
        defaults += ["--monitor-interval", str(MONITOR_INTERVAL_S)]
    args = parser.parse_args(defaults + argv)
    run_dir = os.path.abspath(_setting(args, "--run-dir"))
    # Workers' output also goes to files, so that a failure can be classified from its tail; one
    # folder per host, because the run dir may be on storage that every host shares.
    if not _has(argv, "--log_dir", "--log-dir", "--redirects", "-r", "--tee", "-t"):
        from .launcher import node_name
        args.log_dir, args.tee = os.path.join(run_dir, "workers", node_name()), "3"
    if args.standalone:
        port = free_port()
        args.standalone = False
        args.rdzv_backend, args.rdzv_endpoint, args.rdzv_id = "c10d", f"127.0.0.1:{port}", str(uuid.uuid4())
    inner_backend = args.rdzv_backend
    if inner_backend == "static":
        sys.exit("trainsup.run: the static rendezvous cannot replace a host; use --rdzv_backend=c10d "
                 "(or etcd-v2) with --rdzv_endpoint and --rdzv_id, or --standalone on one machine")
    inner_factory = compat.inner_handler_factory(inner_backend)

    budgets = _setting(args, "--collective-budgets")
    try:
        check_collective_budgets(budgets)
    except ValueError as e:
        sys.exit(f"trainsup.run: --collective-budgets / TRAINSUP_COLLECTIVE_BUDGETS: {e}")
    metrics_port = _setting(args, "--metrics-port")
    if metrics_port is not None:
        try:
            metrics_port = int(metrics_port)
            if not 0 <= metrics_port <= 65535:
                raise ValueError
        except ValueError:
            sys.exit(f"trainsup.run: --metrics-port / TRAINSUP_METRICS_PORT = {metrics_port!r}: must be a port "
                     "number (0-65535; 0: any free port)")
        try:
            import prometheus_client  # noqa: F401
        except ImportError:
            sys.exit("trainsup.run: --metrics-port needs the prometheus-client package (pip install prometheus-client)")
    if kube.enabled():
        try:  # the effect, the `kubernetes` package and its credentials: at launch, not at the first quarantine
            kube.KubeNodes()
        except (ValueError, kube.KubeError) as e:
            sys.exit(f"trainsup.run: TRAINSUP_KUBERNETES_QUARANTINE=1: {e}")
    try:
        allocation = allocation_hosts()
    except ValueError as e:
        sys.exit(f"trainsup.run: {e}")
    bind = _setting(args, "--coordinator-bind")
    settings = {
        "run_dir": run_dir,
        "quarantine_dir": os.path.abspath(_setting(args, "--quarantine-dir") or names.quarantine_dir(run_dir)),
        "quarantine_ttl_s": float(_setting(args, "--quarantine-ttl-s")),
        "quarantine_commands": os.environ.get("TRAINSUP_QUARANTINE_COMMANDS", ""),
        "preflight_command": os.environ.get("TRAINSUP_PREFLIGHT_COMMAND", ""),
        "kubernetes_quarantine": kube.enabled(),
        "metrics_port": metrics_port,
        "metrics_bind": _setting(args, "--metrics-bind"),
        "max_restarts": int(_setting(args, "--max-job-restarts")),
        "max_restarts_without_progress": int(_setting(args, "--max-restarts-without-progress")),
        "bind": bind,
        "advertise": _setting(args, "--coordinator-advertise") or (socket.getfqdn() if bind == "0.0.0.0" else bind),
        # Unix socket paths are limited to 107 bytes: a short private directory, not the run dir.
        "socket_dir": os.environ.get("TRAINSUP_SOCKET_DIR") or os.path.join(
            "/tmp", f"trainsup-{os.getuid()}", hashlib.sha1(run_dir.encode()).hexdigest()[:10]),
        "nproc_per_node": int(args.nproc_per_node),
        "checkpoint_dir": os.path.abspath(os.environ.get("TRAINSUP_CHECKPOINT_DIR", "checkpoints")),
        "worker_log_dir": os.path.abspath(args.log_dir) if args.log_dir else None,
        "agent_heartbeat_s": float(os.environ.get("TRAINSUP_AGENT_HEARTBEAT_S", "1")),
        "agent_timeout_s": float(os.environ.get("TRAINSUP_AGENT_TIMEOUT_S", "5")),
        "hang_floor_s": _seconds(args, "--hang-floor-s"),
        "collective_budgets": budgets,
        "network_grace_s": _seconds(args, "--network-grace-s", positive=False),
        "rank_silence_s": _seconds(args, "--rank-silence-s"),
        "snapshot_memory": os.path.abspath(_setting(args, "--snapshot-memory")),
        "snapshot_max_bytes": _byte_count(args, "--snapshot-max-bytes"),
        "allocation_hosts": allocation,
    }
    os.environ["TRAINSUP_RUN_DIR"] = run_dir
    warm = str(_setting(args, "--warm-workers")).strip().lower()
    if warm not in ("0", "1", "true", "false", "yes", "no", "on", "off"):
        sys.exit(f"trainsup.run: --warm-workers / TRAINSUP_WARM_WORKERS = {warm!r}: must be 0 or 1")
    if warm in ("1", "true", "yes", "on") and not args.no_python and not args.module:
        _warm_start(args, settings)

    from .launcher import TrainsupRendezvousHandler

    handlers = []

    def create(params: Any) -> Any:
        handlers.append(TrainsupRendezvousHandler(inner_factory(params), settings))
        return handlers[-1]

    compat.register_rendezvous_handler("trainsup", create)
    args.rdzv_backend = "trainsup"

    def stopped(sig: int) -> None:
        # Stopped from outside (the scheduler's SIGTERM, a Ctrl-C): torchrun skips shutdown() so
        # that the rendezvous stays open, and this host did not die: the others must not name it.
        for h in handlers:
            h.stopped_by_signal(sig)

    compat.run_torchrun(args, on_signal=stopped)


if __name__ == "__main__":
    main()
