"""Checkpoints of sharded state on torch.distributed.checkpoint (DCP), with trainsup's guarantees.

A step directory written this way is a DCP checkpoint (``__<rank>_0.distcp`` files and
``.metadata``, as DCP's FileSystemWriter writes them) that plain ``dcp.load`` reads, plus
trainsup's shard per rank and ``MANIFEST.json``:

  - DCP's planner and DTensor metadata decide what each rank writes and reads, so state saved
    on N ranks over one mesh loads on M ranks over another (FSDP2, TP, FSDP2 x TP);
  - each rank's data file is checksummed item by item (XXH3-64) while it is fsynced; the checksums
    and the file's size go into that rank's trainsup shard (entry ``trainsup.companions``), rank
    0's also holds ``.metadata``'s; a restore verifies every item it reads and ``.metadata``;
  - the C++ checkpointer does the rest as for its own shards: decisions agreed by every rank,
    the snapshot at a step boundary (here DCP's own staging into a reused CPU copy), the persist
    on its writer thread, the commit (``MANIFEST.json`` after every rank's files are durable),
    newest-valid fallback, retention, the stop-signal save.

DCP's collectives run on a gloo group of their own (untracked: a slow disk is not a hung rank),
made once by every rank with the commit timeout as its timeout.

Everything here runs in the rank (torch is imported).
"""
import io
import json
import mmap
import os
import pickle
import re
import threading
from contextlib import contextmanager
from datetime import timedelta
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.filesystem import FileSystem, FileSystemReader, FileSystemWriter

from . import _trainsup
from .errors import CorruptionError

LAYOUT = "dcp"
COMPANIONS = "trainsup.companions"
METADATA_FILE = ".metadata"
RNG_PREFIX = "trainsup.rng.r"


def dtensor_class() -> Any:
    try:
        from torch.distributed.tensor import DTensor
    except ImportError:
        return None
    return DTensor


def holds_dtensor(state: Dict[str, Any]) -> bool:
    """Whether `state` (modules, optimizers, values) holds a DTensor: FSDP2 or TP state."""
    DTensor = dtensor_class()
    if DTensor is None:
        return False
    for obj in state.values():
        if isinstance(obj, torch.nn.Module):
            if any(isinstance(p, DTensor) for p in obj.parameters()):
                return True
        elif isinstance(obj, DTensor):
            return True
    return False


# --- state <-> DCP state dict ---------------------------------------------------------------

def _owner(optimizer: Any, modules: Dict[str, torch.nn.Module], key: str) -> torch.nn.Module:
    params = {id(p) for g in optimizer.param_groups for p in g["params"]}
    for module in modules.values():
        if any(id(p) in params for p in module.parameters()):
            return module
    raise ValueError(f"trainsup: the optimizer '{key}' optimizes no module of the state ({sorted(modules) or 'none'}); "
                     "a torch.distributed.checkpoint checkpoint names optimizer state by parameter name, so the "
                     "model must be in the state beside its optimizer")


