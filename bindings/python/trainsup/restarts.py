"""The launcher's restart policy: restarts are counted for the whole job in the rendezvous
store, and a job that restarts more than TRAINSUP_MAX_RESTARTS times, or
TRAINSUP_MAX_RESTARTS_WITHOUT_PROGRESS times in a row without the newest valid checkpoint
moving, gives up with EXIT_DO_NOT_REQUEUE (96): a fault that recurs on every host (user code,
a bad checkpoint) must not burn the allocation."""
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
    """One per agent; every agent of a failed round calls account() before it rejoins."""

    def __init__(self, store, run_id, checkpoint_dir, max_restarts, max_restarts_without_progress, events):
        self.store, self.run_id, self.checkpoint_dir = store, run_id, checkpoint_dir
        self.max_restarts, self.max_restarts_without_progress = max_restarts, max_restarts_without_progress
        self.events = events

    def account(self, failed_round):
        """Counts the restart after `failed_round` (the first agent of the round to get here
        counts it) and returns why the job must give up, or None to go on."""
        n = int(self.store.add(names.restarts_key(self.run_id, f"count-{failed_round}"), 1))
        restarts = int(self.store.add(names.restarts_key(self.run_id), 1 if n == 1 else 0))
        step = newest_valid_step(self.checkpoint_dir)
        progress_key = names.restarts_key(self.run_id, "progress")
        last = peek(self.store, progress_key)
        stuck_key = names.restarts_key(self.run_id, "stuck")
        if n == 1:
            if last is not None and int(last) >= step:
                self.store.add(stuck_key, 1)
            else:
                self.store.set(stuck_key, "0")  # counters: set resets
            self.store.set(progress_key, str(step))
        stuck = int(peek(self.store, stuck_key) or 0)
        self.events.write("restart", restarts=restarts, newest_checkpoint_step=step, restarts_without_progress=stuck)
        cap, stuck_cap = self.max_restarts, self.max_restarts_without_progress
        if restarts > cap:
            return f"{restarts} restarts (cap {cap})"
        if stuck > stuck_cap:
            return f"{stuck} restarts without a newer checkpoint (cap {stuck_cap})"
        return None
