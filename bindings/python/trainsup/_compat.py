"""Every use of torch's internals by the rank side of trainsup (a training process), in one
place, because they differ between torch versions: torch.distributed's default store and group,
a group's backend per device, the NCCL process-group abort, torch.compile's wrapped module. The
launcher's use of torchrun's internals is in trainsup/launch/_compat.py. Nothing else in the
package imports a private torch name (tests/python/test_compat.py checks that). Imports of torch
happen inside the functions: `import trainsup` does not load torch.

Run and tested on torch 2.13."""
from typing import Any, Optional


# --- torch.distributed -------------------------------------------------------------------------

def default_store() -> Any:
    """The c10d store of the default process group (checkpoint commits travel through it)."""
    import torch.distributed as dist
    return dist.distributed_c10d._get_default_store()


def default_group() -> Any:
    """The default process group (torch.distributed.group.WORLD's object)."""
    import torch.distributed as dist
    return dist.distributed_c10d._get_default_group()


def group_backend(group: Any, device: str) -> Any:
    """The backend object `group` uses for torch device type `device` ("cpu", "cuda")."""
    import torch
    return group._get_backend(torch.device(device))


def abort_process_groups(dist: Any) -> None:
    """Aborts every process group of `dist` (an initialized torch.distributed), so that no rank
    waits out NCCL's own timeout and no kernel is left pending at exit."""
    c10d = dist.distributed_c10d
    if hasattr(c10d, "_abort_process_group"):
        c10d._abort_process_group()
    else:
        group_backend(c10d._get_default_group(), "cuda").abort()


def compiled_module_inner(obj: Any) -> Optional[Any]:
    """The module a torch.compile'd module (an OptimizedModule) wraps, whose state dict has no
    `_orig_mod.` prefixes; None for anything else."""
    import torch
    inner = getattr(obj, "_orig_mod", None)
    return inner if isinstance(obj, torch.nn.Module) and isinstance(inner, torch.nn.Module) else None
