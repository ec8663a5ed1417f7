"""The launcher's restart policy: restarts are counted for the whole job in the rendezvous
store, and a job that restarts more than TRAINSUP_MAX_RESTARTS times, or
TRAINSUP_MAX_RESTARTS_WITHOUT_PROGRESS times in a row without the newest valid checkpoint (on
disk, or an in-memory snapshot this host holds) moving, gives up with EXIT_DO_NOT_REQUEUE (96): a fault that recurs on every host (user code,
a bad checkpoint) must not burn the allocation."""
import json
import time

from .. import _trainsup, names
from .store import first_set, peek

__all__ = ["RestartGuard", "newest_valid_step", "EXIT_DO_NOT_REQUEUE"]

EXIT_DO_NOT_REQUEUE = _trainsup.EXIT_DO_NOT_REQUEUE  # trainsup/exit_codes.h: 96


def newest_valid_step(checkpoint_dir):
    """The step of the newest valid checkpoint, as restore would take it (progress for the
    restart guard: a newer but broken one is not progress), or -1."""
    try:
        return _trainsup.newest_valid_checkpoint(checkpoint_dir)["step"]
    except (OSError, RuntimeError):
        return -1


class RestartGuard:
    """One per agent; every agent of a failed round calls account() before it rejoins.

    Every agent of the round must reach the same decision, or one gives up (96) while the
    others wait in a rendezvous that will never form. The decision of round r is one store key,
    written once by compare-set: the first agent of the round to get here decides and
    publishes; the others read it. Should that agent die or stall before it publishes,
    each other one waits DECISION_WAIT_S, then offers its own decision by the same
    compare-set, so that whichever lands first is the round's for everyone (its restart event
    says decision_missing). Whoever publishes moves the job's counters."""

    DECISION_WAIT_S = 30.0
    POLL_S = 0.1

    def __init__(self, store, run_id, checkpoint_dir, max_restarts, max_restarts_without_progress, events,
                 memory_step=None):
        self.store, self.run_id, self.checkpoint_dir = store, run_id, checkpoint_dir
        # The newest in-memory snapshot this host holds (SnapshotService.newest_step): progress
        # too, or a job that snapshots every few steps and writes to disk every 10 minutes
        # would be taken for stuck after a few quick failures.
        self.memory_step = memory_step
        self.max_restarts, self.max_restarts_without_progress = max_restarts, max_restarts_without_progress
        self.events = events
        self.used = 0  # restarts of the whole job as of the last one this agent accounted (metrics)

    def _key(self, name=None):
        return names.restarts_key(self.run_id, name)

    def _candidate(self):
        """This agent's decision for the round, from the job's counters (changes nothing)."""
        restarts = int(peek(self.store, self._key()) or 0) + 1
        step = newest_valid_step(self.checkpoint_dir)
        if self.memory_step is not None:
            try:
                step = max(step, int(self.memory_step()))
            except Exception:  # no memory figure: the disk's alone, as before snapshots
                pass
        last = peek(self.store, self._key("progress"))
        stuck = int(peek(self.store, self._key("stuck")) or 0) + 1 if last is not None and int(last) >= step else 0
        return {"restarts": restarts, "step": step, "stuck": stuck}

    def _publish(self, key, mine):
        """The round's decision: `mine` if it is the first published (then the counters follow
        it), else the one published before."""
        text = json.dumps(mine, sort_keys=True)
        won = first_set(self.store, key, text)
        if won == text:
            self.store.set(self._key(), str(mine["restarts"]))
            self.store.set(self._key("stuck"), str(mine["stuck"]))
            self.store.set(self._key("progress"), str(mine["step"]))
        return json.loads(won)

    def _published(self, key):
        """The round's decision once published, or None after DECISION_WAIT_S. Polled, one
        short read at a time: a blocking store.wait() would hold this agent's store client, and
        its keep-alives behind it, for the whole wait (liveness.py)."""
        deadline = time.monotonic() + self.DECISION_WAIT_S
        while True:
            text = peek(self.store, key)
            if text is not None:
                return json.loads(text)
            if time.monotonic() >= deadline:
                return None
            time.sleep(self.POLL_S)

    def account(self, failed_round):
        """Counts the restart after `failed_round` (once for the job) and returns why the job
        must give up, or None to go on: the same answer on every agent of the round."""
        key = self._key(f"decision-{failed_round}")
        first = int(self.store.add(self._key(f"count-{failed_round}"), 1)) == 1
        decision = None if first else self._published(key)
        missing = decision is None and not first
        if decision is None:
            decision = self._publish(key, self._candidate())
        restarts, step, stuck = decision["restarts"], decision["step"], decision["stuck"]
        self.used = max(self.used, int(restarts))
        fields = {"decision_missing": True} if missing else {}
        self.events.write("restart", restarts=restarts, newest_checkpoint_step=step, restarts_without_progress=stuck,
                          **fields)
        cap, stuck_cap = self.max_restarts, self.max_restarts_without_progress
        if restarts > cap:
            return f"{restarts} restarts (cap {cap})"
        if stuck > stuck_cap:
            return f"{stuck} restarts without a newer checkpoint (cap {stuck_cap})"
        return None
