"""`trainsup report` on a month of a 512-host job (bench/report_month.py's generator: 4,096 ranks,
40 incidents, six on h017 and five on h342, checkpoints every 10 minutes): it answers in seconds,
the page opens with the time lost by cause and the ETTR, ranks the hosts by incidents, lists
every incident with its own timeline of only the hosts involved, stays small, and headless
Chromium (Debian's) renders the summary at the top of the screen."""
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import time

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _generator():
    spec = importlib.util.spec_from_file_location("report_month", os.path.join(REPO, "bench", "report_month.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def month(tmp_path_factory):
    root = tmp_path_factory.mktemp("month")
    made = _generator().generate(str(root))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    t = time.monotonic()
    out = subprocess.run([sys.executable, "-m", "trainsup", "report", str(root / "run"), "--logs", str(root / "logs")],
                         capture_output=True, text=True, env=env, timeout=300)
    took = time.monotonic() - t
    assert out.returncode == 0, out.stderr[-3000:]
    return root, made, out.stdout, took


def test_a_month_on_512_hosts_reports_in_seconds_with_the_failing_hosts_first(month):
    root, made, stdout, took = month
    print(f"[measure] report of {made['events']:,} events ({made['rank_logs']} rank logs): {took:.2f} s")
    assert took < 30, took  # bench/report_month.py measures it (about 1.3 s here)
    summary = json.loads(stdout.strip().splitlines()[-1])
    assert len(summary["incidents"]) == 40
    assert summary["hosts_by_incidents"][:2] == [{"host": "h017", "incidents": 6}, {"host": "h342", "incidents": 5}]
    assert "read the event logs of rank 0 only" in stdout
    assert set(summary["lost_by_cause_s"]) == {"detection", "restart", "replay", "checkpoint_stall"}
    assert summary["lost_by_cause_s"]["checkpoint_stall"] > 0 and 0.99 < summary["ettr"] < 1
    page = (root / "run" / "report.html").read_text()
    size = len(page.encode())
    print(f"[measure] HTML {size / 1e3:.0f} kB")
    assert size < 1_000_000, size
    # The order a reader meets: time lost by cause and ETTR, then the hosts, then the incidents.
    first = [page.index(s) for s in ("ETTR", 'id="lost-by-cause"', "Hosts by incidents", "<details>")]
    assert first == sorted(first), first
    assert page.count("<details>") == 40
    hosts_table = page[page.index("Hosts by incidents"):page.index("<h2>Incidents")]
    assert re.search(r"<td>h017</td><td>6</td><td>gpu_hardware &times;6</td>", hosts_table)
    # Each incident's timeline shows the hosts involved, not 552 lanes.
    for block in page.split("<details>")[1:]:
        lanes = re.findall(r'<text x="8" y="[0-9]+" font-weight="bold">([^<]+)</text>', block)
        assert 1 <= len(lanes) <= 6, lanes
    assert "The whole run" not in page  # 552 hosts: no whole-run lanes


def _chromium():
    return shutil.which("chromium") or shutil.which("chromium-browser")


def test_headless_chromium_shows_the_summary_first(month, tmp_path):
    if _chromium() is None:
        pytest.skip("no chromium (scripts/install-deps.sh installs Debian's)")
    Image = pytest.importorskip("PIL.Image")
    root = month[0]
    shot = tmp_path / "report.png"
    out = subprocess.run([_chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                          "--window-size=1280,1000", f"--screenshot={shot}", (root / "run" / "report.html").as_uri()],
                         capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert shot.exists(), out.stderr[-2000:]
    img = Image.open(shot).convert("RGB")
    assert img.size == (1280, 1000)
    # The lost-by-cause bar, in the top fifth of the first screen: every cause's colour in it.
    from trainsup.tools.report import CAUSE_COLORS
    top = img.crop((0, 0, 1280, 200))
    counts = {rgb: n for n, rgb in top.getcolors(maxcolors=1 << 20)}
    for cause, color in CAUSE_COLORS.items():
        rgb = tuple(int(color[i:i + 2], 16) for i in (1, 3, 5))
        print(f"[screenshot] {cause} {color}: {counts.get(rgb, 0)} px in the top 200 px")
        assert counts.get(rgb, 0) >= 100, (cause, color)
    # The rest of the first screen is mostly the page's white and text, not an error page.
    white = counts.get((255, 255, 255), 0)
    assert white > 0.5 * 1280 * 200, white
