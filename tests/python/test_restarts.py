"""The launcher's restart guard (trainsup/launch/restarts.py): every agent of a failed round reaches the
same decision. The scenario suite once hung for 600 s: host-a counted the round's restart and
gave up (96) while host-b, reading the no-progress counter before host-a had moved it, went back
to a rendezvous that could never form."""
import json
import threading

import torch.distributed as dist

from trainsup.launch.restarts import RestartGuard


class Events:
    def __init__(self):
        self.lines = []

    def write(self, event, **fields):
        self.lines.append(dict(fields, event=event))


class GatedStore(dist.Store):
    """A HashStore in which the round's first agent, right after it has counted itself first,
    waits until the second agent has done its own count and is reading (the interleaving that
    split the agents), or with `until_published`, until the second one has given up waiting
    for it and published a decision of its own (a first agent stalled past the wait)."""

    def __init__(self, until_published=False):
        super().__init__()
        self.inner = dist.HashStore()
        self.until_published = until_published
        self.release = threading.Event()

    def add(self, key, value):
        n = self.inner.add(key, value)
        if "/count-" in key:
            if n == 1:
                assert self.release.wait(10), "the second agent never came"
            elif not self.until_published:
                self.release.set()
        return n

    def set(self, key, value):
        self.inner.set(key, value)

    def get(self, key):
        return self.inner.get(key)

    def compare_set(self, key, expected, desired):
        value = self.inner.compare_set(key, expected, desired)
        if self.until_published and "/decision-" in key and expected == b"":
            self.release.set()
        return value

    def wait(self, keys, timeout=None):
        self.inner.wait(keys, timeout)

    def check(self, keys):
        return self.inner.check(keys)


def _guard(store, tmp_path, events, wait_s=RestartGuard.DECISION_WAIT_S):
    guard = RestartGuard(store, "run1", str(tmp_path / "no-checkpoints"), max_restarts=20,
                         max_restarts_without_progress=1, events=events)
    guard.DECISION_WAIT_S = wait_s
    return guard


def _account_together(store, tmp_path, failed_round, wait_s=RestartGuard.DECISION_WAIT_S):
    results, events = [None, None], [Events(), Events()]

    def agent(i):
        results[i] = _guard(store, tmp_path, events[i], wait_s).account(failed_round)

    threads = [threading.Thread(target=agent, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not any(t.is_alive() for t in threads)
    return results, [e.lines[-1] for e in events]


def test_every_agent_of_a_round_reaches_the_same_decision(tmp_path):
    gated = GatedStore()  # kept referenced: the PrefixStore holds only its C++ half
    store = dist.PrefixStore("trainsup/", gated)  # as the agents see the rendezvous store
    decisions = []
    for failed_round in range(3):  # no checkpoint ever: no progress after each restart
        results, lines = _account_together(store, tmp_path, failed_round)
        assert results[0] == results[1], (failed_round, results, lines)
        assert lines[0] == lines[1] and "decision_missing" not in lines[0], lines
        decisions.append((results[0], lines[0]["restarts"], lines[0]["restarts_without_progress"]))
    # One restart counted per round, not per agent; the second one without progress gives up.
    assert [d[1:] for d in decisions] == [(1, 0), (2, 1), (3, 2)], decisions
    assert decisions[0][0] is None and decisions[1][0] is None
    assert decisions[2][0] == "2 restarts without a newer checkpoint (cap 1)"
    assert json.loads(store.get("restarts/run1/decision-2")) == {"restarts": 3, "step": -1, "stuck": 2}


def test_an_agent_left_without_a_decision_decides_from_the_counters_and_says_so(tmp_path):
    store = dist.PrefixStore("trainsup/", dist.HashStore())
    store.add("restarts/run1/count-0", 1)  # the round's first agent counted itself and vanished
    store.add("restarts/run1", 4)
    events = Events()
    assert _guard(store, tmp_path, events, wait_s=0.2).account(0) is None
    assert events.lines[-1]["decision_missing"] is True and events.lines[-1]["restarts"] == 5
    assert store.get("restarts/run1") == b"5"  # the counters follow the published decision


def test_a_first_agent_slower_than_the_wait_takes_the_decision_published_meanwhile(tmp_path):
    gated = GatedStore(until_published=True)  # kept referenced: the PrefixStore holds only its C++ half
    store = dist.PrefixStore("trainsup/", gated)
    store.add("restarts/run1/stuck", 1)
    store.set("restarts/run1/progress", "-1")  # a restart without progress was counted before
    results, lines = _account_together(store, tmp_path, 0, wait_s=0.2)
    assert results[0] == results[1] == "2 restarts without a newer checkpoint (cap 1)", (results, lines)
    assert [{k: v for k, v in line.items() if k != "decision_missing"} for line in lines] == [
        {"event": "restart", "restarts": 1, "newest_checkpoint_step": -1, "restarts_without_progress": 2}] * 2
    assert sorted(line.get("decision_missing", False) for line in lines) == [False, True]


def test_a_store_written_in_python_can_be_peeked_directly():
    """telemetry.peek on a dist.Store subclass itself, not behind a PrefixStore (pybind11 took
    trainsup's compare_set(store, ...) for the override recursing into itself)."""
    from trainsup.launch.store import compare_set, peek
    store = GatedStore()
    assert peek(store, "k") is None
    assert compare_set(store, "k", "", "v") == b"v" and peek(store, "k") == "v"


def test_a_newer_in_memory_snapshot_is_progress(tmp_path):
    """Snapshots every few steps and the disk every 10 minutes: restarts whose newest snapshot
    moved are not restarts without progress, though the disk's checkpoint did not move."""
    store = dist.PrefixStore("trainsup/", dist.HashStore())
    snapshot = {"step": 100}
    guard = RestartGuard(store, "run1", str(tmp_path / "no-checkpoints"), max_restarts=20,
                         max_restarts_without_progress=1, events=Events(), memory_step=lambda: snapshot["step"])
    for failed_round in range(4):
        snapshot["step"] += 50
        assert guard.account(failed_round) is None, failed_round
    assert guard.events.lines[-1]["newest_checkpoint_step"] == 300
    # The snapshots stop moving: the cap applies as before.
    assert guard.account(4) is None
    assert guard.account(5) == "2 restarts without a newer checkpoint (cap 1)"
