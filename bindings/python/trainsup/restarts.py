"""The launcher's restart policy: restarts are counted for the whole job in the rendezvous
store, and a job that restarts more than TRAINSUP_MAX_RESTARTS times, or
TRAINSUP_MAX_RESTARTS_WITHOUT_PROGRESS times in a row without the newest valid checkpoint
moving, gives up with EXIT_DO_NOT_REQUEUE (96): a fault that recurs on every host (user code,
a bad checkpoint) must not burn the allocation."""
import datetime
import json

from . import _trainsup, names
from .telemetry import peek

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
    others wait in a rendezvous that will never form. So the first agent of the round to get
    here counts the restart, checks for progress and publishes the result; the others wait for
    it (DECISION_WAIT_S at most: should the first agent die in between, each then decides from
    the counters as they stand, and says so in its restart event: decision_missing)."""

    DECISION_WAIT_S = 30.0

    def __init__(self, store, run_id, checkpoint_dir, max_restarts, max_restarts_without_progress, events):
        self.store, self.run_id, self.checkpoint_dir = store, run_id, checkpoint_dir
        self.max_restarts, self.max_restarts_without_progress = max_restarts, max_restarts_without_progress
        self.events = events

    def _decide(self):
        """Counts one restart of the job; (restarts, newest valid step, restarts in a row
        without that step moving)."""
        restarts = int(self.store.add(names.restarts_key(self.run_id), 1))
        step = newest_valid_step(self.checkpoint_dir)
        progress_key = names.restarts_key(self.run_id, "progress")
        stuck_key = names.restarts_key(self.run_id, "stuck")
        last = peek(self.store, progress_key)
        if last is not None and int(last) >= step:
            stuck = int(self.store.add(stuck_key, 1))
        else:
            self.store.set(stuck_key, "0")  # counters: set resets
            stuck = 0
        self.store.set(progress_key, str(step))
        return restarts, step, stuck

    def _published(self, key):
        """The decision the round's first agent published under `key`, or None after the wait."""
        try:
            self.store.wait([key], datetime.timedelta(seconds=self.DECISION_WAIT_S))
        except Exception:  # the store's timeout error differs between store kinds
            return None
        text = peek(self.store, key)
        return json.loads(text) if text is not None else None

    def account(self, failed_round):
        """Counts the restart after `failed_round` (once for the job, by its first agent here)
        and returns why the job must give up, or None to go on: the same answer on every agent."""
        key = names.restarts_key(self.run_id, f"decision-{failed_round}")
        first = int(self.store.add(names.restarts_key(self.run_id, f"count-{failed_round}"), 1)) == 1
        decision = None if first else self._published(key)
        missing = not first and decision is None
        if decision is None:
            restarts, step, stuck = self._decide() if first else self._current()
            decision = {"restarts": restarts, "step": step, "stuck": stuck}
            if first:
                self.store.set(key, json.dumps(decision))
        restarts, step, stuck = decision["restarts"], decision["step"], decision["stuck"]
        fields = {"decision_missing": True} if missing else {}
        self.events.write("restart", restarts=restarts, newest_checkpoint_step=step, restarts_without_progress=stuck,
                          **fields)
        cap, stuck_cap = self.max_restarts, self.max_restarts_without_progress
        if restarts > cap:
            return f"{restarts} restarts (cap {cap})"
        if stuck > stuck_cap:
            return f"{stuck} restarts without a newer checkpoint (cap {stuck_cap})"
        return None

    def _current(self):
        """The counters as they stand, when the round's first agent published nothing."""
        restarts = int(peek(self.store, names.restarts_key(self.run_id)) or 0)
        stuck = int(peek(self.store, names.restarts_key(self.run_id, "stuck")) or 0)
        return restarts, newest_valid_step(self.checkpoint_dir), stuck
