"""Admins' reports and sacct's conventions (issue: admins mine a million jobs), on a generated
history whose every figure is worked out by hand here; the same commands through the real
Slurm are in test_admin.py (mixed workload) and test_slurm_versions.py (sacct with slurmdbd)."""

from __future__ import annotations

import csv
import datetime as dt
import io
import json
import re
import sqlite3

import pytest
from hypothesis import example, given, settings, strategies as st

from helpers import H, T0, pswift, rec
from pipeswift_slurm.history.store import History
from pipeswift_slurm.slurm.accounting import limit_seconds
from pipeswift_slurm.history.selection import SelectionError, parse_time, states



@pytest.fixture
def db(tmp_path):
    """Six jobs: ids 2, 9, 10 (numeric order differs from text order), a preempted plain job
    (10: 1 h on 4 CPUs lost), one whose size is unknown (11), a failure, and sacct's usage
    figures for job 2 (CPU time, MaxRSS, requested memory, GPUs)."""
    path = tmp_path / "h.db"
    h = History(path)
    h.add_slurm_records([
        rec("2", T0 + 1.5 * H, T0 + 2.5 * H, NODECNT="2", PROCS="8"),                # across midnight
        rec("9", T0 + 3 * H, T0 + 3.5 * H, USERNAME="bob", ACCOUNT="chem", QOS="long", JOBSTATE="FAILED",
            EXITCODE="3:0", NODECNT="4", PROCS="16"),
        rec("10", T0 + 4 * H, T0 + 5 * H, JOBSTATE="PREEMPTED", SUBMIT=T0 + 3 * H),
        rec("10", T0 + 5.5 * H, T0 + 6 * H, SUBMIT=T0 + 3 * H),
        rec("11", T0 + 7 * H, T0 + 8 * H, JOBSTATE="PREEMPTED", NODECNT="", PROCS=""),
        rec("11", T0 + 9 * H, T0 + 10 * H, NODECNT="", PROCS=""),
        rec("12", T0 + 26 * H, T0 + 27 * H, JOBSTATE="TIMEOUT", EXITCODE="0:15", LIMIT="60"),
    ], "jobcomp")
    # sacct's view of job 2's attempt: the same attempt, with what the plugin cannot know
    h.add_slurm_records([{"JOBID": "2", "START": T0 + 1.5 * H, "END": T0 + 2.5 * H, "CLUSTER": "c", "CPU_TIME_S": 4 * H,
                          "MAX_RSS_MB": 1024, "REQ_MEM_MB": 4096, "ALLOC_GPUS": 2, "DERIVED_EC": "0:0"}], "sacct")
    h.close()
    return path


def run(db, *args: str) -> str:
    proc = pswift("history", *args, "--db", str(db))
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def parsable(db, *args: str) -> list[dict]:
    """-P's rows by column key, as the figures --json holds (asked for the same columns, by the
    header -P printed, which -o takes back), as text ("" unknown). -P shows each figure as the
    terminal does (01:00:00, 50.0%): every cell is checked to be one of the terminal's forms of
    its figure."""
    from pipeswift_slurm.reports.tabular import _cell
    lines = run(db, *args, "-P").splitlines()
    head = lines[0].split("|")
    objs = json.loads(run(db, *args, "--json", "-o", ",".join(head))) if len(lines) > 1 else []
    assert len(objs) == len(lines) - 1 and all(len(o) == len(head) for o in objs), (head, objs[:1])
    rows = []
    for line, obj in zip(lines[1:], objs):
        for text, v in zip(line.split("|"), obj.values()):
            kinds = ("s", "h", "ratio", "mb", "int", "time") if isinstance(v, (int, float)) else ("text",)
            shown = {"" if v is None else _cell(v, kind) for kind in kinds}
            assert text in shown | {str(v)}, (text, v, line)
        rows.append({k: "" if v is None else str(int(v) if isinstance(v, bool) else v) for k, v in obj.items()})
    return rows


# ----------------------------------------------------------------------------- selection
def test_states_take_sacct_codes_and_comma_lists():
    assert states("cd,F,preempted,TO,oom") == ("COMPLETED", "FAILED", "PREEMPTED", "TIMEOUT", "OUT_OF_MEMORY")
    with pytest.raises(SelectionError, match="CD=COMPLETED"):
        states("done")


