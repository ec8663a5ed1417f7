"""trainsup.init_process_group waits for rank 0's store server itself, at a fine pace, before
torch's TCPStore client connects: torch's client, refused because it came first, retries only
after a randomised backoff of 0.25-0.75 s, and after a restart every rank starts at once (the
recovery bench saw a third of a second of the restart there in 3 rounds of 5)."""
import datetime
import os
import socket
import threading
import time

import torch.distributed as dist

from trainsup import distributed as tdist
from trainsup.ports import free_port


def _env(monkeypatch, port, rank="1"):
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(port))
    monkeypatch.setenv("RANK", rank)
    monkeypatch.delenv("TORCHELASTIC_USE_AGENT_STORE", raising=False)


def test_a_rank_that_comes_before_rank_0s_store_connects_as_soon_as_it_listens(monkeypatch):
    port = free_port()
    _env(monkeypatch, port)
    waited = []
    prober = threading.Thread(target=lambda: waited.append(tdist._await_rank0_store({})))
    prober.start()
    # Nothing listens yet: the prober is refused and keeps looking (it has not returned).
    with socket.socket() as s:
        assert s.connect_ex(("127.0.0.1", port)) != 0
    assert prober.is_alive() and not waited
    server = dist.TCPStore("127.0.0.1", port, 2, True, wait_for_workers=False,
                           timeout=datetime.timedelta(seconds=30))
    prober.join(30)
    assert not prober.is_alive() and waited and waited[0] is not None and waited[0] > 0
    # torch's client now finds the server at its first try: no refusal, so no 0.25 s backoff.
    t0 = time.monotonic()
    client = dist.TCPStore("127.0.0.1", port, 2, False, timeout=datetime.timedelta(seconds=30))
    took = time.monotonic() - t0
    client.set("k", "v")
    assert server.get("k") == b"v"  # the probe's bare connection left the server working
    assert took < 0.25, f"torch's client was refused and backed off ({took:.3f} s)"


def test_the_probe_stays_out_of_the_way_where_it_does_not_apply(monkeypatch):
    port = free_port()  # nothing listens: a probe here would wait STORE_PROBE_LIMIT_S
    _env(monkeypatch, port, rank="0")
    assert tdist._await_rank0_store({}) is None  # rank 0 hosts the store itself
    _env(monkeypatch, port)
    assert tdist._await_rank0_store({"store": dist.HashStore()}) is None
    assert tdist._await_rank0_store({"init_method": f"tcp://127.0.0.1:{port}"}) is None
    assert tdist._await_rank0_store({"rank": 0}) is None
    monkeypatch.setenv("TORCHELASTIC_USE_AGENT_STORE", "True")  # the agent's store, up already
    assert tdist._await_rank0_store({}) is None
    monkeypatch.delenv("MASTER_PORT")
    monkeypatch.delenv("TORCHELASTIC_USE_AGENT_STORE")
    assert tdist._await_rank0_store({}) is None  # no env:// rendezvous to speak of


def test_a_store_that_never_comes_is_left_to_torchs_own_timeout(monkeypatch):
    port = free_port()
    _env(monkeypatch, port)
    monkeypatch.setattr(tdist, "STORE_PROBE_LIMIT_S", 0.05)
    waited = tdist._await_rank0_store({})
    assert waited is not None and waited >= 0.05  # gave up looking, raised nothing
    assert os.environ["MASTER_PORT"] == str(port)  # and changed nothing torch reads
