"""Worker failures classified from real error lines (../shared/reference/log-lines.txt, copied
into tests/python/data/log-lines.txt with the class each must get)."""
import os

import pytest

from trainsup.launch.classify import CLASSES, classify

DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "log-lines.txt")


def _cases():
    with open(DATA) as f:
        for line in f:
            if line.strip() and not line.startswith("#"):
                cls, text = line.rstrip("\n").split(" ", 1)
                yield cls, text


@pytest.mark.parametrize("expected,line", list(_cases()))
def test_real_error_lines_get_their_class(expected, line):
    assert expected in CLASSES
    got, why = classify("some earlier output\n" + line + "\n")
    assert got == expected, (line, got, why)


def test_a_plain_traceback_is_user_code_and_the_hardware_wins_over_its_consequences():
    user = 'Traceback (most recent call last):\n  File "train.py", line 3, in <module>\nKeyError: \'labels\'\n'
    assert classify(user) == ("user_code", "KeyError: 'labels'")
    mixed = ("RuntimeError: NCCL communicator was aborted on rank 0.\n"
             "[E ProcessGroupNCCL.cpp:916] NCCL watchdog thread terminated with exception: CUDA error: "
             "uncorrectable ECC error encountered\n")
    assert classify(mixed)[0] == "gpu_hardware"
    assert classify("all fine\n") == ("unknown", "")


def test_a_gloo_peer_that_vanished_is_the_network_not_the_program():
    # What a gloo worker prints when the host of a peer rank dies (seen in the host_death scenario).
    tb = ('Traceback (most recent call last):\n  File "train_ddp.py", line 120, in <module>\n'
          "RuntimeError: [./gloo/transport/tcp/pair.cc:598] Connection closed by peer [127.0.0.1]:11491\n")
    assert classify(tb)[0] == "network_or_peer"


def test_torch_2_rank_prefixes_are_not_part_of_the_message():
    """torch 2.x writes an uncaught exception as "[rank0]: ..." lines (and torchrun's --tee adds
    "[default0]:"): still user code, named by its exception line."""
    tb = ("[rank0]: Traceback (most recent call last):\n"
          '[rank0]:   File "train.py", line 138, in main\n'
          "[rank0]: RuntimeError: injected user-code error at step 120\n")
    assert classify(tb) == ("user_code", "RuntimeError: injected user-code error at step 120")
    teed = "[default0]:[rank0]: RuntimeError: CUDA error: an illegal memory access was encountered\n"
    assert classify(teed)[0] == classify("RuntimeError: CUDA error: an illegal memory access was encountered\n")[0]


def test_the_line_kept_is_the_error_not_the_source_a_traceback_quotes():
    """The kept line becomes the quarantine's reason (and Slurm's drain reason): a traceback
    that quotes the raising source line must not make that code the reason (issue 23's replay
    drained n2 "raise RuntimeError(...)")."""
    tail = ('[default0]:Traceback (most recent call last):\n'
            '[default0]:  File "train.py", line 180, in main\n'
            '[default0]:    raise RuntimeError("CUDA error: unspecified launch failure\\n"\n'
            '[default0]:RuntimeError: CUDA error: unspecified launch failure\n')
    assert classify(tail) == ("cuda_error", "RuntimeError: CUDA error: unspecified launch failure")
    # Only quoted code matches: it is still what there is.
    assert classify('  File "x.py", line 1\n    raise RuntimeError("CUDA error: boom")\n')[0] == "cuda_error"