def test_times_take_sacct_forms():
    now = dt.datetime(2026, 11, 30, 15, 30).timestamp()
    assert parse_time("now-7days", now) == now - 7 * 86400
    assert parse_time("now-2hours", now) == now - 7200 and parse_time("now", now) == now
    assert parse_time("7d", now) == now - 7 * 86400
    assert parse_time("2026-11-01", now) == dt.datetime(2026, 11, 1).timestamp()
    assert parse_time("2026-11-01T08:30", now) == dt.datetime(2026, 11, 1, 8, 30).timestamp()
    assert parse_time("11/01", now) == dt.datetime(2026, 11, 1).timestamp()
    assert parse_time("11/01/25", now) == dt.datetime(2025, 11, 1).timestamp()
    assert parse_time("today", now) == dt.datetime(2026, 11, 30).timestamp()
    assert parse_time("08:15", now) == dt.datetime(2026, 11, 30, 8, 15).timestamp()
    for bad in ("yesterdayish", "13/45", "now-3fortnights"):
        with pytest.raises(SelectionError, match="sacct's forms"):
            parse_time(bad, now)


def test_limits_in_every_form_slurm_writes():
    assert limit_seconds(90) == 5400 and limit_seconds("90") == 5400          # sacct minutes; filetxt MM
    assert limit_seconds("01:30:00") == 5400 and limit_seconds("1-00:00:00") == 86400
    assert limit_seconds("05:30") == 330 and limit_seconds("2-12") == 2 * 86400 + 12 * 3600
    assert limit_seconds("UNLIMITED") is None and limit_seconds(None) is None


def test_bad_selection_is_one_line_and_exit_2(db):
    for args in (["-s", "done"], ["-S", "someday"], ["-j", "12,abc"], ["-o", "job_id,nope"]):
        proc = pswift("history", "jobs", *args, "--db", str(db))
        assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr, proc.stderr


# ----------------------------------------------------------------------------- listings
def test_jobs_in_numeric_order_with_sacct_filters_and_forms(db):
    rows = parsable(db, "jobs")
    assert [r["job_id"] for r in rows] == ["2", "9", "10", "11", "12"]
    assert [r["job_id"] for r in parsable(db, "jobs", "-u", "bob,carol")] == ["9"]
    assert [r["job_id"] for r in parsable(db, "jobs", "-A", "physics", "-s", "cd")] == ["2", "10", "11"]
    assert [r["job_id"] for r in parsable(db, "jobs", "-q", "long", "-r", "low,high")] == ["9"]
    assert [r["job_id"] for r in parsable(db, "jobs", "-j", "12,2")] == ["2", "12"]
    start = dt.datetime.fromtimestamp(T0 + 2 * H).isoformat()
    assert [r["job_id"] for r in parsable(db, "jobs", "-S", start, "-s", "F,TO")] == ["9", "12"]
    # issue 59: -s selects by any attempt's state, as sacct --duplicates shows attempts: 10 and 11
    # were preempted once and completed after (their final state alone never matched PR)
    assert [r["job_id"] for r in parsable(db, "jobs", "-s", "PR")] == ["10", "11"]
    (by_user,) = parsable(db, "report", "--by", "user", "-s", "PR")
    assert by_user["jobs"] == "2", by_user
    # piped: tab-separated, each cell as the terminal shows it (sacct's habit: issue 59); -n drops
    # the header; -o picks columns. JSON and CSV, the forms for programs, hold seconds and ratios.
    tsv = run(db, "jobs", "-o", "job_id,elapsed_s,cpus,time_eff,node_hours", "-n").splitlines()
    assert tsv[0] == "2\t01:00:00\t8\t50.0%\t2.00"
    as_json = json.loads(run(db, "jobs", "--json", "-j", "2"))
    assert as_json[0]["job_id"] == "2" and as_json[0]["elapsed_s"] == 3600.0
    csv = run(db, "jobs", "--csv", "-o", "job_id,state", "-j", "9").splitlines()
    assert csv == ["job_id,state", "9,FAILED"]


def test_admin_fields_merge_the_plugin_and_sacct(db):
    r = json.loads(run(db, "jobs", "--json", "-j", "2"))[0]
    assert (r["account"], r["qos"], r["cpus"], r["gpus"], r["limit_s"]) == ("physics", "normal", 8, 2, 7200.0)
    assert (r["exit_code"], r["derived_exit_code"]) == ("0:0", "0:0")
    assert r["cpu_eff"] == pytest.approx(4 * H / (8 * H))         # TotalCPU / (elapsed x CPUs)
    assert r["time_eff"] == pytest.approx(0.5) and r["mem_eff"] == pytest.approx(0.25)
    assert r["node_hours"] == pytest.approx(2) and r["gpu_hours"] == pytest.approx(2)
    nine = json.loads(run(db, "jobs", "--json", "-j", "9"))[0]
    assert nine["cpu_eff"] is None and nine["max_rss_mb"] is None   # the plugin cannot know: unknown


