"""Python state <-> trainsup checkpoints.

A training state is a dict. Values with ``state_dict()``/``load_state_dict()`` (modules,
optimizers, LR schedulers) are saved through their state dicts; other values are saved as they
are. Every tensor goes into the checkpoint as a named buffer (the C++ checkpointer copies it
into staging memory; CUDA tensors with one device-to-host copy); everything else (nested
dicts, numbers, strings, RNG states of numpy and ``random``) is pickled into one bytes buffer,
``__skeleton__``, with placeholders where the tensors were. Loading unpickles that skeleton, so
only load checkpoints you trust, as with ``torch.load``.

torch 2.x state: a ``torch.compile``d module is saved and loaded through the module it wraps
(``_orig_mod``), so its checkpoints load into the plain module and back. A DTensor (FSDP2's
``fully_shard`` parameters and their optimizer state, or FSDP's sharded state dicts) is saved as
its local shard with its placements and global shape, and loaded back as a DTensor on the
matching device mesh of the state it is loaded into: every rank keeps its own shard, nothing is
gathered.
"""
import functools
import os
import pickle
import random
from typing import Any, Dict, List, Optional, Sequence, Tuple

import torch

from . import _compat, _trainsup

__all__ = ["Checkpoint", "PyStoreChannel", "load_checkpoint", "collect", "load_into", "read_skeleton"]

_TO_NAME = {
    torch.float32: "float32", torch.float64: "float64", torch.float16: "float16",
    torch.bfloat16: "bfloat16", torch.int64: "int64", torch.int32: "int32",
    torch.int16: "int16", torch.int8: "int8", torch.uint8: "uint8", torch.bool: "bool",
}
_FROM_NAME = {v: k for k, v in _TO_NAME.items()}
_FROM_NAME["bytes"] = torch.uint8
SKELETON = "__skeleton__"
RNG_KEY = "__rng__"


class _Tensor:
    """Where a tensor stood in the pickled skeleton."""
    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name

    def __reduce__(self) -> Any:
        return (_Tensor, (self.name,))


class _DTensor:
    """Where a DTensor stood: its local shard is the buffer `name`; the rest rebuilds it."""
    __slots__ = ("name", "placements", "shape", "stride", "mesh", "device_type")

    def __init__(self, name: str, placements: Any, shape: Any, stride: Any, mesh: Any, device_type: str) -> None:
        self.name, self.placements, self.shape, self.stride = name, placements, shape, stride
        self.mesh, self.device_type = mesh, device_type

    def __reduce__(self) -> Any:
        return (_DTensor, (self.name, self.placements, self.shape, self.stride, self.mesh, self.device_type))


@functools.lru_cache(maxsize=None)
def _dtensor_class() -> Any:
    try:
        from torch.distributed.tensor import DTensor
    except ImportError:
        return None
    return DTensor


# Leaves kept as they are, without a name built for them: a snapshot's RNG state alone holds
# Python's 625-int Mersenne Twister state, and walking it item by item was most of the Python
# time of a blocking snapshot (1 ms of its 1.1 ms).
_PLAIN = (int, float, bool, str, bytes, type(None))


def _unwrap(obj: Any) -> Any:
    """The module a torch.compile'd one wraps: its state dict has no `_orig_mod.` prefixes."""
    inner = _compat.compiled_module_inner(obj)
    return inner if inner is not None else obj


def _flatten(prefix: str, obj: Any, tensors: List[Tuple[str, torch.Tensor]]) -> Any:
    DTensor = _dtensor_class()
    if DTensor is not None and isinstance(obj, DTensor):
        name = prefix
        tensors.append((name, obj.to_local()))
        mesh = obj.device_mesh
        return _DTensor(name, tuple(obj.placements), tuple(obj.shape), tuple(obj.stride()),
                        mesh.mesh.tolist(), mesh.device_type)
    if isinstance(obj, torch.Tensor):
        name = prefix
        tensors.append((name, obj))
        return _Tensor(name)
    if isinstance(obj, dict):
        flat = {k: v if type(v) in _PLAIN else _flatten(f"{prefix}.{k}", v, tensors) for k, v in obj.items()}
        if type(obj) is not dict:
            try:
                return type(obj)(flat)  # OrderedDict and friends keep their type
            except TypeError:
                pass
        return flat
    if isinstance(obj, (list, tuple)) and not hasattr(obj, "_fields"):
        items = [v if type(v) in _PLAIN else _flatten(f"{prefix}.{i}", v, tensors) for i, v in enumerate(obj)]
        return items if isinstance(obj, list) else tuple(items)
    return obj


