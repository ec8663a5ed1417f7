"""num_nodes_waiting() for torchrun's agent loop at a store cost that does not grow with the job.

torchrun's agent asks its rendezvous handler, after every look at its healthy workers (0.1 s),
how many nodes wait to join; it restarts the round at once when one does (a spare or a
returning host). torch's handler answers from the whole rendezvous state, one value of
O(nodes) bytes (about 66 bytes per node), read from the store at most once a second per agent.
At 2,048 nodes that is 2,048 reads of 136 KB a second, about 280 MB/s through one store thread,
all the time, while the job trains (bench/rendezvous_bench.py, "steady" phase).

Every node that joins through trainsup.run says so first: it adds one to a counter key in the
store (announce()). An agent then reads the whole state only when that counter moved since its
last full read, or when `refresh_s` (max_nodes / 64 s, at least a second) has passed; otherwise
it repeats its last answer after reading the counter (a few bytes). A node joining through
trainsup.run is seen within a second, as before; one that joins through another launcher and
does not announce is seen within refresh_s. A stale answer can only be a late 0: an answer
above 0 makes torchrun end the round at once, and the next round reads afresh."""
import math
import time

from . import _compat as compat

__all__ = ["NodesWaiting"]


class NodesWaiting:
    # At most one answer a second: torchrun asks every 0.1 s and restarts at once on an answer
    # above 0, so a spare or a returning node is still seen within a second.
    EVERY_S = 1.0

    def __init__(self, inner, store, run_id, clock=time.monotonic):
        self.inner = inner
        self.store = store  # trainsup's store: the counter key lives there
        self.key = f"joins/{run_id}"
        self.refresh_s = max(self.EVERY_S, compat.max_nodes(inner) / 64.0)
        self._clock = clock
        self.answer = 0  # the last answer (> 0: torchrun is restarting the round for joiners)
        self.spares = 0  # nodes waiting at the last full read of the state, spares included
        self._asked = -math.inf  # when the last answer was made
        self._read = -math.inf  # when the state was last read in full
        self._joins = None  # the counter at that read
        self.full_reads = 0  # for tests and the bench

    def announce(self):
        """This node is about to join a round: every agent's next answer reads the state."""
        self.store.add(self.key, 1)

    def reset(self):
        """Forgets the last answer (a new round starts: ask afresh)."""
        self.answer = 0
        self._asked = -math.inf

    def __call__(self):
        now = self._clock()
        if now - self._asked < self.EVERY_S:
            return self.answer
        self._asked = now
        joins = int(self.store.add(self.key, 0))  # read before the state: a join during the read is seen next time
        if joins == self._joins and now - self._read < self.refresh_s:
            return self.answer
        self._joins, self._read = joins, now
        self.full_reads += 1
        n = self.inner.num_nodes_waiting()
        st = compat.state(self.inner)
        # Every node waiting, spares included (metrics: trainsup_spares_waiting), from this read.
        self.spares = len(getattr(st, "wait_list", ()) or ()) + len(getattr(st, "redundancy_list", ()) or ())
        if n and st.complete and len(st.participants) >= compat.max_nodes(self.inner):
            n = 0  # spares: no room for them, so no reason to restart for them
        self.answer = n
        return n
