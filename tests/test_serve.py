"""`pswift history serve`: Datasette over a real history (a real local pswift run, ingested, and
Slurm records as the plugin gives them), read-only and local, its views and canned queries, and
its dashboard rendered by a real headless Chromium (Debian's): no console error, every chart
drawn (asserted on the DOM; the screenshot is kept as an artifact)."""

from __future__ import annotations

import hashlib
import re
import json
import os
import shutil
import socket
import sqlite3
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from http.cookiejar import CookieJar
from pathlib import Path

import pytest

from helpers import ROOT, copy_example, pswift
from pipeswift_slurm.history.store import History

pytestmark = [pytest.mark.deepspeed]
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
ARTIFACTS = Path(os.environ.get("PSWIFT_TEST_ARTIFACTS", ROOT / "test-artifacts"))
VEGA_CHARTS = ("jct-phases", "waste", "waits", "usage", "failures")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


#: the browser of whoever started the server: it opened the token URL, so it has the cookie
JAR = CookieJar()
OPENER = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(JAR))


def get(url: str) -> dict:
    with OPENER.open(url, timeout=30) as r:
        return json.loads(r.read())


def status_without_token(url: str, as_user: str | None = None) -> int:
    """The HTTP status another local user gets (no token, so no cookie)."""
    code = ("import sys, urllib.request, urllib.error\n"
            "try:\n urllib.request.urlopen(sys.argv[1], timeout=30); print(200)\n"
            "except urllib.error.HTTPError as e: print(e.code)\n")
    cmd = [*(["runuser", "-u", as_user, "--"] if as_user else []), "/usr/bin/python3", "-c", code, url]
    return int(subprocess.run(cmd, capture_output=True, text=True, timeout=60, check=True).stdout)


