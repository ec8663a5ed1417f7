"""Runs a selection of PyTorch's own distributed tests (torch.testing._internal.distributed,
shipped in the torch wheel) on gloo with two ranks, plainly or with every process group routed
through trainsup's tracking backend (TRAINSUP_ROUTE=1), and prints one JSON line: each test's
outcome, and in the routed run what the tracker saw.

    TRAINSUP_ROUTE=0|1 python run_torch_dist_tests.py OUT_JSON TEST_NAME...

Used by tests/python/test_torch_transparency.py, which compares the two runs.
"""
import json
import os
import sys
import tempfile

os.environ.setdefault("BACKEND", "gloo")
os.environ.setdefault("WORLD_SIZE", "2")
os.environ.setdefault("TEMP_DIR", tempfile.mkdtemp(prefix="trainsup-torch-suite-"))

import torch.distributed as dist  # noqa: E402

ROUTED = os.environ.get("TRAINSUP_ROUTE") == "1"
# Set here, inherited by the spawned ranks (TEMP_DIR is replaced and removed by each test).
STATS_DIR = os.environ.setdefault("TRAINSUP_SUITE_STATS_DIR", tempfile.mkdtemp(prefix="trainsup-suite-stats-"))

if ROUTED:
    # In every rank process (spawned ranks import this module again): the test's own
    # dist.init_process_group, then trainsup's wrapper in front of the default group.
    import trainsup

    _real_init = dist.init_process_group
    _real_destroy = dist.destroy_process_group

    def _init(*args, **kwargs):
        result = _real_init(*args, **kwargs)
        trainsup.track_process_group()
        return result

    def _destroy(group=None):
        if group is None and dist.is_initialized():
            import time
            import torch
            # The test's works have completed; the tracker hears of it from the completion
            # watcher's next poll (works without a future, such as gloo's point-to-point ones,
            # are polled every millisecond): on a loaded machine that can be after this call.
            deadline = time.monotonic() + 10
            while trainsup.collective_stats()["pending"] and time.monotonic() < deadline:
                time.sleep(0.001)
            backend = dist.distributed_c10d._get_default_group()._get_backend(torch.device("cpu"))
            os.makedirs(STATS_DIR, exist_ok=True)
            stats = dict(trainsup.collective_stats(), wrapped=type(backend).__name__,
                         get_backend=str(dist.get_backend()))
            with open(os.path.join(STATS_DIR, f"{os.getpid()}.json"), "w") as f:
                json.dump(stats, f)
        return _real_destroy(group)

    dist.init_process_group = _init
    dist.destroy_process_group = _destroy

from torch.testing._internal.distributed.distributed_test import (  # noqa: E402
    DistributedTest, TestDistBackend)


class TestDistBackendWithSpawn(TestDistBackend, DistributedTest._DistTestBase):
    def setUp(self):
        super().setUp()
        self._spawn_processes()


def main(out_path, names):
    import unittest
    outcomes = {}

    class Result(unittest.TextTestResult):
        def addSuccess(self, test):
            super().addSuccess(test)
            outcomes[test._testMethodName] = "passed"

        def addFailure(self, test, err):
            super().addFailure(test, err)
            outcomes[test._testMethodName] = "failed"

        def addError(self, test, err):
            super().addError(test, err)
            outcomes[test._testMethodName] = "error"

        def addSkip(self, test, reason):
            super().addSkip(test, reason)
            outcomes[test._testMethodName] = "skipped"

        def addExpectedFailure(self, test, err):
            super().addExpectedFailure(test, err)
            outcomes[test._testMethodName] = "expected_failure"

    suite = unittest.TestSuite(TestDistBackendWithSpawn(n) for n in names)
    unittest.TextTestRunner(resultclass=Result, verbosity=1, stream=sys.stderr).run(suite)
    stats = []
    if os.path.isdir(STATS_DIR):
        for f in sorted(os.listdir(STATS_DIR)):
            with open(os.path.join(STATS_DIR, f)) as fh:
                stats.append(json.load(fh))
    with open(out_path, "w") as f:
        json.dump({"routed": ROUTED, "outcomes": outcomes, "rank_stats": stats}, f)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])
