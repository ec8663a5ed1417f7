#!/usr/bin/env python3
"""Network faults between simulated hosts that each have a network of their own: every host is
a Linux network namespace (ip netns) with its own address on a bridge, and its trainsup-run
agent and worker run inside it. Needs root (CAP_NET_ADMIN) and iproute2; creates only its own
namespaces (ts<tag>-<host>), veth pairs and bridge (tsbr<tag>), on 10.77.<n>.0/24, and removes
them at the end.

  link_cut      hosts a, b active, c spare (--nnodes=2:2); host-b's link goes down for good
                while training: host-b must be named and quarantined, and the job must finish
                on a + c from the newest valid checkpoint.
  store_cut     the same, but the link cut is host-a's, whose agent serves the c10d store (and
                usually the coordinator). With c10d the store dies with the link; the outcome is
                recorded (the etcd-v2 rendezvous, whose store is on no training host, is the
                documented way to survive it).
  coordinator_cut
                the etcd-v2 rendezvous, its etcd on a service host (namespace) of its own; hosts a,
                b active, c spare; the link of the host whose agent runs the coordinator is cut:
                another agent takes the coordinator over, the cut host is named and quarantined,
                and the job finishes on the other host and the spare.
  lossy         hosts a, b (--nnodes=2:2): host-b's link loses --loss-pct (30) % of host-b's
                outgoing packets and delays the rest by --delay-ms (200) ms, what one netem qdisc
                on it would do (netshape.py; --both-ways: incoming packets are lost too), for
                --fault-s seconds: host-b is slow, not dead: no host may be quarantined and the
                job must finish on a + b.
  heal          hosts a, b: host-b's link goes down for --fault-s seconds (under the 5 s silence
                timeout) and comes back: no verdict, no quarantine, the job finishes on a + b.

Prints a JSON summary line last. Used by bench/network_bench.py and tests/python/test_network.py.

  network_scenario.py SCENARIO WORKDIR [--steps N] [--fault-s S] [--loss-pct P] [--delay-ms D]
                      [--both-ways]
"""
import argparse
import json
import os
import pathlib
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from recovery_scenario import TRAIN, Cluster, free_port, start_etcd  # noqa: E402

HOSTS = ("host-a", "host-b", "host-c")
IPTABLES = "iptables-legacy"


def sh(*cmd, check=True):
    r = subprocess.run(cmd, capture_output=True, text=True)
    if check and r.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)}: {r.stderr.strip()}")
    return r


