"""Small operations on the job's c10d store that the launcher's modules share (on any store
with compare_set: torchrun's TCPStore, trainsup's etcd store, a test's HashStore or Python
store): read a key without waiting, set a key once. Runs in the launcher agent."""
from typing import Any, Optional, Union

__all__ = ["compare_set", "peek", "first_set"]


def _text(value: Union[bytes, bytearray, str]) -> str:
    return value.decode() if isinstance(value, (bytes, bytearray)) else str(value)


_ABSENT = "\x00trainsup-absent\x00"


def compare_set(store: Any, key: str, expected: str, desired: str) -> Any:
    """store.compare_set, through trainsup's binding where there is one: torch 1.13's own builds
    its result without the GIL and crashes multi-threaded processes such as the launcher."""
    try:
        from .._trainsup_torch import store_compare_set
    except ImportError:
        return store.compare_set(key, expected, desired)
    return _through_binding(store_compare_set, store, key, expected, desired)


def _through_binding(fn: Any, store: Any, key: str, expected: str, desired: str) -> Any:
    # Not called from compare_set's own frame: for a store written in Python (a dist.Store
    # subclass), pybind11 takes a frame named compare_set whose first argument is the store for
    # the override calling itself, and torch then fails with "Not implemented".
    return fn(store, key, expected, desired)


def peek(store: Any, key: str) -> Optional[str]:
    """The value of `key`, or None when it is not set, without waiting (torch 1.13's Python
    stores have no check()): compare_set with an expected value no one writes changes nothing
    and returns the current value, or the expected one when the key is absent."""
    value = _text(compare_set(store, key, _ABSENT, _ABSENT))
    return None if value == _ABSENT else value


def first_set(store: Any, key: str, value: str) -> str:
    """Sets `key` to `value` unless it is set already; the value in force, as text (the first
    writer's, for everyone)."""
    return _text(compare_set(store, key, "", value))
