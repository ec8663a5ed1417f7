"""Prints where the torch of a Python environment keeps its CMake config, and its version:
`<cmake_prefix_path>;<version>`, or nothing when that environment has no torch.

Run by cmake/TrainsupOptionalDeps.cmake with the interpreter the build is for. Under
`pip install .` with build isolation that interpreter cannot import the environment's own
packages (pip hides them), so the environment's site-packages are searched as files too:
trainsup is built against the torch it will run with, never one of the build environment.
"""
import os
import re
import sys
import sysconfig


def from_import():
    try:
        import torch
        import torch.utils
    except Exception:
        return None
    return torch.utils.cmake_prefix_path, torch.__version__


def from_files():
    seen = set()
    for key in ("purelib", "platlib"):
        site = sysconfig.get_paths().get(key)
        if not site or site in seen:
            continue
        seen.add(site)
        version_py = os.path.join(site, "torch", "version.py")
        cmake = os.path.join(site, "torch", "share", "cmake")
        if os.path.isfile(version_py) and os.path.isdir(cmake):
            text = open(version_py).read()
            m = re.search(r"^__version__\s*=\s*['\"]([^'\"]+)['\"]", text, re.M)
            return cmake, m.group(1) if m else "unknown"
    return None


found = from_import() or from_files()
if found:
    sys.stdout.write(f"{found[0]};{found[1]}")
