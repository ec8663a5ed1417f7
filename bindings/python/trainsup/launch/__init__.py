"""The launcher agent: `trainsup-run` (`python3 -m trainsup.run`), torchrun with trainsup's
rendezvous hook, one per host (process: the agent; its threads: keep-alives, verdict watch, node
services). It starts each round's node monitor and, where elected, the job coordinator; acts on
their verdicts (quarantine, abort orders); names hosts that die outright; counts restarts for the
whole job; and classifies why workers failed. Modules:

  run              the command: torchrun's flags and trainsup's own, then torchrun
  launcher         the rendezvous hook (TrainsupRendezvousHandler) and its wiring
  node_services    this host's node monitor, the coordinator election and takeover
  verdict_watch    acting on the round's first fatal verdict; hosts that vanish
  liveness         the agents' keep-alives and who watches whom
  restarts         the job-wide restart policy
  quarantine_policy, preflight, gpu_faults, classify
                   when a host is quarantined: verdicts, health checks, GPU faults
  snapshots        this host's share of the in-memory snapshots: holds them, copies them to
                   the peer host, fetches lost ones (docs/snapshots.md)
  zygote, warm_client
                   warm worker starts: workers forked from a process that imported torch
  agent_events, expedite, store, _compat
                   the agent's event log, ending torch's last-call wait, store helpers,
                   torchrun's internals

Importing this package, or any module of it but run and launcher, loads no torch.
"""