class TestNet:
    """A bridge and one namespace per host, each with one veth into the bridge."""

    def __init__(self, hosts=HOSTS):
        self.tag = f"{os.getpid() % 10000:04d}"
        self.subnet = 10 + random.Random(os.getpid()).randrange(200)
        self.bridge = f"tsbr{self.tag}"
        self.ns, self.addr, self.link, self.shapers = {}, {}, {}, {}
        try:
            sh("ip", "link", "add", self.bridge, "type", "bridge")
            sh("ip", "addr", "add", f"10.77.{self.subnet}.254/24", "dev", self.bridge)  # this side reaches them
            sh("ip", "link", "set", self.bridge, "up")
            for i, host in enumerate(hosts):
                ns, outer = f"ts{self.tag}-{host}", f"tsv{self.tag}{i}"
                sh("ip", "netns", "add", ns)
                sh("ip", "link", "add", outer, "type", "veth", "peer", "name", "eth0", "netns", ns)
                sh("ip", "link", "set", outer, "master", self.bridge)
                sh("ip", "link", "set", outer, "up")
                addr = f"10.77.{self.subnet}.{i + 1}"
                sh("ip", "netns", "exec", ns, "ip", "addr", "add", f"{addr}/24", "dev", "eth0")
                sh("ip", "netns", "exec", ns, "ip", "link", "set", "eth0", "up")
                sh("ip", "netns", "exec", ns, "ip", "link", "set", "lo", "up")
                self.ns[host], self.addr[host], self.link[host] = ns, addr, outer
        except Exception:
            self.close()
            raise

    # Faults, applied on the bridge side of a host's link (its namespace is untouched).
    def cut(self, host):
        sh("ip", "link", "set", self.link[host], "down")

    def restore(self, host):
        sh("ip", "link", "set", self.link[host], "up")

    def impair(self, host, loss_pct, delay_ms=200, both_ways=False):
        """`loss_pct` % of host's outgoing packets lost and the rest held `delay_ms` (what one netem
        qdisc on its link does; `both_ways`: incoming packets lost too). This kernel has no netem,
        so netshape.py does it from an NFQUEUE inside the host's namespace."""
        ns = self.ns[host]
        queue = 100 + len(self.shapers)
        cmd = ["ip", "netns", "exec", ns, sys.executable, str(pathlib.Path(__file__).resolve().parent / "netshape.py"),
               "--queue", str(queue), "--delay-ms", f"{delay_ms:g}", "--loss-pct", f"{loss_pct:g}",
               *(["--both-ways"] if both_ways else [])]
        log = open(pathlib.Path(tempfile.gettempdir()) / f"netshape-{self.tag}-{host}.log", "w")
        shaper = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=log, text=True)  # warnings go to the log
        first = shaper.stdout.readline().strip()  # "ready" once bound; anything else is its error
        if first != "ready":
            shaper.kill()
            raise RuntimeError(f"netshape.py in {ns} did not start: {first} {shaper.stdout.read()}")
        self.shapers[host] = shaper
        for chain in ("OUTPUT", "INPUT"):
            sh("ip", "netns", "exec", ns, IPTABLES, "-A", chain, "-o" if chain == "OUTPUT" else "-i", "eth0",
               "-j", "NFQUEUE", "--queue-num", str(queue), "--queue-bypass")
        return (f"{loss_pct:g}% of host's outgoing packets lost{' (and of incoming)' if both_ways else ''}, "
                f"the rest delayed {delay_ms:g} ms (netshape.py: NFQUEUE, no netem in this kernel)")

    def unimpair(self, host):
        """Ends the impairment; returns the shaper's packet counts."""
        ns = self.ns[host]
        for chain in ("INPUT", "OUTPUT"):
            sh("ip", "netns", "exec", ns, IPTABLES, "-F", chain, check=False)
        shaper = self.shapers.pop(host, None)
        if shaper is None:
            return None
        shaper.terminate()
        try:
            out, _ = shaper.communicate(timeout=10)
        except subprocess.TimeoutExpired:
            shaper.kill()
            out, _ = shaper.communicate()
        try:
            return json.loads(out.strip().splitlines()[-1])
        except (ValueError, IndexError):
            return {"shaper_output": out[-500:]}

    def close(self):
        """Removes the namespaces, links and bridge, and raises naming whatever it could not.
        `ip netns del` unlinks /run/netns/NAME, which fails (EBUSY) while any process started by
        `ip netns exec` still lives: each holds a copy of every namespace's bind mount. So
        everything running in the namespaces is killed and waited for before they go."""
        for shaper in self.shapers.values():
            shaper.kill()
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            pids = [pid for ns in self.ns.values() for pid in sh("ip", "netns", "pids", ns, check=False).stdout.split()]
            if not pids:
                break
            for pid in pids:
                sh("kill", "-9", pid, check=False)
            time.sleep(0.1)  # polls for the killed processes to be reaped; bounded by the deadline
        left = []
        for ns in self.ns.values():
            while True:
                r = sh("ip", "netns", "del", ns, check=False)
                if r.returncode == 0 or not pathlib.Path("/run/netns", ns).exists():
                    break
                if time.monotonic() >= deadline:
                    left.append(f"namespace {ns}: {r.stderr.strip()}")
                    break
                time.sleep(0.1)  # an exiting process still holds its mount; bounded by the deadline
        for link in list(self.link.values()) + [self.bridge]:
            sh("ip", "link", "del", link, check=False)
            if sh("ip", "link", "show", link, check=False).returncode == 0:
                left.append(f"link {link}")
        if left:
            raise RuntimeError("network_scenario.py could not remove: " + "; ".join(left))


