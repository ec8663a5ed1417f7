"""The ranks of one job as processes of this machine, for the tests (one helper instead of a copy
of "pick a port, start each rank with RANK/WORLD_SIZE/MASTER_PORT" in every test file).

No port can race: the job's store is a TCPStore this test process serves on a port the kernel
assigns at bind time (port 0), and every rank, rank 0 included, joins it as a client
(TORCHELASTIC_USE_AGENT_STORE=True, as torchrun's workers join their agent's store). A port
picked first and bound later by a rank could be taken in between by any connection of a
concurrent test (CI saw EADDRINUSE).

    with Ranks(2, [sys.executable, "worker.py", "--steps", "6"], env={"TRAINSUP_LOG_DIR": ...}) as job:
        outputs = job.communicate(timeout=300)   # [(returncode, stdout + stderr)] by rank
"""
import datetime
import os
import subprocess
import sys
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import torch.distributed as dist


def python_path() -> str:
    """This test process's sys.path, for the ranks to import what it imports (the build tree)."""
    return os.pathsep.join(p for p in sys.path if p)


class Ranks:
    """`world` processes running `argv`, rank r with RANK=r and the job's store in its
    environment. `env` is added to every rank's environment, `rank_env(r)` to rank r's;
    `popen` goes to subprocess.Popen (default: stdout and stderr together, as text)."""

    def __init__(self, world: int, argv: Sequence[str], env: Optional[Dict[str, str]] = None,
                 rank_env: Optional[Callable[[int], Dict[str, str]]] = None, store: bool = True, **popen) -> None:
        self.world = world
        # Served by this process for the job's lifetime; bound to a port the kernel picked.
        self.store = dist.TCPStore("127.0.0.1", 0, world + 1, True, timeout=datetime.timedelta(seconds=300),
                                   wait_for_workers=False) if store else None
        popen.setdefault("stdout", subprocess.PIPE)
        popen.setdefault("stderr", subprocess.STDOUT)
        popen.setdefault("text", True)
        self.procs: List[subprocess.Popen] = []
        try:
            for r in range(world):
                e = dict(os.environ, RANK=str(r), WORLD_SIZE=str(world), LOCAL_RANK=str(r),
                         LOCAL_WORLD_SIZE=str(world), OMP_NUM_THREADS="1", PYTHONPATH=python_path())
                if self.store is not None:
                    e.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(self.store.port),
                             TORCHELASTIC_USE_AGENT_STORE="True")
                e.update(env or {})
                e.update(rank_env(r) if rank_env else {})
                self.procs.append(subprocess.Popen(list(argv), env=e, **popen))
        except BaseException:
            self.kill()
            raise

    def communicate(self, timeout: float) -> List[Tuple[int, str]]:
        """Waits for every rank (killing all if one outlives `timeout`); [(returncode, output)]."""
        outs = []
        try:
            for p in self.procs:
                out, _ = p.communicate(timeout=timeout)
                outs.append((p.returncode, out or ""))
        except subprocess.TimeoutExpired:
            self.kill()
            raise
        return outs

    def wait(self, timeout: float) -> List[int]:
        return [rc for rc, _ in self.communicate(timeout)]

    def kill(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                p.kill()
            p.wait()

    def __enter__(self) -> "Ranks":
        return self

    def __exit__(self, *exc) -> None:
        self.kill()
