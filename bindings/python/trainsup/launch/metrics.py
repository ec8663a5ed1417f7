"""The launcher agent's /metrics (Prometheus text format) and /status (JSON), on one HTTP port
(process: the launcher agent; docs/metrics.md).

Contract. `MetricsServer(state, run_dir, logs_dir, port, bind)` serves, on a daemon thread:
- `/metrics`: what `prometheus-client` renders from a collector that reads everything at scrape
  time (no second bookkeeping that could drift from the event logs):
  - every agent: its host's view (`trainsup_agent_*`, label `host`);
  - the agent whose coordinator is in office (one per job at a time): the job-wide metrics,
    computed from the run directory's event logs by the same analysis as `trainsup report`
    (trainsup/tools/report.py analyse), so PromQL and the report agree, plus the coordinator's
    live state (step times, open collectives) and the job's restart and quarantine counts.
    When the office moves, the new holder reads the same logs: the counters go on where they were.
- `/status`: the same as JSON, plus the slowest ranks and the oldest open collectives with the
  ranks (and hosts) that have not entered them: `trainsup status RUN_DIR` reads it from every
  agent (their addresses are in `<run dir>/agent-<host>.endpoint`).
`state()` is the agent's callable returning its current view (launcher.py `_metrics_state`).
The event logs are read incrementally (each file from where the last read stopped) at most
every `refresh_s`. A log that cannot be read counts as empty; the server never stops the agent.
"""
import json
import os
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple

from .. import names
from ..tools import report

__all__ = ["MetricsServer", "RunDirTail", "DETECTION_BUCKETS_S", "STALL_BUCKETS_S"]

# Histogram buckets (seconds): detection is seconds to minutes; checkpoint times are ms to minutes.
DETECTION_BUCKETS_S = (0.5, 1, 2, 5, 10, 20, 30, 60, 120, 300, 600, 1800)
STALL_BUCKETS_S = (0.001, 0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300)
QUANTILES = (0.5, 0.9, 0.99)


class _FileTail:
    """One JSON-lines file read from where the last read stopped (a torn last line waits)."""

    def __init__(self, path: str) -> None:
        self.path, self.offset, self.events = path, 0, []  # type: str, int, List[Dict[str, Any]]

    def read(self) -> None:
        try:
            with open(self.path, "rb") as f:
                f.seek(self.offset)
                data = f.read()
        except OSError:
            return
        end = data.rfind(b"\n") + 1  # complete lines only
        for line in data[:end].splitlines():
            try:
                self.events.append(json.loads(line))
            except ValueError:
                pass
        self.offset += end


class RunDirTail:
    """The job's event logs (agents', ranks', fault markers) read incrementally; analysis() is
    `trainsup report`'s analyse() of everything read so far."""

    def __init__(self, run_dir: str, logs_dir: Optional[str]) -> None:
        self.run_dir = run_dir
        self.logs_dir = logs_dir or report.default_logs_dir(run_dir)
        self.tails: Dict[str, _FileTail] = {}

    def _files(self) -> Iterator[Tuple[str, str]]:
        import glob
        for p in glob.glob(names.agent_events_file(self.run_dir, "*")):
            yield "agent", p
        for p in report.rank_logs(self.logs_dir)[0]:  # past 64 rank logs, rank 0's (as the report)
            yield "rank", p
        yield "fault", names.faults_file(self.run_dir)

    def read(self) -> Tuple[List[Dict[str, Any]], List[Dict[str, Any]], List[Dict[str, Any]]]:
        agents: List[Dict[str, Any]] = []
        ranks: List[Dict[str, Any]] = []
        faults: List[Dict[str, Any]] = []
        for kind, path in self._files():
            t = self.tails.get(path)
            if t is None:
                t = self.tails[path] = _FileTail(path)
            before = len(t.events)
            t.read()
            if kind == "rank":
                for e in t.events[before:]:
                    e["time"] = e.get("wall_s", 0.0)
            (agents if kind == "agent" else ranks if kind == "rank" else faults).extend(t.events)
        return agents, ranks, faults


def _histogram(name: str, doc: str, values: List[float], bounds: Tuple[float, ...]):
    from prometheus_client.core import HistogramMetricFamily
    h = HistogramMetricFamily(name, doc)
    buckets = [(repr(float(b)), float(sum(1 for v in values if v <= b))) for b in bounds]
    buckets.append(("+Inf", float(len(values))))
    h.add_metric([], buckets, sum_value=float(sum(values)))
    return h


def _quantile(sorted_values: List[float], q: float) -> float:
    i = min(len(sorted_values) - 1, max(0, int(round(q * (len(sorted_values) - 1)))))
    return sorted_values[i]


