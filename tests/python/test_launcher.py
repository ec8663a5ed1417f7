"""trainsup.run end to end on simulated hosts (examples/launch/recovery_scenario.py): a rank
stopped on host-b is named, host-b is quarantined and its agent leaves, the job resumes on
host-a and the spare host-c from the newest valid checkpoint and finishes with the parameters
of a run that never failed; the same when a host dies outright under the etcd-v2 rendezvous."""
import glob
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time

import pytest
import torch

import prometheus_server
from trainsup.tools import status
from trainsup.launch.verdict_watch import QUARANTINE_KINDS

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCENARIO = os.path.join(REPO, "examples", "launch", "recovery_scenario.py")
STEPS = "500"


def _run(scenario, workdir, *extra, env=None):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p), **(env or {}))
    out = subprocess.run([sys.executable, SCENARIO, scenario, str(workdir), "--steps", STEPS, *extra], env=env,
                         capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    summary = json.loads(out.stdout.strip().splitlines()[-1])
    summary["workdir"] = str(workdir)
    return summary


def _explain(summary):
    """What a failed scenario assertion shows: the summary, every agent's event log (compact)
    and the tail of each agent's output, so that a failure on CI can be understood from its log."""
    workdir = summary.get("workdir", "")
    lines = [json.dumps(summary)]
    for path in sorted(glob.glob(os.path.join(workdir, "run", "agent-*.events.jsonl"))):
        lines.append(f"--- {os.path.basename(path)}")
        for e in _events(path):
            extra = {k: v for k, v in e.items()
                     if k not in ("event", "ts", "time", "wall_s", "mono_ns", "host", "pid", "job_id", "seq")}
            lines.append(f"{e['wall_s']:.3f} {e['event']} {json.dumps(extra)[:160]}")
    for path in sorted(glob.glob(os.path.join(workdir, "agent-*.out"))):
        with open(path, errors="replace") as f:
            tail = f.read().splitlines()[-10:]
        lines += [f"--- {os.path.basename(path)} (last lines)"] + tail
    return "\n".join(lines)


def _events(path):
    with open(path) as f:
        return [json.loads(line) for line in f]


@pytest.fixture(scope="module")
def clean(tmp_path_factory):
    """The reference: the same training on host-a + host-b without a fault."""
    workdir = tmp_path_factory.mktemp("clean")
    summary = _run("clean", workdir)
    assert summary["agent_exit_codes"] == {"host-a": 0, "host-b": 0}, summary
    return torch.load(workdir / "final.pt")


def _assert_same_training(ref, path):
    """Bitwise the parameters and momentum of the run that never failed."""
    got = torch.load(path)
    for k in ref["model"]:
        assert torch.equal(ref["model"][k], got["model"][k]), k
    for i, st in ref["optimizer"]["state"].items():
        assert torch.equal(st["momentum_buffer"], got["optimizer"]["state"][i]["momentum_buffer"]), i


def _run_scraped(scenario, workdir, prometheus):
    """The scenario with every agent serving /metrics (TRAINSUP_METRICS_PORT=0: a free port
    each), scraped by `prometheus` from the moment each agent leaves its endpoint file."""
    result = {}

    def job():
        try:
            result["summary"] = _run(scenario, workdir, env={"TRAINSUP_METRICS_PORT": "0"})
        except BaseException as e:  # re-raised on the test's thread
            result["error"] = e

    t = threading.Thread(target=job)
    t.start()
    seen, live = 0, None
    while t.is_alive():
        t.join(0.5)  # the job runs; new agents' endpoints are handed to Prometheus as they appear
        if (workdir / "run").is_dir():
            n = len(prometheus.set_targets(workdir / "run"))
            seen = max(seen, n)
            if live is None and n == 3:
                # `trainsup status` while the job trains on two hosts with the spare waiting.
                answers = status.gather(str(workdir / "run"))
                job = next((a for a in answers if a.get("in_office") and a.get("ranks")), None)
                if job is not None and job.get("spares_waiting"):
                    live = (job, status.render(answers))
    if "error" in result:
        raise result["error"]
    return result["summary"], seen, live


def test_stopped_host_is_quarantined_and_the_spare_takes_its_place(tmp_path, clean):
    if prometheus_server.binary() is None:
        pytest.skip("no prometheus binary (scripts/install-deps.sh installs Debian's)")
    with prometheus_server.PrometheusServer(tmp_path / "prometheus") as prom:
        s, targets, live = _run_scraped("spare", tmp_path / "spare", prom)
        assert s["agent_exit_codes"] == {"host-a": 0, "host-b": 95, "host-c": 0}, _explain(s)
        assert s["quarantine"] == ["host-b"], _explain(s)
        run = tmp_path / "spare" / "run"
        a = _events(run / "agent-host-a.events.jsonl")
        b = _events(run / "agent-host-b.events.jsonl")
        # Named within 10 s of the fault, with its host. Every agent logs the verdict when it sees it;
        # the first one to see it is when the job learned it (the report counts the same one).
        verdict = min((e for e in a + b if e["event"] == "verdict"), key=lambda e: e["time"])
        assert verdict["hosts"] == ["host-b"] and verdict["kind"] in ("silent_rank", "hung_rank"), _explain(s)
        took = verdict["time"] - s["fault_time"]
        print(f"[measure] host-b named ({verdict['kind']}) {took:.2f} s after its worker was stopped")
        assert took <= 10, took
        record = json.loads((run / "quarantine" / "host-b.json").read_text())
        assert record["verdict"] == verdict["kind"] and record["expiry"] - record["time"] == pytest.approx(86400)
        assert any(e["event"] == "quarantined_exit" for e in b)
        # The second round is host-a + host-c; the spare never trained before it.
        second = [e for e in a if e["event"] == "rendezvous" and e["round"] >= 1]
        assert second and second[0]["group_world"] == 2
        c_ranks = sorted((tmp_path / "spare" / "logs").glob("*-host-c-r*.events.jsonl"))
        c_events = [e for p in c_ranks for e in _events(p)]
        restored = next(e for e in c_events if e["event"] == "checkpoint_restored")
        restart = next(e for e in a if e["event"] == "restart" and e["time"] > s["fault_time"])
        assert restored["step"] == restart["newest_checkpoint_step"], (restored, restart)  # newest valid one
        # The report: the incident, its cost split three ways, ETTR, and an HTML timeline.
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
        rep = subprocess.run([sys.executable, "-m", "trainsup", "report", str(run)], capture_output=True, text=True,
                             env=env, timeout=120)
        assert rep.returncode == 0, rep.stderr
        summary = json.loads(rep.stdout.strip().splitlines()[-1])
        (inc,) = summary["incidents"]
        assert inc["verdict"] == verdict["kind"] and inc["hosts"] == ["host-b"]
        assert inc["detection_s"] == pytest.approx(took, abs=0.05)
        assert inc["restored_step"] == restored["step"] and 0 < inc["replay_s"] < 5 and inc["restart_s"] > 0
        assert 0 < summary["ettr"] < 1
        assert "incident 1" in rep.stdout and "quarantine" in rep.stdout
        page = (run / "report.html").read_text()
        # The picture: the incident's lost time as three labelled bands, and the key events named.
        assert "<svg" in page and all(f"{band} " in page for band in ("replay", "detection", "restart"))
        assert f"verdict: {verdict['kind']}" in page and "quarantine host-b" in page
        print(f"[measure] report: lost {summary['lost_s']:.2f} s (detection {inc['detection_s']:.2f}, "
              f"replay {inc['replay_s']:.2f}, restart {inc['restart_s']:.2f}), ETTR {summary['ettr']:.3f}")
        _assert_same_training(clean, tmp_path / "spare" / "final.pt")
        _check_the_scrapes(prom, summary, targets)
        # The live view seen while the job trained: the round, its two hosts, the waiting spare.
        assert live is not None, "trainsup status never showed the job training with its spare waiting"
        job, text = live
        print("[status]\n" + text)
        assert sorted(job["hosts"]) == ["host-a", "host-b"] and job["ranks"] == 2 and job["round"] == 0, job
        assert "host-c: round -1, waiting (spare)" in text, text


def _check_the_scrapes(prom, summary, targets):
    """Issue 24: a real Prometheus scraped the three agents while the job ran; PromQL through its
    HTTP API gives the incident, its culprit host and the time lost that `trainsup report`
    gives (`summary`). The job has ended (its agents with it): each query takes the last value
    seen."""
    assert targets == 3, targets
    window = "[15m]"
    incidents = prom.query(f"max by (kind, host) (max_over_time(trainsup_incidents_total{window}))")
    assert [(r["metric"]["host"], float(r["value"][1])) for r in incidents] == [("host-b", 1.0)], incidents
    (inc,) = summary["incidents"]
    assert incidents[0]["metric"]["kind"] == inc["verdict"]
    lost = prom.query('sum(max by (cause) (max_over_time(trainsup_lost_seconds_total{cause=~"detection|restart|replay"}'
                      f'{window})))')
    lost_s = float(lost[0]["value"][1])
    by_cause = {r["metric"]["cause"]: float(r["value"][1]) for r in prom.query(
        f"max by (cause) (max_over_time(trainsup_lost_seconds_total{window}))")}
    print(f"[measure] Prometheus: incident {inc['verdict']} on host-b, time lost {lost_s:.2f} s "
          f"({', '.join(f'{k} {v:.2f}' for k, v in sorted(by_cause.items()))}); trainsup report: {summary['lost_s']:.2f} s")
    assert abs(lost_s - summary["lost_s"]) <= 1.0, (lost_s, summary["lost_s"])
    detection = prom.query(f"max(max_over_time(trainsup_detection_seconds_count{window}))")
    assert float(detection[0]["value"][1]) == 1.0, detection
    quarantined = prom.query(f"max(max_over_time(trainsup_quarantined_hosts{window}))")
    assert float(quarantined[0]["value"][1]) == 1.0, quarantined
    # The coordinator's live state (C++ Coordinator::snapshot): the ranks' step rate (the demo's
    # steps take about 25 ms) and the round's 2 ranks.
    step = prom.query(f'max(max_over_time(trainsup_step_time_seconds{{quantile="0.5"}}{window}))')
    assert 0.001 < float(step[0]["value"][1]) < 1.0, step
    assert float(prom.query(f"max(max_over_time(trainsup_ranks{window}))")[0]["value"][1]) == 2.0
    hosts = prom.query(f"max by (host) (max_over_time(trainsup_agent_info{window}))")
    assert sorted(r["metric"]["host"] for r in hosts) == ["host-a", "host-b", "host-c"], hosts


def test_a_host_that_dies_outright_is_named_and_evicted_and_the_job_goes_on_under_etcd(tmp_path, clean):
    # etcd-v2: the rendezvous lives outside the hosts. The victim is the host running the
    # coordinator, and its agent dies with its worker, so no rank can report it.
    s = _run("host_death", tmp_path / "death")
    victim = s["victim"]
    survivor = ({"host-a", "host-b"} - {victim}).pop()
    assert s["agent_exit_codes"] == {victim: -9, survivor: 0, "host-c": 0}, _explain(s)
    assert s["quarantine"] == [victim], _explain(s)
    run = tmp_path / "death" / "run"
    events = _events(run / f"agent-{survivor}.events.jsonl") + _events(run / "agent-host-c.events.jsonl")
    # The survivor's rank may fail first (its peer's connection reset) and publish failed_rank,
    # which blames no host; the vanished host's dead_host verdict replaces it (docs/events.md).
    verdicts = sorted((e for e in events if e["event"] == "verdict"), key=lambda e: e["time"])
    assert all(v["kind"] == "failed_rank" or v["hosts"] == [victim] for v in verdicts), verdicts
    verdict = next(v for v in verdicts if v["kind"] != "failed_rank")
    assert verdict["hosts"] == [victim] and verdict["kind"] in ("dead_host", "silent_rank", "dead_rank"), verdict
    took = verdict["time"] - s["fault_time"]
    print(f"[measure] {victim} named ({verdict['kind']}) {took:.2f} s after it died")
    assert took <= 10, took
    assert json.loads((run / "quarantine" / f"{victim}.json").read_text())["verdict"] == verdict["kind"]
    # Its node was taken out of the rendezvous: the next round did not wait out torch's 15 s
    # keep-alive expiry.
    evicted = [e for e in events if e["event"] == "rendezvous_evicted"]
    assert evicted and evicted[0]["evicted_host"] == victim and evicted[0]["was_present"], evicted
    second = next(e for e in _events(run / f"agent-{survivor}.events.jsonl")
                  if e["event"] == "rendezvous" and e["round"] >= 1)
    assert second["group_world"] == 2 and second["time"] - s["fault_time"] < 15, second
    print(f"[measure] next round formed {second['time'] - s['fault_time']:.2f} s after the host died")
    # The survivor's worker failed because its peer vanished: classified, not blamed on the code.
    failures = [e for e in _events(run / f"agent-{survivor}.events.jsonl") if e["event"] == "worker_failure"]
    assert failures and failures[0]["error_class"] == "network_or_peer", failures
    c_events = [e for p in (tmp_path / "death" / "logs").glob("*-host-c-r*.events.jsonl") for e in _events(p)]
    restored = next(e for e in c_events if e["event"] == "checkpoint_restored")
    # The restart that followed the death (not an unrelated earlier one, e.g. after a worker that
    # lost torchrun's race for its master port at start).
    restart = next(e for e in _events(run / f"agent-{survivor}.events.jsonl")
                   if e["event"] == "restart" and e["time"] > s["fault_time"])
    assert restored["step"] == restart["newest_checkpoint_step"], (restored, restart)
    _assert_same_training(clean, tmp_path / "death" / "final.pt")


def test_a_user_code_error_quarantines_no_host_and_the_restart_cap_ends_the_job(tmp_path):
    s = _run("user_error", tmp_path / "user")
    # Every attempt raises at step 120: the job-wide cap (2 restarts here) ends it with 96, the
    # documented "do not requeue" code, on every agent; no host is blamed.
    assert s["agent_exit_codes"] == {"host-a": 96, "host-b": 96}, _explain(s)
    assert s["quarantine"] == [], _explain(s)
    run = tmp_path / "user" / "run"
    events = _events(run / "agent-host-a.events.jsonl") + _events(run / "agent-host-b.events.jsonl")
    kinds = {e["kind"] for e in events if e["event"] == "verdict"}
    assert kinds == {"failed_rank"}, kinds
    assert not any(e["event"] == "quarantine" for e in events)
    # The failure is classified from the worker's output: the program's own error.
    failures = [e for e in events if e["event"] == "worker_failure"]
    assert failures and {e["error_class"] for e in failures} == {"user_code"}, failures
    assert "injected user-code error at step 120" in failures[0]["line"]
    give_up = [e for e in events if e["event"] == "give_up"]
    assert give_up and all(e["code"] == 96 for e in give_up)


def test_restarts_that_never_pass_the_same_checkpoint_end_the_job_before_the_cap(tmp_path):
    """The no-progress guard: every attempt fails at step 120 and the newest checkpoint stays at
    step 100; with one such restart allowed, the second one ends the job (96), long before the
    restart cap (20)."""
    workdir = tmp_path / "guard"
    s = _run("user_error", workdir, "--no-progress-guard")
    assert s["agent_exit_codes"] == {"host-a": 96, "host-b": 96}, _explain(s)
    events = _events(workdir / "run" / "agent-host-a.events.jsonl") + _events(workdir / "run" / "agent-host-b.events.jsonl")
    give_up = [e for e in events if e["event"] == "give_up"]
    assert give_up and all("without a newer checkpoint (cap 1)" in e["reason"] for e in give_up), give_up
    restarts = [e for e in events if e["event"] == "restart"]
    assert max(e["restarts"] for e in restarts) == 3, restarts  # 100 reached, then twice stuck at 100
    assert {e["newest_checkpoint_step"] for e in restarts} == {100}


def test_an_agent_stopped_by_the_scheduler_is_not_taken_for_a_dead_host(tmp_path):
    s = _run("preempt", tmp_path / "preempt")
    assert s["agent_exit_codes"]["host-a"] == 0 and s["agent_exit_codes"]["host-b"] != 0, _explain(s)
    assert s["quarantine"] == [], _explain(s)
    run = tmp_path / "preempt" / "run"
    a = _events(run / "agent-host-a.events.jsonl")
    b = _events(run / "agent-host-b.events.jsonl")
    assert any(e["event"] == "agent_signalled" and e["signal"] == 15 for e in b), b[-3:]
    assert not any(e["event"] in ("agent_lost", "quarantine") for e in a + b)
    # Its ranks said they were asked to stop: whatever the coordinator concluded blames no host.
    kinds = {e["kind"] for e in a + b if e["event"] == "verdict"}
    assert not kinds & QUARANTINE_KINDS, kinds
    last = [e for e in a if e["event"] == "rendezvous"][-1]
    assert last["group_world"] == 1 and (tmp_path / "preempt" / "final.pt").exists()
    # host-b left the rendezvous, so host-a's next round did not wait out torch's keep-alive
    # expiry (15 s) nor its last call (30 s) for it.
    assert last["wait_s"] < 15, last


def test_a_preempted_job_saves_one_step_on_every_rank_and_resumes_from_it(tmp_path, clean):
    # Slurm preempting the job signals every process of it, and torchrun forwards the same
    # SIGTERM to its workers: each rank gets it twice within moments and must still save.
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p), OMP_NUM_THREADS="1",
               TRAINSUP_CHECKPOINT_DIR=str(tmp_path / "ckpt"), TRAINSUP_LOG_DIR=str(tmp_path / "logs"),
               TRAINSUP_LOG_STDERR="0", TRAINSUP_NODE_NAME="host-a")
    cmd = [sys.executable, "-m", "trainsup.run", "--standalone", "--nnodes=1", "--nproc_per_node=2",
           "--run-dir", str(tmp_path / "run"), os.path.join(REPO, "examples", "python", "train_ddp.py"),
           "--steps", STEPS, "--checkpoint-every", "50", "--step-sleep-ms", "20", "--out", str(tmp_path / "final.pt")]

    def rank_events():
        return [e for p in sorted((tmp_path / "logs").glob("*.events.jsonl")) for e in _events(p)]

    job = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while sum(e["event"] == "checkpoint_committed" and e["step"] >= 150 for e in rank_events()) < 2:
            assert job.poll() is None and time.monotonic() < deadline, "the job did not reach step 150"
            time.sleep(0.1)  # polls the ranks' event logs; bounded by the deadline
        os.killpg(job.pid, signal.SIGTERM)  # the agent and both workers, as a scheduler does
        job.wait(timeout=120)
    finally:
        if job.poll() is None:
            os.killpg(job.pid, signal.SIGKILL)
    events = rank_events()
    assert sorted(e["rank"] for e in events if e["event"] == "stop_requested") == [0, 1]
    # Each rank saved where it stopped (train_ddp.py logs the step), the same step on both.
    saved = {}
    for log in (tmp_path / "logs").glob("*.log"):
        m = re.search(r"rank=(\d+)\].*stop requested: checkpointed step (\d+)", log.read_text())
        assert m, f"{log.name} has no stop checkpoint"
        saved[int(m.group(1))] = int(m.group(2))
    assert len(saved) == 2 and len(set(saved.values())) == 1, saved
    step = saved[0]
    committed = {e["rank"] for e in events if e["event"] == "checkpoint_committed" and e["step"] == step}
    assert committed == {0, 1} and (tmp_path / "ckpt" / f"step-{step:020d}").is_dir()
    # Requeued: the same command resumes from that checkpoint and finishes the training exactly.
    again = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stdout[-2000:] + again.stderr[-2000:]
    restored = [e for e in rank_events() if e["event"] == "checkpoint_restored"]
    assert restored and {e["step"] for e in restored} == {step}, restored
    _assert_same_training(clean, tmp_path / "final.pt")