def test_waste_of_preempted_plain_jobs_and_unknown_where_records_cannot_say(db):
    rows = {r["job_id"]: r for r in json.loads(run(db, "jobs", "--json"))}
    assert rows["10"]["preemptions"] == 1 and rows["10"]["wasted_hours"] == pytest.approx(4.0)  # 1 h x 4 CPUs
    assert rows["11"]["preemptions"] == 1 and rows["11"]["wasted_hours"] is None
    assert rows["2"]["wasted_hours"] == 0
    show = run(db, "show", "11")
    assert "unknown CPU-hours wasted" in show and "no checkpoints: whole attempts lost" in show
    # issue 59: every duration of a job in one form, sacct's elapsed ([D-]HH:MM:SS)
    two = run(db, "show", "2")
    assert "elapsed 01:00:00 of limit 02:00:00" in two and re.search(r"JCT \d\d:\d\d:\d\d = queue \d\d:", two), two
    assert not re.search(r"\d(h|m|min)\b", two), two
    doc = pswift("doctor", "10", "--db", str(db)).stdout
    assert "each stop lost its whole attempt, 4 CPU-hours" in doc and "checkpointed" not in doc
    assert "an unknown amount of work" in pswift("doctor", "11", "--db", str(db)).stdout
    doc_json = json.loads(pswift("doctor", "10", "--db", str(db), "--json").stdout)
    assert doc_json["attempts"] == 2 and any("preemption" in f for f in doc_json["findings"])


def test_terminal_table_has_one_unit_per_column(db, monkeypatch):
    from pipeswift_slurm.reports.jct import LISTING
    from pipeswift_slurm.reports.tabular import Output, emit, from_dicts
    import io
    buf = io.StringIO()
    row = {"job_id": "2", "name": "a-very-long-job-name", "queue_s": 90061.0, "wasted_hours": None}
    emit(from_dicts([row], LISTING), LISTING, Output("table", fields="job_id,name,queue_s,wasted_hours"), buf)
    head, rule, line = buf.getvalue().splitlines()
    assert "Wasted (h)" in head and line.split() == ["2", "a-very-lo+", "1-01:01:01", "unknown"]


# ----------------------------------------------------------------------------- reports
def test_usage_by_account_per_day_and_top_users(db):
    day1 = dt.datetime.fromtimestamp(T0).strftime("%Y-%m-%d")
    rows = parsable(db, "usage", "--by", "account", "--per", "day")
    got = {(r["bucket"], r["key"]): float(r["node_hours"]) for r in rows}
    # an attempt counts on the day it started: job 2 (2 nodes x 1 h, from 23:30) on day 1
    assert got[(day1, "physics")] == pytest.approx(2.0)
    assert sum(v for (b, k), v in got.items() if k == "chem") == pytest.approx(2.0)   # 4 nodes x 0.5 h
    top = parsable(db, "usage", "--by", "user", "--top", "1")
    assert len(top) == 1 and top[0]["key"] == "alice"


def test_utilisation_splits_attempts_at_bucket_edges(db):
    rows = parsable(db, "utilisation", "-r", "low", "--per", "day", "--nodes", "4")
    by_day = {r["bucket"]: r for r in rows}
    day1 = dt.datetime.fromtimestamp(T0).strftime("%Y-%m-%d")
    # job 2 ran 23:30-00:30 on 2 nodes: half of it on each day
    assert float(by_day[day1]["busy_node_hours"]) == pytest.approx(1.0)
    assert float(by_day[day1]["utilisation"]) == pytest.approx(1 / (4 * 24), rel=1e-4)
    total = sum(float(r["busy_node_hours"]) for r in rows)
    assert total == pytest.approx(2 + 2 + 1 + 0.5 + 1)   # jobs 2, 9, 10 (two attempts), 12; 11 has no size


def test_efficiency_per_job_and_per_account(db):
    per_job = {r["key"]: r for r in parsable(db, "efficiency", "--by", "job")}
    assert float(per_job["2"]["cpu_eff"]) == pytest.approx(0.5) and per_job["9"]["cpu_eff"] == ""
    assert float(per_job["12"]["time_eff"]) == pytest.approx(1.0)        # ran into its 60 min limit
    acct = {r["key"]: r for r in parsable(db, "efficiency", "--by", "account")}
    assert float(acct["physics"]["cpu_eff"]) == pytest.approx(0.5)       # only jobs with TotalCPU


def test_waits_by_size_and_qos(db):
    size = {r["key"]: r for r in parsable(db, "waits", "--by", "size")}
    assert set(size) == {"1", "2-3", "4-7", "unknown"}
    assert float(size["2-3"]["wait_p50_s"]) == pytest.approx(600)
    qos = {r["key"]: r for r in parsable(db, "waits", "--by", "qos")}
    # job 10 waited 1 h before its first start and 30 min between attempts
    assert int(qos["normal"]["jobs"]) == 4 and float(qos["long"]["wait_p50_s"]) == pytest.approx(600)