class _Collector:
    def __init__(self, server: "MetricsServer") -> None:
        self.server = server

    def describe(self):  # no fixed list: families depend on the office (prometheus-client asks)
        return []

    def collect(self):
        from prometheus_client.core import GaugeMetricFamily
        st = self.server.state()
        host = st["host"]
        g = GaugeMetricFamily("trainsup_agent_info", "This launcher agent (value 1)", labels=["host", "run_id"])
        g.add_metric([host, st.get("run_id", "")], 1)
        yield g
        for name, doc, value in (
                ("trainsup_agent_round", "The rendezvous round this agent is in (-1: none yet)", st.get("round", -1)),
                ("trainsup_agent_in_round", "1 while this host trains in a round, 0 while it waits (a spare)",
                 1 if st.get("in_round") else 0),
                ("trainsup_agent_coordinator", "1 if this agent holds the job's coordinator (and the job's metrics)",
                 1 if st.get("in_office") else 0)):
            g = GaugeMetricFamily(name, doc, labels=["host"])
            g.add_metric([host], value)
            yield g
        if not st.get("in_office"):
            return
        yield from self.job_families(st)

    def job_families(self, st: Dict[str, Any]):
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
        a, ckpt = self.server.job_analysis()
        incidents = a.get("incidents", []) if a else []
        c = CounterMetricFamily("trainsup_incidents", "Incidents (a round ended by a fatal verdict), by verdict kind "
                                "and culprit host", labels=["kind", "host"])
        counts: Dict[Tuple[str, str], int] = {}
        for inc in incidents:
            key = (inc["verdict"], (inc.get("hosts") or ["?"])[0])
            counts[key] = counts.get(key, 0) + 1
        for (kind, h), n in sorted(counts.items()):
            c.add_metric([kind, h], n)
        yield c
        yield _histogram("trainsup_detection_seconds", "Fault to verdict, per incident with a known fault time",
                         [i["detection_s"] for i in incidents if i.get("detection_s") is not None],
                         DETECTION_BUCKETS_S)
        lost = CounterMetricFamily("trainsup_lost_seconds", "Time lost, by cause: detection (fault to verdict), restart "
                                   "(verdict to the first step after resume), replay (work redone since the restored "
                                   "checkpoint), checkpoint_stall (training held by checkpoint saves)", labels=["cause"])
        by = a["lost_by_cause_s"] if a else {c: 0.0 for c in ("detection", "restart", "replay", "checkpoint_stall")}
        for cause, v in by.items():
            lost.add_metric([cause], v)
        yield lost
        wall = a.get("wall_s", 0.0) if a else 0.0
        for name, doc, value in (
                ("trainsup_wall_seconds", "The job's wall time so far (first to last event)", wall),
                ("trainsup_ettr_ratio", "Effective training time ratio so far, as `trainsup report` computes it: "
                 "(wall - detection - restart - replay) / wall", a.get("ettr", 1.0) if a else 1.0),
                ("trainsup_goodput_ratio", "(wall - all time lost, checkpoint stalls included) / wall",
                 a.get("goodput", 1.0) if a else 1.0),
                ("trainsup_checkpoint_newest_step", "The newest committed checkpoint's step (-1: none)",
                 ckpt["newest_step"])):
            g = GaugeMetricFamily(name, doc)
            g.add_metric([], value)
            yield g
        for name, doc, field in (("trainsup_checkpoint_stall_seconds", "Training held by a checkpoint save (the slowest rank's, per save)", "stall_s"),
                               ("trainsup_checkpoint_persist_seconds", "A checkpoint's write and commit in the background", "persist_s"),
                               ("trainsup_checkpoint_restore_seconds", "A restore's duration (the slowest rank's)", "restore_s")):
            yield _histogram(name, doc, ckpt[field], STALL_BUCKETS_S)
        snap = st.get("snapshot") or {}
        steps = sorted(r["step_s"] for r in snap.get("ranks", []) if r.get("step_s", -1) > 0)
        g = GaugeMetricFamily("trainsup_step_time_seconds", "Seconds per step across the ranks (each rank's recent "
                              "rate), by quantile over ranks; quantile=1 is the slowest rank", labels=["quantile"])
        if steps:
            for q in QUANTILES:
                g.add_metric([str(q)], _quantile(steps, q))
            g.add_metric(["1"], steps[-1])
        yield g
        g = GaugeMetricFamily("trainsup_host_quarantined", "1 for each host with a live quarantine record", labels=["host"])
        for h in st.get("quarantined", []):
            g.add_metric([h], 1)
        yield g
        oldest = snap.get("oldest_open") or []
        for name, doc, value in (
                ("trainsup_collectives_open", "Collectives some rank entered and not every rank has finished", snap.get("open", 0)),
                ("trainsup_collective_oldest_open_age_seconds", "Age of the oldest open collective (0: none)",
                 oldest[0]["age_s"] if oldest else 0.0),
                ("trainsup_quarantined_hosts", "Hosts with a live quarantine record", len(st.get("quarantined", []))),
                ("trainsup_spares_waiting", "Nodes waiting to join (spares, newcomers), as the last round saw them",
                 st.get("spares_waiting", 0)),
                ("trainsup_restarts_used", "Restarts of the whole job so far", st.get("restarts_used", 0)),
                ("trainsup_restarts_left", "Restarts left before the job gives up (--max-job-restarts)",
                 max(0, st.get("max_restarts", 0) - st.get("restarts_used", 0))),
                ("trainsup_ranks", "Ranks in the current round", len(snap.get("ranks", [])))):
            g = GaugeMetricFamily(name, doc)
            g.add_metric([], value)
            yield g


