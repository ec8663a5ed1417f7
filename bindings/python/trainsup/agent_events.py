"""The launcher agent's event log (<run dir>/agent-<host>.events.jsonl, docs/events.md) and the
name it goes by."""
import json
import os
import socket
import sys
import threading
import time

from . import names


def node_name():
    """This host's name in verdicts, quarantine records and events: TRAINSUP_NODE_NAME, else
    the host name."""
    return os.environ.get("TRAINSUP_NODE_NAME") or socket.gethostname()


class AgentEvents:
    """JSON lines like a rank's event log, for the agent. Thread-safe."""

    def __init__(self, run_dir, host):
        os.makedirs(run_dir, exist_ok=True)
        self.path = names.agent_events_file(run_dir, host)
        self.host = host
        self._lock = threading.Lock()
        self._warned = False

    def write(self, event, **fields):
        """Appends one event. A log that cannot be written (a full disk) loses the event, says so
        once on stderr, and never stops the agent from doing what the event reports."""
        now = time.time()
        # wall_s as in the ranks' event logs (one name for one fact); time is the same value,
        # kept for readers of earlier releases.
        line = {"event": event, "time": now, "wall_s": now, "mono_ns": time.monotonic_ns(), "host": self.host,
                "pid": os.getpid(), **fields}
        try:
            with self._lock, open(self.path, "a") as f:
                f.write(json.dumps(line) + "\n")
        except OSError as e:
            if not self._warned:
                self._warned = True
                print(f"[trainsup] agent event log {self.path}: {e} (events are lost until it can be written)",
                      file=sys.stderr, flush=True)
