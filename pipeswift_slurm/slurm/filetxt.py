"""jobcomp/filetxt, read as hostile text: Slurm writes each record (JOB_FORMAT in
src/plugins/jobcomp/filetxt, the same fields in 22.05 and 25.11) with the job's name and work
directory unescaped, so a user's job name can hold ``JobState=COMPLETED`` or a newline, and
22.05 cuts a record at 1,023 bytes without its newline, so the next job's record joins the line.

One reader, streamed (the file is never read whole: a line is read up to MAX_LINE bytes, a
longer one is refused and skipped in chunks), takes a record only whole and unambiguous:

- each of Slurm's keys appears once (a name that repeats one is refused: its record, not a
  guess at which value is Slurm's);
- it ends as Slurm ends one (``ExitCode=N:M `` then the newline);
- from a Slurm that cuts records (22.05 and older: ``cut_at``), a line that goes on past 1,023
  bytes into ``JobId=N UserId=`` is two records: the cut one (refused) and the next job's, read
  on its own, never merged. A later Slurm writes a record whole however long, so there the same
  line is one record (a name could put a record's start at byte 1,023), refused if it is not one
  whole record: a neighbour a cut joined is then lost, never forged;
- **a record is never completed by a later line.** A line that starts a record but does not end
  as Slurm ends one (its name or work directory holds a newline) opens a record that takes the
  following lines, whatever they look like, until the joined text has the rest of Slurm's
  shape: JobState= to WorkDir= after the name, and a last line from ReservationName= to
  ExitCode=. Then the whole of it is refused, one count per line. So the real record's remaining
  fields stay its own: ``Name=x\ny DerivedExitCode=0:0 ExitCode=0:0 \nJobId=999 UserId=root(0)
  ...`` is one refused record of three lines, not a root record (issue 57). An open record that
  finds no such end within the most a record spans (1,023 bytes on a cutting Slurm; else
  RECORD_SPAN) is refused there, and reading goes on with the next line.

What text cannot rule out: a name that holds a whole record's tail, then a newline, then a
forged record's head: each line is then a whole record, and nothing tells the two apart. That
name is refused at submission by pswift's job_submit plugin (a newline or any other control
character in a job's name or work directory, for every job: tests/test_admin.py, through both
Slurms); sites that read filetxt without it should fill the history from the jobcomp/script
plugin (Slurm's own environment) or ``sacct --json``. docs/admin.md says so.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import IO, Any, Iterable, Iterator, NamedTuple

#: Slurm 22.05's record buffer: a longer record is cut to this many bytes, without its newline
#: (25.11 formats the record whole; where between them that changed is not known here)
CUT_AT = 1023
LAST_CUTTING = (22, 5)
#: the most bytes a record of a Slurm that writes whole records spans: its name (Slurm refuses
#: more than 1,024 bytes), its work directory (PATH_MAX, 4,096) and Slurm's own fields (a node
#: list of thousands of scattered nodes fits): where a record with a newline must have ended
RECORD_SPAN = 64 << 10
#: the longest line read whole (a 22.05 line joins cut records, 1,023 bytes each); a longer one
#: is refused and skipped in chunks, never held
MAX_LINE = 1 << 20
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
    r"(?: ArrayJobId=(?P<ArrayJobId>\d+) ArrayTaskId=(?P<ArrayTaskId>\d+)| HetJobId=\d+ HetJobOffset=\d+)? "
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
    """:func:`parse` of the file at ``path`` (every record in one list: :func:`batches` holds
    a batch at a time)."""
    refused: list[int] = []
    records = [r for batch in batches(path, cutting, refused) for r in batch]
    return Parsed(records, refused[0])


def batches(path: Path, cutting: bool, refused: list[int], size: int = 5000) -> Iterator[list[dict[str, Any]]]:
    """The records of the file at ``path`` in lists of at most ``size``, streamed (at most
    MAX_LINE bytes of the file held; a longer line is refused), read surrogate-escaped: a record
    cut inside a character keeps its byte count, so the next one still starts at byte CUT_AT of
    the line. When the file is read, ``refused`` gets the count of refused lines appended."""
    reader = _Reader(cutting)
    batch: list[dict[str, Any]] = []
    with path.open("rb") as f:
        for record in reader.records(_bounded_lines(f)):
            batch.append(record)
            if len(batch) >= size:
                yield batch
                batch = []
    if batch:
        yield batch
    refused.append(reader.refused)


def parse(text: str, cutting: bool) -> Parsed:
    """The records of a jobcomp/filetxt file (as sacct's keys, upper case: JOBID, USERNAME,
    JOBSTATE...) and how many lines or cut pieces were refused (see the module's rules);
    ``cutting``: written by a Slurm that cut long records (:func:`cuts_records`)."""
    reader = _Reader(cutting)
    lines = (line.encode("utf-8", "surrogateescape") for line in text.split("\n"))
    return Parsed(list(reader.records(lines)), reader.refused)


def _bounded_lines(f: IO[bytes]) -> Iterator[bytes | None]:
    """Each line of ``f`` without its newline; None for a line longer than MAX_LINE (skipped
    in chunks of MAX_LINE)."""
    while True:
        line = f.readline(MAX_LINE + 1)
        if not line:
            return
        if line.endswith(b"\n"):
            yield line[:-1]
            continue
        if len(line) <= MAX_LINE:     # the file's last line, without a newline
            yield line
            return
        while line and not line.endswith(b"\n"):
            line = f.readline(MAX_LINE)
        yield None


class _Reader:
    """The one record reader: lines in, whole records out, ``refused`` counted (one a line or
    cut piece)."""

    def __init__(self, cutting: bool) -> None:
        self.cutting = cutting
        self.span = CUT_AT if cutting else RECORD_SPAN
        self.refused = 0
        self._open: _OpenRecord | None = None

    def records(self, lines: Iterable[bytes | None]) -> Iterator[dict[str, Any]]:
        for raw in lines:
            if raw is None:                 # longer than any line Slurm writes: refused
                self.refused += 1 + (self._open.lines if self._open else 0)
                self._open = None
                continue
            line = raw.decode("utf-8", "surrogateescape")
            if self._open is not None:
                self._continue_open(line, len(raw))
                continue
            for piece, cut in _pieces(line, self.cutting):
                got = self._piece(piece, cut)
                if got is not None:
                    yield got

    def _piece(self, piece: str, cut: bool) -> dict[str, Any] | None:
        if not piece.strip():
            return None
        f = None if cut else _record(piece)
        if f is not None:
            return _as_record(f)
        if cut or _ends_as_slurm_does(piece) or not _START.match(piece):
            self.refused += 1               # cut, whole but not Slurm's (a key repeated), or no record's start
        else:                               # its name or work dir goes on past a newline
            self._open = _OpenRecord(piece)
        return None

    def _continue_open(self, line: str, size: int) -> None:
        """One more line of an open record: it is the record's, whatever it looks like."""
        rec = self._open
        assert rec is not None
        rec.add(line, size)
        if rec.ended() or rec.size > self.span:
            self.refused += rec.lines
            self._open = None


class _OpenRecord:
    """A record whose name or work directory holds a newline, line by line, until Slurm's own
    fields after them have all come (each line looked at once: linear)."""
    _MIDDLE = re.compile(r" JobState=\S+ Partition=\S* TimeLimit=\S+ StartTime=\S+ EndTime=\S+ "
                         r"NodeList=\S* NodeCnt=\d+ ProcCnt=\d+ WorkDir=")
    _TAIL = re.compile(r" ReservationName=\S* Tres=\S* Account=\S* QOS=\S* WcKey=\S* Cluster=\S* "
                       r"SubmitTime=\S+ EligibleTime=\S+(?: ArrayJobId=\d+ ArrayTaskId=\d+| HetJobId=\d+ "
                       r"HetJobOffset=\d+)? DerivedExitCode=\d+:\d+ ExitCode=\d+:\d+ $")

    def __init__(self, first: str) -> None:
        self.lines, self.size = 1, len(first.encode("utf-8", "surrogateescape"))
        self._middle = self._MIDDLE.search(first, first.find(" Name=") + 1) is not None
        self._last = first

    def add(self, line: str, size: int) -> None:
        self.lines += 1
        self.size += size + 1
        self._last = line
        self._middle = self._middle or self._MIDDLE.search(line) is not None

    def ended(self) -> bool:
        """Slurm's fields after the name and work directory have all come: the record may end
        with this line (the earliest it can; a later end only refuses more lines)."""
        return self._middle and self._TAIL.search(self._last) is not None


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
            "DERIVED_EC": f["DerivedExitCode"], "ELIGIBLE": f["EligibleTime"],
            "ARRAYJOBID": f.get("ArrayJobId"), "ARRAYTASKID": f.get("ArrayTaskId"), **_tres(f["Tres"])}


def _tres(text: str) -> dict[str, Any]:
    """filetxt's allocated ``Tres=cpu=2,mem=125G,node=2,gres/gpu=1`` as record fields."""
    tres = dict(p.partition("=")[::2] for p in text.split(",") if "=" in p)
    mem = tres.get("mem", "")
    scale = {"K": 1 / 1024, "M": 1, "G": 1024, "T": 1024 * 1024}.get(mem[-1:], None)
    return {"ALLOC_GPUS": tres.get("gres/gpu"),
            "ALLOC_MEM_MB": float(mem[:-1]) * scale if scale and mem[:-1].replace(".", "", 1).isdigit() else None}
