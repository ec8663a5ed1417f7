"""trainsup: keeps large PyTorch training jobs alive.

This first cut exposes the C++ supervisor: a watchdog that runs on its own native threads
(so it catches a rank stuck in Python, in C, or holding the GIL), host-attributed logs and the
event log. Checkpointing, the collective tracker and the launcher arrive with later releases.

    import trainsup
    with trainsup.Supervisor(section_budgets={"step": 30}) as sup:
        for step in range(steps):
            with sup.step(step):
                train_one_step()
"""
from . import _trainsup
from ._trainsup import (EXIT_BAD_CONFIG, EXIT_STALL, EXIT_STOP_REQUESTED,
                        EXIT_WATCHDOG_UNRESPONSIVE)

__version__ = _trainsup.__version__

# Keyword argument -> environment variable it overrides (docs/configuration.md).
_SETTINGS = {
    "rank": "RANK", "local_rank": "LOCAL_RANK", "world_size": "WORLD_SIZE",
    "local_world_size": "LOCAL_WORLD_SIZE", "group_rank": "GROUP_RANK",
    "node_name": "TRAINSUP_NODE_NAME", "job_id": "TRAINSUP_JOB_ID",
    "log_dir": "TRAINSUP_LOG_DIR", "log_level": "TRAINSUP_LOG_LEVEL",
    "log_stderr": "TRAINSUP_LOG_STDERR", "watchdog": "TRAINSUP_WATCHDOG",
    "watchdog_interval_s": "TRAINSUP_WATCHDOG_INTERVAL_S",
    "heartbeat_timeout_s": "TRAINSUP_WATCHDOG_HEARTBEAT_TIMEOUT_S",
    "abort_grace_s": "TRAINSUP_ABORT_GRACE_S", "stall_action": "TRAINSUP_STALL_ACTION",
    "budget_multiplier": "TRAINSUP_BUDGET_MULTIPLIER", "budget_floor_s": "TRAINSUP_BUDGET_FLOOR_S",
    "budget_warmup_count": "TRAINSUP_BUDGET_WARMUP_COUNT",
    "budget_warmup_s": "TRAINSUP_BUDGET_WARMUP_S", "warn_fraction": "TRAINSUP_WARN_FRACTION",
    "section_budgets": "TRAINSUP_SECTION_BUDGETS", "handle_signals": "TRAINSUP_HANDLE_SIGNALS",
}


def _as_text(name, value):
    if isinstance(value, bool):
        return "1" if value else "0"
    if name == "section_budgets" and isinstance(value, dict):
        return ",".join(f"{k}={v}" for k, v in value.items())
    return str(value)


class Supervisor:
    """Supervises this rank. Keyword settings override TRAINSUP_* and torchrun variables."""

    def __init__(self, **settings):
        unknown = sorted(set(settings) - set(_SETTINGS))
        if unknown:
            raise TypeError(f"trainsup.Supervisor: unknown setting(s) {unknown}; "
                            f"known: {sorted(_SETTINGS)}")
        overrides = {_SETTINGS[k]: _as_text(k, v) for k, v in settings.items()}
        self._sup = _trainsup.Supervisor(overrides)

    def step(self, step):
        """Context manager timing one training step."""
        return self._sup.step(int(step))

    def section(self, name):
        """Context manager timing a named section (setup, eval, checkpoint, ...)."""
        return self._sup.section(str(name))

    @property
    def stop_requested(self):
        return self._sup.stop_requested

    def log(self, message, level="info"):
        self._sup.log(level, str(message))

    def event(self, name, **fields):
        self._sup.event(name, {k: str(v) for k, v in fields.items()})

    @property
    def host(self):
        return self._sup.host

    @property
    def rank(self):
        return self._sup.rank

    @property
    def log_file(self):
        return self._sup.log_file

    @property
    def event_log(self):
        return self._sup.event_log

    def close(self):
        self._sup.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False
