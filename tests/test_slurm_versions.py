"""The Slurm boundary on whichever Slurm runs the suite (`make test` runs this file on Debian's
22.05 and on 25.11 built from source): the planner's view of a live situation, through every
query backend there is; backend choice and its failure modes; accounting through a real
slurmdbd, read incrementally; the environment check."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from helpers import PSWIFT, pswift, wait_state

pytestmark = [pytest.mark.slurm, pytest.mark.every_version]

VIEW = """
import json, sys
from pipeswift_slurm.slurm import client as slurm
state = slurm.cluster_state()
ids = sys.argv[1:]
print(json.dumps({
    "backend": slurm.backend().name, "now": state.now,
    "nodes": [[n.name, n.cpus, n.idle_cpus, list(n.partitions), n.state.split("+")[0]] for n in state.nodes],
    "running": [[r.job_id, list(r.nodes), r.end_time, r.start_time, r.user_id] for r in state.running if r.job_id in ids],
    "pending": [[p.job_id, p.partition, p.node_count, p.time_limit_s] for p in state.pending if p.job_id in ids],
    "job": [getattr(slurm.job_info(i), k) for i in ids[:1] for k in ("state", "node_names", "node_count", "time_limit_min", "end_time")],
    "preempting": slurm.being_preempted(ids[0]),
}))
"""


def sbatch(*args: str) -> str:
    return subprocess.run(["sbatch", "--parsable", "-o", "/dev/null", *args], capture_output=True,
                          text=True, check=True).stdout.strip()


def pyslurm_usable() -> bool:
    from pipeswift_slurm.slurm import client as slurm
    from pipeswift_slurm.slurm import pyslurm_backend as slurm_pyslurm
    return slurm_pyslurm.unusable(slurm.slurm_version()) is None


def backends() -> list[str]:
    """cli always; pyslurm where it serves this Slurm (`make test-new` sets PSWIFT_REQUIRE_PYSLURM:
    there a missing pyslurm fails instead of skipping)."""
    return ["cli", "pyslurm"]


def view(backend: str, *ids: str) -> tuple[dict, str]:
    proc = subprocess.run([sys.executable, "-c", VIEW, *ids], capture_output=True, text=True,
                          timeout=60, env={**os.environ, "PSWIFT_SLURM_BACKEND": backend})
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout), proc.stderr


@pytest.mark.parametrize("backend", backends())
def test_the_planner_sees_a_live_situation_the_same_on_every_version_and_backend(cluster, backend):
    if backend == "pyslurm" and not pyslurm_usable():
        if os.environ.get("PSWIFT_REQUIRE_PYSLURM") == "1":
            pytest.fail("PSWIFT_REQUIRE_PYSLURM=1 but pyslurm cannot serve this Slurm")
        pytest.skip("pyslurm is not installed for this Slurm (make pyslurm builds it for 25.11)")
    hold = sbatch("-N3", "-t", "60", "--exclusive", "-J", "holder", "--wrap", "sleep 300")
    try:
        wait_state(hold, {"RUNNING"}, timeout=60)
        wait = sbatch("-N4", "-t", "30", "-J", "waiter", "--wrap", "true")
        time.sleep(1.5)
        got, err = view(backend, hold, wait)
    finally:
        subprocess.run(["scancel", hold, wait if "wait" in locals() else hold])
    assert got["backend"] == backend and err == ""
    held = got["running"][0][1]
    assert len(held) == 3 and got["running"][0][0] == hold
    assert abs(got["running"][0][2] - got["now"] - 3600) < 30        # start + 60 min
    assert got["running"][0][2] - got["running"][0][3] == 3600 and got["running"][0][4] == os.getuid()
    assert got["pending"] == [[wait, "low", 4, 1800.0]]
    for name, cpus, idle, parts, state in got["nodes"]:
        assert cpus == 8 and parts == ["low", "high"]
        if name in held:
            assert (idle, state) == (0, "allocated")
    free = [n for n in got["nodes"] if n[0] not in held]
    assert len(free) == 1 and free[0][2] == 8 and free[0][4] in ("idle", "mixed")
    assert got["job"][:4] == ["RUNNING", held, 3, 60] and got["preempting"] is False


REQUEUED = """
import json, sys
from pipeswift_slurm.slurm import client as slurm
print(json.dumps([slurm.being_preempted(sys.argv[1]), slurm.being_preempted(sys.argv[1], 0),
                  slurm.being_preempted(sys.argv[1], 1)]))
