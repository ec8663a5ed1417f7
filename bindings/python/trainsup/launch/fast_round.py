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
protocol, which ends that round for a membership change: slower, never wrong."""
import datetime
import time

from . import _compat as compat
from .store import first_set

__all__ = ["FastRestart"]


def _key(desc):
    return "_".join(str(part) for part in desc)


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
                    t = self._phase("write", t)
                    break
                if time.monotonic() - start > self.writer_timeout_s:
                    first_set(self.store, done_key, "fallback")
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
