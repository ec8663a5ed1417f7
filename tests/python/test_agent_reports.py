"""What the launcher's agent reports of the verdicts it does not act on (trainsup/launch/verdict_watch.py)."""
import json

from trainsup.launch.agent_events import AgentEvents
from trainsup.launch.verdict_watch import VerdictWatch


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


def test_agent_and_rank_event_lines_have_one_format(tmp_path):
    """An agent's lines are written by the ranks' event log writer: the same common fields (less
    the rank's identity), JSON types kept, and `time` equal to `wall_s` for earlier readers."""
    import trainsup

    AgentEvents(str(tmp_path), "host-a", "run7").write("restart", restarts=2, hosts=["host-b"], note=None)
    agent = [json.loads(line) for line in open(tmp_path / "agent-host-a.events.jsonl")]
    with trainsup.Supervisor(log_dir=str(tmp_path / "logs"), node_name="host-a", job_id="run7",
                             handle_signals=False) as sup:
        sup.event("restart", restarts=2)
        path = sup.event_log
    rank = next(e for e in map(json.loads, open(path)) if e["event"] == "restart")
    assert len(agent) == 1 and rank["event"] == "restart"
    a = agent[0]
    assert (a["restarts"], a["hosts"], a["note"]) == (2, ["host-b"], None)
    assert a["time"] == a["wall_s"] and a["host"] == rank["host"] == "host-a" and a["job_id"] == "run7"
    rank_only = {"rank", "local_rank", "world_size", "restart"}
    assert set(a) - {"time", "restarts", "hosts", "note"} == set(rank) - rank_only - {"restarts"}


def test_an_agent_event_log_that_cannot_be_opened_loses_events_until_it_can(tmp_path, capsys):
    run = tmp_path / "run"
    run.mkdir()
    (run / "agent-host-a.events.jsonl").mkdir()  # in the way: the log cannot be opened
    events = AgentEvents(str(run), "host-a")
    events.write("agent_start", run_id="r")  # lost, and nothing raised
    events.write("rendezvous_join", previous_round=None)
    assert capsys.readouterr().err.count("this agent's events are lost") == 1
    (run / "agent-host-a.events.jsonl").rmdir()
    events.write("agent_stop")
    assert [json.loads(line)["event"] for line in open(run / "agent-host-a.events.jsonl")] == ["agent_stop"]