def test_failures_by_state_and_exit_code(db):
    rows = parsable(db, "failures")
    got = {(r["state"], r["exit_code"]): int(r["jobs"]) for r in rows}
    assert got == {("COMPLETED", "0:0"): 3, ("FAILED", "3:0"): 1, ("TIMEOUT", "0:15"): 1}
    assert rows[0]["state"] == "COMPLETED" and float(rows[0]["share"]) == pytest.approx(0.6)


@pytest.mark.parametrize("args", [["usage", "--per", "day"], ["utilisation", "-r", "low", "--nodes", "4"],
                                  ["efficiency", "--by", "account"], ["waits", "--by", "size"], ["failures"],
                                  ["report", "--by", "account"]])
def test_every_report_plots_and_an_empty_selection_says_so(db, tmp_path, args):
    png = tmp_path / "r.png"
    proc = pswift("history", *args, "--db", str(db), "--plot", str(png))
    assert proc.returncode == 0 and png.read_bytes()[:4] == b"\x89PNG" and png.stat().st_size > 10_000, proc.stderr
    empty = pswift("history", *args, "--db", str(db), "-u", "nobody", "--plot", str(tmp_path / "e.png"))
    assert empty.returncode == 1 and "no job in the history matches" in empty.stderr
    assert not (tmp_path / "e.png").exists()


def test_report_and_wait_plot_follow_the_selection(db):
    rows = parsable(db, "report", "--by", "user", "-s", "F")
    assert [(r["user"], r["jobs"]) for r in rows] == [("bob", "1")]


# ----------------------------------------------------------------------------- schema
def test_a_database_at_schema_8_gets_the_admin_columns_and_a_rebuilt_rollup(tmp_path):
    from pipeswift_slurm.history.schema import MIGRATIONS
    path = tmp_path / "old.db"
    conn = sqlite3.connect(path)
    for m in MIGRATIONS[:8]:
        conn.executescript(m)
    conn.execute("INSERT INTO slurm_jobs (cluster, job_id, start, end, submit, state, node_count, procs, user) "
                 "VALUES ('c', '10', 100, 700, 50, 'PREEMPTED', 1, 2, 'u'), ('c', '10', 800, 900, 50, 'COMPLETED', 1, 2, 'u'),"
                 " ('c', '9', 100, 200, 90, 'COMPLETED', 1, 1, 'u')")
    conn.execute("PRAGMA user_version = 8")
    conn.commit()
    conn.close()
    History(path).close()
    rows = json.loads(run(path, "jobs", "--json", "-o", "job_id,attempts,preemptions,wasted_hours,jct_s"))
    assert rows == [{"job_id": "9", "attempts": 1, "preemptions": 0, "wasted_hours": 0.0, "jct_s": 110.0},
                    {"job_id": "10", "attempts": 2, "preemptions": 1,
                     "wasted_hours": pytest.approx(600 * 2 / 3600), "jct_s": 850.0}]


def test_user_text_with_separators_quotes_and_escapes_stays_in_its_cell(tmp_path):
    import csv
    import io
    path = tmp_path / "h.db"
    h = History(path)
    nasty = 'a\tb|c,"d"\x1b[31m\nnext'
    h.add_slurm_records([rec("5", T0, T0 + H, JOBNAME=nasty, USERNAME="-cmd"), rec("6", T0, T0 + H)], "t")
    h.close()
    for form, sep in (("-P", "|"), (None, "\t")):
        lines = run(path, "jobs", *([form] if form else [])).splitlines()
        assert len(lines) == 3 and all(line.count(sep) == lines[0].count(sep) for line in lines)
        assert "\x1b" not in "".join(lines)
    rows = list(csv.DictReader(io.StringIO(run(path, "jobs", "--csv"))))
    assert [r["job_id"] for r in rows] == ["5", "6"] and rows[0]["user"] == "'-cmd"
    assert rows[0]["name"] == 'a?b|c,"d"?[31m?next'      # whole, its control characters inert
    assert json.loads(run(path, "jobs", "--json"))[0]["name"] == nasty


def test_the_reports_waste_is_the_listings_summed(db):
    """One figure every way (issue 25): a report's preemption waste per group is the sum of its
    jobs' listing column (job 10: 1 h x 4 CPUs; job 11's is unknown, left out of both)."""
    rows = json.loads(run(db, "jobs", "--json"))
    for by in ("partition", "user", "account"):
        for g in json.loads(run(db, "report", "--by", by, "--json")):
            want = sum(r["wasted_hours"] or 0.0 for r in rows if r[by] == g[by])
            assert g["wasted_hours"] == pytest.approx(want), (by, g)
    (low,) = json.loads(run(db, "report", "--by", "partition", "--json"))
    assert low["wasted_hours"] == pytest.approx(4.0)


