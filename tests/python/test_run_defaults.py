"""trainsup.run's defaults for torchrun's own flags (docs/configuration.md, "torchrun flags
whose defaults trainsup.run changes"), and that a flag the user gives wins. torchrun itself is
not started: its parsed arguments are taken where trainsup.run hands them over."""
import pytest

from trainsup.launch import run
from trainsup.launch.launcher import node_name


@pytest.fixture
def handed_over(monkeypatch, tmp_path):
    got = []
    monkeypatch.setattr(run.compat, "run_torchrun", lambda args, on_signal: got.append(args))
    monkeypatch.setenv("TRAINSUP_RUN_DIR", str(tmp_path / "run"))
    # main() sets this for torchrun (compat.prepare_environment): undone after the test.
    monkeypatch.setenv("TORCH_DISABLE_SHARE_RDZV_TCP_STORE", "1")

    def main(*flags):
        got.clear()
        run.main(["--standalone", "--nproc_per_node=1", "--warm-workers", "0", *flags, "train.py", "--x", "1"])
        assert len(got) == 1
        return got[0]
    return main


def test_torchruns_flags_get_trainsups_defaults(handed_over, tmp_path):
    args = handed_over()
    assert float(args.monitor_interval) == run.MONITOR_INTERVAL_S == 0.02
    assert int(args.max_restarts) == 100
    assert str(args.tee) == "3" and args.log_dir == str(tmp_path / "run" / "workers" / node_name())
    assert args.rdzv_backend == "trainsup" and args.training_script_args == ["--x", "1"]


def test_a_flag_the_user_gives_wins(handed_over):
    assert float(handed_over("--monitor-interval=0.5").monitor_interval) == 0.5
    assert float(handed_over("--monitor_interval", "1").monitor_interval) == 1.0
    assert int(handed_over("--max-restarts", "7").max_restarts) == 7
