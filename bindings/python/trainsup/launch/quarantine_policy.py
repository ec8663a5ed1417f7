"""A launcher agent's side of quarantine (process: the launcher agent): imposing a record on a
host (with its event and the configured commands) and the preflight health check that may
quarantine the agent's own host before it joins. The records themselves are
trainsup/quarantine.py, shared with the operator's `trainsup quarantine`."""
from typing import Any, List

from .. import kube
from ..quarantine import Quarantine, run_commands
from . import preflight

__all__ = ["AgentQuarantine"]


class AgentQuarantine:
    """A launcher agent's side of quarantine: imposing a record (with its event and the
    configured commands) and the preflight check that may quarantine the agent's own host."""

    def __init__(self, quarantine, node, events, ttl_s, commands, preflight_command="", kubernetes=False):
        self.records, self.node, self.events = quarantine, node, events
        self.ttl_s, self.commands, self.preflight_command = ttl_s, commands, preflight_command
        self.kubernetes = kubernetes  # cordon and taint the node through the API (trainsup/kube.py)
        self._kube = None

    def get(self, host):
        return self.records.get(host)

    def impose(self, host, reason, verdict, gpu=""):
        """Writes the record, says so in the event log and runs the configured commands."""
        record = self.records.add(host, reason=reason, verdict=verdict, gpu=gpu, ttl_s=self.ttl_s)
        self.events.write("quarantine", quarantined_host=host, verdict=verdict, gpu=gpu)
        for command, rc in run_commands(record, self.commands):
            self.events.write("quarantine_command", command=command, exit_code=rc)
        if self.kubernetes:
            self.cordon(record)

    def cordon(self, record):
        """Cordons and taints the record's node through the Kubernetes API; a failure is an
        event (`quarantine_kubernetes` with ok false and the API server's answer), never an
        exception: the record stands and the job goes on."""
        try:
            if self._kube is None:
                self._kube = kube.KubeNodes()
            patch = self._kube.quarantine(record)
            taint = patch["spec"]["taints"][-1]
            self.events.write("quarantine_kubernetes", node=record["host"], ok=True,
                              taint=f"{taint['key']}={taint['value']}:{taint['effect']}")
        except Exception as e:
            self.events.write("quarantine_kubernetes", node=record["host"], ok=False, error=f"{type(e).__name__}: {e}")

    def preflight(self):
        """Runs the health check before this host's workers start; an unhealthy host that is
        not quarantined yet is quarantined now (its agent then leaves at its first rendezvous)."""
        gpus: List[Any] = []
        healthy, details, bad_gpus = preflight.run(self.preflight_command, records=gpus)
        self.events.write("preflight", healthy=healthy, details=details, bad_gpus=bad_gpus, gpus=gpus)
        if not healthy and self.get(self.node) is None:
            self.impose(self.node, "preflight: " + "; ".join(details[1:]), "preflight", gpu=",".join(bad_gpus))