def test_sacct_habits_field_names_the_same_columns_piped_and_iso_times(db):
    """`-o JobID,State` as sacct spells them (any case); piped output has the terminal's
    columns; a time is ISO 8601 (local) in every form (issue 25)."""
    from pipeswift_slurm.reports.jct import LISTING, LISTING_DEFAULT
    from pipeswift_slurm.reports.tabular import Output, Renderer, choose, heading
    assert run(db, "jobs", "-o", "JobID,jobname,STATE,NNodes,Elapsed") == \
        run(db, "jobs", "-o", "job_id,name,state,nodes,elapsed_s")
    # the headers are sacct's and one in every text form: a terminal's, piped, -P (issue 42)
    headers = [heading(c) for c in choose(LISTING, LISTING_DEFAULT)]
    assert headers[:3] == ["JobID", "JobName", "User"] and headers[-1] == "Wasted (h)"
    assert run(db, "jobs").splitlines()[0].split("\t") == headers
    assert run(db, "jobs", "-P").splitlines()[0].split("|") == headers
    terminal = io.StringIO()
    Renderer(LISTING, Output("table", True, LISTING_DEFAULT), terminal).start()
    assert terminal.getvalue().splitlines()[0].split() == " ".join(headers).split()
    assert run(db, "jobs", "-o", ",".join(headers)) == run(db, "jobs")     # what is printed, -o takes back
    assert len(json.loads(run(db, "jobs", "--json"))[0]) > len(LISTING_DEFAULT.split(","))  # every column
    want = dt.datetime.fromtimestamp(T0 + 1.5 * H - 600).strftime("%Y-%m-%dT%H:%M:%S")
    (two,) = [r for r in parsable(db, "jobs", "-o", "JobID,Submit") if r["job_id"] == "2"]
    assert two["submit"] == want
    assert [r["submit"] for r in json.loads(run(db, "jobs", "-j", "2", "--json"))] == [want]
    assert run(db, "jobs", "-j", "2", "--csv", "-o", "submit").splitlines() == ["submit", want]


def test_usage_days_are_local_days_on_both_sides_of_a_dst_change(tmp_path):
    """00:30 local on a summer day and 23:30 on a winter day (New York, UTC-4 then UTC-5): each
    counts on its own local date; either offset for the whole history would move one of them."""
    path = tmp_path / "h.db"
    summer = dt.datetime(2026, 7, 1, 4, 30, tzinfo=dt.timezone.utc).timestamp()    # 00:30 EDT, July 1
    winter = dt.datetime(2026, 12, 1, 4, 30, tzinfo=dt.timezone.utc).timestamp()   # 23:30 EST, Nov 30
    h = History(path)
    h.add_slurm_records([rec("1", summer, summer + 600), rec("2", winter, winter + 600)], "t")
    h.close()
    proc = pswift("history", "usage", "--per", "day", "--db", str(path), "-P", env={"TZ": "America/New_York"})
    assert proc.returncode == 0, proc.stderr
    days = sorted(line.split("|")[0] for line in proc.stdout.splitlines()[1:])
    assert days == ["2026-07-01", "2026-11-30"]


def test_weeks_are_iso_weeks_and_one_week_across_new_year_is_one_bucket(tmp_path):
    path = tmp_path / "h.db"
    days = [(2026, 11, 1), (2026, 11, 2), (2026, 12, 31), (2027, 1, 3)]   # Sun W44, Mon W45; Thu + Sun of 2026-W53
    h = History(path)
    h.add_slurm_records([rec(str(i), dt.datetime(*d, 12).timestamp(), dt.datetime(*d, 13).timestamp())
                         for i, d in enumerate(days, 1)], "t")
    h.close()
    weeks = {r["bucket"]: r["attempts"] for r in parsable(path, "usage", "--per", "week")}
    assert weeks == {"2026-W44": "1", "2026-W45": "1", "2026-W53": "2"}, weeks


def test_a_reader_that_stops_early_ends_the_listing_quietly(tmp_path):
    from helpers import PSWIFT
    path = tmp_path / "h.db"
    h = History(path)
    h.add_slurm_records([rec(str(i), T0 + i, T0 + i + 60) for i in range(20000)], "t")
    h.close()
    import shlex
    import subprocess
    cmd = f"{shlex.join([*PSWIFT, 'history', 'jobs', '--db', str(path)])} | head -2"
    proc = subprocess.run(["bash", "-o", "pipefail", "-c", cmd], capture_output=True, text=True, timeout=120)
    assert proc.stdout.splitlines()[1].startswith("0\t") and proc.stderr == "", proc.stderr
    assert proc.returncode == 0


