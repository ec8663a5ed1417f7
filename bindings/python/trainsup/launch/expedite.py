"""Ending torch's last-call wait early on a restart: a shrinking job would otherwise wait 30 s
for nodes that are gone. The watch ends the wait once every node that can come back (by
identity, not by count: a spare or a newcomer is no stand-in for a survivor still on its way)
has joined the round being formed."""
import threading

from . import _compat as compat

__all__ = ["expedite_round", "expected_back"]


def expected_back(agent, hosts):
    """The nodes (node_desc() lists) that can come back of `hosts` (the round we were in):
    their current agents, less those that left, were lost or are quarantined (None when one of
    them is not known). Asked every poll by every agent: the batched reads cost one store read
    each while nothing changes (liveness.current_nodes, Quarantine.records)."""
    members = agent.liveness.current_nodes(hosts)
    quarantined = agent.quarantine.records.records(hosts)
    nodes = []
    for h in hosts:
        node, gone = members[h]
        if gone or h in quarantined:
            continue
        if node is None:
            return None
        nodes.append(node)
    return nodes


def expedite_round(agent):
    """On a restart (agent.round is the round that ended), watches the round being formed on a
    thread of its own. Returns the event that stops the watch (set it once next_rendezvous
    returns)."""
    done = threading.Event()
    if agent.round is None:
        return done
    rnd, world, inner = agent.round, agent.world, agent.inner

    def watch():
        hosts = None  # the last round's hosts: read once, when first needed
        # At the rendezvous's own polling pace (compat.shorten_rendezvous_polls).
        while not done.wait(compat.rendezvous_poll_s()):
            # This host quarantined meanwhile leaves; inside a fixed allocation a round short of
            # hosts may wait for nobody: requeue.
            agent._leave_if_out()
            try:
                forming = compat.forming_round(inner)
                if forming is None or not forming[1] or forming[0] < compat.min_nodes(inner):
                    continue  # no last call under way: nothing to end
                hosts = hosts if hosts is not None else agent.liveness.hosts_of_round(rnd, world)
                expected = expected_back(agent, hosts)
                # expedite() checks on the state it writes that every expected node has joined.
                if expected is not None and compat.expedite(inner, expected):
                    agent.events.write("rendezvous_expedited", joined=forming[0], expected=len(expected))
                    return
            except Exception as e:  # torch's own deadline still ends the wait
                agent.events.write("rendezvous_expedite_failed", error=str(e))
                return

    threading.Thread(target=watch, name="trainsup-rendezvous-expedite", daemon=True).start()
    return done
