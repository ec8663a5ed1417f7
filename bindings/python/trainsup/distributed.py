"""torch.distributed with trainsup's collective tracker in the path of every collective.

``trainsup.init_process_group(backend="gloo", **kwargs)`` calls
``torch.distributed.init_process_group`` with the same arguments and puts a C++
``TrackingBackend`` in front of the backend of **every process group the job creates**, for each
of its device types: the default group, ``new_group``, ``new_subgroups``, ``split_group``, and
the groups of ``init_device_mesh`` and its slices (every DeviceMesh dimension). Every collective
and point-to-point op such a group dispatches — ``dist.all_reduce``, DDP's bucketed
all-reduces from C++ autograd hooks, FSDP2's all-gathers and reduce-scatters, DTensor's TP
collectives, pipeline send/recv, isend/irecv and ``batch_isend_irecv`` — passes through the
wrapper, which records the op, bytes, enter time, the group's identity (the same on every
member: a hash of the group's name), the group's own sequence number (for point-to-point ops,
the channel's: the k-th send from a to b meets b's k-th receive from a) and the peer, forwards
the call unchanged, and has the work polled until it has really finished (``Work.isCompleted()``:
CUDA events for NCCL), so a collective that hangs on the GPU stays in flight. Each rank also
tells the job coordinator its rank in each group and the group's description (a mesh
dimension's name, ``mesh_tp``), from which the coordinator knows every group's members.

How groups are found without a change to the model code: torch creates every group through
``distributed_c10d._new_process_group_helper`` (which is given the members' global ranks) or
``split_group``; trainsup wraps both once, at ``trainsup.init_process_group``
(``_compat.on_new_process_group``; DeviceMesh's groups are caught too). A group created before
that is tracked by ``track_process_group(group)``.

The job is otherwise unchanged: ``dist.get_backend()`` says ``gloo`` or ``nccl``;
``monitored_barrier``, DDP, FSDP, DeviceMesh and ``torch.distributed.checkpoint`` work as
without trainsup. One visible difference: ``group._get_backend(device)`` returns the wrapper;
``inner_backend()`` gives the real one.
"""
import contextlib
import os
import threading
from typing import Any, Dict, Iterator, List, Optional

import torch.distributed as dist

from . import _compat, _trainsup

__all__ = ["init_process_group", "track_process_group", "inner_backend", "tracking_available",
           "collective_stats", "recent_collectives", "tracked_groups"]


def tracking_available() -> bool:
    try:
        from . import _trainsup_torch  # noqa: F401
        return True
    except ImportError:
        return False


def track_process_group(group: Optional[Any] = None) -> int:
    """Puts the tracking wrapper in front of `group`'s backends (default: the default group)
    and registers this rank's membership of it. Returns how many device types it wrapped now;
    0 when the group was tracked already (or this rank is not its member).

    ``trainsup.init_process_group`` calls this for every group the job creates; call it
    yourself only for a group created before that."""
    from . import _trainsup_torch
    group = group if group is not None else _compat.default_group()
    if group is None or group is dist.GroupMember.NON_GROUP_MEMBER:
        return 0
    ranks = dist.get_process_group_ranks(group)
    desc = getattr(group, "group_desc", "") or ""
    return _trainsup_torch.track_process_group(group, global_ranks=list(ranks), desc=desc)


_hooked = False
_untracked = threading.local()


@contextlib.contextmanager
def untracked_groups() -> Iterator[None]:
    """Process groups this thread creates inside are not tracked: trainsup's own (the
    checkpoint writer's gloo group, whose collectives wait on disks, not on hung ranks)."""
    depth = getattr(_untracked, "depth", 0)
    _untracked.depth = depth + 1
    try:
        yield
    finally:
        _untracked.depth = depth


def _track_new_group(pg: Any, global_ranks: Optional[List[int]] = None) -> None:
    from . import _trainsup_torch
    if getattr(_untracked, "depth", 0):
        return
    try:
        if global_ranks is None:
            global_ranks = list(dist.get_process_group_ranks(pg))
        desc = getattr(pg, "group_desc", "") or ""
        _trainsup_torch.track_process_group(pg, global_ranks=list(global_ranks), desc=desc)
    except Exception as e:  # never break the user's group creation
        import warnings
        warnings.warn(f"trainsup: could not track process group {getattr(pg, 'group_name', pg)!r}: {e}")


