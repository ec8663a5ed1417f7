import os
import sys

# ctest sets TRAINSUP_PYTHONPATH to the build tree's bindings/python (docs/CONTRIBUTING.md).
_path = os.environ.get("TRAINSUP_PYTHONPATH")
if _path and _path not in sys.path:
    sys.path.insert(0, _path)