class MetricsServer:
    """/metrics and /status for one agent (see the module's contract)."""

    def __init__(self, state: Callable[[], Dict[str, Any]], run_dir: str, logs_dir: Optional[str], port: int,
                 bind: str = "0.0.0.0", refresh_s: float = 2.0) -> None:
        from prometheus_client import CollectorRegistry
        self.state = state
        self.tail = RunDirTail(run_dir, logs_dir)
        self.refresh_s = refresh_s
        self._lock = threading.Lock()
        self._analysis: Tuple[float, Optional[Dict[str, Any]], Dict[str, Any]] = (-1e18, None,
                                                                                  report.checkpoint_figures([]))
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(_Collector(self))
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):  # noqa: N802 (http.server's name)
                try:
                    path = self.path.split("?", 1)[0]
                    if path == "/metrics":
                        from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
                        body, ctype = generate_latest(server.registry), CONTENT_TYPE_LATEST
                    elif path == "/status":
                        body, ctype = json.dumps(server.status()).encode(), "application/json"
                    else:
                        self.send_error(404, "trainsup agent: /metrics or /status")
                        return
                except Exception as e:  # a bad scrape is the scraper's error, never the agent's end
                    self.send_error(500, f"{type(e).__name__}: {e}")
                    return
                self.send_response(200)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):  # scrapes every few seconds: not the agent's output
                pass

        self.httpd = ThreadingHTTPServer((bind, port), Handler)
        self.httpd.daemon_threads = True
        self.port = self.httpd.server_address[1]
        self._thread = threading.Thread(target=self.httpd.serve_forever, name="trainsup-metrics", daemon=True)
        self._thread.start()

    def job_analysis(self) -> Tuple[Optional[Dict[str, Any]], Dict[str, Any]]:
        """`trainsup report`'s analysis of the logs so far and the checkpoint figures, at most
        refresh_s old."""
        with self._lock:
            at, a, ckpt = self._analysis
            if time.monotonic() - at >= self.refresh_s:
                agents, ranks, faults = self.tail.read()
                try:
                    a = report.analyse(agents, ranks, faults)
                except ValueError:  # no events yet
                    a = None
                ckpt = report.checkpoint_figures(ranks)
                self._analysis = (time.monotonic(), a, ckpt)
            return a, ckpt

    def status(self) -> Dict[str, Any]:
        """What `trainsup status` shows (docs/metrics.md)."""
        st = self.state()
        out: Dict[str, Any] = {k: st.get(k) for k in ("host", "run_id", "round", "world", "in_round", "in_office",
                                                      "hosts", "coordinator")}
        if not st.get("in_office"):
            return out
        a, ckpt = self.job_analysis()
        snap = st.get("snapshot") or {}
        ranks = snap.get("ranks", [])
        host_of = {r["rank"]: r["host"] for r in ranks}
        out["ranks"] = len(ranks)
        out["slowest"] = sorted((r for r in ranks if r.get("step_s", -1) > 0), key=lambda r: -r["step_s"])[:5]
        out["oldest_open"] = [dict(o, missing_hosts=sorted({host_of.get(m, "?") for m in o["missing"]}))
                              for o in snap.get("oldest_open", [])]
        out["open_collectives"] = snap.get("open", 0)
        out["incidents"] = [{k: i.get(k) for k in ("round", "verdict", "hosts", "verdict_time", "detection_s",
                                                    "restart_s", "replay_s", "lost_s")} for i in (a or {}).get("incidents", [])]
        out["ettr"] = (a or {}).get("ettr")
        out["newest_checkpoint_step"] = ckpt["newest_step"]
        out["quarantined"] = st.get("quarantined", [])
        out["spares_waiting"] = st.get("spares_waiting", 0)
        out["restarts_used"] = st.get("restarts_used", 0)
        out["max_restarts"] = st.get("max_restarts", 0)
        return out

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
