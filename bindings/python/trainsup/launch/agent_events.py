"""The launcher agent's event log (<run dir>/agent-<host>.events.jsonl, docs/events.md) and the
name it goes by."""
import os
import socket
import sys

from .. import _trainsup_agent, names
from ..errors import IoError
from ..events import json_fields

__all__ = ["AgentEvents", "node_name"]


def node_name():
    """This host's name in verdicts, quarantine records and events: TRAINSUP_NODE_NAME, else
    the host name."""
    return os.environ.get("TRAINSUP_NODE_NAME") or socket.gethostname()


class AgentEvents:
    """The agent's event log: lines in the ranks' format, written by the C++ library's one event
    log writer (trainsup/event_log.h; docs/events.md), without the rank fields. Thread-safe."""

    def __init__(self, run_dir, host, run_id=""):
        os.makedirs(run_dir, exist_ok=True)
        self.path = names.agent_events_file(run_dir, host)
        self.host, self.run_id = host, run_id
        self._log = None
        self._warned = False
        self._open()

    def _open(self):
        try:
            self._log = _trainsup_agent.AgentEventLog(self.path, self.host, self.run_id)
        except IoError as e:
            # Never stops the agent from doing what its events report; said once, and the next
            # event tries again (the directory may come back).
            if not self._warned:
                self._warned = True
                print(f"[trainsup] {e} (this agent's events are lost until it can be opened)", file=sys.stderr,
                      flush=True)

    def write(self, event, **fields):
        """Appends one event. A log that cannot be written (a full disk) loses the event, says so
        once on stderr, and never raises."""
        if self._log is None:
            self._open()
        if self._log is not None:
            self._log.write(event, json_fields(fields))
