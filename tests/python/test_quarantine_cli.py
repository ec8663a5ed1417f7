"""`python3 -m trainsup quarantine ...`: records on disk, expiry, the sbatch --exclude text, and
the configured commands run with shell-quoted placeholders."""
import contextlib
import io
import json
import os
import subprocess
import sys

from trainsup.tools.cli import main as cli_main
from trainsup.quarantine import Quarantine, run_commands


def _cli(tmp_path, *args, env=None):
    """The command as an operator runs it: a process of its own."""
    e = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p), **(env or {}))
    return subprocess.run([sys.executable, "-m", "trainsup", "quarantine", *args, "--dir", str(tmp_path)],
                          capture_output=True, text=True, env=e)


def _main(tmp_path, *args):
    """The same command's main() in this process (each process start costs seconds of imports)."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            rc = cli_main(["quarantine", *args, "--dir", str(tmp_path)])
        except SystemExit as e:
            rc = e.code
    return subprocess.CompletedProcess(args, rc, out.getvalue(), err.getvalue())


def test_add_list_exclude_remove(tmp_path):
    assert _cli(tmp_path, "exclude-arg").stdout.strip() == ""
    out = _cli(tmp_path, "add", "node17", "--reason", "ECC errors", "--gpu", "3:GPU-abc")
    assert out.returncode == 0, out.stderr
    _main(tmp_path, "add", "node42", "--reason", "manual check")
    _main(tmp_path, "add", "node99", "--reason", "expired already", "--ttl-s", "0.001")
    listed = [json.loads(l) for l in _main(tmp_path, "list").stdout.splitlines()]
    assert [r["host"] for r in listed] == ["node17", "node42"]  # node99 expired
    assert listed[0]["gpu"] == "3:GPU-abc" and listed[0]["reason"] == "ECC errors"
    assert _main(tmp_path, "exclude-arg").stdout.strip() == "--exclude=node17,node42"
    assert _main(tmp_path, "remove", "node42").returncode == 0
    assert _main(tmp_path, "remove", "node42").returncode == 1
    assert _cli(tmp_path, "exclude-arg").stdout.strip() == "--exclude=node17"
    bad = _cli(tmp_path, "add", "../etc", "--reason", "x")
    assert bad.returncode != 0 and "is not a host name" in bad.stderr


def test_quarantine_commands_get_quoted_placeholders(tmp_path):
    out = tmp_path / "drained.txt"
    record = Quarantine(str(tmp_path / "q")).add("node7", reason="rank 3 silent; $(reboot)", verdict="silent_rank")
    results = run_commands(record, f"echo drain {{host}} {{reason}} >> {out}\n\nfalse")
    assert [rc for _, rc in results] == [0, 1]
    assert out.read_text() == "drain node7 rank 3 silent; $(reboot)\n"


def test_remove_releases_the_host_for_a_running_job_too(tmp_path):
    """The job's agents keep a copy of each record in the job's store; the operator's CLI has no
    store. `trainsup quarantine remove` used to delete the file only, the agents fell back to the
    store copy, and the host kept exiting 95 for the rest of the job (issue 19, defect 6)."""
    import torch.distributed as dist
    store = dist.HashStore()
    agents_view = Quarantine(str(tmp_path), store)  # what the job's agents see
    agents_view.add("node5", reason="hung_rank on rank 9", verdict="hung_rank")
    assert agents_view.get("node5")["verdict"] == "hung_rank"
    assert _main(tmp_path, "remove", "node5").returncode == 0  # the operator, without the store
    assert agents_view.get("node5") is None, "released, but the job still sees the store's copy"
    assert Quarantine(str(tmp_path)).get("node5") is None
    assert _main(tmp_path, "list").stdout.strip() == ""
    # A new fault after the release quarantines the host again, in the store as on disk.
    agents_view.add("node5", reason="dead_host", verdict="dead_host")
    assert agents_view.get("node5")["verdict"] == "dead_host"
    os.remove(tmp_path / "node5.json")  # a host that does not share the directory: the store's copy counts
    assert agents_view.get("node5")["verdict"] == "dead_host"


def test_records_reads_again_only_after_a_change_and_sees_every_kind_of_change(tmp_path):
    """Quarantine.records(hosts), asked every poll by every agent while a round forms: one stat
    and one store read while nothing changes; a record written by an agent on another directory
    (its store copy), by an operator's command in this directory, and a release are all seen."""
    from counting_store import CountingStore
    store = CountingStore()
    hosts = [f"host-{i}" for i in range(64)]
    here = Quarantine(str(tmp_path / "shared"), store)
    elsewhere = Quarantine(str(tmp_path / "other-fs"), store)  # an agent that does not share the directory
    old = os.stat(here.dir).st_mtime - 10
    os.utime(here.dir, (old, old))  # settled: its mtime tells every later change
    assert here.records(hosts) == {} and here.records(hosts[1:]) == {}
    before = store.ops
    for _ in range(10):
        assert here.records(hosts) == {} and here.records(hosts[1:]) == {}
    assert store.ops - before == 20  # the callers ask about different lists: still one read a call
    elsewhere.add("host-3", reason="hung", verdict="hung_rank")
    assert list(here.records(hosts)) == ["host-3"]
    Quarantine(here.dir).add("host-9", reason="ECC", verdict="manual")  # an operator, no store
    assert sorted(here.records(hosts)) == ["host-3", "host-9"]
    Quarantine(here.dir).remove("host-3")  # released by an operator: outranks the store copy
    assert list(here.records(hosts)) == ["host-9"]