def to_dcp(state: Dict[str, Any], rank: int, include_rng: bool) -> Tuple[Dict[str, Any], Callable[[Dict[str, Any]], None]]:
    """The DCP state dict of `state` (modules and their optimizers through
    torch.distributed.checkpoint.state_dict, which names optimizer state by parameter and keeps
    DTensors sharded; other objects with state_dict() through it; other values as they are),
    and a function that puts a loaded one back into `state`."""
    from torch.distributed.checkpoint.state_dict import (get_model_state_dict, get_optimizer_state_dict,
                                                           set_model_state_dict, set_optimizer_state_dict)
    from . import _compat
    modules = {k: _compat.compiled_module_inner(v) or v for k, v in state.items() if isinstance(v, torch.nn.Module)}
    out: Dict[str, Any] = {}
    setters: List[Callable[[Dict[str, Any]], Any]] = []

    def setter(key: str, obj: Any) -> Callable[[Dict[str, Any]], Any]:
        if key in modules:
            return lambda d: set_model_state_dict(modules[key], d[key])
        if isinstance(obj, torch.optim.Optimizer):
            module = _owner(obj, modules, key)
            return lambda d: set_optimizer_state_dict(module, obj, d[key])
        if hasattr(obj, "state_dict") and hasattr(obj, "load_state_dict"):
            return lambda d: obj.load_state_dict(d[key])
        return lambda d: state.__setitem__(key, d[key])

    for key, obj in state.items():
        if key.startswith(RNG_PREFIX):
            raise ValueError(f"trainsup: state key '{key}' is reserved (the ranks' RNG states)")
        if key in modules:
            out[key] = get_model_state_dict(modules[key])
        elif isinstance(obj, torch.optim.Optimizer):
            out[key] = get_optimizer_state_dict(_owner(obj, modules, key), obj)
        elif hasattr(obj, "state_dict") and hasattr(obj, "load_state_dict"):
            out[key] = obj.state_dict()
        else:
            out[key] = obj
        setters.append(setter(key, obj))
    if include_rng:
        from .checkpoint import _rng_state
        out[f"{RNG_PREFIX}{rank}"] = torch.frombuffer(bytearray(pickle.dumps(_rng_state())), dtype=torch.uint8)

    def apply(loaded: Dict[str, Any]) -> None:
        for s in setters:
            s(loaded)
        rng = loaded.get(f"{RNG_PREFIX}{rank}")
        if isinstance(rng, torch.Tensor):
            from .checkpoint import _set_rng_state
            _set_rng_state(pickle.loads(rng.numpy().tobytes()))
    return out, apply


def _flat(state_dict: Dict[str, Any]) -> Dict[str, Any]:
    from . import _compat
    return _compat.flatten_state_dict(state_dict)


def check_fit(target: Dict[str, Any], metadata: Any, where: str) -> None:
    """Raises ValueError naming the key (and both shapes) where `target` does not fit the
    checkpoint's metadata: a key the checkpoint lacks, or a tensor of another global shape."""
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata
    saved = metadata.state_dict_metadata
    for key, value in _flat(target).items():
        if key.startswith(RNG_PREFIX):
            continue
        md = saved.get(key)
        if md is None:
            near = [k for k in saved if k.split(".")[0] == key.split(".")[0]][:3]
            raise ValueError(f"the checkpoint in {where} has no '{key}', which the state has"
                             + (f" (it has e.g. {near})" if near else ""))
        if isinstance(value, torch.Tensor):
            if not isinstance(md, TensorStorageMetadata):
                raise ValueError(f"'{key}': the checkpoint in {where} holds a non-tensor value, the state a tensor "
                                 f"of shape {list(value.shape)}")
            if list(md.size) != list(value.shape):
                raise ValueError(f"'{key}': the checkpoint in {where} has shape {list(md.size)}, the state "
                                 f"{list(value.shape)}")


# --- writing: DCP's FileSystemWriter, its data checksummed as it is written ---------------------