def test_without_a_spare_the_job_shrinks_to_one_host_and_finishes(tmp_path):
    s = _run("shrink", tmp_path / "shrink")
    assert s["agent_exit_codes"] == {"host-a": 0, "host-b": 95}, _explain(s)
    assert s["quarantine"] == ["host-b"], _explain(s)
    a = _events(tmp_path / "shrink" / "run" / "agent-host-a.events.jsonl")
    last = [e for e in a if e["event"] == "rendezvous"][-1]
    assert last["round"] >= 1 and last["group_world"] == 1, last
    # The smaller round formed without torch's 30 s last call: written at once by the survivor
    # (fast_round.py), or, had that fallen back, with torch's wait ended once every node that
    # could come back had (expedite.py).
    fast = [e for e in a if e["event"] == "rendezvous_fast"]
    assert fast and fast[-1]["outcome"] == "written", fast
    assert last["wait_s"] < 2, last
    logs = tmp_path / "shrink" / "logs"
    ranks = [e for p in logs.glob("*-host-a-r*.events.jsonl") for e in _events(p)]
    restored = [e for e in ranks if e["event"] == "checkpoint_restored" and e["world_size"] == 1]
    assert restored and restored[0]["step"] > 0, "the shrunk job resumed from a checkpoint of the 2-rank job"
    assert (tmp_path / "shrink" / "final.pt").exists()