"""


@pytest.mark.parametrize("backend", backends())
def test_a_job_slurm_already_requeued_counts_as_preempted_for_the_attempt_it_ended(cluster, backend):
    """A requeue clears PreemptTime; when the grace time runs out during a controller outage,
    Slurm's requeue comes before the launcher can ask. Attempt 0 must still read "preempted"
    (before: "cancelled", and the job's history lost its preemption)."""
    if backend == "pyslurm" and not pyslurm_usable():
        pytest.skip("pyslurm is not installed for this Slurm")
    job = sbatch("-N1", "-t", "5", "--requeue", "--wrap", "sleep 300")
    try:
        wait_state(job, {"RUNNING"}, timeout=60)
        subprocess.run(["scontrol", "requeue", job], check=True, capture_output=True, timeout=30)
        wait_state(job, {"PENDING"}, timeout=60)
        proc = subprocess.run([sys.executable, "-c", REQUEUED, job], capture_output=True, text=True,
                              timeout=60, env={**os.environ, "PSWIFT_SLURM_BACKEND": backend})
    finally:
        subprocess.run(["scancel", job])
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == [False, True, False]   # no attempt given; attempt 0; the new attempt 1


def test_a_pyslurm_for_another_slurm_is_one_warning_and_the_commands(cluster, tmp_path):
    """A pyslurm built for another Slurm major.minor is never imported (its import would load
    that Slurm's library): one warning line, and the CLI answers."""
    fake = tmp_path / "site" / "pyslurm"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("raise SystemExit('imported a pyslurm built for another Slurm')\n")
    (fake / "version.py").write_text('__version__ = "19.05.0"\n')
    env = {"PYTHONPATH": str(tmp_path / "site")}
    got, err = view_env("auto", env)
    assert got["backend"] == "cli"
    assert err.count("\n") == 1 and err.startswith("pswift: warning: pyslurm 19.05.0 does not match the Slurm")
    assert "using Slurm's commands instead" in err
    proc = pswift("doctor", env=env)
    assert "query backend: cli (pyslurm 19.05.0 does not match" in proc.stdout


def view_env(backend: str, extra: dict[str, str]) -> tuple[dict, str]:
    hold = sbatch("-N1", "-t", "5", "--wrap", "sleep 30")
    try:
        proc = subprocess.run([sys.executable, "-c", VIEW, hold], capture_output=True, text=True, timeout=60,
                              env={**os.environ, **extra, "PSWIFT_SLURM_BACKEND": backend})
    finally:
        subprocess.run(["scancel", hold])
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout), proc.stderr


def test_backend_choice_errors_are_one_line(cluster, tmp_path):
    proc = pswift("status", "1", env={"PSWIFT_SLURM_BACKEND": "slurmrestd"})
    assert proc.returncode == 1 and proc.stderr.count("\n") == 1
    assert "PSWIFT_SLURM_BACKEND='slurmrestd': use cli, pyslurm or leave it unset" in proc.stderr
    if not pyslurm_usable():
        got, err = view_env("pyslurm", {})
        assert got["backend"] == "cli" and err.startswith("pswift: warning: pyslurm")


