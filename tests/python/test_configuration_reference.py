"""docs/configuration.md is the reference for every setting: each variable a rank reads (the C++
library's own list), every TRAINSUP_* name anywhere in the code, scripts and examples, and every
flag of trainsup.run must be in it."""
import os
import re

import trainsup
from trainsup import _trainsup
from trainsup.launch.run import OUR_FLAGS

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DOC = open(os.path.join(REPO, "docs", "configuration.md")).read()
SOURCES = ("libsupervisor", "bindings", "tools", "examples", "scripts", "bench", "cmake", "CMakeLists.txt")


def _names_in_code():
    names = {}
    for top in SOURCES:
        path = os.path.join(REPO, top)
        walk = [(os.path.dirname(path), [], [os.path.basename(path)])] if os.path.isfile(path) else os.walk(path)
        for d, dirs, files in walk:
            dirs[:] = [x for x in dirs if x not in ("__pycache__",) and not x.startswith(".")]
            for f in files:
                if not f.endswith((".py", ".sh", ".cc", ".h", ".cmake", ".txt", ".in", ".yaml", ".sbatch")):
                    continue
                text = open(os.path.join(d, f), errors="replace").read()
                for n in re.findall(r"\bTRAINSUP_[A-Z0-9_]*[A-Z0-9]\b", text):
                    names.setdefault(n, os.path.relpath(os.path.join(d, f), REPO))
    return names


def test_every_variable_a_rank_reads_is_documented_and_a_keyword():
    missing = [v for v in _trainsup.SETTING_VARIABLES if f"`{v}`" not in DOC]
    assert not missing, f"not in docs/configuration.md: {missing}"
    assert "TRAINSUP_CHECKPOINT_SYNC_STEPS" in _trainsup.SETTING_VARIABLES
    keywords = set(trainsup._SETTINGS.values())
    assert {v for v in _trainsup.SETTING_VARIABLES if v.startswith("TRAINSUP_")} - keywords == {"TRAINSUP_RESTART_COUNT"}


def test_every_trainsup_name_in_the_code_is_documented():
    missing = {n: where for n, where in _names_in_code().items() if n not in DOC}
    assert not missing, f"TRAINSUP_* names used but not in docs/configuration.md: {missing}"


def test_every_launcher_flag_is_documented():
    for flag, (env, _) in OUR_FLAGS.items():
        assert f"trainsup.run {flag}`" in DOC and f"`{env}`" in DOC, flag
