"""trainsup: keeps large PyTorch training jobs alive.

The package mirrors trainsup's layers (docs/architecture.md):

  trainsup           the rank side, imported by a training process: the C++ supervisor (a
                     watchdog on its own native threads that catches a rank stuck in Python, in
                     C, or holding the GIL, and dumps native and Python stacks), host-attributed
                     logs, the event log, asynchronous verified checkpoints, and
                     torch.distributed with every collective tracked
  trainsup.launch    the launcher agent, `trainsup-run` (torchrun with trainsup's hooks)
  trainsup.tools     operator commands: `trainsup report`, `trainsup quarantine`

    import trainsup
    state = {"model": model, "optimizer": optimizer, "next_step": 0}
    with trainsup.Supervisor(section_budgets={"step": 30}) as sup:
        sup.restore(state)                     # newest valid checkpoint (returns its step)
        for step in range(state["next_step"], steps):
            with sup.step(step):
                train_one_step()
            state["next_step"] = step + 1
            sup.maybe_checkpoint(step, state)  # every TRAINSUP_CHECKPOINT_INTERVAL_S

`import trainsup` loads no torch (an operator's tools run where torch is not installed); the
names that need torch (init_process_group, load_checkpoint, ...) load it on first use. A torch
release other than the one trainsup was built against is refused at import all the same, read
from torch's files without importing it.
"""
import atexit
import functools
import importlib
import os
import warnings
import weakref
from typing import Any, Callable, Dict, Optional

from ._build_info import check_torch as _check_torch

_check_torch()  # before any extension built against torch is loaded

from . import _compat, _trainsup  # noqa: E402
from .events import json_fields as _json_fields  # noqa: E402
from .errors import (CorruptionError, Error, InternalError, InvalidArgumentError, IoError,  # noqa: E402
                     NotFoundError, TimedOutError, UnavailableError)
from ._trainsup import (EXIT_ABORTED, EXIT_BAD_CONFIG, EXIT_DO_NOT_REQUEUE, EXIT_QUARANTINED, EXIT_REQUEUE,  # noqa: E402
                        EXIT_STALL, EXIT_STOP_REQUESTED, EXIT_WATCHDOG_UNRESPONSIVE, exit_code_name)

# Names whose modules import torch: loaded on first use (PEP 562).
_LAZY = {
    "Checkpoint": "checkpoint", "PyStoreChannel": "checkpoint", "load_checkpoint": "checkpoint",
    "collective_stats": "distributed", "init_process_group": "distributed", "inner_backend": "distributed",
    "recent_collectives": "distributed", "track_process_group": "distributed",
}
_SUBMODULES = {"checkpoint", "distributed", "launch", "tools"}

__all__ = [
    "Supervisor", "init_process_group", "track_process_group", "inner_backend", "collective_stats",
    "recent_collectives", "Checkpoint", "PyStoreChannel", "load_checkpoint",
    "Error", "CorruptionError", "InternalError", "InvalidArgumentError", "IoError", "NotFoundError",
    "TimedOutError", "UnavailableError",
    "EXIT_ABORTED", "EXIT_BAD_CONFIG", "EXIT_DO_NOT_REQUEUE", "EXIT_QUARANTINED", "EXIT_REQUEUE", "EXIT_STALL",
    "EXIT_STOP_REQUESTED", "EXIT_WATCHDOG_UNRESPONSIVE", "exit_code_name", "cmake_prefix_path", "__version__",
]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        value = getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
        globals()[name] = value
        return value
    if name in _SUBMODULES:
        return importlib.import_module(f".{name}", __name__)
    raise AttributeError(f"module 'trainsup' has no attribute {name!r}")


__version__ = _trainsup.__version__

import os as _os  # noqa: E402
# For C++ trainers that link the library installed with this package:
# cmake -DCMAKE_PREFIX_PATH="$(python -c 'import trainsup; print(trainsup.cmake_prefix_path)')"
cmake_prefix_path = _os.path.join(_os.path.dirname(__file__), "lib", "cmake")