class _HashingStream(io.RawIOBase):
    """A data file DCP writes. DCP reads tell() before and after each item it writes, so each
    segment between two tell() calls is one item. close() makes the file durable and hashes
    each segment at the same time: fsync on a thread of its own (it waits for the disk) while
    this thread hashes the segments from the page cache (mmap, no copy); both release the GIL.
    The hash thus leaves the critical path, which the fsync sets."""

    def __init__(self, raw: Any, path: str) -> None:
        super().__init__()
        self.raw, self.path = raw, path
        self.pos = self.start = raw.tell()
        self.bounds: List[Tuple[int, int]] = []
        self.segments: Dict[Tuple[int, int], str] = {}

    def write(self, b: Any) -> int:
        data = memoryview(b).cast("B")
        n = self.raw.write(data)
        n = len(data) if n is None else n
        self.pos += n
        return n

    def tell(self) -> int:
        if self.pos > self.start:
            self.bounds.append((self.start, self.pos - self.start))
        self.start = self.pos
        return self.pos

    def writable(self) -> bool:
        return True

    def fileno(self) -> int:
        return self.raw.fileno()

    def flush(self) -> None:
        if not self.raw.closed:
            self.raw.flush()

    def close(self) -> None:
        if self.closed:
            return
        try:
            self.tell()
            self.raw.flush()
            failed: List[BaseException] = []

            def sync() -> None:
                try:
                    os.fsync(self.raw.fileno())
                except BaseException as e:  # noqa: B036 -- re-raised below, on DCP's thread
                    failed.append(e)

            syncer = threading.Thread(target=sync, name="trainsup-dcp-fsync")
            syncer.start()
            try:
                self._hash_segments()
            finally:
                syncer.join()
            if failed:
                raise failed[0]
        finally:
            self.raw.close()
            super().close()

    def _hash_segments(self) -> None:
        if self.pos == 0:
            return
        with open(self.path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
            for offset, length in self.bounds:
                if offset + length > len(m):
                    raise CorruptionError(f"{self.path}: {len(m)} bytes on disk, {offset + length} written")
                self.segments[(offset, length)] = _xxh3_mapped(m, offset, length)


class _HashingFileSystem(FileSystem):
    def __init__(self) -> None:
        super().__init__()
        self.files: Dict[str, _HashingStream] = {}

    @contextmanager
    def create_stream(self, path: Any, mode: str) -> Iterator[Any]:
        with super().create_stream(path, mode) as raw:
            if "w" not in mode or not str(path).endswith(".distcp"):
                yield raw
                return
            stream = _HashingStream(raw, str(path))
            self.files[str(path)] = stream
            yield stream
            stream.close()


class _Writer(FileSystemWriter):
    """DCP's FileSystemWriter (one file per rank), hashing what it writes. Its own fsyncs are off:
    each data file is fsynced by its stream's close() (at the same time as its hashing), and
    persist() fsyncs ``.metadata``; the checkpointer then fsyncs the step directory (their
    names) before the rank reports its shard, so the commit still follows durable files."""

    def __init__(self, path: str) -> None:
        super().__init__(path, single_file_per_rank=True, sync_files=False, thread_count=1, overwrite=True)
        self.fs: _HashingFileSystem = _HashingFileSystem()
        self.results: List[Any] = []

    def write_data(self, plan: Any, planner: Any) -> Any:
        future = super().write_data(plan, planner)
        self.results = list(future.value())
        return future

    def companions(self) -> List[Dict[str, Any]]:
        """This rank's files: name, size, and (offset, length, XXH3) of every item in them."""
        by_file: Dict[str, List[List[Any]]] = {}
        for r in self.results:
            info = r.storage_data
            by_file.setdefault(info.relative_path, []).append([info.offset, info.length])
        out = []
        for path, stream in self.fs.files.items():
            name = os.path.basename(path)
            items = []
            for offset, length in sorted(by_file.get(name, [])):
                digest = stream.segments.get((offset, length))
                if digest is None:  # not one segment: hash it from the file (it was just written)
                    digest = _hash_range(path, offset, length)
                items.append([offset, length, digest])
            out.append({"file": name, "size": os.path.getsize(path), "items": items})
        return out


def _xxh3(data: Any) -> str:
    h = _trainsup.Xxh3()
    h.update(data)
    return h.hexdigest()


def _xxh3_mapped(m: mmap.mmap, offset: int, length: int) -> str:
    """XXH3-64 of bytes [offset, offset + length) of a mapped file, hashed in place (the
    caller checks the bounds)."""
    view = memoryview(m)[offset:offset + length]
    try:
        return _xxh3(view)
    finally:
        view.release()


def _hash_range(path: str, offset: int, length: int) -> str:
    h = _trainsup.Xxh3()
    with open(path, "rb") as f:
        f.seek(offset)
        left = length
        while left > 0:
            chunk = f.read(min(left, 16 << 20))
            if not chunk:
                raise CorruptionError(f"{path}: ends before offset {offset} + {length}")
            h.update(chunk)
            left -= len(chunk)
    return h.hexdigest()


# --- reading: every item verified against the shard that wrote it -----------------------------

class _VerifiedReader(FileSystemReader):
    def __init__(self, path: str, world_size: int) -> None:
        super().__init__(path)
        self._world = world_size
        self._listed: Dict[int, List[Dict[str, Any]]] = {}  # rank -> its shard's companion files
        self._sums: Dict[str, Dict[int, Tuple[int, str]]] = {}  # file -> offset -> (length, xxh3)
        self._names: Dict[Tuple[str, int], str] = {}
        self._maps: Dict[str, Tuple[Any, mmap.mmap]] = {}  # data file -> (file, its mmap), during read_data

    def _companions(self, rank: int) -> List[Dict[str, Any]]:
        """The files rank `rank` wrote, from its shard (checked against the manifest)."""
        if rank not in self._listed:
            shard = _trainsup.open_checked_shard(str(self.path), rank)
            entries = {e["name"]: e for e in shard.entries()}
            if COMPANIONS not in entries:
                raise CorruptionError(f"{shard.path}: no {COMPANIONS} entry (not a torch.distributed.checkpoint shard)")
            buf = torch.empty(entries[COMPANIONS]["shape"], dtype=torch.uint8)
            shard.read_into(COMPANIONS, buf.data_ptr(), buf.numel())
            self._listed[rank] = json.loads(buf.numpy().tobytes())
            for c in self._listed[rank]:
                if "items" in c:
                    self._sums[c["file"]] = {int(o): (int(n), d) for o, n, d in c["items"]}
        return self._listed[rank]

    def _checksums(self, name: str) -> Dict[int, Tuple[int, str]]:
        if name not in self._sums:
            m = re.match(r"__(\d+)_", name)  # DCP names rank r's files __<r>_<n>.distcp
            hint = [int(m.group(1))] if m and int(m.group(1)) < self._world else []
            for r in hint + list(range(self._world)):
                self._companions(r)
                if name in self._sums:
                    break
        if name not in self._sums:
            raise CorruptionError(f"{os.path.join(str(self.path), name)}: no shard of the checkpoint lists this file")
        return self._sums[name]

    def read_metadata(self, *args: Any, **kwargs: Any) -> Any:
        path = os.path.join(str(self.path), METADATA_FILE)
        meta = next((c for c in self._companions(0) if c.get("file") == METADATA_FILE), None)
        if meta is None:
            raise CorruptionError(f"{path}: shard 0 does not list it")
        with open(path, "rb") as f:
            data = f.read()
        if len(data) != meta["size"] or _xxh3(data) != meta["xxh3"]:
            raise CorruptionError(f"{path}: checksum mismatch ({len(data)} bytes, shard 0 says {meta['size']})")
        metadata = pickle.loads(data)
        from torch.distributed.checkpoint.metadata import StorageMeta
        if getattr(metadata, "storage_meta", None) is None:
            metadata.storage_meta = StorageMeta()
        metadata.storage_meta.load_id = self.load_id
        return metadata

    def set_up_storage_reader(self, metadata: Any, is_coordinator: bool, *args: Any, **kwargs: Any) -> None:
        super().set_up_storage_reader(metadata, is_coordinator, *args, **kwargs)
        self._names = {(s.relative_path, s.offset): index.fqn for index, s in metadata.storage_data.items()}

    def read_data(self, plan: Any, planner: Any) -> Any:
        try:
            return super().read_data(plan, planner)
        finally:
            for f, m in self._maps.values():
                m.close()
                f.close()
            self._maps.clear()

    def _map(self, name: str) -> Optional[mmap.mmap]:
        """The data file `name` mapped read-only (once per load), or None when it is empty."""
        if name not in self._maps:
            f = open(os.path.join(str(self.path), name), "rb")
            if os.fstat(f.fileno()).st_size == 0:
                f.close()
                return None
            self._maps[name] = (f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ))
        return self._maps[name][1]

    def _slice_file(self, file: Any, sinfo: Any) -> Any:
        """Verifies the item's bytes against its checksum, hashing them in place (mmap of the
        page cache, no copy), then gives DCP its own view of the file to load from."""
        where = f"{os.path.join(str(self.path), sinfo.relative_path)} at offset {sinfo.offset}"
        what = self._names.get((sinfo.relative_path, sinfo.offset), "?")
        expected = self._checksums(sinfo.relative_path).get(sinfo.offset)
        if expected is None or expected[0] != sinfo.length:
            raise CorruptionError(f"{where} ('{what}'): no checksum for these {sinfo.length} bytes")
        m = self._map(sinfo.relative_path)
        size = 0 if m is None else len(m)
        if sinfo.offset + sinfo.length > size:
            raise CorruptionError(f"{where} ('{what}'): {sinfo.length} bytes expected, the file ends after "
                                  f"{max(0, size - sinfo.offset)} (truncated?)")
        assert m is not None
        if _xxh3_mapped(m, sinfo.offset, sinfo.length) != expected[1]:
            raise CorruptionError(f"{where} ('{what}'): checksum mismatch")
        return super()._slice_file(file, sinfo)


