"""A launcher agent's side of quarantine (process: the launcher agent): imposing a record on a
host (with its event and the configured commands) and the preflight health check that may
quarantine the agent's own host before it joins. The records themselves are
trainsup/quarantine.py, shared with the operator's `trainsup quarantine`."""
from typing import Any, List

from ..quarantine import Quarantine, run_commands
from . import preflight

__all__ = ["AgentQuarantine"]


class AgentQuarantine:
    """A launcher agent's side of quarantine: imposing a record (with its event and the
    configured commands) and the preflight check that may quarantine the agent's own host."""

    def __init__(self, quarantine, node, events, ttl_s, commands, preflight_command=""):
        self.records, self.node, self.events = quarantine, node, events
        self.ttl_s, self.commands, self.preflight_command = ttl_s, commands, preflight_command

    def get(self, host):
        return self.records.get(host)

    def impose(self, host, reason, verdict, gpu=""):
        """Writes the record, says so in the event log and runs the configured commands."""
        record = self.records.add(host, reason=reason, verdict=verdict, gpu=gpu, ttl_s=self.ttl_s)
        self.events.write("quarantine", quarantined_host=host, verdict=verdict, gpu=gpu)
        for command, rc in run_commands(record, self.commands):
            self.events.write("quarantine_command", command=command, exit_code=rc)

    def preflight(self):
        """Runs the health check before this host's workers start; an unhealthy host that is
        not quarantined yet is quarantined now (its agent then leaves at its first rendezvous)."""
        gpus: List[Any] = []
        healthy, details, bad_gpus = preflight.run(self.preflight_command, records=gpus)
        self.events.write("preflight", healthy=healthy, details=details, bad_gpus=bad_gpus, gpus=gpus)
        if not healthy and self.get(self.node) is None:
            self.impose(self.node, "preflight: " + "; ".join(details[1:]), "preflight", gpu=",".join(bad_gpus))