def test_views_are_recreated_when_stale_and_a_read_only_reader_keeps_what_is_there(db):
    from pipeswift_slurm.history import views as history_views
    conn = sqlite3.connect(db, isolation_level=None)
    conn.execute("DROP VIEW failures")
    conn.close()
    ro = sqlite3.connect(f"file:{db}?mode=ro", uri=True, isolation_level=None)
    history_views.ensure(ro)                     # cannot write: no error, nothing changed
    assert not ro.execute("SELECT 1 FROM sqlite_master WHERE name = 'failures'").fetchall()
    History(db).close()                          # a writer's open brings it back
    assert ro.execute("SELECT jobs FROM failures WHERE state = 'FAILED'").fetchall() == [(1,)]


def test_the_wait_cdf_plots_the_selected_jobs_only(db):
    from pipeswift_slurm.reports.jct import wait_quantiles
    from pipeswift_slurm.history.selection import Selection
    h = History(db)
    try:
        assert wait_quantiles(h, Selection(users=("bob",))) == [600.0, 600.0]
        # job 10 waited 1 h, then 30 min between attempts; job 11 10 min, then 1 h between
        assert wait_quantiles(h, Selection()) == [600.0, 600.0, 600.0, 4200.0, 5400.0, 5400.0]
    finally:
        h.close()


def test_plots_draw_unknown_as_unknown_a_100_percent_line_and_name_the_selection(db, monkeypatch):
    """Issue 25: the efficiency plot drew a figure Slurm never recorded as 0 %; shares had no
    100 % line; no title said which jobs it shows."""
    from pipeswift_slurm import figures
    from pipeswift_slurm.reports import accounting as admin_reports
    from pipeswift_slurm.history.selection import build
    figs = []
    monkeypatch.setattr(figures, "save", lambda fig, path: figs.append(fig))
    h = History(db)
    sel = build("alice", None, "low", None, None, None, None, None, False)
    rep = admin_reports.efficiency(h, "job", sel)
    h.close()
    unknown = sum(r["cpu_eff"] is None for r in rep.rows)
    assert 0 < unknown < len(rep.rows)          # job 2 has sacct's CPU time, the others none
    admin_reports.draw(rep, "unused.png", sel.describe())
    (ax,) = figs[0].axes
    assert ax.get_title(loc="left").endswith("(partition low, user alice)")
    missing = sum(r[k] is None for r in rep.rows for k in ("time_eff", "cpu_eff", "mem_eff"))
    assert sum(t.get_text() == "unknown" for t in ax.texts) == missing >= unknown
    cpu_bars = [c for c in ax.containers if c.get_label() == "CPUEff"]
    assert len(cpu_bars) == 1 and len(cpu_bars[0]) == len(rep.rows) - unknown   # no 0 bar for unknown
    assert any(list(line.get_ydata()) == [100, 100] for line in ax.lines)
    assert build(None, None, None, None, None, None, None, None, False).describe() == "all jobs"


def _stderr_on_a_terminal(args: list[str], **kw) -> tuple[int, str, str]:
    """Run the CLI with stderr on a pseudo-terminal (as a person at a shell) and stdout piped:
    (exit code, stdout, what the terminal got)."""
    import os
    import pty
    import subprocess
    import sys
    master, slave = pty.openpty()
    proc = subprocess.Popen([sys.executable, "-m", "pipeswift_slurm.cli.main", *args], stdout=subprocess.PIPE,
                            stderr=slave, text=True, **kw)
    os.close(slave)
    out = proc.stdout.read()
    proc.wait(timeout=120)
    seen = b""
    while True:
        try:
            chunk = os.read(master, 65536)
        except OSError:
            break
        if not chunk:
            break
        seen += chunk
    os.close(master)
    return proc.returncode, out, seen.decode(errors="replace")