# Keyword argument -> environment variable it overrides (docs/configuration.md), made from the
# C++ library's own list of what a rank reads: TRAINSUP_<NAME> is keyword <name>, and torchrun's identity
# variables are keywords too (RANK is rank). Run ids and restart counts are the launcher's.
_IDENTITY = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "MASTER_ADDR", "MASTER_PORT")
_SETTINGS = {v[len("TRAINSUP_"):].lower() if v.startswith("TRAINSUP_") else v.lower(): v
             for v in _trainsup.SETTING_VARIABLES
             if (v.startswith("TRAINSUP_") and v != "TRAINSUP_RESTART_COUNT") or v in _IDENTITY}
_SETTINGS["heartbeat_timeout_s"] = "TRAINSUP_WATCHDOG_HEARTBEAT_TIMEOUT_S"  # the keyword of earlier releases


def _as_text(name: str, value: Any) -> str:
    if isinstance(value, bool):
        return "1" if value else "0"
    if name == "section_budgets" and isinstance(value, dict):
        return ",".join(f"{k}={v}" for k, v in value.items())
    return str(value)


class Supervisor:
    """Supervises this rank. Keyword settings override TRAINSUP_* and torchrun variables."""

    def __init__(self, include_rng: bool = True, **settings: Any) -> None:
        unknown = sorted(set(settings) - set(_SETTINGS))
        if unknown:
            raise TypeError(f"trainsup.Supervisor: unknown setting(s) {unknown}; "
                            f"known: {sorted(_SETTINGS)}")
        by_variable: Dict[str, list] = {}
        for k in settings:
            by_variable.setdefault(_SETTINGS[k], []).append(k)
        both = [sorted(ks) for ks in by_variable.values() if len(ks) > 1]
        if both:
            raise TypeError(f"trainsup.Supervisor: {both[0]} name the same setting ({_SETTINGS[both[0][0]]}); "
                            "give one")
        overrides = {_SETTINGS[k]: _as_text(k, v) for k, v in settings.items()}
        self._sup = _trainsup.Supervisor(overrides)
        _live.add(self)
        self._include_rng = include_rng
        self._checkpoints = False
        self._dcp: Optional[Any] = None  # trainsup.dcp.DcpCheckpoints, made with the checkpointer
        self._snapshot_alive: Optional[list] = None
        if _nccl_initialized():
            self._sup.add_abort_callback("torch.distributed", _abort_torch_distributed)

    # --- checkpoints: collective calls, every rank at the same steps ---
    def _ensure_checkpoints(self) -> None:
        if self._checkpoints:
            return
        channel = None
        if self._sup.world_size > 1:
            import torch.distributed as dist
            if not dist.is_initialized():
                raise RuntimeError("trainsup: checkpoints of several ranks need torch.distributed "
                                   "initialized first (its store carries the commit)")
            from .checkpoint import PyStoreChannel
            channel = PyStoreChannel(_compat.default_store())
        persist = None
        if self._sup.checkpoint_format != "native" and _dcp_available():
            # The DCP path's writer runs on the checkpointer's writer thread (trainsup/dcp.py);
            # its gloo group is made here, by every rank at the same call.
            from .dcp import DcpCheckpoints
            self._dcp = DcpCheckpoints(self._sup.rank, self._sup.world_size, self._sup.checkpoint_commit_timeout_s)
            persist = self._dcp.persist
        elif self._sup.checkpoint_format == "dcp":
            raise RuntimeError("trainsup: checkpoint_format='dcp' needs torch.distributed.checkpoint, which this "
                               "torch does not have")
        self._sup.enable_checkpoints(channel, persist)
        self._checkpoints = True

    def _uses_dcp(self, state: Dict[str, Any]) -> bool:
        if self._dcp is None:
            return False
        if self._sup.checkpoint_format == "dcp":
            return True
        from .dcp import holds_dtensor
        return holds_dtensor(state)

    def _save(self, step: int, state: Dict[str, Any], now: bool) -> str:
        self._ensure_checkpoints()
        keep: list = []

        def collect(tier: str = "disk") -> Any:
            # The memory tier always writes trainsup's own shards (a DTensor as its local shard):
            # it is restored by a job of the same world size and mesh (docs/snapshots.md).
            if tier == "disk" and self._uses_dcp(state):
                # DCP's staging: the only stall; the writer thread then persists through DCP.
                from .dcp import LAYOUT, to_dcp
                assert self._dcp is not None
                try:
                    state_dict, _ = to_dcp(state, self._sup.rank, self._include_rng)
                    self._dcp.stage(int(step), state_dict)
                except Exception as e:
                    # The other ranks' collective save must not wait for this rank (dcp.py).
                    self._dcp.abstain(int(step), e)
                    raise
                return [], {"trainsup.python": "1", "trainsup.layout": LAYOUT}
            from .checkpoint import collect as _collect
            buffers, metadata, alive = _collect(state, self._include_rng)
            keep.append(alive)
            return buffers, metadata

        outcome, earlier = self._sup.save(int(step), collect, now)
        # Overlapped snapshots read the tensors after save() returns: keep them (and the RNG
        # copies made for this save) alive until the copy is done.
        self._snapshot_alive = keep if self._sup.snapshot_outstanding else None
        if earlier:
            warnings.warn(f"trainsup: an earlier checkpoint failed (training continues): {earlier}",
                          RuntimeWarning, stacklevel=3)
        return outcome

    def await_snapshot(self) -> None:
        """With checkpoint_snapshot="overlapped": waits until the last checkpoint's copy of the
        state is done; call it before the state next changes (guard_optimizer does it for the
        optimizer step). Returns at once when nothing is outstanding."""
        if not self._checkpoints:
            return
        error = self._sup.await_snapshot()
        self._snapshot_alive = None
        if error:
            warnings.warn(f"trainsup: checkpoint snapshot failed (training continues): {error}",
                          RuntimeWarning, stacklevel=2)

    def guard_optimizer(self, optimizer: Any) -> Any:
        """Makes optimizer.step() call await_snapshot() first, so that an overlapped snapshot
        never sees a half-updated state. Returns the optimizer."""
        inner = optimizer.step

        @functools.wraps(inner)
        def step(*args: Any, **kwargs: Any) -> Any:
            self.await_snapshot()
            return inner(*args, **kwargs)

        optimizer.step = step
        return optimizer

    def maybe_checkpoint(self, step: int, state: Dict[str, Any]) -> str:
        """Checkpoints `state` if one is due (interval or every-N-steps); returns 'started',
        'not_due' or 'skipped_busy'. The stall is the copy; the write happens in the background."""
        return self._save(step, state, False)

    def checkpoint(self, step: int, state: Dict[str, Any]) -> str:
        """Checkpoints `state` now (subject to the busy policy)."""
        return self._save(step, state, True)

    def restore(self, state: Dict[str, Any], adopt_dcp: Optional[str] = None) -> int:
        """Loads the newest checkpoint that verifies on every rank into `state` (in place: modules,
        optimizers and schedulers through load_state_dict, other values replaced) and returns its
        step, or 0 when there is none. The step was completed before it was saved: resume at the
        next one (keep it in `state`, e.g. state["next_step"]). A state that does not match the
        checkpoint, or any error of a load_state_dict, raises ValueError and stops the restore on
        every rank; an unreadable or corrupt checkpoint is skipped for the next older one.

        Checkpoints of the dcp layout (torch.distributed.checkpoint) load on any world size and
        mesh: DCP reshards them. `adopt_dcp`: a DCP checkpoint directory (written by plain
        dcp.save, as a job did before it adopted trainsup) to load when trainsup's directory
        has no checkpoint yet; the step returned is then 0 and `state` holds what was saved."""
        self._ensure_checkpoints()
        from .checkpoint import load_into

        def load(shard: Any, manifest: Dict[str, Any]) -> None:
            if manifest["metadata"].get("trainsup.layout") == "dcp":
                self._load_dcp(state, os.path.dirname(shard.path), manifest["world_size"])
            else:
                load_into(state, shard)
        step = self._sup.restore(load)
        if step is None and adopt_dcp is not None:
            if not os.path.exists(os.path.join(adopt_dcp, ".metadata")):
                raise NotFoundError(f"trainsup: adopt_dcp={adopt_dcp!r} is not a torch.distributed.checkpoint "
                                    "checkpoint (no .metadata)")
            self._load_dcp(state, adopt_dcp, None)
            self.event("checkpoint_adopted", dir=adopt_dcp)
            self.log(f"adopted the torch.distributed.checkpoint checkpoint {adopt_dcp}")
        return 0 if step is None else step

    def _load_dcp(self, state: Dict[str, Any], path: str, world_size: Optional[int]) -> None:
        if self._dcp is None:
            raise ValueError(f"trainsup: {path} is a torch.distributed.checkpoint checkpoint and "
                             "checkpoint_format is 'native'")
        from .dcp import to_dcp
        state_dict, apply = to_dcp(state, self._sup.rank, True)
        self._dcp.load(state_dict, path, world_size)
        apply(state_dict)

    def add_abort_callback(self, name: str, callback: Callable[[str, int], None]) -> None:
        """Runs callback(section, step) when this rank aborts (a stall with stall_action=exit,
        or the coordinator's abort order), before the process exits; on a trainsup thread,
        with the GIL. Keep it short: the exit is bounded by abort_grace_s."""
        self._sup.add_abort_callback(str(name), callback)

    def step(self, step: int) -> Any:
        """Context manager timing one training step."""
        return self._sup.step(int(step))

    def section(self, name: str) -> Any:
        """Context manager timing a named section (setup, eval, checkpoint, ...)."""
        return self._sup.section(str(name))

    @property
    def stop_requested(self) -> bool:
        return self._sup.stop_requested

    def log(self, message: Any, level: str = "info") -> None:
        self._sup.log(level, str(message))

    def event(self, name: str, **fields: Any) -> None:
        """One line in the event log: strings stay strings; numbers, bools, None, lists and dicts
        keep their JSON types; anything else is written as its str() (trainsup/events.py)."""
        self._sup.event(name, _json_fields(fields))

    @property
    def host(self) -> str:
        return self._sup.host

    @property
    def rank(self) -> int:
        return self._sup.rank

    @property
    def log_file(self) -> str:
        return self._sup.log_file

    @property
    def event_log(self) -> str:
        return self._sup.event_log

    def close(self, failed: bool = False) -> None:
        """Stops the watchdog, waits for a pending checkpoint persist, says goodbye to the
        coordinator, flushes the logs. Idempotent. `failed=True` (what `with` passes when the
        block raised): if the job's coordinator is ordering an abort (the error was a
        consequence of it), the process exits with EXIT_ABORTED as ordered; otherwise the
        goodbye says this rank failed on its own (a failed_rank verdict, no host blamed)."""
        self._sup.close(bool(failed))
        _live.discard(self)

    def __enter__(self) -> "Supervisor":
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        self.close(failed=exc_type is not None and not issubclass(exc_type, SystemExit))