def test_doctor_checks_the_environment(cluster, tmp_path):
    proc = pswift("doctor", "--db", str(tmp_path / "h.db"))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    from pipeswift_slurm.slurm import client as slurm
    v = ".".join(map(str, slurm.slurm_version()))
    assert f"ok  Slurm: {v}, cluster pswiftdev" in proc.stdout
    assert f"ok  Slurm configuration: {os.environ['SLURM_CONF']} ($SLURM_CONF)" in proc.stdout
    assert "history DB: " in proc.stdout and "accounting: off (no slurmdbd)" in proc.stdout
    bad = pswift("doctor", env={"SLURM_CONF": str(tmp_path / "nope.conf")})
    assert bad.returncode == 1 and "BAD Slurm configuration" in bad.stdout
    assert bad.stderr.count("\n") == 1 and "point SLURM_CONF at an existing slurm.conf" in bad.stderr


def sacct_has(*ids: str, timeout: float = 60) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        out = subprocess.run(["sacct", "-n", "-X", "-P", "-o", "jobid,state", "-j", ",".join(ids)],
                             capture_output=True, text=True).stdout.split()
        done = [line for line in out if line.split("|")[1] in ("COMPLETED", "FAILED")]
        if len(done) >= len(ids):
            return
        time.sleep(0.5)
    raise AssertionError(f"sacct does not show {ids} finished after {timeout} s")


def settled_qos(job: str, timeout: float = 20) -> str | None:
    """The QOS sacct shows for a finished job, waiting up to timeout s for slurmdbd to fill it
    (until then sacct prints "Unknown" or nothing, and --json has null)."""
    deadline = time.time() + timeout
    while True:
        qos = subprocess.run(["sacct", "-n", "-X", "-P", "-o", "qos", "-j", job], capture_output=True,
                             text=True, timeout=60).stdout.strip()
        if qos not in ("", "Unknown") or time.time() > deadline:
            return qos if qos not in ("", "Unknown") else None
        time.sleep(0.5)


def ingest(db: Path) -> tuple[int, int]:
    proc = pswift("history", "ingest", "--sacct", "--no-registered", "--db", str(db))
    assert proc.returncode == 0 and "warning" not in proc.stderr, proc.stdout + proc.stderr
    import re
    m = re.search(r"(\d+) sacct record\(s\) of cluster pswiftacct \((\d+) new\)", proc.stdout)
    assert m, proc.stdout
    return int(m.group(1)), int(m.group(2))


def test_ingest_sacct_reads_a_real_slurmdbd_incrementally(acct_cluster, tmp_path, monkeypatch):
    monkeypatch.setenv("SLURM_CONF", acct_cluster)
    ok = sbatch("-J", "ok", "--wrap", "true")
    bad = sbatch("-J", "bad", "--wrap", "exit 3")
    sacct_has(ok, bad)
    db = tmp_path / "history.db"
    read, new = ingest(db)
    assert 2 <= new <= read
    import sqlite3
    rows = {r[0]: r[1:] for r in sqlite3.connect(db).execute(
        "SELECT job_id, cluster, name, state, exit_code, user FROM slurm_jobs WHERE job_id IN (?, ?)", (ok, bad))}
    from pipeswift_slurm.slurm import client as slurm
    if slurm.slurm_version()[:2] > (22, 5):
        assert rows[ok] == ("pswiftacct", "ok", "COMPLETED", "0:0", "root")
        assert rows[bad] == ("pswiftacct", "bad", "FAILED", "3:0", "root")
    else:  # 22.05's slurmdbd keeps a job that starts at submission as "allocation", exit 0:0
        assert (rows[ok][0], rows[ok][2], rows[ok][4]) == ("pswiftacct", "COMPLETED", "root")
        assert (rows[bad][0], rows[bad][2], rows[bad][4]) == ("pswiftacct", "FAILED", "root")
    assert ingest(db)[1] == 0                     # twice: nothing new, nothing duplicated
    third = sbatch("-J", "third", "--wrap", "true")
    sacct_has(third)
    read3, new3 = ingest(db)
    assert new3 == 1 and read3 <= 3, (read3, read)   # from the last end time on, not from 1970
    count = sqlite3.connect(db).execute("SELECT COUNT(*), COUNT(DISTINCT job_id || start) FROM slurm_jobs").fetchone()
    assert count[0] == count[1]


