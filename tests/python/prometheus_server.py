"""A Prometheus server for the suite (issue 24): Debian's `prometheus` (2.42), started and stopped
by the test, scraping trainsup agents every second. Its targets come from a file_sd file the
test writes from the agents' endpoint files (<run dir>/agent-<host>.endpoint), as an operator's
discovery would; Prometheus re-reads the file when it changes.

    with PrometheusServer(workdir) as p:
        p.set_targets(run_dir)                 # whenever agents appear
        p.query('trainsup_incidents_total')    # PromQL through the HTTP API: the result list
"""
import glob
import json
import os
import pathlib
import shutil
import subprocess
import urllib.parse
import urllib.request

from daemons import Daemons
from trainsup import names
from trainsup.ports import free_port


def binary():
    return shutil.which("prometheus") or ("/usr/bin/prometheus" if os.path.exists("/usr/bin/prometheus") else None)


class PrometheusServer(Daemons):
    def __init__(self, workdir, scrape_interval="1s"):
        self.dir = pathlib.Path(workdir).resolve()
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.scrape_interval = scrape_interval
        self.procs = {}
        self.log_dir = self.dir / "prometheus.log"
        self.targets = self.dir / "targets.json"

    def start(self):
        self.dir.mkdir(parents=True, exist_ok=True)
        self.targets.write_text("[]")
        cfg = {"global": {"scrape_interval": self.scrape_interval, "evaluation_interval": self.scrape_interval},
               "scrape_configs": [{"job_name": "trainsup", "scrape_timeout": self.scrape_interval,
                                   "file_sd_configs": [{"files": [str(self.targets)], "refresh_interval": "1s"}]}]}
        (self.dir / "prometheus.yml").write_text(json.dumps(cfg))  # JSON is YAML
        log = open(self.dir / "prometheus.log", "ab")
        self.procs["prometheus"] = subprocess.Popen([binary(), f"--config.file={self.dir / 'prometheus.yml'}",
                                                     f"--storage.tsdb.path={self.dir / 'data'}",
                                                     f"--web.listen-address=127.0.0.1:{self.port}"],
                                                    stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        log.close()
        self._until(self._ready, 60, "prometheus ready (/-/ready)")
        return self

    def _ready(self):
        try:
            with urllib.request.urlopen(self.url + "/-/ready", timeout=2) as r:
                return r.status == 200
        except OSError:
            return False

    def stop(self):
        p = self.procs.get("prometheus")
        if p is not None and p.poll() is None:
            p.terminate()
            try:
                p.wait(15)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(5)

    def set_targets(self, run_dir):
        """Scrape every agent that left an endpoint in `run_dir`; returns the addresses."""
        hosts = []
        for path in sorted(glob.glob(names.endpoint_file(str(run_dir), "*"))):
            url = pathlib.Path(path).read_text().strip()
            hosts.append(urllib.parse.urlparse(url).netloc)
        tmp = self.targets.with_suffix(".tmp")
        tmp.write_text(json.dumps([{"targets": hosts, "labels": {"job_dir": str(run_dir)}}]))
        os.replace(tmp, self.targets)
        return hosts

    def query(self, promql, at=None):
        """An instant query through the HTTP API (at: Unix time, default now); the result list."""
        params = {"query": promql}
        if at is not None:
            params["time"] = f"{at:.3f}"
        with urllib.request.urlopen(f"{self.url}/api/v1/query?{urllib.parse.urlencode(params)}", timeout=10) as r:
            body = json.loads(r.read())
        assert body["status"] == "success", body
        return body["data"]["result"]

    def scraped(self):
        """{address: health} of the active targets."""
        with urllib.request.urlopen(f"{self.url}/api/v1/targets", timeout=10) as r:
            body = json.loads(r.read())
        return {t["scrapeUrl"]: t["health"] for t in body["data"]["activeTargets"]}