def test_a_host_failing_its_preflight_quarantines_itself_and_never_joins(tmp_path):
    script = tmp_path / "never_runs.py"
    script.write_text("raise SystemExit('the worker must not start on an unhealthy host')\n")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p), TRAINSUP_NODE_NAME="host-x",
               TRAINSUP_PREFLIGHT_COMMAND="exit 3")
    run = tmp_path / "run"
    p = subprocess.run([sys.executable, "-m", "trainsup.run", "--standalone", "--nnodes=1", "--nproc_per_node=1",
                        "--run-dir", str(run), str(script)], env=env, capture_output=True, text=True, timeout=120)
    assert p.returncode == 95, p.stdout[-2000:] + p.stderr[-2000:]
    events = _events(run / "agent-host-x.events.jsonl")
    pre = next(e for e in events if e["event"] == "preflight")
    assert not pre["healthy"] and any("exited 3" in d for d in pre["details"])
    # No driver here: the GPU part is skipped, not failed.
    assert "skipped" in pre["details"][0]
    assert json.loads((run / "quarantine" / "host-x.json").read_text())["verdict"] == "preflight"
    assert not any(e["event"] == "rendezvous" for e in events)


@pytest.mark.parametrize("flag, env, value, says, by_env", [
    ("--hang-floor-s", "TRAINSUP_HANG_FLOOR_S", "-1", "positive number of seconds", False),
    ("--network-grace-s", "TRAINSUP_NETWORK_GRACE_S", "soon", "non-negative number of seconds", True),
    ("--collective-budgets", "TRAINSUP_COLLECTIVE_BUDGETS", "allreduc=30", "unknown op 'allreduc'", False),
    ("--rank-silence-s", "TRAINSUP_RANK_SILENCE_S", "nan", "positive number of seconds", True),
])
def test_a_bad_detection_setting_stops_the_launcher_naming_it(tmp_path, flag, env, value, says, by_env):
    script = tmp_path / "never_runs.py"
    script.write_text("raise SystemExit('the worker must not start with bad settings')\n")
    extra = {env: value} if by_env else {}
    p = subprocess.run([sys.executable, "-m", "trainsup.run", "--standalone", "--nnodes=1", "--nproc_per_node=1",
                        "--run-dir", str(tmp_path / "run"), *([] if by_env else [f"{flag}={value}"]), str(script)],
                       env=dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p), **extra),
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 1, p.stdout[-2000:] + p.stderr[-2000:]
    assert f"{flag} / {env}" in p.stderr and says in p.stderr, p.stderr[-2000:]
    assert "must not start" not in p.stdout + p.stderr


