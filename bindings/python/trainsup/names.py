"""Every rendezvous-store key and file name the launcher side of trainsup uses, in one place
(as leveldb's db/filename.cc does for its files), so that a reader finds what is stored where,
and two modules cannot drift apart on a spelling. The ranks' own names (rank logs, event logs,
checkpoint directories and shards, commit keys) are the C++ library's: Supervisor.log_file,
Supervisor.event_log, trainsup._trainsup.checkpoint_dir_name; docs/checkpoint-format.md.

Store keys (the launcher's agents use a PrefixStore "trainsup/" over the rendezvous store):
  telemetry/<job>/token          the job token (first agent to compare-set it wins)
  telemetry/<job>/coordinator    "host:port/epoch" of the elected coordinator
  telemetry/<job>/ranks          JSON rank table: [rank, local_rank, host, gpu] for each rank
  telemetry/<job>/verdict        the round's first fatal verdict (JSON)
  agents/<run>/<host>/beat       the agent's keep-alive counter
  agents/<run>/<host>/node       JSON [fqdn, pid, local_id]: its node in torch's rendezvous
  agents/<run>/<host>/left       the node JSON of an agent that ended on purpose
  agents/<run>/<host>/slow       JSON {"round_trip_ms", "baseline_ms"} while its link is slow
  agents/<run>/<host>/lost-claim/<node>
                                 which agent quarantines a lost host (the first to claim it)
  agents/<run>/round-<r>/<g>     the host of group rank g in round r
  agents/<run>/count, agents/<run>/agent-<i>
                                 every agent that ever joined (the witnesses)
  agents/<run>/slow_changes      moves whenever a host's "slow" key changes
  trainsup/quarantine/<host>     the quarantine record mirrored in the store
  restarts/<run>                 the job's restarts so far (restarts.RestartGuard)
  restarts/<run>/count-<r>       agents that reached the restart after round r (the first decides)
  restarts/<run>/decision-<r>    JSON {"restarts", "step", "stuck"}: the round's decision, set once
                                 (by that first agent, or by one that waited for it in vain)
  restarts/<run>/progress        the newest valid checkpoint step at the last restart
  restarts/<run>/stuck           restarts in a row without that step moving
  restarts/<run>/give_up         JSON {"reason", "host"}: the job gave up (set once); every agent
                                 that restarts afterwards gives up too, with that reason
  faults/<run>/round-<r>/cuda/<host>
                                 the CUDA error a worker of <host> failed with in round r
  faults/<run>/round-<r>/cuda_hosts
                                 how many hosts had one (gpu_faults.GpuFaultJudge)
<job> is "<run id>.<round>"; <run> is torchrun's run id.

Files (under the launcher's run directory):
  agent-<host>.events.jsonl      an agent's event log (docs/events.md)
  faults.jsonl                   fault markers written by test scenarios, read by `trainsup report`
  quarantine/<host>.json         quarantine records (unless --quarantine-dir says otherwise)
"""
import json
import os
from typing import Any, Optional

__all__ = ["telemetry_key", "agent_key", "lost_claim_key", "round_key", "agents_count_key", "agent_list_key", "slow_changes_key", "membership_changes_key", "quarantine_changes_key", "restarts_key", "give_up_key", "cuda_fault_key", "cuda_fault_count_key", "quarantine_key", "endpoint_file", "write_endpoint", "agent_events_file", "faults_file", "quarantine_dir"]


def telemetry_key(job_id: str, name: str) -> str:
    return f"trainsup/telemetry/{job_id}/{name}"


def agent_key(run_id: str, host: str, name: str) -> str:
    return f"agents/{run_id}/{host}/{name}"


def lost_claim_key(run_id: str, host: str, node_desc: Any) -> str:
    return agent_key(run_id, host, f"lost-claim/{json.dumps(node_desc)}")


def round_key(run_id: str, rnd: int, group_rank: int) -> str:
    return f"agents/{run_id}/round-{rnd}/{group_rank}"


def agents_count_key(run_id: str) -> str:
    return f"agents/{run_id}/count"


def agent_list_key(run_id: str, index: int) -> str:
    return f"agents/{run_id}/agent-{index}"


def slow_changes_key(run_id: str) -> str:
    return f"agents/{run_id}/slow_changes"


def restarts_key(run_id: str, name: Optional[str] = None) -> str:
    """restarts/<run>, or restarts/<run>/<name> (count-<r>, decision-<r>, progress, stuck)."""
    return f"restarts/{run_id}" if name is None else f"restarts/{run_id}/{name}"


def give_up_key(run_id: str) -> str:
    return restarts_key(run_id, "give_up")


def cuda_fault_key(run_id: str, rnd: int, host: str) -> str:
    return f"faults/{run_id}/round-{rnd}/cuda/{host}"


def cuda_fault_count_key(run_id: str, rnd: int) -> str:
    return f"faults/{run_id}/round-{rnd}/cuda_hosts"


def endpoint_file(run_dir: str, host: str) -> str:
    """Where an agent leaves the address of its /metrics and /status (trainsup status reads it)."""
    return os.path.join(run_dir, f"agent-{host}.endpoint")


def write_endpoint(run_dir: str, host: str, url: str) -> None:
    path = endpoint_file(run_dir, host)
    tmp = f"{path}.tmp.{os.getpid()}"
    with open(tmp, "w") as f:
        f.write(url + "\n")
    os.rename(tmp, path)


def quarantine_key(host: str) -> str:
    return f"trainsup/quarantine/{host}"


def quarantine_changes_key() -> str:
    """A counter every store write of a quarantine record (add, remove) moves."""
    return "trainsup/quarantine_changes"


def membership_changes_key(run_id: str) -> str:
    """A counter that moves when an agent of the job starts (its node key) or leaves on purpose."""
    return f"agents/{run_id}/membership_changes"


def agent_events_file(run_dir: str, host: str) -> str:
    return os.path.join(run_dir, f"agent-{host}.events.jsonl")


def faults_file(run_dir: str) -> str:
    return os.path.join(run_dir, "faults.jsonl")


def quarantine_dir(run_dir: str) -> str:
    return os.path.join(run_dir, "quarantine")
