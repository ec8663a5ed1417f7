"""Real network faults between simulated hosts that each have their own network namespace and
address (examples/launch/network_scenario.py). A cut link: host-b must be named within the
budget of a stopped rank, quarantined, and the job must finish on host-a and the spare host-c.
A lossy, slow link (30% of host-b's packets lost, the rest delayed 200 ms): host-b is a
straggler, not dead: its slow link is named, nobody is quarantined, and the job finishes. The
longer cases (partitions that heal, other loss rates, the store's or the coordinator's host cut)
are in bench/network_bench.py. Needs root (network namespaces)."""
import json
import os
import shutil
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCENARIO = os.path.join(REPO, "examples", "launch", "network_scenario.py")


def _can_make_namespaces():
    if os.geteuid() != 0 or shutil.which("ip") is None:
        return False
    probe = subprocess.run(["ip", "netns", "add", f"tsprobe{os.getpid()}"], capture_output=True)
    subprocess.run(["ip", "netns", "del", f"tsprobe{os.getpid()}"], capture_output=True)
    return probe.returncode == 0


@pytest.mark.skipif(not _can_make_namespaces(), reason="needs root and iproute2 to make network namespaces")
def test_a_host_whose_link_is_cut_is_named_quarantined_and_the_job_goes_on(tmp_path):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    out = subprocess.run([sys.executable, SCENARIO, "link_cut", str(tmp_path / "cut"), "--steps", "400"], env=env,
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    s = json.loads(out.stdout.strip().splitlines()[-1])
    assert s["verdicts"], s
    first = s["verdicts"][0]
    print(f"[measure] link cut: {first['kind']} naming {first['hosts']} {first['after_s']} s after the cut; "
          f"next round {s['next_round_after_s']} s after")
    assert first["hosts"] == ["host-b"] and first["after_s"] <= 10, s
    assert all(v["hosts"] == ["host-b"] for v in s["verdicts"]), s  # nobody else blamed
    assert s["quarantine"] == ["host-b"], s
    assert s["finished"] and s["agent_exit_codes"]["host-a"] == 0 and s["agent_exit_codes"]["host-c"] == 0, s
    assert not list((tmp_path).glob("ts*"))  # nothing of the namespaces left in the work dir
    names = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert "host-" not in names, names  # the scenario removed its namespaces


def _netfilterqueue():
    try:
        import netfilterqueue  # noqa: F401
        return True
    except ImportError:
        return False


@pytest.mark.skipif(not _can_make_namespaces() or not _netfilterqueue(),
                    reason="needs root, iproute2 and NetfilterQueue (the delay shaper)")
def test_a_host_with_a_lossy_slow_link_is_a_straggler_not_dead(tmp_path):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    out = subprocess.run([sys.executable, SCENARIO, "lossy", str(tmp_path / "lossy"), "--steps", "300",
                          "--fault-s", "10", "--loss-pct", "30", "--delay-ms", "200"], env=env,
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    s = json.loads(out.stdout.strip().splitlines()[-1])
    slow = [x for x in s["slow_links"] if not x["recovered"]]
    print(f"[measure] lossy link: slow link {[x['host'] for x in slow]} after "
          f"{[x['after_s'] for x in slow]} s; steps/s {s['steps_per_s_before_fault']} before, "
          f"{s['steps_per_s_during_fault']} during; verdicts {s['verdicts']}")
    assert s["shaped_packets"]["dropped_out"] > 0 and s["shaped_packets"]["delayed"] > 0, s
    # Nobody named dead or hung, nobody quarantined. A collective held past its budget and the
    # network grace before host-b's slow link reached the coordinator may end in a
    # communication_fault (seen once, with CI's background builds delaying the slow-link report
    # to 7.9 s): the job restarts with every host; it names no culprit (docs/reliability.md).
    assert s["quarantine"] == [], s
    assert [x["host"] for x in slow] == ["host-b"] and slow[0]["after_s"] <= 10, s
    # ...and only then: a verdict more than 1 s after host-b published its slow link (the
    # coordinator's agent passes it on within about half a second) is a defect, whatever its kind.
    assert all(v["kind"] == "communication_fault" and v["after_s"] < slow[0]["after_s"] + 1.0
               for v in s["verdicts"]), s
    assert all(x["hosts"] == ["host-b"] for x in s["stragglers"]), s
    assert s["finished"] and s["agent_exit_codes"] == {"host-a": 0, "host-b": 0}, s
