"""Every use of torchrun's internals by the launcher (trainsup.launch), in one place, because
they differ between torch versions: torchrun's parser, runner, handler registry and rendezvous
handler state. Nothing else in the package imports a private torch name (tests/python/
test_compat.py checks that; the rank side's are in trainsup/_compat.py). Imports of torch
happen inside the functions: importing the launcher's modules does not load torch.

Run and tested on torch 2.13 (every launcher scenario of the suite): next_rendezvous returns a
RendezvousInfo, spares wait in redundancy_list, _NodeDesc has .addr, and the rendezvous store
shared with workers must be turned off (prepare_environment). The torch 1.x branches kept here
(tuple results, fqdn, Std parsing, stores without check()) are no longer exercised: torch 1.x
is unsupported since the move to torch 2.x."""
import dataclasses
import os
import re


def torchrun_parser():
    """torchrun's own argument parser (trainsup.run adds its flags to it)."""
    import torch.distributed.run as torchrun
    return torchrun.get_args_parser()


def register_rendezvous_handler(name, create):
    """Registers `create(params) -> RendezvousHandler` as rendezvous backend `name`; a second
    registration in the same process keeps the first."""
    from torch.distributed.elastic.rendezvous import rendezvous_handler_registry
    try:
        rendezvous_handler_registry.register(name, create)
    except ValueError:
        pass


def run_torchrun(args, on_signal):
    """torchrun's main with parsed `args`. When torchrun is stopped by a signal from outside
    (its SignalException), calls on_signal(signal number) and re-raises."""
    import torch.distributed.run as torchrun
    from torch.distributed.elastic.multiprocessing.api import SignalException
    try:
        torchrun.run(args)
    except SignalException as e:
        on_signal(e.sigval)
        raise