def token_url(server: subprocess.Popen, deadline: float) -> str:
    """The one-time URL the server prints at start (Datasette's --root)."""
    seen = []
    while time.time() < deadline:
        line = server.stdout.readline()
        if not line:
            break
        seen.append(line)
        m = re.search(r"(http://\S+/-/auth-token\?token=\w+)", line)
        if m:
            return m.group(1)
    raise AssertionError("no token URL printed: " + "".join(seen)[-2000:])


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    d = tmp_path_factory.mktemp("serve")
    toml = copy_example(d / "ex", {"steps": "6", "checkpoint_interval": "0"})
    run, db = d / "run", d / "history.db"
    proc = pswift("run", "--run-dir", str(run), str(toml), env={"PSWIFT_HOME": str(d / "home")})
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert pswift("history", "ingest", str(run), "--db", str(db)).returncode == 0
    t0 = time.time() - 3 * 86400
    h = History(db)
    h.add_slurm_records([
        {"JOBID": str(100 + i), "START": t0 + i * 3600, "END": t0 + i * 3600 + 1800, "SUBMIT": t0 + i * 3600 - 60 * i,
         "USERNAME": f"u{i % 3}", "ACCOUNT": f"a{i % 2}", "QOS": ("normal", "long")[i % 2], "PARTITION": "low",
         "JOBSTATE": ("COMPLETED", "FAILED", "PREEMPTED")[i % 3], "EXITCODE": ("0:0", "1:0", "0:15")[i % 3],
         "NODECNT": str(1 + i % 4), "PROCS": str(4 * (1 + i % 4)), "LIMIT": "01:00:00", "CLUSTER": "c"}
        for i in range(30)], "jobcomp")
    h.close()
    digest = hashlib.sha256(db.read_bytes()).hexdigest()
    port = free_port()
    server = subprocess.Popen([sys.executable, "-m", "pipeswift_slurm.cli.main", "history", "serve", "--db", str(db),
                               "--port", str(port)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    base = f"http://127.0.0.1:{port}"
    deadline = time.time() + 90
    url = token_url(server, deadline)
    while True:   # the token is for one use: nothing is consumed while the port refuses
        try:
            OPENER.open(url, timeout=30).read()
            break
        except (urllib.error.URLError, ConnectionError):
            assert server.poll() is None and time.time() < deadline, server.stdout.read() if server.poll() else "no answer"
            time.sleep(0.3)
    yield base, db, digest, server
    server.terminate()
    server.wait(timeout=30)
    import psutil
    left = [p.pid for p in psutil.process_iter(["cmdline"]) if str(db) in " ".join(p.info["cmdline"] or [])]
    assert not left, f"serve left processes behind: {left}"


def test_serve_listens_on_localhost_only_and_never_writes(served):
    import psutil
    base, db, digest, server = served
    procs = [psutil.Process(server.pid), *psutil.Process(server.pid).children(recursive=True)]
    listening = [c.laddr for p in procs for c in p.net_connections("inet") if c.status == psutil.CONN_LISTEN]
    assert listening and all(a.ip == "127.0.0.1" for a in listening), listening
    sql = urllib.parse.quote("DELETE FROM slurm_jobs")
    answer = None
    try:                                   # a write through the SQL API: refused
        OPENER.open(f"{base}/history.json?sql={sql}", timeout=30)
    except urllib.error.HTTPError as e:
        answer = e.code
    assert answer == 400
    assert get(f"{base}/history.json?sql=SELECT+COUNT(*)+FROM+slurm_jobs")["rows"] == [[30]]
    assert hashlib.sha256(db.read_bytes()).hexdigest() == digest
    assert get(f"{base}/-/settings.json")["sql_time_limit_ms"] == 2000


def test_other_local_users_get_nothing_without_the_token(served):
    """A second user of the login node, who has no token: every page, the data and the
    dashboard answer 403 (before, any local user read every user's jobs)."""
    base, _, _, _ = served
    for path in ("/", "/history/slurm_jobs.json", "/history/job_listing.json", "/-/dashboards/pswift",
                 "/history.json?sql=SELECT+1"):
        assert status_without_token(base + path) == 403, path
    if os.geteuid() == 0:
        assert status_without_token(base + "/history/slurm_jobs.json", as_user="nobody") == 403


def test_one_users_server_shows_that_users_jobs_only_and_leaves_no_copy(served, tmp_path):
    """What a user who does not own the database is served (here an admin's --user preview):
    a private copy of their own jobs, through real Datasette, removed when the server stops."""
    import psutil
    _, db, digest, _ = served
    before = set(Path(tempfile_dir()).glob("pswift-serve-*"))
    port = free_port()
    server = subprocess.Popen([sys.executable, "-m", "pipeswift_slurm.cli.main", "history", "serve", "--db", str(db),
                               "--port", str(port), "--user", "u1"],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(CookieJar()))
    try:
        url, deadline = token_url(server, time.time() + 90), time.time() + 90
        while True:
            try:
                opener.open(url, timeout=30).read()
                break
            except (urllib.error.URLError, ConnectionError):
                assert server.poll() is None and time.time() < deadline
                time.sleep(0.3)
        base = f"http://127.0.0.1:{port}/history"
        with opener.open(f"{base}.json?sql=SELECT+user,+COUNT(*)+FROM+slurm_jobs+GROUP+BY+user", timeout=30) as r:
            assert json.loads(r.read())["rows"] == [["u1", 10]]
        with opener.open(f"{base}.json?sql=SELECT+COUNT(*)+FROM+jobs", timeout=30) as r:
            assert json.loads(r.read())["rows"] == [[0]]          # the pswift run is root's
        with opener.open(f"{base}/job_listing.json?_shape=array", timeout=30) as r:
            assert {row["user"] for row in json.loads(r.read())} == {"u1"}
        copies = set(Path(tempfile_dir()).glob("pswift-serve-*")) - before
        assert len(copies) == 1 and oct((copies.pop()).stat().st_mode & 0o777) == "0o700"
    finally:
        server.terminate()
        server.wait(timeout=30)
    assert set(Path(tempfile_dir()).glob("pswift-serve-*")) == before
    assert not [p.pid for p in psutil.process_iter(["cmdline"]) if "pswift-serve-" in " ".join(p.info["cmdline"] or [])]
    assert hashlib.sha256(db.read_bytes()).hexdigest() == digest


def tempfile_dir() -> str:
    import tempfile
    return tempfile.gettempdir()


def test_metadata_views_and_canned_queries(served):
    base, db, _, _ = served
    meta = get(f"{base}/-/metadata.json")
    tables = meta["databases"]["history"]["tables"]
    assert tables["job_efficiency"]["units"]["max_rss_mb"] == "MB" and tables["usage_daily"]["title"]
    views = {v["name"] for v in get(f"{base}/history.json")["views"]}
    assert {"job_listing", "usage_daily", "job_efficiency", "job_waits", "failures", "preemption_waste",
            "jct_phases"} <= views
    phases = get(f"{base}/history/jct_phases.json?_shape=objects")["rows"]
    assert len(phases) == 1 and phases[0]["setup_s"] > 0 and phases[0]["training_s"] > 0
    failures = {(r["state"], r["exit_code"]): r["jobs"] for r in
                get(f"{base}/history/failures_by_exit_code.json?_shape=objects")["rows"]}
    assert failures == {("FAILED", "1:0"): 10, ("PREEMPTED", "0:15"): 10}
    util = get(f"{base}/history/utilisation_per_day.json?partition=low&nodes=4&_shape=objects")["rows"]
    assert util and abs(sum(r["busy_node_hours"] for r in util) - sum(0.5 * (1 + i % 4) for i in range(30))) < 1e-6
    waste = get(f"{base}/history/preemption_waste.json?_shape=objects")["rows"]
    assert len(waste) == 10 and all(r["wasted_hours"] > 0 for r in waste)


def filtered_jobs(base: str, query: str) -> list[str]:
    """The jobs metric as the browser draws it for the dashboard at ``?query``."""
    from playwright.sync_api import sync_playwright
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=["--no-sandbox"])
        try:
            context = browser.new_context()
            context.add_cookies([{"name": c.name, "value": c.value, "url": base} for c in JAR])
            page = context.new_page()
            page.goto(f"{base}/-/dashboards/pswift?{query}", wait_until="networkidle")
            page.wait_for_function("document.querySelector('#chart-jobs') && "
                                   "/\\d/.test(document.querySelector('#chart-jobs').innerText)", timeout=30_000)
            return page.inner_text("#chart-jobs").split()
        finally:
            browser.close()


def test_every_chart_query_runs_with_and_without_each_filter(served):
    """What the dashboard sends for each chart, with no filter and with all of them: it runs, and
    a filter never widens a chart; with no pswift job selected the JCT chart says so."""
    from datasette_dashboards import replace_opts_in_query
    from pipeswift_slurm.reports.serve import dashboard, filters
    _, db, _, _ = served
    d = dashboard("history")["pswift"]
    assert set(d["filters"]) == set(filters("history")) == {"date_start", "date_end", "partition", "user", "account"}
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    every = {"date_start": "2000-01-01", "date_end": "2999-12-31", "partition": "low", "user": "u1", "account": "a1"}
    for slug, chart in d["charts"].items():
        plain = conn.execute(replace_opts_in_query(chart["query"], {})).fetchall()
        narrowed = conn.execute(replace_opts_in_query(chart["query"], every), every).fetchall()
        assert plain and len(narrowed) <= len(plain), slug
    phases = d["charts"]["jct-phases"]["query"]
    nobody = {"user": "nobody"}
    (row,) = conn.execute(replace_opts_in_query(phases, nobody), nobody).fetchall()
    assert row[0] == "none" and "no pswift job in this selection" in row[1]


def test_the_dashboard_renders_in_a_real_browser_without_console_errors(served):
    if CHROMIUM is None:
        if os.environ.get("PSWIFT_REQUIRE_BROWSER"):
            pytest.fail("chromium is not installed (apt-get install chromium)")
        pytest.skip("chromium is not installed (apt-get install chromium)")
    from playwright.sync_api import sync_playwright
    base, _, _, _ = served
    errors: list[str] = []
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=["--no-sandbox"])
        try:
            context = browser.new_context(viewport={"width": 1400, "height": 1800})
            context.add_cookies([{"name": c.name, "value": c.value, "url": base}
                                 for c in JAR])
            page = context.new_page()
            page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
            page.on("pageerror", lambda e: errors.append(str(e)))
            page.on("requestfailed", lambda r: errors.append(f"request failed: {r.url}"))
            page.goto(f"{base}/-/dashboards/pswift", wait_until="networkidle")
            page.wait_for_function(f"document.querySelectorAll('.vega-embed canvas, .vega-embed svg').length "
                                   f">= {len(VEGA_CHARTS)}", timeout=30_000)
            page.screenshot(path=str(ARTIFACTS / "dashboard.png"), full_page=True)
            sizes = {slug: page.eval_on_selector(f"#chart-{slug} canvas, #chart-{slug} svg",
                                                 "el => [el.getBoundingClientRect().width, "
                                                 "el.getBoundingClientRect().height]") for slug in VEGA_CHARTS}
            jobs = page.inner_text("#chart-jobs")
        finally:
            browser.close()
    assert not errors, errors
    assert all(w > 100 and h > 50 for w, h in sizes.values()), sizes
    assert jobs.split() == ["30"]       # the Slurm jobs on record (the local run has no Slurm record)
    # a filter narrows every chart: u1's 10 jobs; none submitted after tomorrow
    assert filtered_jobs(base, "user=u1") == ["10"]
    tomorrow = time.strftime("%Y-%m-%d", time.localtime(time.time() + 86400))
    assert filtered_jobs(base, f"date_start={tomorrow}") == ["0"]
    assert (ARTIFACTS / "dashboard.png").stat().st_size > 20_000
