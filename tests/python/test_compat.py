"""trainsup's adapters to torch's and torchrun's internals (trainsup/_compat.py for the rank
side, trainsup/launch/_compat.py for the launcher's torchrun internals), on real
rendezvous handlers (two nodes of one c10d rendezvous in this process) and a real etcd; and
no other module of the package uses a private torch name."""
import dataclasses
import datetime
import os
import sys
import threading
import time
from types import SimpleNamespace

import pytest

from trainsup.launch import _compat as compat
from trainsup.launch.store import compare_set, peek

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                                "examples", "launch"))
from recovery_scenario import start_etcd  # noqa: E402
from trainsup.ports import free_port


@pytest.fixture()
def two_nodes():
    """Two handlers of one c10d rendezvous (min = max = 2), after their first round."""
    from torch.distributed.elastic.rendezvous import RendezvousParameters

    endpoint = f"127.0.0.1:{free_port()}"
    make = compat.inner_handler_factory("c10d")
    handlers = [make(RendezvousParameters(backend="c10d", endpoint=endpoint, run_id="compat", min_nodes=2,
                                          max_nodes=2, join_timeout="30")) for _ in range(2)]
    results = [None, None]

    def join(i):
        results[i] = compat.unpack_rendezvous(handlers[i].next_rendezvous())

    threads = [threading.Thread(target=join, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert all(results), "the two nodes did not form a round"
    yield handlers, results
    for h in handlers:
        h._stop_heartbeats()


def test_the_round_is_unpacked_the_same_from_a_tuple_or_a_rendezvous_info(two_nodes):
    handlers, results = two_nodes
    assert sorted(r[1] for r in results) == [0, 1] and {r[2] for r in results} == {2}
    info = SimpleNamespace(store="s", rank=3, world_size=4, bootstrap_store_info=None)  # torch 2.x's shape
    assert compat.unpack_rendezvous(info) == ("s", 3, 4)
    assert compat.round_of(handlers[0]) == 0 and compat.max_nodes(handlers[0]) == 2


def test_a_dead_node_is_evicted_by_another_and_the_round_ends_for_the_survivor(two_nodes):
    handlers, _ = two_nodes
    alive, dead = handlers
    dead._stop_heartbeats()  # it "dies": no more keep-alives, nothing else
    desc = compat.node_desc(dead)
    assert len(desc) == 3 and desc[1] > 0
    st = compat.state(alive)
    assert len(st.participants) == 2
    assert compat.evict(alive, desc) is True
    st = compat.current_state(alive)
    assert [list(dataclasses.astuple(n)) for n in st.participants] == [compat.node_desc(alive)]
    assert compat.evict(alive, desc) is False  # gone already: nothing to do
    # The survivor leaves too: nobody is left, as _exit() expects before it stops serving.
    compat.leave(alive)
    st = compat.current_state(alive)
    assert not st.participants and not st.wait_list


class _ScriptedBackend:
    """A rendezvous backend whose compare-and-set loses while `lose` is positive."""
    name = "scripted"

    def __init__(self, lose):
        self.lose, self.value, self.token, self.calls = lose, b"v0", 0, []

    def get_state(self):
        self.calls.append("get")
        return self.value, self.token

    def set_state(self, state, token=None):
        self.calls.append("set")
        if self.lose > 0:
            self.lose -= 1
            self.token += 1
            self.value = f"v{self.token}".encode()  # another node's write
            return self.value, self.token, False
        self.token += 1
        self.value = state
        return state, self.token, True


def test_a_lost_rendezvous_write_backs_off_and_retries_against_fresh_state():
    backend = _ScriptedBackend(lose=2)
    handler = SimpleNamespace(_state_holder=SimpleNamespace(_backend=backend))
    wrapper = compat.damp_rendezvous_contention(handler, base_s=0.001)
    assert handler._state_holder._backend is wrapper and wrapper.name == "scripted"
    assert compat.damp_rendezvous_contention(handler) is wrapper  # applied once
    lost = wrapper.set_state(b"mine", 0)
    # The answer is the state read after the wait (the store's current value), not ours.
    assert lost == (b"v1", 1, False) and backend.calls == ["set", "get"] and wrapper.backoffs == 1
    assert wrapper.set_state(b"mine", 1)[2] is False and wrapper.backoffs == 2
    assert wrapper.set_state(b"mine", 2) == (b"mine", 3, True)
    assert backend.value == b"mine" and wrapper._losses == 0  # a win resets the window
    assert compat.damp_rendezvous_contention(SimpleNamespace()) is None


def test_many_nodes_with_backoff_still_form_one_round_with_every_rank():
    """The backoff changes only the pace of torch's writes: 12 nodes joining at once get one
    round, ranks 0..11 each once, and a restart (every node leaves and joins again) too."""
    from torch.distributed.elastic.rendezvous import RendezvousParameters

    n = 12
    endpoint = f"127.0.0.1:{free_port()}"
    make = compat.inner_handler_factory("c10d")
    handlers = [make(RendezvousParameters(backend="c10d", endpoint=endpoint, run_id="backoff", min_nodes=n,
                                          max_nodes=n, join_timeout="60")) for _ in range(n)]
    wrappers = []
    for h in handlers:
        compat.shorten_rendezvous_polls(h)
        wrappers.append(compat.damp_rendezvous_contention(h))
    try:
        for round_no in range(2):
            results = [None] * n

            def join(i):
                results[i] = compat.unpack_rendezvous(handlers[i].next_rendezvous())

            threads = [threading.Thread(target=join, args=(i,)) for i in range(n)]
            for t in threads:
                t.start()
            for t in threads:
                t.join(90)
            assert all(results), f"round {round_no}: only {sum(1 for r in results if r)} of {n} nodes returned"
            assert sorted(r[1] for r in results) == list(range(n)) and {r[2] for r in results} == {n}
            assert {compat.round_of(h) for h in handlers} == {round_no}
    finally:
        for h in handlers:
            h._stop_heartbeats()


def test_nodes_waiting_reads_the_whole_state_only_after_a_join_or_its_refresh():
    """torchrun asks every 0.1 s whether nodes wait; the answer reads the whole rendezvous state
    (O(nodes) bytes) only when some node announced a join, or every max_nodes / 64 s."""
    import torch.distributed as dist
    from trainsup.launch.waiting import NodesWaiting

    class Inner:
        def __init__(self):
            self.waiting, self.reads = 0, 0
            self._settings = SimpleNamespace(min_nodes=1, max_nodes=128)
            self._state_holder = SimpleNamespace(state=SimpleNamespace(complete=True, participants={1: 0, 2: 1}))

        def num_nodes_waiting(self):
            self.reads += 1
            return self.waiting

    now = [100.0]
    store = dist.HashStore()
    inner = Inner()
    gate = NodesWaiting(inner, store, "job", clock=lambda: now[0])
    other = NodesWaiting(Inner(), store, "job")  # another agent of the job, on the same store
    assert gate.refresh_s == 2.0  # 128 / 64
    assert gate() == 0 and inner.reads == 1
    now[0] += 0.5
    assert gate() == 0 and inner.reads == 1  # asked again within a second: the last answer
    now[0] += 1.0
    assert gate() == 0 and inner.reads == 1  # no join announced, refresh not due: no full read
    inner.waiting = 1
    other.announce()  # a spare's agent is about to join
    now[0] += 1.0
    assert gate() == 1 and inner.reads == 2  # seen within a second of the announcement
    gate.reset()
    inner.waiting = 0
    assert gate() == 0 and inner.reads == 2  # counter unchanged, read 0 s ago
    now[0] += 2.0
    assert gate() == 0 and inner.reads == 3  # the refresh: a joiner that did not announce is seen too
    # Spares beyond max_nodes give no reason to restart a complete round.
    inner.waiting = 3
    inner._settings.max_nodes = 2
    other.announce()
    now[0] += 1.0
    assert gate() == 0 and inner.reads == 4


def test_expedite_ends_the_last_call_wait_of_a_round_that_has_everyone_it_can_get():
    from torch.distributed.elastic.rendezvous import RendezvousParameters

    # MIN 1, MAX 2: one node alone waits torch's last call (30 s) for a second one.
    h = compat.inner_handler_factory("c10d")(RendezvousParameters(
        backend="c10d", endpoint=f"127.0.0.1:{free_port()}", run_id="expedite", min_nodes=1, max_nodes=2))
    done = threading.Event()
    result = []
    threading.Thread(target=lambda: (result.append(compat.unpack_rendezvous(h.next_rendezvous())), done.set()),
                     daemon=True).start()
    pause = threading.Event()  # never set: a bounded poll of the shared state
    for _ in range(200):  # until it is the one participant of the forming round (at most 20 s)
        if compat.forming_round(h) == (1, True):
            break
        pause.wait(0.1)
    assert compat.forming_round(h) == (1, True)
    assert compat.expedite(h) is True
    assert done.wait(10), "the round did not complete although its last call was ended"
    assert result[0][1:] == (0, 1)
    assert compat.forming_round(h) is None and compat.expedite(h) is False  # complete: nothing to end
    h._stop_heartbeats()


def test_trainsups_store_is_not_stalled_by_torchruns_blocking_gets(two_nodes):
    # torchrun's agent blocks in gets on the rendezvous store (its exit barrier waits up to 300 s)
    # and a TCPStore client serialises its operations: the keep-alives must not queue behind it.
    handlers, _ = two_nodes
    base = compat.base_store(handlers[0])
    ours = compat.trainsup_store(handlers[0])
    assert ours is not base and ours.port == base.port
    base.set_timeout(datetime.timedelta(seconds=4))
    blocked = threading.Thread(target=lambda: pytest.raises(Exception, base.get, "never-set"), daemon=True)
    blocked.start()
    blocked.join(0.3)
    assert blocked.is_alive(), "the get should be waiting"
    t0 = time.monotonic()
    ours.add("keepalive", 1)
    took = time.monotonic() - t0
    blocked.join(10)
    assert took < 2, f"the keep-alive waited {took:.1f} s behind torchrun's get"


def test_the_old_etcd_backend_is_refused_with_the_ones_that_work():
    with pytest.raises(ValueError, match=r"'etcd'.*c10d.*etcd-v2"):
        compat.inner_handler_factory("etcd")


def test_the_etcd_store_does_what_the_election_and_the_quarantine_need(tmp_path):
    import etcd
    from torch.distributed import PrefixStore

    port = free_port()
    server = start_etcd(tmp_path, port)
    try:
        client = etcd.Client(host="127.0.0.1", port=port)
        base = compat._etcd_store_class()(client, "/trainsup/test/store")
        store = PrefixStore("trainsup/", base)  # as the launcher wraps it
        # compare_set with TCPStore's semantics: an absent key counts as "".
        assert peek(store, "office") is None
        assert compare_set(store, "office", "", "a") == b"a"
        assert compare_set(store, "office", "", "b") == b"a"        # taken: the holder is returned
        assert compare_set(store, "office", "a", "c") == b"c"       # taken over from the holder
        assert compare_set(store, "missing", "x", "y") == b"x"      # absent and something expected
        assert peek(store, "missing") is None
        # Counters and plain values share the encoding.
        assert store.add("restarts", 2) == 2 and store.add("restarts", 1) == 3
        store.set("stuck", "0")
        assert store.add("stuck", 1) == 1
        assert store.delete_key("office") is True and peek(store, "office") is None
        assert store.delete_key("office") is False
        # Racing writers: exactly one wins the empty office.
        winners = []
        lock = threading.Lock()

        def elect(name):
            got = compare_set(store, "race", "", name)
            with lock:
                winners.append(got)

        threads = [threading.Thread(target=elect, args=(f"n{i}",)) for i in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        assert len(winners) == 8 and len(set(winners)) == 1, winners
    finally:
        server.terminate()
        server.wait()


def test_only_compat_touches_torch_internals():
    """A private torch name (`_get_default_group`, `torch.distributed.run`, ...) anywhere but the
    two _compat.py (the rank side's, the launcher's) would break on the next torch release
    without the version adapter noticing."""
    import ast
    import pathlib
    import trainsup
    package = pathlib.Path(trainsup.__file__).parent
    internal_modules = ("torch.distributed.run", "torch.distributed.elastic.multiprocessing",
                        "torch.distributed.elastic.rendezvous.registry", "torch.distributed.elastic.rendezvous.dynamic",
                        "torch.distributed.elastic.rendezvous.etcd", "torch._")
    offenders = []
    modules = sorted(package.rglob("*.py"))
    assert {p.relative_to(package).as_posix() for p in modules} >= {"_compat.py", "launch/_compat.py",
                                                                   "launch/launcher.py", "tools/cli.py"}
    for path in modules:
        if path.name == "_compat.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                names = [node.module or ""] if isinstance(node, ast.ImportFrom) else [a.name for a in node.names]
                offenders += [f"{path.name}:{node.lineno} imports {n}" for n in names
                              if n.startswith(internal_modules)
                              or (n.startswith("torch.") and any(p.startswith("_") for p in n.split(".")))]
            elif isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__"):
                base = node.value
                chain = []
                while isinstance(base, ast.Attribute):
                    chain.append(base.attr)
                    base = base.value
                root = base.id if isinstance(base, ast.Name) else ""
                if root in ("torch", "dist", "c10d") or "distributed_c10d" in chain or node.attr in (
                        "_get_backend", "_get_default_group", "_get_default_store", "_abort_process_group"):
                    offenders.append(f"{path.name}:{node.lineno} uses {node.attr}")
            elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                  and node.func.id in ("getattr", "hasattr", "setattr") and len(node.args) >= 2
                  and isinstance(node.args[1], ast.Constant) and isinstance(node.args[1].value, str)):
                # A private attribute by name (getattr(module, "_orig_mod")) of anything but our
                # own objects; namedtuple's documented `_fields` and the like are public.
                name = node.args[1].value
                own = isinstance(node.args[0], ast.Name) and node.args[0].id == "self"
                if (name.startswith("_") and not name.startswith("__") and not own
                        and name not in ("_fields", "_asdict", "_replace", "_make")):
                    offenders.append(f"{path.name}:{node.lineno} uses {name} by name")
    assert offenders == []


def _handlers(n, min_nodes, max_nodes, run_id):
    from torch.distributed.elastic.rendezvous import RendezvousParameters
    endpoint = f"127.0.0.1:{free_port()}"
    make = compat.inner_handler_factory("c10d")
    handlers = [make(RendezvousParameters(backend="c10d", endpoint=endpoint, run_id=run_id, min_nodes=min_nodes,
                                          max_nodes=max_nodes, join_timeout="60", local_addr="127.0.0.1"))
                for _ in range(n)]
    for h in handlers:
        compat.shorten_rendezvous_polls(h)
    return handlers


def _in_threads(calls, timeout=90):
    results = [None] * len(calls)

    def run(i):
        results[i] = calls[i]()

    threads = [threading.Thread(target=run, args=(i,), daemon=True) for i in range(len(calls))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout)
    return results


@pytest.fixture
def rendezvous_nodes(monkeypatch):
    """rendezvous_nodes(n, min, max, run_id): n of torch's rendezvous handlers on one store
    (_handlers), their keep-alives stopped after the test."""
    monkeypatch.setenv("TORCH_DISABLE_SHARE_RDZV_TCP_STORE", "1")
    made = []

    def make(*args):
        made.extend(_handlers(*args))
        return made[-args[0]:]
    yield make
    for h in made:
        h._stop_heartbeats()


def test_a_fast_restart_gives_every_survivor_torchs_round_and_ranks(rendezvous_nodes):
    """Six nodes restart through the round written once: each gets what torch's protocol would
    give (the next round, complete, ranks in sorted node order, the world), and torch's own
    protocol carries on from that state."""
    from trainsup.launch.fast_round import FastRestart
    n = 6
    handlers = rendezvous_nodes(n, n, n, "fast")
    first = _in_threads([lambda h=h: compat.unpack_rendezvous(h.next_rendezvous()) for h in handlers])
    assert sorted(r[1] for r in first) == list(range(n))
    fast = [FastRestart(h, "fast") for h in handlers]
    infos = _in_threads([lambda f=f: f() for f in fast])
    assert [f.last for f in fast] == ["fast"] * n
    got = [compat.unpack_rendezvous(i) for i in infos]
    order = sorted(range(n), key=lambda i: compat.node_desc(handlers[i]))
    assert [got[i][1] for i in order] == list(range(n)) and {g[2] for g in got} == {n}
    assert {compat.round_of(h) for h in handlers} == {1}
    got[0][0].set("written-in-round-1", "x")  # the round's store is round 1's, as torch's
    assert handlers[1]._get_store().get("written-in-round-1") == b"x"
    again = _in_threads([lambda h=h: compat.unpack_rendezvous(h.next_rendezvous()) for h in handlers])
    assert sorted(r[1] for r in again) == list(range(n)) and {compat.round_of(h) for h in handlers} == {2}


def test_a_fast_restart_drops_the_lost_node_and_gives_its_place_to_the_spare(rendezvous_nodes):
    from trainsup.launch.fast_round import FastRestart
    handlers = rendezvous_nodes(4, 2, 3, "fast-spare")
    active, spare = handlers[:3], handlers[3]
    _in_threads([lambda h=h: h.next_rendezvous() for h in active])
    spare_result = []
    waiting = threading.Thread(target=lambda: spare_result.append(compat.unpack_rendezvous(spare.next_rendezvous())),
                               daemon=True)
    waiting.start()
    deadline = time.monotonic() + 30
    while compat.node_desc(spare) not in compat.completed_round(active[0])[2] and time.monotonic() < deadline:
        time.sleep(0.05)  # the spare joins on its own thread: poll the state, bounded by the deadline
    lost = max(active, key=compat.node_desc)  # not the writer
    lost._stop_heartbeats()
    survivors = [compat.node_desc(h) for h in active if h is not lost]
    fast = [FastRestart(h, "fast-spare") for h in active if h is not lost]
    infos = _in_threads([lambda f=f: f(survivors) for f in fast])
    waiting.join(30)
    assert [f.last for f in fast] == ["fast", "fast"]
    worlds = {compat.unpack_rendezvous(i)[2] for i in infos} | {spare_result[0][2]}
    assert worlds == {3}
    st = compat.synced_state(spare)
    assert compat.node_desc(lost) not in [list(dataclasses.astuple(d)) for d in st.participants]
    assert sorted([compat.unpack_rendezvous(i)[1] for i in infos] + [spare_result[0][1]]) == [0, 1, 2]


def test_a_waiting_spare_is_rung_when_the_round_is_written_not_at_its_next_poll(rendezvous_nodes, monkeypatch):
    """The spare waits in torch's protocol, which looks at the state once per poll interval
    (here made 5 s, so that a look cannot pass for the bell): the writer's wake key ends its
    wait, and it joins the round written for it at once."""
    from trainsup.launch.fast_round import FastRestart
    handlers = rendezvous_nodes(4, 2, 3, "fast-bell")
    active, spare = handlers[:3], handlers[3]
    _in_threads([lambda h=h: h.next_rendezvous() for h in active])
    monkeypatch.setattr(compat, "_SYNC_POLL_S", [5.0])
    bell = FastRestart(spare, "fast-bell")
    told = []  # the agent's rendezvous_waiting event: once, naming the round the spare waits behind
    bell.on_waiting = told.append
    monkeypatch.setattr(compat, "_SYNC_WAKER", [bell.wait_for_round])
    spare_result = []
    waiting = threading.Thread(target=lambda: spare_result.append((compat.unpack_rendezvous(spare.next_rendezvous()),
                                                                   time.monotonic())), daemon=True)
    waiting.start()
    deadline = time.monotonic() + 30
    while compat.node_desc(spare) not in compat.completed_round(active[0])[2] and time.monotonic() < deadline:
        time.sleep(0.05)  # the spare joins on its own thread: poll the state, bounded by the deadline
    first_round = compat.completed_round(active[0])[0]
    lost = max(active, key=compat.node_desc)
    lost._stop_heartbeats()
    survivors = [compat.node_desc(h) for h in active if h is not lost]
    fast = [FastRestart(h, "fast-bell") for h in active if h is not lost]
    infos = _in_threads([lambda f=f: f(survivors) for f in fast])
    written = time.monotonic()
    waiting.join(30)
    assert [f.last for f in fast] == ["fast", "fast"] and spare_result
    (_, spare_rank, spare_world), joined = spare_result[0]
    assert spare_world == 3 and sorted([compat.unpack_rendezvous(i)[1] for i in infos] + [spare_rank]) == [0, 1, 2]
    assert joined - written < 2.5, f"the spare joined {joined - written:.2f} s after the round was written"
    # Rung once for that round: a later wait behind it (nothing to ring) sleeps instead.
    assert bell.wait_for_round(0.01) is False
    assert told == [first_round], told


def test_the_bell_waits_for_one_key_at_a_time_and_lets_the_old_wait_go():
    import datetime
    from torch.distributed import PrefixStore, TCPStore
    from trainsup.launch.fast_round import _Bell
    server = TCPStore("127.0.0.1", 0, None, True, datetime.timedelta(seconds=30))
    other = PrefixStore("trainsup/", TCPStore("127.0.0.1", server.port, None, False, datetime.timedelta(seconds=30)))
    bell = _Bell(lambda: TCPStore("127.0.0.1", server.port, None, False, datetime.timedelta(seconds=30)),
                 lambda key: other.set(key, "1"))
    assert bell.wait("a", 0.05) is False
    first = bell._thread
    assert bell.wait("b", 0.05) is False  # a new key: the wait on "a" was let go, its client reused
    first.join(5)
    assert not first.is_alive()
    threading.Timer(0.2, lambda: other.set("b", "1")).start()
    t0 = time.monotonic()
    assert bell.wait("b", 10) is True and time.monotonic() - t0 < 5
    # At the agent's end, a wait under way is let go and its thread ends before the interpreter
    # finalizes (a thread still in the store's C++ wait then terminates the process: exit -6).
    assert bell.wait("c", 0.05) is False
    waiting = bell._thread
    bell.close()
    assert not waiting.is_alive()


def test_a_fast_restart_falls_back_when_the_writer_never_comes(rendezvous_nodes):
    from trainsup.launch.fast_round import FastRestart
    handlers = rendezvous_nodes(3, 3, 3, "fast-none")
    _in_threads([lambda h=h: h.next_rendezvous() for h in handlers])
    writer = min(handlers, key=compat.node_desc)  # it never calls: dead, or on torch's path
    rest = [FastRestart(h, "fast-none", writer_timeout_s=0.5, grace_s=0.5)
            for h in handlers if h is not writer]
    t0 = time.monotonic()
    assert _in_threads([lambda f=f: f() for f in rest]) == [None, None]
    assert [f.last for f in rest] == ["the writer did not answer"] * 2 and time.monotonic() - t0 < 10
    assert {compat.round_of(h) for h in handlers} == {0}  # nothing written: torch's protocol takes over


def test_when_the_writer_is_found_lost_the_next_survivor_writes_the_round(rendezvous_nodes):
    """The survivors are asked again while the round forms: the first in order never comes and
    is then reported lost, and the next one writes the round instead of everyone waiting out the
    writer's deadline and falling back."""
    from trainsup.launch.fast_round import FastRestart
    handlers = rendezvous_nodes(3, 2, 3, "fast-lost")
    _in_threads([lambda h=h: h.next_rendezvous() for h in handlers])
    dead = min(handlers, key=compat.node_desc)
    dead._stop_heartbeats()
    everyone = [compat.node_desc(h) for h in handlers]
    reported = threading.Event()  # the liveness verdict on the dead node
    survivors = lambda: [d for d in everyone if not (reported.is_set() and d == compat.node_desc(dead))]  # noqa: E731
    rest = [FastRestart(h, "fast-lost", writer_timeout_s=30, grace_s=30) for h in handlers if h is not dead]
    threading.Timer(1.0, reported.set).start()
    t0 = time.monotonic()
    infos = _in_threads([lambda f=f: f(survivors) for f in rest])
    assert [f.last for f in rest] == ["fast", "fast"] and time.monotonic() - t0 < 10
    assert sorted(compat.unpack_rendezvous(i)[1:] for i in infos) == [(0, 2), (1, 2)]


def test_stopping_torchruns_log_tailing_does_not_wait_out_its_pause(tmp_path):
    """torchrun --tee copies worker logs with threads that pause between reads; stopping the
    workers waited for those pauses (0.1 s of every restart). With trainsup's tail_logfile the
    stop wakes them, and every line written before the stop is still copied, exactly once."""
    import io
    from torch.distributed.elastic.multiprocessing import tail_log
    assert compat.prompt_log_tailing()
    assert compat.prompt_log_tailing()  # twice in a process: still one layer, torch's underneath
    assert not hasattr(tail_log.tail_logfile.__trainsup_original__, "__trainsup_original__")
    log = tmp_path / "worker0.log"
    log.write_text("first\n")
    dst = io.StringIO()
    # A pause of 60 s: the copy of "first" shows the thread has read to the end and paused.
    tailer = tail_log.TailLog("w", {0: str(log)}, dst, interval_sec=60).start()
    deadline = time.monotonic() + 30
    while "first" not in dst.getvalue():
        assert time.monotonic() < deadline, "the tailer never copied the first line"
        time.sleep(0.01)  # polls another thread's output; bounded
    with open(log, "a") as f:
        f.write("second\nthird\n")  # written during the pause, before the stop
    t0 = time.monotonic()
    tailer.stop()
    took = time.monotonic() - t0
    assert dst.getvalue() == "[w0]:first\n[w0]:second\n[w0]:third\n"
    assert took < 30, f"stop() waited out the tailer's 60 s pause ({took:.1f} s)"