# --- the rank's side of it -----------------------------------------------------------------

def _causes(e: BaseException) -> List[Tuple[int, BaseException]]:
    """(rank, exception) per rank of a DCP CheckpointException, by rank; [] for anything else."""
    failures = getattr(e, "failures", None) or {}
    # (exception, traceback summary) per rank
    return [(rank, wrapped[0] if isinstance(wrapped, tuple) else wrapped) for rank, wrapped in sorted(failures.items())]


def _save_failure(e: BaseException) -> str:
    """A DCP save's CheckpointException as one line per failed rank: 'rank R: Type: message'."""
    causes = _causes(e)
    if not causes:
        return f"{type(e).__name__}: {e}"
    return "; ".join(f"rank {rank}: {type(cause).__name__}: {cause}" for rank, cause in causes)


def _failure(e: BaseException) -> BaseException:
    """A DCP CheckpointException (failures gathered from every rank) as what trainsup's restore
    understands: CorruptionError when a file was bad or unreadable on any rank (try an older
    checkpoint), else the first rank's own error."""
    causes = _causes(e)
    if not causes:
        return e
    bad = [(r, c) for r, c in causes if isinstance(c, (CorruptionError, OSError, EOFError, pickle.UnpicklingError))]
    if bad:
        return CorruptionError("; ".join(f"rank {r}: {c}" for r, c in bad))
    rank, cause = causes[0]
    return cause if isinstance(cause, ValueError) else ValueError(f"rank {rank}: {cause}")


