"""jobcomp/filetxt, read as hostile text: Slurm writes each record (JOB_FORMAT in
src/plugins/jobcomp/filetxt, the same fields in 22.05 and 25.11) with the job's name and work
directory unescaped, so a user's job name can hold ``JobState=COMPLETED`` or a newline, and
22.05 cuts a record at 1,023 bytes without its newline, so the next job's record joins the line.

A record is taken only whole and unambiguous:

- each of Slurm's keys appears once (a name that repeats one is refused: its record, not a
  guess at which value is Slurm's);
- it ends as Slurm ends one (``ExitCode=N:M `` then the newline);
- from a Slurm that cuts records (22.05 and older: ``cut_at``), a line that goes on past 1,023
  bytes into ``JobId=N UserId=`` is two records: the cut one (refused) and the next job's, read
  on its own, never merged. A later Slurm writes a record whole however long, so there the same
  line is one record (a name could put a record's start at byte 1,023), refused if it is not one
  whole record: a neighbour a cut joined is then lost, never forged;
- a line after a record that did not end (its name held a newline) is that record's rest:
  refused too.

Each refusal is counted. What text cannot rule out: a name whose newline is followed by a whole
forged record line. Sites should fill the history from the jobcomp/script plugin (Slurm's own
environment) or ``sacct --json``; docs/admin.md says so.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, NamedTuple

#: Slurm 22.05's record buffer: a longer record is cut to this many bytes, without its newline
#: (25.11 formats the record whole; where between them that changed is not known here)
CUT_AT = 1023
LAST_CUTTING = (22, 5)
KEYS = ("JobId", "UserId", "GroupId", "Name", "JobState", "Partition", "TimeLimit", "StartTime", "EndTime",
        "NodeList", "NodeCnt", "ProcCnt", "WorkDir", "ReservationName", "Tres", "Account", "QOS", "WcKey",
        "Cluster", "SubmitTime", "EligibleTime", "ArrayJobId", "ArrayTaskId", "HetJobId", "HetJobOffset",
        "DerivedExitCode", "ExitCode")
_KEY = re.compile(r"(?:^| )(" + "|".join(KEYS) + r")=")
_START = re.compile(r"JobId=\d+ UserId=")
#: the record up to the user's WorkDir: identity first and by position, then the job's name (free
#: text), Slurm's own fields, the work directory (free text), and Slurm's fields to the end
_RECORD = re.compile(
    r"JobId=(?P<JobId>\d+) UserId=(?P<UserId>[^\s(]*)\(\d+\) GroupId=[^\s(]*\(\d+\) "
    r"Name=(?P<Name>.*) JobState=(?P<JobState>\S+) Partition=(?P<Partition>\S*) "
    r"TimeLimit=(?P<TimeLimit>\S+) StartTime=(?P<StartTime>\S+) EndTime=(?P<EndTime>\S+) "
    r"NodeList=(?P<NodeList>\S*) NodeCnt=(?P<NodeCnt>\d+) ProcCnt=(?P<ProcCnt>\d+) "
    r"WorkDir=(?P<WorkDir>.*) ReservationName=(?P<ReservationName>\S*) Tres=(?P<Tres>\S*) "
    r"Account=(?P<Account>\S*) QOS=(?P<QOS>\S*) WcKey=(?P<WcKey>\S*) Cluster=(?P<Cluster>\S*) "
    r"SubmitTime=(?P<SubmitTime>\S+) EligibleTime=(?P<EligibleTime>\S+)"
    r"(?: ArrayJobId=\d+ ArrayTaskId=\d+| HetJobId=\d+ HetJobOffset=\d+)? "
    r"DerivedExitCode=(?P<DerivedExitCode>\d+:\d+) ExitCode=(?P<ExitCode>\d+:\d+) ")


class Parsed(NamedTuple):
    records: list[dict[str, Any]]
    refused: int


def cuts_records(version: tuple[int, ...] | None) -> bool:
    """Whether the Slurm of ``version`` (major, minor, ...) cut long records (None: unknown, so
    records are never split: a neighbour may be lost, nothing is forged)."""
    return version is not None and tuple(version[:2]) <= LAST_CUTTING


def _pieces(line: str, cut: bool) -> list[tuple[str, bool]]:
    """(text, cut) of each record on one line: a cutting Slurm cut a record at CUT_AT bytes and
    the next record began right there; ``cut`` for those cut ones."""
    raw, at, out = line.encode("utf-8", "surrogateescape"), 0, []
    while cut and len(raw) - at > CUT_AT and _START.match(raw[at + CUT_AT:at + CUT_AT + 64].decode("utf-8", "replace")):
        out.append((raw[at:at + CUT_AT].decode("utf-8", "surrogateescape"), True))
        at += CUT_AT
    out.append((raw[at:].decode("utf-8", "surrogateescape"), False))
    return out


def _record(text: str) -> dict[str, Any] | None:
    """One whole record's fields, or None: a key repeated, or not Slurm's shape to its end."""
    keys = _KEY.findall(text)
    if len(keys) != len(set(keys)):
        return None
    m = _RECORD.fullmatch(text)
    return None if m is None else m.groupdict()


def read(path: Path, cutting: bool) -> Parsed:
    """:func:`parse` of the file at ``path``, read surrogate-escaped: a record cut inside a
    character keeps its byte count, so the next one still starts at byte CUT_AT of the line."""
    return parse(path.read_text(encoding="utf-8", errors="surrogateescape"), cutting)


def parse(text: str, cutting: bool) -> Parsed:
    """The records of a jobcomp/filetxt file (as sacct's keys, upper case: JOBID, USERNAME,
    JOBSTATE...) and how many were refused (see the module's rules); ``cutting``: written by a
    Slurm that cut long records (:func:`cuts_records`)."""
    records: list[dict[str, Any]] = []
    refused = 0
    open_record = False    # the last record did not end: the next line may be its name's rest
    for line in text.split("\n"):
        for piece, cut in _pieces(line, cutting):
            if not piece.strip():
                continue
            f = None if cut or open_record else _record(piece)
            if f is None:
                refused += 1
                # a cut record's successor starts where Slurm cut it; any other broken record
                # may go on to the next line, until a line ends as Slurm ends a record
                open_record = not cut and not _ends_as_slurm_does(piece)
                continue
            open_record = False
            records.append(_as_record(f))
    return Parsed(records, refused)


_END = re.compile(r" DerivedExitCode=\d+:\d+ ExitCode=\d+:\d+ $")


def _ends_as_slurm_does(piece: str) -> bool:
    return _END.search(piece) is not None


def _as_record(raw: dict[str, str]) -> dict[str, Any]:
    # bytes that are not UTF-8 (read surrogate-escaped, to count bytes) as U+FFFD
    f = {k: v.encode("utf-8", "surrogateescape").decode("utf-8", "replace") for k, v in raw.items() if v is not None}
    return {"JOBID": f["JobId"], "USERNAME": f["UserId"] or None, "JOBNAME": f["Name"],
            "JOBSTATE": f["JobState"], "PARTITION": f["Partition"], "LIMIT": f["TimeLimit"],
            "START": f["StartTime"], "END": f["EndTime"], "NODES": f["NodeList"], "NODECNT": f["NodeCnt"],
            "PROCS": f["ProcCnt"], "WORK_DIR": f["WorkDir"], "SUBMIT": f["SubmitTime"],
            "EXITCODE": f["ExitCode"], "CLUSTER": f["Cluster"], "ACCOUNT": f["Account"], "QOS": f["QOS"],
            "DERIVED_EC": f["DerivedExitCode"], "ELIGIBLE": f["EligibleTime"], **_tres(f["Tres"])}


def _tres(text: str) -> dict[str, Any]:
    """filetxt's allocated ``Tres=cpu=2,mem=125G,node=2,gres/gpu=1`` as record fields."""
    tres = dict(p.partition("=")[::2] for p in text.split(",") if "=" in p)
    mem = tres.get("mem", "")
    scale = {"K": 1 / 1024, "M": 1, "G": 1024, "T": 1024 * 1024}.get(mem[-1:], None)
    return {"ALLOC_GPUS": tres.get("gres/gpu"),
            "ALLOC_MEM_MB": float(mem[:-1]) * scale if scale and mem[:-1].replace(".", "", 1).isdigit() else None}