# Supervisors still open at exit are closed while the interpreter is intact, so that no thread
# is joined (and no pending persist waited for) during interpreter shutdown.
_live: "weakref.WeakSet[Supervisor]" = weakref.WeakSet()


def _dcp_available() -> bool:
    try:
        import torch.distributed.checkpoint  # noqa: F401
        from torch.distributed.checkpoint.state_dict import get_model_state_dict  # noqa: F401
    except ImportError:
        return False
    return True


def _nccl_initialized() -> bool:
    import sys
    dist = sys.modules.get("torch.distributed")
    return (dist is not None and dist.is_available() and dist.is_initialized()
            and "nccl" in str(dist.get_backend()).lower())


def _abort_torch_distributed(section: str, step: int) -> None:
    """On abort: NCCL process groups are aborted so that no rank waits out NCCL's timeout and
    no kernel is left pending at exit (torch 2.x; gloo and torch 1.x need nothing here)."""
    import sys
    dist = sys.modules.get("torch.distributed")
    if dist is None or not dist.is_available() or not dist.is_initialized():
        return
    if "nccl" not in str(dist.get_backend()).lower():
        return
    _compat.abort_process_groups(dist)


@atexit.register
def _close_all() -> None:
    for sup in list(_live):
        sup.close()
    # No collective-completion polling while the interpreter and torch are torn down, and no
    # backend thread left as the last owner of a work: gloo's worker would decref the work's
    # Python tensors during Py_FinalizeEx and abort the process (issue 19).
    _trainsup.release_completion_watcher_at_exit(1.0)
    # Nor a process group destroyed then: it would join gloo's threads with the GIL released,
    # during Py_FinalizeEx (issue 19). The tracked backends live until the process ends.
    import sys
    torch_ext = sys.modules.get(__name__ + "._trainsup_torch")
    if torch_ext is not None:
        torch_ext.hold_tracked_backends_until_exit()