class DcpCheckpoints:
    """One rank's DCP path: stages at the step boundary, writes from the checkpointer's writer
    thread (persist hook), loads at restore."""

    def __init__(self, rank: int, world_size: int, timeout_s: float) -> None:
        self.rank, self.world_size = rank, world_size
        self.group: Optional[Any] = None
        if world_size > 1:
            from .distributed import untracked_groups
            with untracked_groups():
                self.group = dist.new_group(backend="gloo", timeout=timedelta(seconds=max(1.0, timeout_s)))
        self._cache: Optional[Dict[str, Any]] = None
        self._signature: Optional[Any] = None
        self._pending: Optional[Tuple[int, Dict[str, Any]]] = None

    # Training thread, at a step boundary: the stall.
    def stage(self, step: int, state_dict: Dict[str, Any]) -> None:
        """Copies `state_dict`'s tensors into a CPU copy kept across saves (DCP's staging with
        a reused stager), for the next persist."""
        from . import _compat
        signature = [(k, tuple(v.shape), v.dtype) for k, v in _flat(state_dict).items() if isinstance(v, torch.Tensor)]
        if self._cache is None or signature != self._signature:
            self._cache = _compat.cpu_state_dict(state_dict, pin_memory=torch.cuda.is_available())
            self._signature = signature
        staged = _compat.copy_state_dict(state_dict, self._cache, non_blocking=torch.cuda.is_available())
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        self._pending = (step, staged)

    # Writer thread: the persist hook (checkpointer.h). Every rank, every persist.
    def persist(self, step_dir: str, step: int) -> List[Tuple[str, bytes]]:
        pending, self._pending = self._pending, None
        if pending is None:
            return []  # this checkpoint is trainsup's own format
        if pending[0] != step:
            raise RuntimeError(f"trainsup: staged state of step {pending[0]} persisted as step {step}")
        writer = _Writer(step_dir)
        from torch.distributed.checkpoint.api import CheckpointException  # a BaseException
        try:
            dcp.save(pending[1], storage_writer=writer, process_group=self.group)
        except CheckpointException as e:
            raise RuntimeError(_save_failure(e)) from e
        companions = writer.companions()
        if self.rank == 0:
            path = os.path.join(step_dir, METADATA_FILE)
            with open(path, "rb") as f:
                data = f.read()
                os.fsync(f.fileno())
            companions.append({"file": METADATA_FILE, "size": len(data), "xxh3": _xxh3(data)})
        return [(COMPANIONS, json.dumps(companions, separators=(",", ":")).encode())]

    # Training thread, at a save whose staging (or collection) failed on this rank.
    def abstain(self, step: int, error: BaseException) -> None:
        """This rank could not stage step `step`. The other ranks persist it through DCP's
        collective save, which would wait for this rank until the group's timeout (the commit
        timeout, 10 min by default) and hold up every later save meanwhile. This rank joins that
        save with a plan that fails with `error`: DCP gathers the failure, and the save ends on
        every rank at once, naming this rank. (This rank's writer is idle here: a save first
        waits for the previous persist, so the group's collectives stay in order.)"""
        self._pending = None
        if self.group is None:
            return
        from torch.distributed.checkpoint.api import CheckpointException  # a BaseException
        from torch.distributed.checkpoint.default_planner import DefaultSavePlanner

        class _Refuse(DefaultSavePlanner):
            def set_up_planner(self, *args: Any, **kwargs: Any) -> None:
                raise error

        try:
            dcp.save({}, storage_writer=FileSystemWriter(f"trainsup-abstains-from-step-{step}"),
                     planner=_Refuse(), process_group=self.group)
        except (Exception, CheckpointException):
            pass  # the failure it was made to carry

    # Training thread, at restore: a trainsup checkpoint of the dcp layout, or an adopted one.
    def load(self, state_dict: Dict[str, Any], path: str, world_size: Optional[int]) -> None:
        """Loads `path` into `state_dict` in place. world_size: that of the trainsup checkpoint
        (every item verified), or None for a plain DCP checkpoint being adopted."""
        from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner
        reader: Any = _VerifiedReader(path, world_size) if world_size else FileSystemReader(path)
        try:
            metadata = reader.read_metadata()
        except FileNotFoundError as e:
            raise CorruptionError(f"{path}: {e.strerror}: {e.filename}") from e
        except (pickle.UnpicklingError, EOFError) as e:
            raise CorruptionError(f"{os.path.join(path, METADATA_FILE)}: unreadable: {e}") from e
        check_fit(state_dict, metadata, path)  # before any state is touched
        # This rank's RNG state where this rank saved one (a job of another size resumes the
        # rest fresh); every other key must be there (check_fit).
        for key in [k for k in state_dict if k.startswith(RNG_PREFIX)]:
            if key not in metadata.state_dict_metadata:
                del state_dict[key]
            else:
                size = metadata.state_dict_metadata[key].size
                state_dict[key] = torch.empty(list(size), dtype=torch.uint8)
        from torch.distributed.checkpoint.api import CheckpointException  # a BaseException
        try:
            dcp.load(state_dict, storage_reader=reader, planner=DefaultLoadPlanner(allow_partial_load=True),
                     process_group=self.group)
        except (Exception, CheckpointException) as e:
            raise _failure(e) from e
