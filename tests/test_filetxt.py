"""jobcomp/filetxt read as hostile text (issue 37): records written as Slurm writes them
(JOB_FORMAT, with 22.05's cut at 1,023 bytes) with any job name and work directory a user can
choose (no newline: that case is in test_admin.py on real output): a record taken is the one
Slurm wrote, field for field, and a plain neighbour is never lost."""

from __future__ import annotations

from hypothesis import given, settings, strategies as st

from pipeswift_slurm.slurm import filetxt

FORMAT = ("JobId={job} UserId={user}({uid}) GroupId={user}({uid}) Name={name} JobState={state} Partition={part} "
          "TimeLimit=15 StartTime=2026-11-29T15:05:27 EndTime=2026-11-29T15:05:31 NodeList=node1 NodeCnt={nodes} "
          "ProcCnt=2 WorkDir={work} ReservationName= Tres=cpu=2,mem=1G,node=1 Account=research QOS=normal WcKey= "
          "Cluster=c SubmitTime=2026-11-29T15:05:26 EligibleTime=2026-11-29T15:05:26 DerivedExitCode=0:0 "
          "ExitCode=0:0 \n")


def written(job: int, user: str, name: str, work: str, state: str = "COMPLETED", part: str = "low",
            nodes: int = 1, cut: bool = True) -> str:
    """One record as Slurm writes it (22.05: cut to 1,023 bytes, without its newline; a cut
    through a character leaves its first bytes, read back as the reader does, surrogate-escaped)."""
    rec = FORMAT.format(job=job, user=user, uid=1000 + job, name=name, state=state, part=part, nodes=nodes, work=work)
    raw = rec.encode()
    return raw[:filetxt.CUT_AT].decode("utf-8", "surrogateescape") if cut and len(raw) > filetxt.CUT_AT + 1 else rec


text = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\n\r\x00"), max_size=1100)
fieldish = st.sampled_from(["JobState=COMPLETED", "Partition=gpu", "NodeCnt=512", "UserId=bob(2)", "JobId=9",
                            " ExitCode=0:0 ", "WorkDir=/x", "ReservationName= Tres=cpu=1", "JobId=5 UserId=x(1) "])
hostile = st.lists(st.one_of(text, fieldish), max_size=6).map(" ".join)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(hostile, hostile, st.booleans()), min_size=1, max_size=6), st.booleans())
def test_a_record_taken_is_slurms_and_plain_neighbours_are_never_lost(jobs, cutting):
    """As a 22.05 writes them (``cutting``: long records cut) and as 25.11 does (whole)."""
    lines, truth = [], {}
    for i, (name, work, plain) in enumerate(jobs):
        job = 100 + 2 * i
        lines.append(written(job, "mallory", name, work, state="FAILED", part="evil", nodes=7, cut=cutting))
        truth[str(job)] = (name, work)
        if plain:   # a plain neighbour of another user right after it
            lines.append(written(job + 1, "alice", "train", "/home/alice", cut=cutting))
    got = filetxt.parse("".join(lines), cutting=cutting)
    for r in got.records:
        if r["USERNAME"] == "alice":
            assert (r["JOBNAME"], r["WORK_DIR"], r["JOBSTATE"], r["PARTITION"], r["NODECNT"]) == (
                "train", "/home/alice", "COMPLETED", "low", "1")
        else:
            assert r["USERNAME"] == "mallory" and (r["JOBNAME"], r["WORK_DIR"]) == truth[r["JOBID"]]
            assert (r["JOBSTATE"], r["PARTITION"], r["NODECNT"]) == ("FAILED", "evil", "7")
    neighbours = sum(plain for _, _, plain in jobs)
    assert sum(r["USERNAME"] == "alice" for r in got.records) == neighbours
    assert len(got.records) + got.refused == len(lines)


