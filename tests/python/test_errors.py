"""Errors cross the Python boundary with their status code as their type (trainsup/errors.py):
callers catch trainsup.CorruptionError, trainsup.NotFoundError, ... instead of searching messages
(issue 14, defect 5). Each is also the built-in exception closest to it, and a RuntimeError."""
import os

import pytest
import torch

import trainsup
from trainsup import _trainsup


def test_a_bad_setting_is_an_invalid_argument_error_naming_it(tmp_path):
    with pytest.raises(trainsup.InvalidArgumentError) as e:
        trainsup.Supervisor(checkpoint_dir=str(tmp_path), checkpoint_keep=0, handle_signals=False,
                            log_dir=str(tmp_path / "logs"))
    assert isinstance(e.value, ValueError) and isinstance(e.value, trainsup.Error)
    assert "TRAINSUP_CHECKPOINT_KEEP" in str(e.value) and e.value.code == "InvalidArgument"


def test_a_missing_shard_is_not_found_and_a_damaged_one_is_corruption(tmp_path):
    with pytest.raises(trainsup.NotFoundError) as e:
        _trainsup.open_shard(str(tmp_path / "nothing.tsc"))
    assert isinstance(e.value, LookupError)
    with trainsup.Supervisor(checkpoint_dir=str(tmp_path / "ckpt"), handle_signals=False, include_rng=False,
                             log_dir=str(tmp_path / "logs")) as sup:
        sup.checkpoint(3, {"w": torch.arange(1000, dtype=torch.float32)})
    step_dir = tmp_path / "ckpt" / _trainsup.checkpoint_dir_name(3)
    shard = next(p for p in step_dir.iterdir() if p.name.endswith(".tsc"))
    data = bytearray(shard.read_bytes())
    data[-20] ^= 0x40  # inside the footer
    shard.write_bytes(bytes(data))
    with pytest.raises(trainsup.CorruptionError) as e:
        _trainsup.open_shard(str(shard))
    assert "footer" in str(e.value) and isinstance(e.value, RuntimeError) and not isinstance(e.value, ValueError)


def test_every_status_code_has_its_class():
    names = {"InvalidArgument", "NotFound", "IoError", "Corruption", "TimedOut", "Unavailable", "Internal"}
    assert set(trainsup.errors.BY_CODE) == names
    assert issubclass(trainsup.TimedOutError, TimeoutError) and issubclass(trainsup.IoError, OSError)
    assert issubclass(trainsup.UnavailableError, ConnectionError)
