"""Issue 57: no raw ESC (0x1b), DEL or C1 control (U+0080-U+009F) reaches stdout or stderr of
any read command, whatever a run directory or the history holds. A property test: hostile
strings in every text field of a run's plan and events, its log and a jobcomp/filetxt record's
name and work directory, then every read command over them (terminal forms, pipes, JSON, CSV),
each a real `pswift` process."""

from __future__ import annotations

import json
from pathlib import Path

from hypothesis import HealthCheck, given, settings, strategies as st

from helpers import GOOD, PLAN, pswift

#: what drives a terminal: escapes (OSC, CSI), C1's CSI alone, DEL, a bell, a carriage return,
#: and TeX math for the plots
PIECES = ["\x1b]0;OWNED\x07", "\x1b[2J", "\x1b[31m", "\u009b31m", "\u0085", "\x7f", "\r", "\x08",
          "$\\sqrt{x}$", "|", ",", '"', "\t", "=cmd", "é"]
hostile = st.lists(st.sampled_from(PIECES), min_size=1, max_size=6).map("".join)


def _bad(text: str) -> list[str]:
    return sorted({f"U+{ord(c):04X}" for c in text if c == "\x1b" or c == "\x7f" or "\x80" <= c <= "\x9f"})


def _runs(base: Path, s: list[str]) -> tuple[Path, Path]:
    """A local run (no JOB_ID: status reads its events) and a Slurm one (JOB_ID, a log), each
    field a hostile string."""
    plan = {**PLAN, "job_name": s[0], "user": s[1], "partition": s[2]}
    events = [dict(e) for e in GOOD]
    events[0].update(partition=s[3], node=s[4], job_id="4242")
    events[-1].update(reason=s[5], why=s[6])
    events.insert(-1, {"event": "crash", "attempt": 0, "time": 12.5, "how": s[7], "why": s[8], "node": s[4],
                       "action": "restart", "rank": 1, "step": 2})
    made = []
    for name, job_id in (("local", None), ("slurm", "4242")):
        run = base / name
        run.mkdir()
        (run / "plan.json").write_text(json.dumps(plan))
        (run / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))
        if job_id:
            (run / "JOB_ID").write_text(job_id + "\n")
            (run / f"slurm-{job_id}.out").write_text(f"step 1 loss 2.0\n{s[9]}\nstep 2\n")
        made.append(run)
    return made[0], made[1]


def _jobcomp(base: Path, s: list[str]) -> Path:
    """A filetxt record whose name and work directory hold hostile text (no newline: a record)."""
    name, work = (x.replace("\n", " ") for x in (s[0], s[1]))
    f = base / "jobcomp.txt"
    f.write_text(
        f"JobId=4242 UserId=root(0) GroupId=root(0) Name={name} JobState=COMPLETED Partition=low "
        f"TimeLimit=15 StartTime=2026-11-29T15:05:27 EndTime=2026-11-29T15:05:31 NodeList=node1 NodeCnt=1 "
        f"ProcCnt=2 WorkDir={work} ReservationName= Tres=cpu=2,mem=1G,node=1 Account=research QOS=normal "
        f"WcKey= Cluster=c SubmitTime=2026-11-29T15:05:26 EligibleTime=2026-11-29T15:05:26 "
        f"DerivedExitCode=0:0 ExitCode=0:0 \nJobId=4243 UserId=root(0) GroupId=root(0) Name={name}\n")
    return f


def _commands(local: Path, slurm_run: Path, db: Path, out: Path) -> list[list[str]]:
    d = ["--db", str(db)]
    reports = [["history", r, *d] for r in ("report", "usage", "waits", "efficiency", "utilisation", "failures")]
    return [["status", str(local)], ["status", str(local), "--json"], ["logs", str(slurm_run)],
            ["plot", str(local), "-o", str(out / "p.png")],
            ["history", "ingest", str(slurm_run), "--jobcomp-file", str(out.parent / "jobcomp.txt"), *d],
            ["history", "jobs", *d], ["history", "jobs", "-P", *d], ["history", "jobs", "--json", *d],
            ["history", "jobs", "--csv", *d], ["history", "show", "4242", *d],
            ["history", "show", "4242", "--json", *d], ["history", "export", *d],
            ["history", "export", "--json", *d], ["history", "export", "--tsv", *d], *reports,
            ["doctor", str(local)]]


@settings(max_examples=3, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(hostile, min_size=10, max_size=10))
def test_no_read_command_prints_a_control_character(tmp_path_factory, strings):
    base = tmp_path_factory.mktemp("inert")
    local, slurm_run = _runs(base, strings)
    _jobcomp(base, strings)
    out = base / "out"
    out.mkdir()
    db = base / "h.db"
    env = {"SLURM_CONF": "/nonexistent/slurm.conf", "PSWIFT_HOME": str(base / "home")}
    for args in _commands(local, slurm_run, db, out):
        proc = pswift(*args, env=env, timeout=120)
        for stream, text in (("stdout", proc.stdout), ("stderr", proc.stderr)):
            assert not _bad(text), (args, stream, _bad(text), text[-400:])
        assert "Traceback" not in proc.stderr, (args, proc.stderr[-600:])
