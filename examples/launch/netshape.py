#!/usr/bin/env python3
"""Delay and loss on one simulated host's link where the kernel has no netem (this project's CI
kernel lacks sch_netem): iptables sends the host's packets to an NFQUEUE, and this process, run
inside the host's network namespace, drops --loss-pct % of the host's outgoing packets and holds
each other outgoing packet for --delay-ms before accepting it: what one `tc qdisc add dev eth0
root netem loss 30% delay 200ms` does. --both-ways drops incoming packets too (a harsher link).
Order is kept (one fixed delay).

  ip netns exec NS netshape.py --queue N --delay-ms 200 --loss-pct 30 [--both-ways]

The rules it needs (network_scenario.TestNet.impair adds them; --queue-bypass lets packets pass
unshaped whenever no shaper listens, so a dead shaper never cuts the link):
  iptables -A OUTPUT -j NFQUEUE --queue-num N --queue-bypass
  iptables -A INPUT  -j NFQUEUE --queue-num N --queue-bypass
Prints "ready" once bound, a JSON line of counts at the end (SIGTERM or SIGINT ends it; held
packets are released, not dropped). Uses NetfilterQueue (PyPI) on libnetfilter-queue (Debian).
"""

import argparse
import heapq
import json
import random
import select
import signal
import sys
import time

from netfilterqueue import COPY_META, NetfilterQueue

NF_INET_LOCAL_OUT = 3


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--queue", type=int, required=True, help="the NFQUEUE number the rules send to")
    p.add_argument("--delay-ms", type=float, default=0.0, help="added to every outgoing packet")
    p.add_argument("--loss-pct", type=float, default=0.0, help="outgoing packets dropped")
    p.add_argument("--both-ways", action="store_true", help="drop --loss-pct of incoming packets too")
    p.add_argument("--seed", type=int, default=None)
    args = p.parse_args()
    if not 0 <= args.loss_pct <= 100 or args.delay_ms < 0:
        p.error("--loss-pct must be in 0..100 and --delay-ms >= 0")
    rng = random.Random(args.seed)
    delay = args.delay_ms / 1000.0
    held = []  # (due, n, packet): a heap, in arrival order for equal due times
    counts = {"out": 0, "in": 0, "dropped_out": 0, "dropped_in": 0, "delayed": 0, "max_held": 0}
    n = [0]

    def on_packet(pkt):
        out = pkt.hook == NF_INET_LOCAL_OUT
        counts["out" if out else "in"] += 1
        if (out or args.both_ways) and rng.random() * 100 < args.loss_pct:
            counts["dropped_out" if out else "dropped_in"] += 1
            pkt.drop()
        elif out and delay > 0:
            n[0] += 1
            heapq.heappush(held, (time.monotonic() + delay, n[0], pkt))
            counts["delayed"] += 1
            counts["max_held"] = max(counts["max_held"], len(held))
        else:
            pkt.accept()

    stop = [False]

    def on_signal(*_):
        stop[0] = True

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    q = NetfilterQueue()
    q.bind(args.queue, on_packet, max_len=65536, mode=COPY_META)
    fd = q.get_fd()
    print("ready", flush=True)
    try:
        while not stop[0]:
            timeout = max(0.0, held[0][0] - time.monotonic()) if held else 0.2
            try:
                ready, _, _ = select.select([fd], [], [], timeout)
            except InterruptedError:
                continue
            if ready:
                q.run(block=False)  # every message waiting; verdicts from this thread only
            now = time.monotonic()
            while held and held[0][0] <= now:
                heapq.heappop(held)[2].accept()
    finally:
        while held:
            heapq.heappop(held)[2].accept()
        q.unbind()
        print(json.dumps(counts), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