def prepare_environment():
    """torch 2.x shares one TCPStore server (the round's rank-0 agent's) with the workers of
    every round, and a restarted worker's init_process_group reads the previous attempt's keys
    under the same names: gloo then connects to the dead peers of the last attempt (plain
    torchrun 2.13 with --max-restarts fails its first restart this way, "Connection refused"
    or a hang). With TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 each round's workers get a store of
    their own on a fresh port (hosted by their rank 0, as in torch 1.x)."""
    os.environ["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] = "1"


def prompt_log_tailing():
    """torchrun with --tee copies each worker's log file to its own output with one thread per
    file that sleeps 0.1 s whenever it reaches the end of the file (tail_log.tail_logfile), and
    stopping the workers waits for those threads: up to 0.1 s of every restart, after a
    worker's exit is seen (the recovery bench measured 0.13-0.25 s from a worker's end to the
    restart with torch's 0.1 s monitor interval). The same loop, whose pause ends as soon as
    the tailing is told to finish: what it copies and when it stops are unchanged. Returns
    False where tail_log has no such function (nothing replaced)."""
    from torch.distributed.elastic.multiprocessing import tail_log
    original = getattr(tail_log, "tail_logfile", None)
    if original is None:
        return False
    original = getattr(original, "__trainsup_original__", original)

    def tail_logfile(header, file, dst, finished, interval_sec, log_line_filter=None):
        while not os.path.exists(file):
            if finished.is_set():
                return
            finished.wait(interval_sec)  # the file is not there yet
        with open(file, errors="replace") as fp:
            while True:
                line = fp.readline()
                if line:
                    if log_line_filter and log_line_filter(line):  # as torch: no filter, no copy
                        dst.write(f"{header}{line}")
                elif finished.is_set():
                    break  # at the end, and the producer is done
                else:
                    finished.wait(interval_sec)  # woken by stop(), to copy the rest at once

    setattr(tail_logfile, "__trainsup_original__", original)
    tail_log.tail_logfile = tail_logfile
    return True


def fix_std_parsing():
    """torch 1.13's Std.from_str iterates an IntFlag to map "0".."3" to members; on Python 3.11
    iteration skips the zero and composite members (NONE, ALL), so the default "0" yields None
    and torchrun crashes at start ('NoneType' object has no attribute 'get'). Replace it with
    a version that builds the member from its value."""
    from torch.distributed.elastic.multiprocessing import api

    std = api.Std
    if std.from_str("0") is std.NONE and std.from_str("3") is std.ALL:
        return False  # this torch/Python pair is fine

    def from_str(cls, vm):
        if re.match(api._VALUE_REGEX, vm):
            return cls(int(vm))
        if re.match(api._MAPPING_REGEX, vm):
            return {int(i): cls(int(v)) for i, v in (m.split(":") for m in vm.split(","))}
        raise ValueError(f"{vm} does not match: <{api._VALUE_REGEX}> or <{api._MAPPING_REGEX}>")

    std.from_str = classmethod(from_str)  # type: ignore[method-assign, assignment]
    return True


def inner_handler_factory(backend):
    """torchrun's own handler factory for `backend` (c10d, etcd-v2, ...)."""
    from torch.distributed.elastic.rendezvous import registry

    # Both build torch's DynamicRendezvousHandler, whose state the hook reads (the older "etcd"
    # backend is a different handler and is not supported).
    factories = {"c10d": "_create_c10d_handler", "etcd-v2": "_create_etcd_v2_handler"}
    name = factories.get(backend)
    if name is None or not hasattr(registry, name):
        raise ValueError(f"trainsup.run: rendezvous backend {backend!r} is not supported here "
                         f"(use one of {sorted(k for k, v in factories.items() if hasattr(registry, v))})")
    return getattr(registry, name)


def base_store(handler):
    """The store the dynamic rendezvous handler keeps its state in (a TCPStore for c10d)."""
    store = getattr(handler, "_store", None)
    if store is None:
        raise RuntimeError("trainsup.run: this torch version's rendezvous handler has no _store")
    return store


def _as_bytes(value):
    """A store value as torch hands it to a Python store: bytes, str, or (torch 1.13, which
    converts std::vector<uint8_t>) a list of ints."""
    if isinstance(value, (bytes, bytearray)):
        return bytes(value)
    if isinstance(value, str):
        return value.encode()
    return bytes(value)


def _etcd_store_class():
    import etcd
    from torch.distributed.elastic.rendezvous.etcd_store import EtcdStore, cas_delay

    class TrainsupEtcdStore(EtcdStore):
        """torch's EtcdStore plus the two operations trainsup's election, verdict and quarantine
        keys need and torch's lacks: compare_set (with TCPStore's semantics: an absent key
        counts as the empty value) and delete_key."""

        def compare_set(self, key, expected_value, desired_value):
            path = self.prefix + self._encode(key)
            expected, desired = _as_bytes(expected_value), _as_bytes(desired_value)
            while True:
                try:
                    node = self.client.get(key=path)
                except etcd.EtcdKeyNotFound:
                    if expected:
                        return expected
                    try:
                        self.client.write(key=path, value=self._encode(desired), prevExist=False)
                        return desired
                    except etcd.EtcdAlreadyExist:
                        continue  # someone else created it first: compare against theirs
                current = self._decode(node.value)
                if current != expected:
                    return current
                try:
                    self.client.test_and_set(key=path, value=self._encode(desired), prev_value=node.value)
                    return desired
                except (etcd.EtcdCompareFailed, etcd.EtcdKeyNotFound):
                    cas_delay()  # changed under us: read it again

        def delete_key(self, key):
            try:
                self.client.delete(key=self.prefix + self._encode(key))
                return True
            except etcd.EtcdKeyNotFound:
                return False

        deleteKey = delete_key  # the name torch 1.13's store trampoline looks up

    return TrainsupEtcdStore


def trainsup_store(handler):
    """The store trainsup keeps its job-wide keys in (election, verdicts, quarantine mirror,
    restart counters, agents' keep-alives), as a client of trainsup's own: for c10d a second
    TCPStore client of the rendezvous's server (a client serialises its operations, and
    torchrun's agent blocks in long gets on its own, e.g. 300 s in its exit barrier, which would
    stall every keep-alive behind it); for etcd-v2 an etcd store under /trainsup/<run id>/ on
    the same etcd client, which supports compare_set."""
    import datetime
    from torch.distributed import TCPStore
    store = base_store(handler)
    client = getattr(store, "client", None)
    if client is not None and type(store).__name__ == "EtcdStore":
        return _etcd_store_class()(client, f"/trainsup/{handler.get_run_id()}/store")
    if isinstance(store, TCPStore):
        return TCPStore(store.host, store.port, None, False, datetime.timedelta(seconds=60))
    return store


def unpack_rendezvous(result):
    """(store, group_rank, group_world) from what next_rendezvous returned: a tuple in torch
    1.x, a RendezvousInfo in torch 2.x (the agent reads its fields, so the hook returns the
    object it got)."""
    if isinstance(result, tuple):
        return result
    return result.store, result.rank, result.world_size


def use_agent_store(handler):
    """torch 2.x: whether workers share the agent's store (a property of the handler)."""
    return bool(getattr(handler, "use_agent_store", False))


_SYNC_POLL_S = [1.0]
_SYNC_WAKER = [None]  # waker(timeout_s) -> bool, or None (see wake_rendezvous_polls)


def shorten_rendezvous_polls(handler):
    """torch's dynamic rendezvous (c10d and etcd-v2) looks at the shared state at most once a
    second while it waits for other nodes: it sleeps a fixed 1 s between looks
    (dynamic_rendezvous: `_delay(seconds=1)` on _Action.SYNC), and its state holder reuses a
    copy up to 1 s old (`cache_duration=1`). A node that waits for the round to complete learns
    of it up to a second late (issue 22 measured the restart's rendezvous at 1.2 s). Both become
    max_nodes / 1000 s, between 0.1 s and torch's 1 s: the store then serves at most about 1000
    of these reads a second whatever the job's size (at 1000 nodes and more, torch's own pace).
    Other delays (the random start-up skew) are torch's. Returns the interval."""
    from torch.distributed.elastic.rendezvous import dynamic_rendezvous as dr
    _SYNC_POLL_S[0] = min(1.0, max(0.1, float(max_nodes(handler)) / 1000.0))
    holder = getattr(handler, "_state_holder", None)
    if holder is not None and hasattr(holder, "_cache_duration"):
        holder._cache_duration = _SYNC_POLL_S[0]
    original = getattr(dr._delay, "__trainsup_original__", dr._delay)

    def delay(seconds):
        if seconds == 1:
            waker = _SYNC_WAKER[0]
            if waker is not None and waker(_SYNC_POLL_S[0]):
                return
            seconds = _SYNC_POLL_S[0]
        original(seconds)

    setattr(delay, "__trainsup_original__", original)
    dr._delay = delay
    return _SYNC_POLL_S[0]


def wake_rendezvous_polls(waker):
    """Between two looks at the rendezvous state (shorten_rendezvous_polls), calls
    waker(timeout_s) instead of sleeping the interval: it waits for something worth a look
    (at most timeout_s) and returns True, or returns False at once and the interval is slept.
    None: sleep as before."""
    _SYNC_WAKER[0] = waker


def waiting_behind(handler):
    """The number of the complete round this node waits behind (in its wait or redundancy
    list), from the handler's last look at the state; None when it waits for anything else."""
    holder = getattr(handler, "_state_holder", None)
    st = getattr(holder, "state", None)
    node = getattr(handler, "_this_node", None)
    if st is None or not st.complete or st.closed or node in st.participants:
        return None
    if node in st.wait_list or node in getattr(st, "redundancy_list", ()):
        return st.round
    return None


def expire_state_cache(handler):
    """The handler's next look at the rendezvous state reads the backend, whatever its cache."""
    handler._state_holder._last_sync_time = -1.0


class _BackoffBackend:
    """A rendezvous backend that backs off after a lost compare-and-set (see
    damp_rendezvous_contention). Everything else is the wrapped backend's."""

    def __init__(self, inner, base_s, cap_s):
        import random
        self._inner = inner
        self._base_s, self._cap_s = base_s, cap_s
        self._losses = 0  # consecutive lost writes of this node
        self._random = random.Random()
        self.backoffs = 0  # lost writes followed by a wait (for tests and the bench)

    @property
    def name(self):
        return self._inner.name

    def get_state(self):
        return self._inner.get_state()

    def set_state(self, state, token=None):
        import time
        result = self._inner.set_state(state, token)
        if result is None or result[2]:
            self._losses = 0
            return result
        # Lost: another node wrote first. Wait a random part of a window that doubles with
        # each consecutive loss ("full jitter"), then answer with the state as it is after the
        # wait, so that the retry is made against fresh state, not the one that lost.
        self._losses += 1
        self.backoffs += 1
        time.sleep(self._random.uniform(0.0, min(self._cap_s, self._base_s * 2 ** self._losses)))
        fresh = self._inner.get_state()
        if fresh is None:
            return result
        return fresh[0], fresh[1], False


def damp_rendezvous_contention(handler, base_s=0.001):
    """torch's dynamic rendezvous keeps the whole state (participants, wait list, heartbeats:
    O(nodes) bytes) in one value that every node changes by compare-and-set. A node whose write
    loses gets the new state back and writes again at once, so when N nodes join or leave
    together (every restart) each winning write is followed by up to N-1 lost ones: O(N^2)
    store operations carrying O(N) bytes each (bench/rendezvous_bench.py measures it: at 128
    nodes a restart round moved 121 MB). Here a node that loses waits a random time in a window
    that starts at `base_s` and doubles with each consecutive loss, capped at the rendezvous
    poll interval (shorten_rendezvous_polls, which runs first), before it reads the state again
    and retries. The state machine and its writes are torch's: only their pace changes. Returns
    the wrapper (its .backoffs counts the waits), or None where the handler has no backend to
    wrap."""
    holder = getattr(handler, "_state_holder", None)
    backend = getattr(holder, "_backend", None)
    if holder is None or backend is None:
        return None
    if isinstance(backend, _BackoffBackend):
        return backend
    wrapper = _BackoffBackend(backend, base_s, _SYNC_POLL_S[0])
    holder._backend = wrapper
    return wrapper


def synced_state(handler):
    """The handler's own state holder synced now (its cache skipped), and its state."""
    holder = handler._state_holder
    holder._last_sync_time = -1.0  # older than any cache: sync() reads the backend
    holder.sync()
    return holder.state


def completed_round(handler):
    """(round, participants, waiting) of the round this node took part in, read now: the
    participants and the nodes waiting for a place (wait and redundancy lists, those whose
    keep-alive has not expired) as sorted node_desc lists. None unless that round is complete,
    open, and has this node."""
    st = synced_state(handler)  # sync() drops the nodes whose keep-alives expired
    if not st.complete or st.closed or handler._this_node not in st.participants:
        return None
    waiting = set(st.wait_list) | set(getattr(st, "redundancy_list", ()))
    return (st.round, sorted(list(dataclasses.astuple(n)) for n in st.participants),
            sorted(list(dataclasses.astuple(n)) for n in waiting))


def write_next_round(handler, round_, nodes, attempts=20):
    """Moves the rendezvous from the complete round `round_` to round_ + 1, complete, with
    `nodes` (node_desc lists) as its participants, ranked as torch ranks them
    (_mark_rendezvous_complete: in sorted order), in one compare-and-set of the state: what
    torch's protocol reaches after every node has left and joined again, written once. Nodes
    of the new round leave the wait and redundancy lists; everything else is kept. Retries
    while only keep-alives move the state under it; returns False (nothing written) once the
    state is not `round_` complete any more."""
    import pickle
    from datetime import datetime, timezone
    backend = handler._state_holder._backend
    members = sorted(_node(d) for d in nodes)
    for _ in range(attempts):
        got = backend.get_state()
        if got is None:
            return False
        st, token = pickle.loads(got[0]), got[1]
        if st.round != round_ or not st.complete or st.closed:
            return False
        now = datetime.now(timezone.utc)
        st.round += 1
        st.deadline = None
        st.participants = {node: rank for rank, node in enumerate(members)}
        for node in members:
            st.wait_list.discard(node)
            st.redundancy_list.discard(node)
        st.last_heartbeats = {node: when for node, when in st.last_heartbeats.items()
                              if node in st.wait_list or node in st.redundancy_list}
        st.last_heartbeats.update({node: now for node in members})
        result = backend.set_state(pickle.dumps(st), token)
        if result is not None and result[2]:
            return True
    return False


def adopt_round(handler, round_):
    """Returns what next_rendezvous() returns for round `round_`, written by another node
    (write_next_round), as torch builds it after its join op: this node's rank and the world
    from the state, the round's store, keep-alives restarted. None if the state is not that
    round, complete, with this node (the caller then runs torch's protocol)."""
    from torch.distributed.elastic.rendezvous.api import RendezvousInfo, RendezvousStoreInfo
    if os.environ.get("TORCH_DISABLE_SHARE_RDZV_TCP_STORE", "0") != "1":
        return None  # torch shares its store server with the workers: only its own path sets that up
    st = synced_state(handler)
    if st.round != round_ or not st.complete or st.closed or handler._this_node not in st.participants:
        return None
    handler._start_heartbeats()
    rank, world = handler._get_world()
    store = handler._get_store()
    return RendezvousInfo(store, rank, world, RendezvousStoreInfo.build(rank, store, local_addr=handler._this_node.addr))


def stop_keep_alives(handler):
    """Stops torch's keep-alive timer (next_rendezvous does it first too)."""
    handler._stop_heartbeats()


def rendezvous_poll_s():
    """The wait between reads of the rendezvous state while waiting for other nodes."""
    return _SYNC_POLL_S[0]


def state(handler):
    """The handler's view of the shared rendezvous state (synced by num_nodes_waiting)."""
    return handler._state_holder.state


def max_nodes(handler):
    return handler._settings.max_nodes


def min_nodes(handler):
    return handler._settings.min_nodes


def forming_round(handler):
    """(participants, deadline pending) of the round being formed now, or None when no round is
    forming (it is complete or closed)."""
    st = current_state(handler)
    if st.complete or st.closed:
        return None
    return len(st.participants), st.deadline is not None


def _node(desc):
    from torch.distributed.elastic.rendezvous import dynamic_rendezvous as dr
    return dr._NodeDesc(str(desc[0]), int(desc[1]), int(desc[2]))


def expedite(handler, required=()):
    """Ends the last-call wait of the round being formed: torch waits last_call_timeout (30 s)
    for more nodes once MIN have joined; when every node that can come has come, that is time
    lost. Sets the round's deadline to now, so the next participant to sync completes it, if
    every node in `required` (node_desc() lists) is a participant of the state it writes.
    Returns True if this agent's write won (the backend's compare-and-set)."""
    from datetime import datetime
    holder = _fresh_holder(handler)
    st = holder.state
    if st.complete or st.closed or st.deadline is None:
        return False
    if not all(_node(d) in st.participants for d in required):
        return False
    tz = getattr(st.deadline, "tzinfo", None)  # naive UTC in torch 1.x, aware in 2.x
    st.deadline = datetime.now(tz) if tz is not None else datetime.utcnow()
    holder.mark_dirty()
    return bool(holder.sync())


def round_of(handler):
    return state(handler).round


class _LeaveOp:
    """A rendezvous operation that removes the executor's node from the participants or the
    wait list, whichever holds it."""

    def __call__(self, ctx, deadline):
        import time
        from torch.distributed.elastic.rendezvous import dynamic_rendezvous as dr
        if time.monotonic() > deadline:
            return dr._Action.ERROR_TIMEOUT
        if ctx.node in ctx.state.participants:
            return dr._Action.REMOVE_FROM_PARTICIPANTS
        if ctx.node in ctx.state.wait_list:
            return dr._Action.REMOVE_FROM_WAIT_LIST
        if ctx.node in getattr(ctx.state, "redundancy_list", ()):  # torch 2.x: a spare
            return dr._Action.REMOVE_FROM_REDUNDANCY_LIST
        return dr._Action.FINISH


def leave(handler, timeout_s=10.0):
    """Removes this node from the rendezvous (participants or wait list) without closing it, so
    that the others form the next round at once instead of waiting out our keep-alive."""
    import time
    handler._stop_heartbeats()
    handler._op_executor.run(_LeaveOp(), time.monotonic() + timeout_s)


def node_desc(handler):
    """This agent's identity in the rendezvous, as JSON-able [fqdn, pid, local_id]."""
    # Positional: the first field is `fqdn` in torch 1.x and `addr` in 2.x.
    return list(dataclasses.astuple(handler._this_node))


def _fresh_holder(handler):
    """A state holder of our own, synced now (the handler's caches its state for a second)."""
    from torch.distributed.elastic.rendezvous import dynamic_rendezvous as dr
    holder = dr._BackendRendezvousStateHolder(handler._state_holder._backend, handler._settings)
    holder.sync()
    return holder


def current_state(handler):
    """The shared rendezvous state as the backend holds it right now."""
    return _fresh_holder(handler).state


def evict(handler, desc, timeout_s=10.0):
    """Removes another (dead) node, given by node_desc(), from the rendezvous, so that the
    survivors form the next round now instead of after its keep-alive expires (torch keeps a
    silent node for keep_alive_interval x keep_alive_max_attempt, 15 s). Runs on a state holder
    of its own, so it is safe beside this agent's own rendezvous calls: the backend's
    compare-and-set orders the writes. Returns True if the node was in the rendezvous."""
    import time
    from torch.distributed.elastic.rendezvous import dynamic_rendezvous as dr
    node = _node(desc)
    holder = _fresh_holder(handler)
    st = holder.state
    present = node in st.participants or node in st.wait_list or node in getattr(st, "redundancy_list", ())
    if present:
        dr._DistributedRendezvousOpExecutor(node, holder, handler._settings).run(_LeaveOp(),
                                                                               time.monotonic() + timeout_s)
    return present


def store_port(handler):
    store = base_store(handler)
    return int(getattr(store, "port", 0) or 0)


def serves_store(handler):
    """Whether this process is the TCPStore server of the rendezvous (it listens on the store's
    port): its exit would take the rendezvous down for every other node."""
    import os
    port = store_port(handler)
    if port <= 0:
        return False
    inodes = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as f:
                next(f)
                for line in f:
                    cols = line.split()
                    local, state, inode = cols[1], cols[3], cols[9]
                    if state == "0A" and int(local.rsplit(":", 1)[1], 16) == port and inode in inodes:
                        return True
        except OSError:
            continue
    return False


def rendezvous_over(handler):
    """True once the rendezvous is closed (the job ended) or has nobody left in it."""
    handler._state_holder.sync()
    st = state(handler)
    return st.closed or (not st.participants and not st.wait_list and not getattr(st, "redundancy_list", None))


def others_alive(handler):
    """Whether any other node has a keep-alive record in the rendezvous."""
    st = state(handler)
    return any(node != handler._this_node for node in st.last_heartbeats)
