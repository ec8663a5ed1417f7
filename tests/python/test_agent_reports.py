"""What the launcher's agent reports of the verdicts it does not act on (trainsup/verdict_watch.py)."""
import json

from trainsup.agent_events import AgentEvents
from trainsup.verdict_watch import VerdictWatch


def test_a_straggler_verdict_is_reported_by_the_agent_and_nothing_else_is(tmp_path, capsys):
    class Agent:
        round = 3
        events = AgentEvents(str(tmp_path), "host-a")

    v = {"kind": "straggler", "ranks": [1], "hosts": ["host-b"], "gpus": [""],
         "evidence": "rank 1 arrived last in 90% of the last 50 collectives"}
    watch = VerdictWatch(Agent)
    watch.report(v)
    watch.report(dict(v, kind="hung_rank"))  # acted on elsewhere, through the store
    events = [json.loads(line) for line in open(tmp_path / "agent-host-a.events.jsonl")]
    assert [(e["event"], e["ranks"], e["hosts"], e["round"]) for e in events] == [("straggler", [1], ["host-b"], 3)]
    assert "straggler: rank(s) [1] on host(s) ['host-b']" in capsys.readouterr().err