def test_a_job_that_grows_keeps_its_restarts_for_real_failures(tmp_path):
    """--nnodes=1:3 with one restart allowed: host-b and host-c join a running job (two rounds
    ended for nodes that joined), then host-c's worker is killed. Every new round was counted
    as a restart, so a job that had grown gave up (96) on its next real failure (issue 19,
    defect 4); torchrun does not count them either."""
    s = _run("grow", tmp_path / "grow")
    assert s["agent_exit_codes"] == {"host-a": 0, "host-b": 0, "host-c": 95}, _explain(s)
    a = _events(tmp_path / "grow" / "run" / "agent-host-a.events.jsonl")
    assert sum(e["event"] == "membership_change" for e in a) >= 2, _explain(s)
    assert [e["restarts"] for e in a if e["event"] == "restart"] == [1], _explain(s)
    assert s["quarantine"] == ["host-c"], _explain(s)


def test_checkpoints_the_shrunk_job_cannot_restore_end_it_at_once_saying_why(tmp_path):
    """The job shrinks to host-a alone, and its checkpoints hold sharded state written by two
    ranks: the restore fails. Classified as the program's error, it failed the same way attempt
    after attempt until the restart cap (issue 19, defect 10). Now host-a sees that a round of
    one rank cannot restore them and gives up with the reason after the first such failure."""
    s = _run("sharded", tmp_path / "sharded")
    assert s["agent_exit_codes"] == {"host-a": 96, "host-b": 95}, _explain(s)
    a = _events(tmp_path / "sharded" / "run" / "agent-host-a.events.jsonl")
    failed = [e for e in a if e["event"] == "worker_failure"]
    assert [e["error_class"] for e in failed] == ["checkpoint_incompatible"], _explain(s)
    give_up = [e for e in a if e["event"] == "give_up"]
    assert len(give_up) == 1 and give_up[0]["cause"] == "checkpoint_incompatible", _explain(s)
    assert "written by world size 2" in give_up[0]["reason"] and "with world size 1" in give_up[0]["reason"]