def test_export_format_names_columns_as_history_jobs_does_and_the_old_spelling_still_works(db):
    """Issue 42 item 6: -o/--format is the columns in `history jobs` and `history export` alike;
    the form is --json/--tsv (CSV by default). `--format json` works one more release, with a notice."""
    jobs = parsable(db, "jobs", "-o", "job_id,state,jct_s")
    exported = list(csv.DictReader(io.StringIO(run(db, "export", "-o", "job_id,state,jct_s"))))
    assert [list(r) for r in exported][0] == ["job_id", "state", "jct_s"]
    assert sorted(r["job_id"] for r in exported) == sorted(r["job_id"] for r in jobs)
    as_json = json.loads(run(db, "export", "--json"))
    old = pswift("history", "export", "--format", "json", "--db", str(db))
    assert old.returncode == 0 and json.loads(old.stdout) == as_json
    assert old.stderr.count("\n") == 1 and "--format json is now --json" in old.stderr
    assert run(db, "export", "--tsv", "-o", "job_id").splitlines()[0] == "JobID"     # as `history jobs` piped
    spellings = run(db, "export", "-o", "help").splitlines()
    assert spellings[0].split() == ["key", "header", "sacct's", "name"]
    assert ["elapsed_s", "Elapsed"] in [line.split()[:2] for line in spellings]
    assert ["jct_s", "JCT"] in [line.split() for line in spellings]
    both = pswift("history", "export", "--json", "--tsv", "--db", str(db))
    assert both.returncode == 2 and both.stderr.count("\n") == 1


def test_long_commands_show_progress_on_a_terminal_and_nothing_when_piped(db, tmp_path):
    """Issue 25: rich's bar on stderr while export and ingest work, when a person watches; a
    pipe or a log file gets nothing but the data."""
    rc, out, tty = _stderr_on_a_terminal(["history", "export", "--db", str(db)])
    assert rc == 0 and out.count("\n") == 6 and "jobs exported" in tty, tty      # a header, 5 jobs
    assert "j12" not in tty                                                       # the data: stdout only
    piped = pswift("history", "export", "--db", str(db))
    assert piped.returncode == 0 and piped.stdout == out and piped.stderr == ""
    spool = tmp_path / "spool"
    spool.mkdir(mode=0o700)
    rc, out, tty = _stderr_on_a_terminal(["history", "ingest", "--no-registered", "--spool", str(spool),
                                          "--db", str(tmp_path / "new.db")])
    assert rc == 0 and "spooled records" in tty, tty


def test_a_queue_wait_counts_from_eligibility_not_from_a_begin_time_or_a_hold(tmp_path):
    """A job submitted with --begin two hours ahead (or held) waited for its user, not for the
    queue: its wait, which the planner's queue estimate reads for everyone, starts at ELIGIBLE."""
    h = History(tmp_path / "h.db")
    h.add_slurm_records([rec("20", T0 + 2 * H + 60, T0 + 3 * H, SUBMIT=T0, ELIGIBLE=T0 + 2 * H),
                         rec("21", T0 + 600, T0 + H, SUBMIT=T0)], "jobcomp")
    waits = dict(h.conn.execute("SELECT job_id, queue_s FROM job_rollup").fetchall())
    assert waits == {"20": 60.0, "21": 600.0}
    assert sorted(h.partition_waits("low", 1)) == [60.0, 600.0]
    h.close()


def test_two_clusters_jobs_with_one_id_are_never_merged(tmp_path):
    """One slurmdbd serves several clusters, so one history holds job 1 of c1 and job 1 of c2:
    `show 1 -M c2` is c2's alone; without -M the ambiguity is one line with the fix; listings
    take -M as sacct does."""
    db = tmp_path / "h.db"
    h = History(db)
    h.add_slurm_records([rec("1", T0, T0 + H, CLUSTER="c1", JOBNAME="first", USERNAME="alice"),
                         rec("1", T0 + 2 * H, T0 + 3 * H, CLUSTER="c2", JOBNAME="second", USERNAME="bob",
                             JOBSTATE="FAILED", EXITCODE="1:0")], "jobcomp")
    h.close()
    ambiguous = pswift("history", "show", "1", "--db", str(db))
    assert ambiguous.returncode == 2 and ambiguous.stderr.count("\n") == 1, ambiguous.stderr
    assert "job 1 is in the history of 2 clusters (c1, c2): say which with -M CLUSTER" in ambiguous.stderr
    two = json.loads(run(db, "show", "1", "-M", "c2", "--json"))
    assert (two["name"], two["user"], two["state"]) == ("second", "bob", "FAILED")
    # issue 42 item 6: times as sacct prints them, no epoch number
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d", two["submit"]), two
    assert not [k for k, v in two.items() if isinstance(v, (int, float)) and v > 1e9], two
    one = run(db, "show", "1", "--clusters", "c1")
    assert "'first'" in one and "alice" in one and "second" not in one
    rows = parsable(db, "jobs", "-M", "c2", "-o", "job_id,name,state")
    assert [(r["job_id"], r["name"], r["state"]) for r in rows] == [("1", "second", "FAILED")]
    assert pswift("history", "show", "1", "-M", "c3", "--db", str(db)).returncode == 1