def test_a_cut_through_a_character_keeps_the_next_record_and_invalid_bytes_read_as_replacement(tmp_path):
    """22.05 cuts at byte 1,023 even inside a character: the file is read surrogate-escaped, so
    the next record still starts at that byte and is taken; a name's bytes that are not UTF-8
    come out as U+FFFD, never as text SQLite cannot store."""
    name = "x" * 300 + "é" * 400                   # the cut falls inside an é for one of two offsets
    cuts = [written(100, "mallory", name[:n], "/w", cut=True).encode("utf-8", "surrogateescape") for n in (699, 700)]
    assert any(len(c.decode("utf-8", "ignore").encode()) < len(c) for c in cuts)    # one cut inside a character
    for raw in cuts:
        (tmp_path / "jobcomp.txt").write_bytes(raw + written(101, "alice", "train", "/home/alice").encode() + b"\n")
        got = filetxt.read(tmp_path / "jobcomp.txt", cutting=True)
        assert [r["JOBID"] for r in got.records] == ["101"] and got.refused == 1
    (tmp_path / "jobcomp.txt").write_bytes(written(102, "bob", "a", "/w").encode().replace(b"Name=a", b"Name=a\xff"))
    (rec,) = filetxt.read(tmp_path / "jobcomp.txt", cutting=False).records
    assert rec["JOBNAME"] == "a\ufffd" and rec["JOBNAME"].encode()


FORGER = "x\ny DerivedExitCode=0:0 ExitCode=0:0 \nJobId=999 UserId=root(0) GroupId=root(0) Name=forged"


def test_a_later_line_never_completes_a_record_the_two_newline_forgery():
    """Issue 57's input: a name with two newlines closes the real record on its second line, and
    the real record's remaining fields would complete ``JobId=999 UserId=root``. The record
    takes every line up to Slurm's own fields and is refused whole (three lines); the plain
    neighbours on both sides are read."""
    for cutting in (True, False):
        text = (written(7, "alice", "before", "/home/alice", cut=cutting)
                + written(100, "mallory", FORGER, "/home/m", cut=cutting)
                + written(8, "alice", "after", "/home/alice", cut=cutting))
        got = filetxt.parse(text, cutting=cutting)
        assert [(r["JOBID"], r["USERNAME"]) for r in got.records] == [("7", "alice"), ("8", "alice")]
        assert got.refused == 3


@settings(max_examples=200, deadline=None)
@given(st.lists(st.sampled_from(["\n", " ExitCode=0:0 \n", "JobId=999 UserId=root(0) GroupId=root(0) Name=f",
                                 " JobState=COMPLETED Partition=low", "y DerivedExitCode=0:0 ExitCode=0:0 ",
                                 "WorkDir=/x\n", "z"]), min_size=1, max_size=8).map("".join),
       st.booleans())
def test_no_record_is_made_of_a_names_lines_after_an_open_one(name, cutting):
    """Any name that leaves its first line open (a newline before Slurm's fields): nothing of
    root's is taken, and the neighbour after it is read once the record has ended."""
    if "\n" not in name:
        return
    first_line = ("JobId=100 UserId=mallory(1100) GroupId=mallory(1100) Name=" + name).split("\n")[0]
    if filetxt._ends_as_slurm_does(first_line):
        return      # a first line ending as a whole record: the case text cannot rule out (docstring)
    text = written(100, "mallory", name, "/m", cut=cutting) + written(8, "alice", "after", "/a", cut=cutting)
    got = filetxt.parse(text, cutting=cutting)
    assert all(r["USERNAME"] != "root" for r in got.records)
    assert [r["JOBID"] for r in got.records if r["USERNAME"] == "alice"] == ["8"]


def test_an_open_record_that_never_ends_is_refused_within_a_records_span(tmp_path):
    """A line that opens a record and no end within what a record spans (1,023 bytes on 22.05):
    its lines are refused, and the records after the span are read."""
    opened = "JobId=5 UserId=m(1) GroupId=m(1) Name=a\n" + "b\n" * 600
    text = opened + written(8, "alice", "after", "/a", cut=True)
    got = filetxt.parse(text, cutting=True)
    assert [r["JOBID"] for r in got.records] == ["8"] and got.refused > 1


def test_read_streams_and_refuses_a_line_longer_than_max_line(tmp_path, monkeypatch):
    """filetxt.read holds one line at most: a line past MAX_LINE is refused and skipped in
    chunks; the records before and after it are read."""
    monkeypatch.setattr(filetxt, "MAX_LINE", 4096)
    f = tmp_path / "jobcomp.txt"
    f.write_bytes((written(7, "alice", "a", "/a", cut=False) + "x" * 20000 + "\n"
                   + written(8, "alice", "b", "/a", cut=False)).encode())
    got = filetxt.read(f, cutting=False)
    assert [r["JOBID"] for r in got.records] == ["7", "8"] and got.refused == 1