def _hook_group_creation() -> None:
    """Has every process group created from now on tracked (once per process)."""
    global _hooked
    if not _hooked:
        _compat.on_new_process_group(_track_new_group)
        _hooked = True


def inner_backend(group: Optional[Any] = None, device: str = "cpu") -> Any:
    """The real backend (ProcessGroupGloo, ProcessGroupNCCL, ...) of `group` for `device`,
    behind trainsup's wrapper if there is one."""
    group = group if group is not None else _compat.default_group()
    backend = _compat.group_backend(group, device)
    return getattr(backend, "inner", backend)


# How often a rank looks for rank 0's store server, and for how long before it leaves the rest
# to torch's own connect (which still waits out the group's timeout).
STORE_PROBE_INTERVAL_S = 0.005
STORE_PROBE_LIMIT_S = 60.0


def _await_rank0_store(kwargs: Dict[str, Any]) -> Optional[float]:
    """Waits, polling every 5 ms, until rank 0's TCPStore server accepts connections, then
    returns the seconds waited (None when not applicable). A rank that asks torch's TCPStore
    client to connect before the server listens is refused and retried after a randomised
    backoff of 0.25-0.75 s (measured on torch 2.13: a server up 20 ms after the client cost it
    0.32-0.62 s). After a restart every rank starts at once, so a non-zero rank often comes
    first: a third of a second of every restart, on the critical path. Applies to the env://
    rendezvous with a store hosted by rank 0 (torchrun's, MASTER_ADDR/MASTER_PORT); a store
    passed in, another init_method or the agent's shared store is left alone. Never fails:
    after STORE_PROBE_LIMIT_S, torch's own connect goes on as it would have."""
    import socket
    import time
    env = os.environ
    if kwargs.get("store") is not None or kwargs.get("init_method") not in (None, "env://"):
        return None
    if env.get("TORCHELASTIC_USE_AGENT_STORE") == "True":
        return None
    addr, port, rank = env.get("MASTER_ADDR"), env.get("MASTER_PORT"), kwargs.get("rank", env.get("RANK"))
    try:
        port_n, rank_n = int(port or ""), int(rank if rank is not None else "")
    except ValueError:
        return None
    if not addr or rank_n == 0:
        return None
    start = time.monotonic()
    while True:
        try:
            with socket.create_connection((addr, port_n), timeout=1.0):
                return time.monotonic() - start
        except OSError:
            if time.monotonic() - start >= STORE_PROBE_LIMIT_S:
                return time.monotonic() - start
            time.sleep(STORE_PROBE_INTERVAL_S)  # a retry pace, not synchronisation: refused is refused


def init_process_group(backend: Optional[str] = None, **kwargs: Any) -> Any:
    """Initializes torch.distributed like dist.init_process_group (same arguments, same
    result), with every collective and point-to-point op of every process group tracked: the
    default group and every group created after it."""
    if not tracking_available():
        raise ImportError("trainsup.init_process_group: the _trainsup_torch extension is missing from "
                          "this build (built without torch?); reinstall trainsup into an environment "
                          "that has torch: pip install --no-build-isolation trainsup")
    _hook_group_creation()
    _await_rank0_store(kwargs)
    result = dist.init_process_group(backend=backend, **kwargs)
    track_process_group()  # idempotent: the hook tracked it already where torch registers it
    from . import _live, _abort_torch_distributed, _nccl_initialized
    if _nccl_initialized():
        # Supervisors created before the process group: abort it on their abort paths too.
        for sup in list(_live):
            sup.add_abort_callback("torch.distributed", _abort_torch_distributed)
    return result


def collective_stats() -> Dict[str, Any]:
    """Counts and bytes by op, and issued/completed/failed totals, for this process."""
    return _trainsup.collective_stats()


def recent_collectives(n: int = 100) -> List[Dict[str, Any]]:
    """The newest n collective records (seq, group, group_seq, peer, op, bytes, enter_ns,
    exit_ns, ok), oldest first; group is 0 for ops the coordinator does not match (a receive
    from any source)."""
    return _trainsup.recent_collectives(n)


def tracked_groups() -> List[Dict[str, Any]]:
    """This rank's tracked process groups: group (id), name, desc, group_rank, group_size."""
    return _trainsup.tracked_groups()
