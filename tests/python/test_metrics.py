"""The agent's /metrics and /status (trainsup/launch/metrics.py) and `trainsup status`, over HTTP,
on a run directory of event logs written here: the job-wide families come from the agent in
office only, agree with `trainsup report`'s analysis of the same logs, follow the logs as they
grow, and the live view names who has not entered the oldest open collective.
(tests/python/test_launcher.py's spare scenario has a real Prometheus scrape a real job.)"""
import json
import os
import urllib.request

import pytest

pytest.importorskip("prometheus_client")
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

from trainsup import names  # noqa: E402
from trainsup.launch.metrics import MetricsServer  # noqa: E402
from trainsup.tools import report, status  # noqa: E402

SNAPSHOT = {"open": 3, "ranks": [
    {"rank": 0, "host": "host-a", "step": 300, "section": "step", "step_s": 0.025, "silent_s": 0.1, "dead": False,
     "finished": False},
    {"rank": 1, "host": "host-b", "step": 290, "section": "forward", "step_s": 0.080, "silent_s": 0.2, "dead": False,
     "finished": False}],
    "oldest_open": [{"what": "allreduce #157 of group 'default_pg'", "bytes": 8708, "age_s": 4.2, "members": 2,
                     "entered": 1, "missing": [1]}]}


def _write(path, events):
    with open(path, "a") as f:
        for e in events:
            f.write(json.dumps(e) + "\n")


def _job(tmp_path, t0=1000.0, offset=0.0):
    run, logs = tmp_path / "run", tmp_path / "logs"
    run.mkdir(exist_ok=True)
    logs.mkdir(exist_ok=True)
    t = t0 + offset
    _write(names.faults_file(str(run)), [{"event": "fault_injected", "time": t + 98.0, "host": "host-b"}])
    _write(names.agent_events_file(str(run), "host-a"), [
        {"event": "agent_start", "time": t, "wall_s": t},
        {"event": "verdict", "time": t + 100.0, "wall_s": t + 100.0, "round": int(offset), "kind": "hung_rank",
         "hosts": ["host-b"]}])
    _write(str(logs / "job-host-a-r0.events.jsonl"), [
        {"event": "checkpoint_snapshot", "wall_s": t + 90.0, "step": 100 + int(offset), "stall_s": 0.1,
         "restart": int(offset)},
        {"event": "checkpoint_committed", "wall_s": t + 91.0, "step": 100 + int(offset), "persist_s": 0.5,
         "restart": int(offset)},
        {"event": "checkpoint_restored", "wall_s": t + 103.0, "step": 100 + int(offset), "restore_s": 0.3,
         "restart": int(offset) + 1},
        {"event": "first_step", "wall_s": t + 104.0, "step": 101 + int(offset), "restart": int(offset) + 1}])
    return run, logs


def _state(in_office=True):
    return {"host": "host-a", "run_id": "job", "round": 1, "world": 2, "in_round": True, "in_office": in_office,
            "coordinator": "127.0.0.1:1/1", "hosts": ["host-a", "host-b"], "snapshot": SNAPSHOT if in_office else None,
            "quarantined": ["host-b"], "spares_waiting": 1, "restarts_used": 1, "max_restarts": 3}


def _get(server, path):
    with urllib.request.urlopen(f"http://127.0.0.1:{server.port}{path}", timeout=10) as r:
        return r.read().decode()


