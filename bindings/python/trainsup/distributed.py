"""torch.distributed with trainsup's collective tracker in the path of every collective.

``trainsup.init_process_group(backend="gloo", **kwargs)`` works like
``torch.distributed.init_process_group`` but registers a backend ``trainsup_<backend>`` whose
process group is a C++ ``TrackingProcessGroup`` wrapping the real gloo (or NCCL) group. Every
collective of the default group — explicit ``dist.all_reduce`` calls and the bucketed
all-reduces that DistributedDataParallel issues from C++ autograd hooks alike — passes through
the wrapper, which records sequence number, op, bytes, and enter and exit times in the
process-wide CollectiveTracker, then forwards the call unchanged.
"""
import torch.distributed as dist

from . import _trainsup

_registered = set()


def _creator(backend):
    from . import _trainsup_torch

    def create(store, rank, size, timeout):
        if backend == "gloo":
            inner = dist.ProcessGroupGloo(store, rank, size, timeout)
        elif backend == "nccl":
            opts = dist.ProcessGroupNCCL.Options()
            opts._timeout = timeout
            inner = dist.ProcessGroupNCCL(store, rank, size, opts)
        else:
            raise ValueError(f"trainsup.init_process_group: backend {backend!r} is not supported (gloo, nccl)")
        return _trainsup_torch.TrackingProcessGroup(inner)
    return create


def tracking_available():
    try:
        from . import _trainsup_torch  # noqa: F401
        return True
    except ImportError:
        return False


def init_process_group(backend="gloo", **kwargs):
    """Initializes torch.distributed like dist.init_process_group, with the collective tracker.
    Without the tracking module (a torch version it was not built for) it warns and initializes
    the plain backend."""
    backend = str(backend).lower()
    if not tracking_available():
        import warnings
        warnings.warn("trainsup: collective tracking is not available for this torch build; "
                      "initializing the plain backend", RuntimeWarning)
        return dist.init_process_group(backend=backend, **kwargs)
    name = f"trainsup_{backend}"
    if name not in _registered:
        dist.Backend.register_backend(name, _creator(backend))
        _registered.add(name)
    result = dist.init_process_group(backend=name, **kwargs)
    if backend == "nccl":
        # Supervisors created before the process group: abort it on their abort paths too.
        from . import _live, _abort_torch_distributed
        for sup in list(_live):
            sup.add_abort_callback("torch.distributed", _abort_torch_distributed)
    return result


def collective_stats():
    """Counts and bytes by op, and issued/completed/failed totals, for this process."""
    return _trainsup.collective_stats()


def recent_collectives(n=100):
    """The newest n collective records (seq, op, bytes, enter_ns, exit_ns, ok), oldest first."""
    return _trainsup.recent_collectives(n)
