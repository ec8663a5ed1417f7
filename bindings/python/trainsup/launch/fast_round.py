"""A restart round written once, instead of every node leaving and joining through torch's
protocol (docs/notes/rendezvous-next.md; docs/goodput.md, "The rendezvous alone").

On a restart after a fault, torch's dynamic rendezvous has every node leave the completed round
and join the next by compare-and-set of the whole state: 2N writes in sequence, each carrying
O(N) bytes, with lost writes on top (bench/rendezvous_bench.py: O(N^2) store operations). Here the
survivors, whose names the agents already know, each set a key of their own; one of them, the
first in torch's order (the writer), waits for those keys and writes the next round, complete,
in one compare-and-set (its members ranked as torch ranks them, waiting spares taking free
places up to max_nodes); the others wait for the writer's "done" key, which the store notifies,
and read the state once. What each returns is what torch's next_rendezvous() returns.

Anything unusual hands the round back to torch's protocol: a node not in a complete round, too
few nodes for min_nodes, a survivor that does not announce itself within `writer_timeout_s`, a
writer that does not answer within that plus `grace_s`, a state that moved under the writer.
A node that falls back while the others took the fast path leaves and joins again in torch's
protocol, which ends that round for a membership change: slower, never wrong.

A spare waiting in torch's protocol (the wait list of a complete round) is rung when the round
is written: the writer then sets a "wake" key, on which a thread of the spare's waits (on a
store client of its own: a timed-out TCPStore wait logs two warnings, so it waits long, not a
poll interval at a time). Between its looks at the state the spare waits for that bell, at
most the poll interval (wait_for_round), and looks again as soon as it rings."""
import datetime
import threading
import time

from . import _compat as compat
from .store import first_set

__all__ = ["FastRestart"]


def _key(desc):
    return "_".join(str(part) for part in desc)


class _Bell:
    """Waits for one store key at a time, in a thread of its own on a store client of its own,
    so that a caller can wait for it in slices without a store call per slice. A new key
    releases the wait on the old one by setting it through `release` (another client: the
    waiting one is busy; wake keys are signals, nothing reads their values)."""
    HOLD_S = 600.0  # one store wait at most this long; then another

    def __init__(self, make_store, release):
        self._make_store = make_store
        self._release = release
        self._base = None
        self._store = None
        self._key = None
        self._rang = threading.Event()
        self._thread = None

    def wait(self, key, timeout_s):
        """True once `key` is set (at most timeout_s of waiting)."""
        if key != self._key or self._thread is None or (not self._thread.is_alive() and not self._rang.is_set()):
            self._watch(key)
        return self._rang.wait(timeout_s)

    def close(self, timeout_s=2.0):
        """Ends the wait under way and waits for its thread (at the agent's end). A thread still
        blocked in the store's C++ wait when the interpreter finalizes is ended by pthread_exit,
        whose forced unwind through torch's frames std::terminate()s the process: an agent that
        ran its job to the end exited -6 when the store's host closed the store under the wait."""
        t = self._thread
        if t is None or not t.is_alive():
            return
        try:
            self._release(self._key)
        except Exception:
            pass  # the store is gone: the wait ends by itself on the closed connection
        t.join(timeout_s)

    def _watch(self, key):
        if self._thread is not None and self._thread.is_alive():
            try:
                self._release(self._key)  # ends the old wait; then its client is reused
            except Exception:
                self._store = None  # a client that failed is not reused
            self._thread.join(5.0)
            if self._thread.is_alive():
                self._store = None
        if self._store is None:
            from torch.distributed import PrefixStore
            self._base = self._make_store()  # kept: a store written in Python (etcd) must stay referenced
            self._store = PrefixStore("trainsup/", self._base)
        self._key, self._rang = key, threading.Event()
        store, rang = self._store, self._rang

        def run():
            try:
                store.wait([key], datetime.timedelta(seconds=self.HOLD_S))
                rang.set()
            except Exception:  # HOLD_S passed, or the store went: the next wait() starts again
                pass
        self._thread = threading.Thread(target=run, name="trainsup-round-bell", daemon=True)
        self._thread.start()