class NetCluster(Cluster):
    """Cluster whose agents run in the hosts' namespaces, rendezvous at host-a's address, bind
    their telemetry services to their own address, and speak gloo over their own link."""

    def __init__(self, net, workdir, nnodes, steps, etcd=False, **kw):
        super().__init__(workdir, nnodes, steps, **kw)
        self.net = net
        self.port = free_port()
        if etcd:  # on a service host of its own, as on a cluster's service node
            self.backend = "etcd-v2"
            self.endpoint = net.addr["svc"]
            self.etcd = start_etcd(self.dir, self.port, net.addr["svc"], ("ip", "netns", "exec", net.ns["svc"]))
        else:
            self.endpoint = net.addr["host-a"]

    def start(self, host):
        out = open(self.dir / f"agent-{host}.out", "w")
        addr = self.net.addr[host]
        cmd = ["ip", "netns", "exec", self.net.ns[host], sys.executable, "-m", "trainsup.run",
               f"--nnodes={self.nnodes}", "--nproc_per_node=1", f"--rdzv_backend={self.backend}",
               f"--rdzv_endpoint={self.endpoint}:{self.port}", "--rdzv_id=netscenario",
               # host-a serves the c10d store: torchrun cannot tell from a namespace's address.
               *([f"--rdzv_conf=is_host={'true' if host == 'host-a' else 'false'}"] if self.backend == "c10d" else []),
               f"--local_addr={addr}", "--coordinator-bind", addr,
               "--run-dir", str(self.dir / "run"), str(TRAIN), "--steps", str(self.steps),
               "--checkpoint-every", "50", "--step-sleep-ms", "20", "--progress-every", "5", *self.extra_train]
        env = dict(self.env, TRAINSUP_NODE_NAME=host, GLOO_SOCKET_IFNAME="eth0", MASTER_ADDR=addr)
        self.agents[host] = subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT)


def steps_done(c, host):
    """The newest step host's rank reported (its progress events, every 5 steps)."""
    steps = [e.get("step", -1) for e in c.rank_events(host)
             if e["event"] in ("progress", "checkpoint_committed", "first_step")]
    return max(steps, default=0)


def verdicts(c):
    seen = {}
    for h in HOSTS:
        for e in c.agent_events(h):
            if e["event"] == "verdict":
                key = (e.get("kind"), tuple(e.get("hosts", [])))
                seen.setdefault(key, e)
    return sorted(seen.values(), key=lambda e: e["time"])


