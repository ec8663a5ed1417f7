"""Every binding that blocks on a file releases the GIL while it does (issue 19, defect 2).

The launcher calls the checkpoint readers on torchrun's thread (the restart guard's newest
valid checkpoint). On a slow or hung checkpoint file system a call that kept the GIL starved the
agent's keep-alive thread (1 tick in 3 s instead of ~30), and the other agents took the healthy
host for dead and evicted it. Here the file is a FIFO: opening it blocks, as a hung NFS server
does, until a process of the test (not Python: a thread of ours would need the GIL) opens the
other end one second later. Meanwhile a Python thread ticks every millisecond."""
import os
import subprocess
import threading
import time

import pytest

from trainsup import _trainsup, _trainsup_agent

HOLD_S = 1.0


def _ticks_during(call, fifo, writer_end):
    """(ticks of a Python thread while `call` blocks on `fifo`, what the call raised or returned)."""
    os.mkfifo(fifo)
    # The far end, opened HOLD_S from now by a shell: for reading (`cat`) when the call writes,
    # for writing (an empty write) when it reads.
    other = f"cat {fifo} > /dev/null" if writer_end == "read" else f": > {fifo}"
    peer = subprocess.Popen(["sh", "-c", f"sleep {HOLD_S}; {other}"])
    ticks = [0]
    stop = threading.Event()

    def tick():
        while not stop.is_set():
            ticks[0] += 1
            time.sleep(0.001)

    ticker = threading.Thread(target=tick)
    ticker.start()
    t0 = time.monotonic()
    try:
        outcome = call()
    except Exception as e:  # the FIFO is no checkpoint: the call fails, naming it
        outcome = e
    took = time.monotonic() - t0
    stop.set()
    ticker.join()
    assert peer.wait(timeout=30) == 0
    assert took >= HOLD_S * 0.8, f"the call did not block on the FIFO ({took:.2f} s)"
    return ticks[0], outcome


def _step_dir(root):
    d = os.path.join(root, _trainsup.checkpoint_dir_name(7))
    os.makedirs(d)
    return d


CALLS = {
    "read_manifest": lambda tmp: (os.path.join(_step_dir(tmp), "MANIFEST.json"),
                                  lambda d=os.path.join(tmp, _trainsup.checkpoint_dir_name(7)): _trainsup.read_manifest(d)),
    "check_checkpoint": lambda tmp: (os.path.join(_step_dir(tmp), "MANIFEST.json"),
                                     lambda d=os.path.join(tmp, _trainsup.checkpoint_dir_name(7)): _trainsup.check_checkpoint(d)),
    "newest_valid_checkpoint": lambda tmp: (os.path.join(_step_dir(tmp), "MANIFEST.json"),
                                            lambda: _trainsup.newest_valid_checkpoint(str(tmp))),
    "open_shard": lambda tmp: (os.path.join(str(tmp), "shard.tsc"),
                               lambda: _trainsup.open_shard(os.path.join(str(tmp), "shard.tsc"))),
}


@pytest.mark.parametrize("name", sorted(CALLS))
def test_a_checkpoint_read_that_blocks_leaves_other_python_threads_running(tmp_path, name):
    fifo, call = CALLS[name](str(tmp_path))
    ticks, outcome = _ticks_during(call, fifo, "write")
    print(f"[measure] {name}: a Python thread ticked {ticks} times while the call waited {HOLD_S} s on the file")
    assert ticks > 100, f"{name} held the GIL while it waited on the file ({ticks} ticks)"
    assert isinstance(outcome, Exception), outcome  # an empty manifest or shard is no checkpoint...
    assert "MANIFEST.json" in str(outcome) or "shard.tsc" in str(outcome) or "no valid checkpoint" in str(outcome)


def test_opening_the_agent_event_log_leaves_other_python_threads_running(tmp_path):
    fifo = str(tmp_path / "agent.events.jsonl")
    # The log is dropped at once (closing the FIFO), so that the reader at the far end ends.
    ticks, outcome = _ticks_during(lambda: (_trainsup_agent.AgentEventLog(fifo, "host-a", "job"), "opened")[1],
                                   fifo, "read")
    assert ticks > 100, f"opening the agent's event log held the GIL ({ticks} ticks)"
    assert outcome == "opened", outcome