class FastRestart:
    def __init__(self, inner, run_id, writer_timeout_s=10.0, grace_s=10.0):
        from torch.distributed import PrefixStore
        self.inner = inner
        # The announcement and done keys live in trainsup's part of the store, through a client
        # of their own: a client serialises its operations, and the waits here (up to
        # writer_timeout_s + grace_s) must not hold up the agent's keep-alives on its client.
        # (A store written in Python, etcd's, must stay referenced: hence _base.)
        self._base = compat.trainsup_store(inner)
        self.store = PrefixStore("trainsup/", self._base)
        self.run_id = run_id
        self.writer_timeout_s = float(writer_timeout_s)
        self.grace_s = float(grace_s)
        self.last = None  # why the last call fell back, or "fast"; for events and tests
        self._woken = set()  # wake keys wait_for_round returned early for
        self._behind = set()  # complete rounds this node was seen waiting behind (on_waiting told)
        self.on_waiting = None  # called once per such round with its number: this node is a spare
        self._bell = _Bell(lambda: compat.trainsup_store(inner), lambda key: self.store.set(key, "1"))
        self.phases = {}  # seconds of the last call's phases: stop, read, wait (or write), adopt

    # How often a waiting node looks again at who is still expected (a host found lost while
    # the others wait: if it was the writer, the next survivor in order takes its place).
    SLICE_S = 0.5

    def __call__(self, survivors=None):
        """Tries the restart round. `survivors`: the node_desc lists of the nodes expected back
        (the last round's less the quarantined and lost), or a function returning them now
        (None: not known), asked again while the round is being formed; None: every node of the
        last round. Returns next_rendezvous()'s result, or None after which the caller runs
        torch's protocol."""
        self.phases = {}
        t = start = time.monotonic()
        current = survivors if callable(survivors) else (lambda: survivors)
        # Keep-alives first: they share the handler's state holder with what follows (torch's
        # next_rendezvous stops them first too, and restarts them when the round is formed).
        compat.stop_keep_alives(self.inner)
        t = self._phase("stop", t)
        got = compat.completed_round(self.inner)
        t = self._phase("read", t)
        if got is None:
            self.last = "not in a complete round"
            return None
        rnd, participants, waiting = got
        me = compat.node_desc(self.inner)
        expected = current()
        if callable(survivors) and expected is None:
            self.last = "a survivor's node is not known"
            return None
        prefix = f"fastround/{self.run_id}/{rnd}"
        done_key = f"{prefix}/done"
        self.store.set(f"{prefix}/in/{_key(me)}", "1")
        while True:
            back = [d for d in participants if expected is None or d in expected]
            if me not in back:
                self.last = "this node is not among the survivors"
                return None
            if self.store.check([done_key]):
                break
            if me == min(back):
                missing = [f"{prefix}/in/{_key(d)}" for d in back if d != me]
                missing = [k for k in missing if not self.store.check([k])]
                if not missing:
                    # First value stands: a writer taken for lost that was only slow cannot
                    # overwrite the answer of the one that took its place.
                    first_set(self.store, done_key, self._write(rnd, back, waiting))
                    self.store.set(f"{prefix}/wake", "1")  # the spares waiting behind rnd look now
                    t = self._phase("write", t)
                    break
                if time.monotonic() - start > self.writer_timeout_s:
                    first_set(self.store, done_key, "fallback")
                    self.store.set(f"{prefix}/wake", "1")
                    break
                wait_for = missing
            else:
                if time.monotonic() - start > self.writer_timeout_s + self.grace_s:
                    self.last = "the writer did not answer"
                    return None
                wait_for = [done_key]
            try:
                self.store.wait(wait_for, datetime.timedelta(seconds=self.SLICE_S))
            except Exception:
                pass  # a slice ended: look again at who is expected
            now_expected = current()
            expected = now_expected if now_expected is not None else expected
        t = self._phase("wait", t)
        answer = self.store.get(done_key)
        if answer != str(rnd + 1).encode():
            self.last = "the writer fell back"
            return None
        result = compat.adopt_round(self.inner, rnd + 1)
        self._phase("adopt", t)
        self.last = "fast" if result is not None else "the round written is not this node's"
        return result

    def close(self):
        """Ends this agent's waits in the store; before the agent exits."""
        self._bell.close()

    def wait_for_round(self, timeout_s):
        """For compat.wake_rendezvous_polls: a node in the wait list of complete round R waits
        (at most timeout_s) for R's wake key, set when a restart round is written, then has its
        state read afresh. True when it waited; False (sleep instead) when it waits behind no
        complete round, or was woken for this key already (the round written was torch's
        fallback, or not for it: the key stays set, and waiting on it would not wait). The first
        time it finds this node behind round R it calls on_waiting(R)."""
        rnd = compat.waiting_behind(self.inner)
        if rnd is None:
            return False
        if rnd not in self._behind:
            self._behind.add(rnd)
            if self.on_waiting is not None:
                self.on_waiting(rnd)
        key = f"fastround/{self.run_id}/{rnd}/wake"
        if key in self._woken:
            return False
        try:
            if not self._bell.wait(key, timeout_s):
                return True
        except Exception:  # no store client to wait on now: the plain poll, inside torch's loop
            return False
        self._woken.add(key)
        compat.expire_state_cache(self.inner)
        return True

    def _write(self, rnd, back, waiting):
        """The writer's part: the next round, or "fallback" when torch's protocol must form it."""
        room = compat.max_nodes(self.inner) - len(back)
        members = sorted(back + waiting[:max(room, 0)])
        if len(members) < compat.min_nodes(self.inner):
            return "fallback"
        return str(rnd + 1) if compat.write_next_round(self.inner, rnd, members) else "fallback"

    def _phase(self, name, since):
        now = time.monotonic()
        self.phases[name] = round(now - since, 4)
        return now