def test_a_width_after_a_field_sizes_its_column_as_sacct_does(db):
    """`-o JobName%30` (issue 42 item 6): the column that wide on a terminal, a longer value cut
    with sacct's `+`; the machine forms have the whole value."""
    from pipeswift_slurm.reports.jct import LISTING
    from pipeswift_slurm.reports.tabular import Output, Renderer, choose
    from pipeswift_slurm.history.selection import SelectionError
    assert [c.width for c in choose(LISTING, "JobID,JobName%30,state%3")] == [8, 30, 3]
    out = io.StringIO()
    r = Renderer(LISTING, Output("table", True, "jobname%4"), out)
    r.start()
    r.row(["1", "a-long-name", *[None] * (len(LISTING) - 2)])
    r.finish()
    assert out.getvalue().splitlines()[-1].strip() == "a-l+"
    assert run(db, "jobs", "-o", "jobid%3,name%40") == run(db, "jobs", "-o", "jobid,name")   # piped: whole values
    for bad in ("name%0", "name%x", "name%99999"):
        with pytest.raises(SelectionError, match="a width is a number of characters"):
            choose(LISTING, bad)


def test_sacct_start_end_nodelist_and_alloctres_are_columns(db, tmp_path):
    """`-o JobID,Start,End,NodeList,AllocTRES` (issue 42): the newest attempt's, as sacct -X
    shows them; a history from before these columns gets them when it is opened (migration)."""
    h = History(db)
    h.add_slurm_records([{**rec("2", T0 + 1.5 * H, T0 + 2.5 * H, NODECNT="2", PROCS="8"), "NODES": "node[1-2]",
                          "ALLOC_MEM_MB": 8000}], "jobcomp")
    h.close()
    rows = {r["job_id"]: r for r in parsable(db, "jobs", "-o", "JobID,Start,End,NodeList,AllocTRES")}
    iso = lambda t: dt.datetime.fromtimestamp(t).strftime("%Y-%m-%dT%H:%M:%S")  # noqa: E731
    assert (rows["10"]["start"], rows["10"]["end"]) == (iso(T0 + 5.5 * H), iso(T0 + 6 * H))   # the newest attempt
    assert rows["2"]["nodelist"] == "node[1-2]"
    assert rows["2"]["alloc_tres"] == "cpu=8,mem=8000M,node=2,gres/gpu=2"
    assert rows["11"]["alloc_tres"] == ""                  # nothing known of its size: nothing made up
    old = tmp_path / "old.db"                             # a history written before migration 14
    conn = sqlite3.connect(old)
    from pipeswift_slurm.history.schema import MIGRATIONS
    for sql in MIGRATIONS[:13]:
        conn.executescript(sql)
    conn.execute("PRAGMA user_version = 13")
    conn.commit()
    conn.close()
    h = History(old)
    h.add_slurm_records([{**rec("5", T0, T0 + H, NODECNT="1", PROCS="4"), "NODES": "node3"}], "jobcomp")
    h.close()
    assert parsable(old, "jobs", "-o", "jobid,nodelist,alloctres") == [
        {"job_id": "5", "nodelist": "node3", "alloc_tres": "cpu=4,node=1"}]


@settings(max_examples=60, deadline=None)
@example([(-0.0, -0.0, -0.0, -0.0, False, 0), (-0.4, -0.004, -0.0004, -0.4, True, -1), (86400.5, 0.005, 0.0005, 0.5, True, 1)])
@given(st.lists(st.tuples(*[st.one_of(st.none(), st.floats(-4e6, 4e6, allow_nan=False))] * 4, st.booleans(),
                          st.integers(-10**6, 10**6)), min_size=1, max_size=20))
def test_a_pipe_shows_every_figure_as_the_terminal_does(rows):
    """Issue 59: one unit per column in every text form, as sacct prints the same on a terminal
    and piped (durations [D-]HH:MM:SS, ratios in %, hours to 0.01, MB whole)."""
    import io
    from pipeswift_slurm.reports.tabular import Col, Output, Renderer
    cols = [Col("d", "D", "s", 16), Col("h", "H", "h", 16), Col("r", "R", "ratio", 16), Col("m", "M", "mb", 16),
            Col("b", "B", "bool"), Col("i", "I", "int")]   # wide enough that no cell is cut
    shown = {}
    for form in ("table", "tsv", "parsable"):
        out = io.StringIO()
        render = Renderer(cols, Output(form, header=False), out)
        render.start()
        for row in rows:
            render.row(row)
        render.finish()
        sep = {"tsv": "\t", "parsable": "|"}.get(form)
        shown[form] = [line.split(sep) if sep else line.split() for line in out.getvalue().splitlines()]
    assert shown["tsv"] == shown["parsable"]
    # a terminal says "unknown" (or leaves blank) what a pipe leaves empty
    table = [[c for c in line if c != "unknown"] for line in shown["table"]]
    assert [[c for c in line if c] for line in shown["tsv"]] == table