def test_a_job_arrays_tasks_are_tied_to_their_array_in_the_history(acct_cluster, tmp_path, monkeypatch):
    """sacct's array fields, as each version writes them, reach the history: every task is a
    Slurm job of its own, tied to the array's id by its index, and `history show ARRAY` lists
    them (a pswift run of members is such an array)."""
    monkeypatch.setenv("SLURM_CONF", acct_cluster)
    arr = sbatch("-J", "arr", "--array=0-1", "--wrap", "true")
    sacct_has(arr, arr)                                       # the array's two tasks
    db = tmp_path / "history.db"
    ingest(db)
    import sqlite3
    tasks = dict(sqlite3.connect(db).execute(
        "SELECT array_task_id, job_id FROM slurm_jobs WHERE array_job_id = ?", (arr,)).fetchall())
    assert sorted(tasks) == [0, 1] and len(set(tasks.values())) == 2 and arr in tasks.values(), tasks
    plain = sqlite3.connect(db).execute("SELECT COUNT(*) FROM slurm_jobs WHERE array_job_id IS NULL AND "
                                        "array_task_id IS NOT NULL").fetchone()[0]
    assert plain == 0
    shown = json.loads(pswift("history", "show", arr, "--db", str(db), "--json", check=True).stdout)
    assert [(m["task"], m["job_id"], m["attempts"], m["state"]) for m in shown["members"]] == \
        [(0, tasks[0], 1, "COMPLETED"), (1, tasks[1], 1, "COMPLETED")], shown["members"]
    text = pswift("history", "show", arr, "--db", str(db), check=True).stdout
    assert f"2 member job(s) of array {arr}:" in text and f"task 1: job {tasks[1]}, 1 attempt(s)" in text, text