def _committed_world(workdir, step):
    """The world size of the job that committed checkpoint `step` (its ranks' events)."""
    worlds = {e["world_size"] for p in (workdir / "logs").glob("*.events.jsonl") for e in _events(p)
              if e["event"] == "checkpoint_committed" and e["step"] == step}
    assert len(worlds) == 1, worlds
    return worlds.pop()


def test_a_sharded_fsdp_tp_job_that_loses_a_host_resumes_resharded_on_the_smaller_mesh(tmp_path):
    """Issue 20: 2 hosts x 2 ranks, FSDP2 x TP on a 2x2 mesh, no spare; host-b frozen. host-b is
    quarantined and the job resumes on host-a alone (mesh 1x2) from the torch.distributed.checkpoint
    checkpoint the 4 ranks wrote, and finishes."""
    s = _run("mesh_shrink", tmp_path / "mesh_shrink")
    assert s["agent_exit_codes"] == {"host-a": 0, "host-b": 95} and s["quarantine"] == ["host-b"], _explain(s)
    assert s["finished"], _explain(s)
    after = [r for r in s["restores"] if r["wall_s"] > s["fault_time"]]
    assert sorted(r["rank"] for r in after) == [0, 1] and all(r["world_size"] == 2 for r in after), _explain(s)
    step = after[0]["step"]
    assert step >= 150 and _committed_world(tmp_path / "mesh_shrink", step) == 4, _explain(s)
    print(f"[measure] mesh 2x2 -> 1x2: resumed from step {step} "
          f"{after[0]['wall_s'] - s['fault_time']:.2f} s after host-b froze")