def _samples(text):
    out = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def test_the_job_metrics_agree_with_the_report_and_follow_the_logs(tmp_path):
    run, logs = _job(tmp_path)
    server = MetricsServer(lambda: _state(True), str(run), str(logs), 0, "127.0.0.1", refresh_s=0.0)
    try:
        m = _samples(_get(server, "/metrics"))
        a = report.analyse(*report.load(str(run), str(logs)))
        (inc,) = a["incidents"]
        assert (inc["detection_s"], inc["restart_s"], inc["replay_s"]) == (2.0, 4.0, 8.0)
        assert m[("trainsup_incidents_total", (("host", "host-b"), ("kind", "hung_rank")))] == 1
        for cause, v in (("detection", 2.0), ("restart", 4.0), ("replay", 8.0), ("checkpoint_stall", 0.1)):
            assert m[("trainsup_lost_seconds_total", (("cause", cause),))] == pytest.approx(v)
        assert m[("trainsup_ettr_ratio", ())] == pytest.approx(a["ettr"])
        assert m[("trainsup_detection_seconds_bucket", (("le", "2.0"),))] == 1
        assert m[("trainsup_detection_seconds_bucket", (("le", "1.0"),))] == 0
        assert m[("trainsup_checkpoint_restore_seconds_sum", ())] == pytest.approx(0.3)
        assert m[("trainsup_checkpoint_newest_step", ())] == 100
        assert m[("trainsup_step_time_seconds", (("quantile", "1"),))] == pytest.approx(0.080)
        assert m[("trainsup_collectives_open", ())] == 3
        assert m[("trainsup_collective_oldest_open_age_seconds", ())] == pytest.approx(4.2)
        assert m[("trainsup_restarts_left", ())] == 2 and m[("trainsup_spares_waiting", ())] == 1
        assert m[("trainsup_quarantined_hosts", ())] == 1
        # A second incident later in the logs: the counters go on from where they were.
        _job(tmp_path, offset=500.0)
        m = _samples(_get(server, "/metrics"))
        assert m[("trainsup_incidents_total", (("host", "host-b"), ("kind", "hung_rank")))] == 2
        assert m[("trainsup_lost_seconds_total", (("cause", "detection"),))] == pytest.approx(4.0)
    finally:
        server.close()


def test_an_agent_not_in_office_exports_its_host_only(tmp_path):
    run, logs = _job(tmp_path)
    server = MetricsServer(lambda: _state(False), str(run), str(logs), 0, "127.0.0.1")
    try:
        names_seen = {k[0] for k in _samples(_get(server, "/metrics"))}
        assert names_seen == {"trainsup_agent_info", "trainsup_agent_round", "trainsup_agent_in_round",
                              "trainsup_agent_coordinator"}, names_seen
        assert "incidents" not in json.loads(_get(server, "/status"))
        with pytest.raises(urllib.error.HTTPError) as e:
            _get(server, "/nothing")
        assert e.value.code == 404
    finally:
        server.close()


def test_trainsup_status_shows_who_has_not_entered_the_oldest_collective(tmp_path):
    run, logs = _job(tmp_path)
    server = MetricsServer(lambda: _state(True), str(run), str(logs), 0, "127.0.0.1", refresh_s=0.0)
    try:
        names.write_endpoint(str(run), "host-a", f"http://127.0.0.1:{server.port}")
        names.write_endpoint(str(run), "host-z", "http://127.0.0.1:1")  # an agent that has ended
        answers = status.gather(str(run))
        text = status.render(answers)
        print(text)
        assert "open: allreduce #157 of group 'default_pg' for 4.20 s, 1 of 2 entered; not entered: rank(s) 1 on host-b" \
            in text
        assert "slowest ranks: rank 1 on host-b 80.0 ms/step" in text
        assert "round 0: hung_rank on host-b: detection 2.00 s, restart 4.00 s, replay 8.00 s" in text
        assert "http://127.0.0.1:1: no answer" in text
        assert status.main([str(run), "--json"]) == 0
    finally:
        server.close()
    assert status.main([str(tmp_path / "empty")]) == 1


def test_without_a_fault_marker_detection_counts_from_the_verdicts_onset(tmp_path):
    """Real faults leave no marker: the verdict's onset_s (the culprit's last sign of life, the
    hung collective's first entry) dates the fault, in the report and the metrics alike."""
    run, logs = _job(tmp_path)
    os.remove(names.faults_file(str(run)))
    a = report.analyse(*report.load(str(run), str(logs)))
    assert a["incidents"][0]["detection_s"] is None  # no marker, no onset: not counted
    path = names.agent_events_file(str(run), "host-a")
    lines = [json.loads(x) for x in open(path)]
    for e in lines:
        if e["event"] == "verdict":
            e["onset_s"] = 3.5
    with open(path, "w") as f:
        f.writelines(json.dumps(e) + "\n" for e in lines)
    (inc,) = report.analyse(*report.load(str(run), str(logs)))["incidents"]
    assert inc["fault_estimated"] and inc["detection_s"] == pytest.approx(3.5)
    assert inc["replay_s"] == pytest.approx(1096.5 - 1090.0)  # from the save to the estimated fault
    server = MetricsServer(lambda: _state(True), str(run), str(logs), 0, "127.0.0.1", refresh_s=0.0)
    try:
        m = _samples(_get(server, "/metrics"))
        assert m[("trainsup_lost_seconds_total", (("cause", "detection"),))] == pytest.approx(3.5)
        assert m[("trainsup_detection_seconds_count", ())] == 1
    finally:
        server.close()
