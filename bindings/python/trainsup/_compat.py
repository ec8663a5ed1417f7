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


def flatten_state_dict(state_dict: Any) -> Any:
    """A nested state dict as torch.distributed.checkpoint's planners see it: {"a.b.c": value}."""
    from torch.distributed.checkpoint._nested_dict import flatten_state_dict as flatten
    return flatten(state_dict)[0]


def cpu_state_dict(state_dict: Any, pin_memory: bool) -> Any:
    """A CPU copy of a state dict's structure (DTensors stay DTensors), to stage into: what DCP's
    stagers allocate once and reuse."""
    from torch.distributed._state_dict_utils import _create_cpu_state_dict
    return _create_cpu_state_dict(state_dict, pin_memory=pin_memory)


def copy_state_dict(state_dict: Any, into: Any, non_blocking: bool) -> Any:
    """Copies `state_dict`'s tensors into `into` (made by cpu_state_dict); returns the copy."""
    from torch.distributed._state_dict_utils import _copy_state_dict
    return _copy_state_dict(state_dict, into, non_blocking=non_blocking)


def compiled_module_inner(obj: Any) -> Optional[Any]:
    """The module a torch.compile'd module (an OptimizedModule) wraps, whose state dict has no
    `_orig_mod.` prefixes; None for anything else."""
    import torch
    inner = getattr(obj, "_orig_mod", None)
    return inner if isinstance(obj, torch.nn.Module) and isinstance(inner, torch.nn.Module) else None


def on_new_process_group(callback: Any) -> None:
    """Calls callback(pg, global_ranks) for every process group this rank joins from now on
    (global_ranks: the members' global ranks by group rank, or None when torch has registered
    them itself and dist.get_process_group_ranks(pg) gives them). torch creates groups in
    distributed_c10d._new_process_group_helper (init_process_group, new_group, new_subgroups,
    DeviceMesh's new_group path; it is given the members' global ranks, [] for the default
    group) and split_group (DeviceMesh's split path, which imported it by name). Both are
    looked up in their module at call time, so wrapping the module attribute catches them."""
    import sys
    import torch.distributed as dist
    c10d = dist.distributed_c10d
    helper = c10d._new_process_group_helper

    def _new_process_group_helper(*args: Any, **kwargs: Any) -> Any:
        result = helper(*args, **kwargs)
        pg = result[0] if isinstance(result, tuple) else result
        if pg is not None and pg is not dist.GroupMember.NON_GROUP_MEMBER:
            ranks = args[2] if len(args) > 2 else kwargs.get("global_ranks_in_group")
            callback(pg, list(ranks) if ranks else list(range(pg.size())))  # []: every rank
        return result
    c10d._new_process_group_helper = _new_process_group_helper
    split = getattr(c10d, "split_group", None)
    if split is None:
        return

    def split_group(*args: Any, **kwargs: Any) -> Any:
        pg = split(*args, **kwargs)
        if pg is not None and pg is not dist.GroupMember.NON_GROUP_MEMBER:
            callback(pg, None)
        return pg
    split_group.__doc__ = split.__doc__
    c10d.split_group = split_group
    for module in (dist, sys.modules.get("torch.distributed.device_mesh")):
        if module is not None and getattr(module, "split_group", None) is split:
            setattr(module, "split_group", split_group)