def test_a_sharded_fsdp_tp_job_grows_onto_a_host_that_joins(tmp_path):
    """Issue 20: the job trains on host-a alone (mesh 1x2); host-b joins at the next round and the
    job resumes on 4 ranks (mesh 2x2) from the checkpoint the 2 ranks wrote, and finishes."""
    s = _run("mesh_grow", tmp_path / "mesh_grow")
    assert s["agent_exit_codes"] == {"host-a": 0, "host-b": 0} and s["quarantine"] == [], _explain(s)
    assert s["finished"], _explain(s)
    grown = [r for r in s["restores"] if r["world_size"] == 4]
    assert sorted(r["rank"] for r in grown) == [0, 1, 2, 3], _explain(s)
    assert _committed_world(tmp_path / "mesh_grow", grown[0]["step"]) == 2, _explain(s)


def test_a_desync_that_repeats_after_a_restart_ends_the_job_saying_where(tmp_path):
    """Rank 1 issues two collectives in the wrong order at the same step of every attempt: a
    desync, the program's error. Nobody is quarantined, and after the same desync in two
    attempts in a row the job gives up (96) naming the group, both ops and the rank, instead of
    repeating it until the restart cap."""
    s = _run("mesh_desync", tmp_path / "desync")
    assert s["agent_exit_codes"] == {"host-a": 96, "host-b": 96} and s["quarantine"] == [], _explain(s)
    events = _events(tmp_path / "desync" / "run" / "agent-host-a.events.jsonl") + \
        _events(tmp_path / "desync" / "run" / "agent-host-b.events.jsonl")
    verdicts = {e["round"] for e in events if e["event"] == "verdict" and e["kind"] == "desync"}
    assert verdicts == {0, 1}, _explain(s)
    # Every agent saw both desyncs: each decides on its own (or follows the first to publish).
    give_up = [e for e in events if e["event"] == "give_up"]
    assert {e["cause"] for e in give_up} == {"desync"} and len(give_up) == 2, _explain(s)
    assert all("rank(s) [1] entered broadcast" in e["reason"] and "allreduce" in e["reason"] for e in give_up), give_up