def test_ingest_follow_fills_the_history_from_sacct_as_a_service(acct_cluster, tmp_path, monkeypatch):
    """Where the jobcomp plugin is not installed (a site's own JobCompType): `history ingest
    --sacct --follow` keeps the history current from slurmdbd, each job once, until TERM."""
    import signal
    import sqlite3
    import time
    monkeypatch.setenv("SLURM_CONF", acct_cluster)
    db = tmp_path / "history.db"
    service = subprocess.Popen([*PSWIFT, "history", "ingest", "--sacct", "--follow", "--interval", "1",
                                "--db", str(db)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        job = sbatch("-J", "followed", "--wrap", "true")
        sacct_has(job)
        deadline = time.monotonic() + 60
        rows: list = []
        while time.monotonic() < deadline and not rows:
            time.sleep(1)
            if db.exists():
                rows = sqlite3.connect(db).execute("SELECT name, state FROM slurm_jobs WHERE job_id = ?",
                                                   (job,)).fetchall()
        # 22.05's slurmdbd names a job that starts at its submission "allocation" (see above)
        assert len(rows) == 1 and rows[0][0] in ("followed", "allocation") and rows[0][1] == "COMPLETED", rows
        # the job can be in the first pass (a busy slurmdbd's first read is long): let one more
        # pass (--interval 1) find it again and add nothing before the service is stopped
        time.sleep(3)
    finally:
        service.send_signal(signal.SIGTERM)
        out, err = service.communicate(timeout=30)
    assert service.returncode == 0 and "Traceback" not in err, err
    assert out.count("ingested 0 changed run directories") >= 2, out
    count = sqlite3.connect(db).execute("SELECT COUNT(*), COUNT(DISTINCT job_id || start) FROM slurm_jobs").fetchone()
    assert count[0] == count[1]


def test_submit_warns_when_slurm_would_hold_the_job_before_max_requeues(acct_cluster, tmp_path, monkeypatch):
    """From 24.05 Slurm requeues preempted jobs itself and holds a job after MaxBatchRequeue - 1
    such requeues (seen in the preemption storm test before the dev cluster raised it): a
    max_requeues past that is said at submission. Before 24.05 there is no such limit."""
    from helpers import copy_example
    from pipeswift_slurm.slurm import client as slurm
    monkeypatch.setenv("SLURM_CONF", acct_cluster)
    toml = copy_example(tmp_path / "ex", {"max_requeues": "6"})
    proc = pswift("sbatch", "--parsable", "--run-dir", str(tmp_path / "run"), str(toml), "--", "--hold")
    assert proc.returncode == 0, proc.stderr
    subprocess.run(["scancel", proc.stdout.strip()])
    if slurm.slurm_version()[:2] >= (24, 5):
        assert proc.stderr.count("\n") == 1 and "holds a job after 4 automatic requeues (MaxBatchRequeue = 5" in proc.stderr
        assert "set max_requeues <= 4 or raise MaxBatchRequeue" in proc.stderr
    else:
        assert proc.stderr == ""


def test_sacct_gives_the_admin_fields_and_the_reports_use_them(acct_cluster, tmp_path, monkeypatch):
    """Through slurmdbd: account, QOS, allocated CPUs, requested memory, the limit, CPU time
    and MaxRSS (jobacct_gather/linux) of a job that burns 3 s of CPU holding 80 MB; then the
    efficiency and failures reports over them."""
    monkeypatch.setenv("SLURM_CONF", acct_cluster)
    burn = ("import time\nx = bytearray(80 * 2**20)\nfor i in range(0, len(x), 4096): x[i] = 1\n"
            "t = time.process_time()\nwhile time.process_time() - t < 3: pass\n")
    (tmp_path / "burn.py").write_text(burn)
    busy = sbatch("-J", "busy", "-t", "5", "--mem=200M", "--wrap", f"{sys.executable} {tmp_path / 'burn.py'}")
    bad = sbatch("-J", "bad", "-t", "5", "--wrap", "exit 3")
    sacct_has(busy, bad)
    # the QOS slurmdbd recorded, read back with sacct itself: "normal", the account's default. On
    # 22.05 slurmdbd shows a finished job with QOS "Unknown" for ~2 s and fills it in after (a CI
    # run ingested it empty and read "normal" from sacct later), so the ingest runs once sacct's
    # record has settled; a QOS that never comes is compared as None
    recorded = settled_qos(busy)
    db = tmp_path / "history.db"
    ingest(db)
    row = json.loads(pswift("history", "jobs", "--db", str(db), "-j", busy, "--json", check=True).stdout)[0]
    assert recorded in ("normal", None) and row["qos"] == recorded, (row["qos"], recorded)
    assert (row["account"], row["state"], row["derived_exit_code"]) == ("root", "COMPLETED", "0:0")
    assert row["cpus"] >= 1 and row["req_mem_mb"] == 200 and row["limit_s"] == 300
    assert row["cpu_time_s"] >= 2.5, row                       # sacct's TotalCPU (user + system)
    assert row["max_rss_mb"] is not None and 60 <= row["max_rss_mb"] <= 200, row
    eff = json.loads(pswift("history", "efficiency", "--db", str(db), "--by", "job", "-j", busy, "--json",
                            check=True).stdout)[0]
    assert eff["cpu_eff"] == pytest.approx(row["cpu_time_s"] / (row["elapsed_s"] * row["cpus"]))
    assert 0.3 <= eff["mem_eff"] <= 1 and 0 < eff["time_eff"] < 0.1
    fails = json.loads(pswift("history", "failures", "--db", str(db), "-j", f"{busy},{bad}", "--json",
                              check=True).stdout)
    assert {(f["state"], f["jobs"]) for f in fails} == {("COMPLETED", 1), ("FAILED", 1)}


@pytest.mark.parametrize("text", ["node[1-3,5],gpu07", "rack[1-2]-node[1-2]", "r[1,3]n[08-09],x,c[2]", "n[098-101]"])
def test_host_lists_expand_as_scontrol_expands_them(cluster, text):
    from pipeswift_slurm.slurm import records as slurm_json
    want = subprocess.run(["scontrol", "show", "hostnames", text], capture_output=True, text=True, timeout=30,
                          check=True).stdout.split()
    assert list(slurm_json.expand_hostlist(text)) == want
