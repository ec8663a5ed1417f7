"""Ports for the stores and rendezvous endpoints that test jobs listen on.

A port from bind(("127.0.0.1", 0)) lies in the kernel's ephemeral range, where any outgoing
connection of a concurrent test may take it between the check and the job's own bind (CI saw
EADDRINUSE from a store). free_port() picks a port below that range instead, and checks that a
bind succeeds now. A job can still lose it to another listener; that is rare, not routine.
"""

import os
import random
import socket

__all__ = ["free_port"]


def _ephemeral_low() -> int:
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def free_port() -> int:
    low = min(_ephemeral_low(), 32768)
    first = 20000 if low > 21000 else 1024
    rng = random.Random(os.getpid() ^ int.from_bytes(os.urandom(4), "little"))
    for _ in range(2000):
        port = rng.randrange(first, low)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError(f"no free port in {first}-{low - 1} on 127.0.0.1")
