"""torch.distributed with trainsup's collective tracker in the path of every collective.

``trainsup.init_process_group(backend="gloo", **kwargs)`` calls
``torch.distributed.init_process_group`` with the same arguments, then puts a C++
``TrackingBackend`` in front of the default group's backend for each of its device types.
Every collective that group dispatches — explicit ``dist.all_reduce`` calls, the bucketed
all-reduces DistributedDataParallel issues from C++ autograd hooks, FSDP's all-gathers and
reduce-scatters — passes through the wrapper, which records sequence number, op, bytes and the
enter time in the process-wide CollectiveTracker, forwards the call unchanged, and has the work
polled until it has really finished (``Work.isCompleted()``: CUDA events for NCCL), so a
collective that hangs on the GPU stays in flight.

The job is otherwise unchanged: ``dist.get_backend()`` says ``gloo`` or ``nccl``,
``monitored_barrier``, ``new_group`` (its subgroups are not tracked unless given to
``track_process_group``, and never matched across ranks: detection follows the default group's
sequence; point-to-point ops are tracked but not matched either), DDP, FSDP and
``torch.distributed.checkpoint`` work as without
trainsup. One visible difference: ``group._get_backend(device)`` returns the wrapper;
``inner_backend()`` gives the real one.
"""
from typing import Any, Dict, List, Optional

import torch.distributed as dist

from . import _compat, _trainsup

__all__ = ["init_process_group", "track_process_group", "inner_backend", "tracking_available",
           "collective_stats", "recent_collectives"]


def tracking_available() -> bool:
    try:
        from . import _trainsup_torch  # noqa: F401
        return True
    except ImportError:
        return False


def track_process_group(group: Optional[Any] = None) -> int:
    """Puts the tracking wrapper in front of `group`'s backends (default: the default group).
    Returns how many device types it wrapped now; 0 when the group was tracked already.

    Only the default group's collectives are matched across ranks by the job coordinator
    (every rank issues them in the same order). A subgroup's ops, and point-to-point ops on
    any group, are tracked for this rank's own view (they count as pending while it waits in
    them) but never matched: a subgroup's members and a pipeline stage's peers issue different
    numbers of them."""
    from . import _trainsup_torch
    default = _compat.default_group()
    group = group if group is not None else default
    return _trainsup_torch.track_process_group(group, job_group=group is default)


def inner_backend(group: Optional[Any] = None, device: str = "cpu") -> Any:
    """The real backend (ProcessGroupGloo, ProcessGroupNCCL, ...) of `group` for `device`,
    behind trainsup's wrapper if there is one."""
    group = group if group is not None else _compat.default_group()
    backend = _compat.group_backend(group, device)
    return getattr(backend, "inner", backend)


def init_process_group(backend: Optional[str] = None, **kwargs: Any) -> Any:
    """Initializes torch.distributed like dist.init_process_group (same arguments, same
    result), with every collective of the default group tracked."""
    if not tracking_available():
        raise ImportError("trainsup.init_process_group: the _trainsup_torch extension is missing from "
                          "this build (built without torch?); reinstall trainsup into an environment "
                          "that has torch: pip install --no-build-isolation trainsup")
    result = dist.init_process_group(backend=backend, **kwargs)
    track_process_group()
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
    """The newest n collective records (seq, job_seq, op, bytes, enter_ns, exit_ns, ok), oldest
    first; job_seq is 0 for ops the coordinator does not match (point-to-point, subgroups)."""
    return _trainsup.recent_collectives(n)
