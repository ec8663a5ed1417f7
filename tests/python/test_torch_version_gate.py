"""A torch release other than the one trainsup was built against is refused at import, with a
message naming the installed and the supported versions, before any extension built against
torch is loaded (which could otherwise crash inside c10d)."""
import os
import subprocess
import sys

import torch
import trainsup
from trainsup import _build_info


def _import_with_fake_torch(tmp_path, version):
    fake = tmp_path / "torch"
    fake.mkdir()
    (fake / "__init__.py").write_text(f"__version__ = {version!r}\n")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path)] + [p for p in sys.path if p]))
    return subprocess.run([sys.executable, "-c", "import trainsup"], env=env, capture_output=True, text=True, timeout=120)


def test_the_build_records_the_torch_it_was_built_against():
    assert _build_info.TORCH_VERSION.split("+")[0] == torch.__version__.split("+")[0]
    assert trainsup.distributed.tracking_available()


def test_another_torch_release_is_refused_with_both_versions_named(tmp_path):
    p = _import_with_fake_torch(tmp_path, "2.4.1")
    assert p.returncode != 0
    assert "ImportError" in p.stderr
    assert "2.4.1" in p.stderr and _build_info.TORCH_VERSION in p.stderr, p.stderr
    assert f"torch >= {_build_info.TORCH_MIN_VERSION}" in p.stderr, p.stderr


def test_a_patch_release_of_the_same_torch_is_accepted(tmp_path):
    major, minor = torch.__version__.split(".")[:2]
    p = _import_with_fake_torch(tmp_path, f"{major}.{minor}.99")
    # The gate passes; what fails next (if anything) is the fake torch itself, not the gate.
    assert "was built against torch" not in p.stderr, p.stderr