def run(scenario, workdir, steps, fault_s, loss_pct=30, delay_ms=200, both_ways=False, with_spare=False):
    # A fresh directory: events left by an earlier run would be read as this one's.
    shutil.rmtree(workdir, ignore_errors=True)
    pathlib.Path(workdir).mkdir(parents=True)
    net = TestNet(HOSTS + (("svc",) if scenario == "coordinator_cut" else ()))
    spare = with_spare or scenario in ("link_cut", "store_cut", "coordinator_cut")
    c = NetCluster(net, workdir, "2:2", steps, etcd=scenario == "coordinator_cut",
                   extra_train=["--out", str(pathlib.Path(workdir) / "final.pt")])
    summary = {"scenario": scenario, "addresses": net.addr}
    try:
        c.start_a_then_b(100, 240)
        if spare:
            c.start("host-c")
            c.wait_spare("host-c")
        c.wait_until(lambda: c.training_at("host-a", 200), 180, "training to step 200")
        time.sleep(0.4)
        victim = "host-a" if scenario == "store_cut" else "host-b"
        if scenario == "coordinator_cut":
            victim = c.coordinator_host()
        fault_wall = time.time()
        if scenario in ("link_cut", "store_cut", "coordinator_cut"):
            net.cut(victim)
        elif scenario == "heal":
            net.cut(victim)
            time.sleep(fault_s)
            net.restore(victim)
        elif scenario == "lossy":
            before = steps_done(c, "host-a")
            summary["impairment"] = net.impair(victim, loss_pct, delay_ms, both_ways)
            time.sleep(fault_s)
            during = steps_done(c, "host-a") - before
            summary["shaped_packets"] = net.unimpair(victim)
            summary["steps_per_s_during_fault"] = round(during / fault_s, 2)
        with open(c.dir / "run" / "faults.jsonl", "a") as f:
            f.write(json.dumps({"event": "fault_injected", "time": fault_wall, "host": victim, "kind": scenario}) + "\n")
        survivors = [h for h in c.agents if h != victim] if spare else list(c.agents)
        # Without its store host a c10d job cannot finish, and without a spare a job whose host
        # was quarantined waits for a replacement: record where it stands after 90 s.
        deadline = time.monotonic() + (90 if scenario == "store_cut" else 600)
        while time.monotonic() < deadline and any(c.agents[h].poll() is None for h in survivors):
            if not spare and any(p.poll() == 95 for p in c.agents.values()):
                deadline = min(deadline, time.monotonic() + 90)
            time.sleep(0.2)  # polls the agents; bounded
        summary["agent_exit_codes"] = {h: p.poll() for h, p in c.agents.items()}
        summary.update(fault_time=fault_wall, victim=victim, fault_s=fault_s if scenario in ("heal", "lossy") else None)
        summary["verdicts"] = [{k: e.get(k) for k in ("kind", "hosts", "ranks")} | {"after_s": round(e["time"] - fault_wall, 2)}
                               for e in verdicts(c)]
        summary["stragglers"] = [{"hosts": e.get("hosts"), "after_s": round(e["time"] - fault_wall, 2)}
                                 for h in HOSTS for e in c.agent_events(h) if e["event"] == "straggler"]
        summary["slow_links"] = [{"host": e["slow_host"], "round_trip_ms": e["round_trip_ms"],
                                  "after_s": round(e["time"] - fault_wall, 2), "recovered": e["event"] != "slow_link"}
                                 for h in HOSTS for e in c.agent_events(h)
                                 if e["event"] in ("slow_link", "slow_link_recovered")]
        commits = {e["step"]: e["wall_s"] for e in c.rank_events("host-a") if e["event"] == "checkpoint_committed"}
        if 100 in commits and 200 in commits:
            summary["steps_per_s_before_fault"] = round(100 / (commits[200] - commits[100]), 2)
        summary["quarantine"] = sorted(x.name[:-5] for x in (c.dir / "run" / "quarantine").glob("*.json"))
        summary["finished"] = (pathlib.Path(workdir) / "final.pt").exists()
        rounds = [e for h in HOSTS for e in c.agent_events(h) if e["event"] == "rendezvous"]
        after = [e for e in rounds if e["time"] > fault_wall]
        summary["next_round_after_s"] = round(min(e["time"] for e in after) - fault_wall, 2) if after else None
        return summary
    finally:
        c.kill_all()
        net.close()


def main():
    # SIGTERM (a timeout, a Ctrl-C'd parent) ends the run through its cleanup: the namespaces,
    # links and processes go with it.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    p = argparse.ArgumentParser()
    p.add_argument("scenario", choices=["link_cut", "store_cut", "coordinator_cut", "lossy", "heal"])
    p.add_argument("workdir")
    p.add_argument("--steps", type=int, default=500)
    p.add_argument("--fault-s", type=float, default=2.0)
    p.add_argument("--loss-pct", type=float, default=30, help="lossy: share of host-b's outgoing packets lost")
    p.add_argument("--delay-ms", type=float, default=200, help="lossy: delay of host-b's outgoing packets")
    p.add_argument("--both-ways", action="store_true", help="lossy: host-b's incoming packets are lost too")
    p.add_argument("--spare", action="store_true", help="lossy, heal: host-c waits as a spare")
    a = p.parse_args()
    print(json.dumps(run(a.scenario, a.workdir, a.steps, a.fault_s, a.loss_pct, a.delay_ms, a.both_ways, a.spare)))


if __name__ == "__main__":
    main()