def _rng_state() -> Dict[str, Any]:
    state: Dict[str, Any] = {"torch": torch.get_rng_state(), "python": random.getstate()}
    try:
        import numpy
        state["numpy"] = numpy.random.get_state()
    except ImportError:
        pass
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def _set_rng_state(state: Dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    if "numpy" in state:
        import numpy
        numpy.random.set_state(state["numpy"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def collect(state: Dict[str, Any], include_rng: bool = True) -> Tuple[list, Dict[str, str], List[Any]]:
    """(buffers, metadata, keep) for _trainsup.Supervisor.save: `keep` holds the memory the buffers
    point into (contiguous copies, the RNG state, the pickled skeleton) until the copy is done."""
    tensors: List[Tuple[str, torch.Tensor]] = []
    skeleton: Dict[str, Any] = {}
    for key, obj in state.items():
        if hasattr(obj, "state_dict") and hasattr(obj, "load_state_dict"):
            skeleton[key] = ("state_dict", _flatten(key, _unwrap(obj).state_dict(), tensors))
        else:
            skeleton[key] = ("value", _flatten(key, obj, tensors))
    if include_rng:
        skeleton[RNG_KEY] = ("rng", _flatten(RNG_KEY, _rng_state(), tensors))
    buffers = []
    keep = []
    for name, t in tensors:
        t = t.detach()
        if t.dtype not in _TO_NAME:
            raise TypeError(f"trainsup: tensor '{name}' has dtype {t.dtype}, which cannot be checkpointed")
        if not t.is_contiguous():
            t = t.contiguous()
        if t.device.type not in ("cpu", "cuda"):
            t = t.cpu()
        keep.append(t)
        buffers.append((name, _TO_NAME[t.dtype], list(t.shape), t.data_ptr(), t.numel() * t.element_size(),
                        t.device.index if t.device.type == "cuda" else -1))
    # The copy runs as a plain cudaMemcpy: every kernel writing these tensors, on any stream of
    # any device, must be done first.
    for device in sorted({t.device.index for t in keep if t.device.type == "cuda"}):
        torch.cuda.synchronize(device)
    blob = torch.frombuffer(bytearray(pickle.dumps(skeleton, protocol=pickle.HIGHEST_PROTOCOL)), dtype=torch.uint8)
    keep.append(blob)
    buffers.append((SKELETON, "bytes", [blob.numel()], blob.data_ptr(), blob.numel(), -1))
    return buffers, {"trainsup.python": "1"}, keep


def _read(shard: Any, entry: Dict[str, Any]) -> torch.Tensor:
    t = torch.empty(entry["shape"], dtype=_FROM_NAME[entry["dtype"]])
    shard.read_into(entry["name"], t.data_ptr(), t.numel() * t.element_size())
    return t


def _meshes_of(obj: Any) -> List[Any]:
    """The device meshes of the DTensors `obj` holds (a module's parameters and buffers, an
    optimizer's parameters), where a loaded DTensor is put back."""
    DTensor = _dtensor_class()
    if DTensor is None:
        return []
    tensors: List[Any] = []
    if isinstance(obj, torch.nn.Module):
        tensors = list(obj.parameters()) + list(obj.buffers())
    elif isinstance(obj, torch.optim.Optimizer):
        tensors = [p for g in obj.param_groups for p in g["params"]]
    meshes: List[Any] = []
    for t in tensors:
        if isinstance(t, DTensor) and all(t.device_mesh is not m for m in meshes):
            meshes.append(t.device_mesh)
    return meshes


def _to_dtensor(node: _DTensor, local: torch.Tensor, meshes: Sequence[Any]) -> Any:
    from torch.distributed.tensor import DTensor
    for mesh in meshes:
        if mesh.device_type == node.device_type and mesh.mesh.tolist() == node.mesh:
            device = torch.device(node.device_type, torch.cuda.current_device()) \
                if node.device_type == "cuda" else torch.device(node.device_type)
            return DTensor.from_local(local.to(device), mesh, node.placements, run_check=False,
                                      shape=torch.Size(node.shape), stride=node.stride)
    raise ValueError(f"'{node.name}' was saved as a DTensor on a {node.device_type} mesh {node.mesh}, "
                     f"and the state it is loaded into has no such mesh (meshes: "
                     f"{[(m.device_type, m.mesh.tolist()) for m in meshes] or 'none'})")


def _materialize(node: Any, shard: Any, entries: Dict[str, Dict[str, Any]], meshes: Optional[Sequence[Any]] = ()) -> Any:
    if isinstance(node, _Tensor):
        return _read(shard, entries[node.name])
    if isinstance(node, _DTensor):
        local = _read(shard, entries[node.name])
        return _to_dtensor(node, local, meshes) if meshes is not None else local
    if isinstance(node, dict):
        return {k: _materialize(v, shard, entries, meshes) for k, v in node.items()}
    if isinstance(node, list):
        return [_materialize(v, shard, entries, meshes) for v in node]
    if isinstance(node, tuple):
        return tuple(_materialize(v, shard, entries, meshes) for v in node)
    return node


def read_skeleton(shard: Any, entries: Dict[str, Dict[str, Any]]) -> Optional[Dict[str, Any]]:
    if SKELETON not in entries:
        return None
    return pickle.loads(_read(shard, entries[SKELETON]).numpy().tobytes())


def load_into(state: Dict[str, Any], shard: Any) -> None:
    """Loads a shard into `state` in place. KeyError/ValueError/TypeError mean the state does not
    match the checkpoint (the restore stops); anything else means the checkpoint is bad."""
    entries = {e["name"]: e for e in shard.entries()}
    skeleton = read_skeleton(shard, entries)
    if skeleton is None:
        raise KeyError(f"{shard.path} has no Python state ({SKELETON}); it was not written by trainsup.Supervisor")
    missing = [k for k in state if k not in skeleton]
    if missing:
        raise KeyError(f"the checkpoint in {shard.path} has no entry for {missing}")
    # Optimizers' DTensors go on their parameters' meshes, which the modules hold too.
    meshes = [m for obj in state.values() for m in _meshes_of(obj)]
    for key, (kind, node) in skeleton.items():
        if kind != "rng" and key not in state:
            continue
        value = _materialize(node, shard, entries, meshes)
        if kind == "rng":
            _set_rng_state(value)
        elif kind == "state_dict":
            try:
                _unwrap(state[key]).load_state_dict(value)
            except RuntimeError as e:  # torch reports shape mismatches as RuntimeError
                raise ValueError(f"'{key}': {e}") from e
        else:
            state[key] = value


class PyStoreChannel:
    """A torch.distributed Store as trainsup's commit channel (any torch version).

    get() polls instead of blocking in store.wait(): a TCPStore client holds its connection's
    lock for the whole of a wait(), which would block this process's other thread (the writer
    waits for commits while the training thread reads decisions) and deadlock across ranks.
    Stores without check() in Python (torch 1.13) get a presence counter beside each key,
    which add(key, 0) reads without blocking."""

    def __init__(self, store: Any) -> None:
        self._store = store
        self._has_check = hasattr(store, "check")

    def set(self, key: str, value: str) -> None:
        self._store.set(key, value)
        if not self._has_check:
            self._store.add(key + "#present", 1)

    def _present(self, key: str) -> bool:
        if self._has_check:
            return self._store.check([key])
        return self._store.add(key + "#present", 0) > 0

    def get(self, key: str, timeout_s: float) -> str:
        import time
        deadline = time.monotonic() + timeout_s
        pause = 0.0005
        while not self._present(key):
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"store key {key!r} did not appear within {timeout_s:.1f} s")
            time.sleep(min(pause, left))
            pause = min(pause * 2, 0.05)
        return self._store.get(key).decode()

    def add(self, key: str, delta: int) -> int:
        return self._store.add(key, delta)

    def remove(self, key: str) -> None:
        for k in (key, key + "#present"):
            try:
                self._store.delete_key(k)
            except (RuntimeError, NotImplementedError):
                pass  # FileStore cannot delete; a leftover key costs a few bytes


class Checkpoint:
    """A checkpoint opened for reading: ``step``, ``world_size``, ``metadata``, ``path``, and per
    rank ``tensors(rank)`` (every buffer as a tensor; ``bytes`` ones as uint8) and ``state(rank)``
    (the Python state as saved by trainsup.Supervisor, tensors in place)."""

    def __init__(self, path: str) -> None:
        self.path = path
        manifest = _trainsup.read_manifest(path)
        self.step = manifest["step"]
        self.world_size = manifest["world_size"]
        self.metadata = dict(manifest["metadata"])
        self.shards = manifest["shards"]

    def _shard(self, rank: int) -> Any:
        return _trainsup.open_shard(os.path.join(self.path, self.shards[rank]["file"]))

    def tensors(self, rank: int = 0) -> Dict[str, torch.Tensor]:
        shard = self._shard(rank)
        return {e["name"]: _read(shard, e) for e in shard.entries() if e["name"] != SKELETON}

    def state(self, rank: int = 0) -> Optional[Dict[str, Any]]:
        shard = self._shard(rank)
        entries = {e["name"]: e for e in shard.entries()}
        skeleton = read_skeleton(shard, entries)
        if skeleton is None:
            return None
        # DTensors come back as this rank's local shard: there is no mesh to put them on here.
        return {k: _materialize(node, shard, entries, None) for k, (kind, node) in skeleton.items()}


def load_checkpoint(path: str) -> Checkpoint:
    """Opens a checkpoint: a step directory, or a checkpoint root (then the newest valid one).
    Valid means what restore accepts short of reading the data (checkpoint_format.h: manifest,
    every shard present with the manifest's size, index checksum, rank, world size and step);
    the tensor data's checksums are verified as it is read. Returns a Checkpoint; raises
    trainsup.CorruptionError or NotFoundError (a LookupError) saying what is wrong."""
    if os.path.exists(os.path.join(path, "MANIFEST.json")):
        _trainsup.check_checkpoint(path)
        return Checkpoint(path)
    return Checkpoint(_trainsup.newest_valid_checkpoint(path)["dir"])
