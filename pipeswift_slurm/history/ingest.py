"""`pswift history ingest` as a library call: run directories, the jobcomp plugin's spool, a
jobcomp/filetxt file and slurmdbd's accounting merged into one history, and what each gave
(:class:`Ingested`); the command prints it. :func:`follow` repeats the Slurm sources on an
interval: a site that runs no jobcomp plugin (Slurm allows one JobCompType, and a site may use
its own) fills the history from sacct as a service instead (docs/admin.md)."""

from __future__ import annotations

# Imports inside functions: signal, only for `ingest --follow`'s stop on TERM and INT

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

from pipeswift_slurm import runfiles
from pipeswift_slurm.errors import SlurmError, UsageError
from pipeswift_slurm.progress import no_progress
from pipeswift_slurm.history import eventfold
from pipeswift_slurm.errors import IngestRefused
from pipeswift_slurm.history.store import History
from pipeswift_slurm.slurm import client as slurm
from pipeswift_slurm.slurm import filetxt


@dataclass
class Ingested:
    """What one ingest merged; ``warnings``: one line each, what was refused and why."""
    run_dirs: int = 0
    spooled: int | None = None
    jobcomp: tuple[int, int] | None = None     # (records read, new)
    sacct: list[tuple[str, int, int]] = field(default_factory=list)   # (cluster, records read, new) each
    skipped_events: int = 0
    dropped_events: int = 0
    attempts: int = 0                          # Slurm attempts in the history after it
    pswift_jobs: int = 0
    warnings: list[str] = field(default_factory=list)

    def summary(self, where: Path) -> str:
        msgs = [f"{self.run_dirs} changed run director{'y' if self.run_dirs == 1 else 'ies'}"]
        if self.spooled is not None:
            msgs.append(f"{self.spooled} spooled record(s)")
        if self.skipped_events:
            msgs.append(f"{self.skipped_events} bad event line(s) skipped")
        if self.dropped_events:
            msgs.append(f"{self.dropped_events} event line(s) past one job's bounds left out (over "
                        f"{eventfold.MAX_ATTEMPTS} attempts, {eventfold.MAX_KEPT_EVENTS:,} kept events or "
                        f"{eventfold.MAX_SLOW_LINES:,} lines besides the steps: docs/admin.md)")
        if self.jobcomp is not None:
            msgs.append(f"{self.jobcomp[0]} jobcomp record(s) ({self.jobcomp[1]} new)")
        for cluster, read, new in self.sacct:
            msgs.append(f"{read} sacct record(s) of cluster {cluster} ({new} new)")
        return (f"ingested {', '.join(msgs)}; {self.attempts} Slurm attempt(s), {self.pswift_jobs} pswift "
                f"job(s) in {where}")


def ingest(h: History, run_dirs: Sequence[Path] = (), spool: Path | None = None, jobcomp_file: Path | None = None,
           use_sacct: bool = False, registered: bool = True, progress: Any = no_progress,
           clusters: Sequence[str] = ()) -> Ingested:
    """Merge the named sources into ``h`` (without ``run_dirs``: every job pswift submitted,
    unless not ``registered``; sacct: each of ``clusters``, else this one, each from its own read
    mark). Raises UsageError for a source that is not there."""
    got = Ingested()
    for d in run_dirs:
        if not (d / runfiles.PLAN).is_file():
            raise UsageError(f"{d} is not a run directory (no plan.json)")
    if jobcomp_file is not None and not jobcomp_file.is_file():
        raise UsageError(f"{jobcomp_file}: no such file")
    if run_dirs:
        with progress("run directories", len(run_dirs)) as advance:
            for d in run_dirs:
                try:
                    got.run_dirs += h.ingest_run_dir(d)
                except IngestRefused as e:
                    got.warnings.append(f"warning: {d}: {e}")
                advance(1)
    elif registered:
        got.run_dirs = h.ingest_registered(progress=progress)
    if spool is not None:
        got.spooled, problems = h.ingest_spool(spool, progress=progress)
        got.warnings += [f"warning: spool file {p}" for p in problems]
    if jobcomp_file is not None:
        _jobcomp(h, jobcomp_file, got)
    if use_sacct:
        for cluster in clusters or [slurm.cluster_name()]:
            _sacct(h, got, cluster)
    got.skipped_events, got.dropped_events = h.skipped_events, h.dropped_events
    # Slurm's own records (not the ones a run's events stand in for until those come)
    got.attempts = h.conn.execute("SELECT COUNT(*) FROM slurm_jobs WHERE source != 'pswift'").fetchone()[0]
    got.pswift_jobs = h.db["jobs"].count
    return got


def _jobcomp(h: History, path: Path, got: Ingested) -> None:
    try:
        version: tuple[int, int, int] | None = slurm.slurm_version()
    except SlurmError:
        version = None
    read = new = 0
    refused: list[int] = []
    for batch in filetxt.batches(path, filetxt.cuts_records(version), refused):
        read, new = read + len(batch), new + h.add_slurm_records(batch, "filetxt")
    got.jobcomp = (read, new)
    if refused[0]:
        got.warnings.append(f"warning: {path}: {refused[0]} record(s) refused: a key repeated, a record "
                            f"cut or continued on the next line (Slurm writes job names unescaped; prefer the "
                            f"jobcomp/script plugin or --sacct, docs/admin.md)")


def _sacct(h: History, got: Ingested, cluster: str) -> None:
    here = cluster == slurm.cluster_name()
    records = slurm.sacct_jobs(since=h.sacct_since(cluster), cluster=None if here else cluster)
    if records is None:
        got.warnings.append(f"warning: `sacct --json` gave nothing for cluster {cluster} (no slurmdbd here, or "
                            f"another cluster's name?); use --jobcomp-file")
    else:
        got.sacct.append((cluster, len(records), h.add_sacct(cluster, records)))


def follow(open_history: Callable[[], History], interval_s: float, say: Callable[[str], None],
           spool: Path | None, use_sacct: bool, rounds: int | None = None, clusters: Sequence[str] = ()) -> None:
    """Ingest ``spool`` and/or sacct every ``interval_s`` seconds until stopped (TERM, INT) or
    ``rounds`` are done; sacct resumes from the history's read mark each time, so a stop or a
    restart loses nothing. A round that fails (Slurm unreachable, a locked database) is said
    and the next round tries again."""
    import signal
    stop = {"now": False}

    def stopping(*_: Any) -> None:
        stop["now"] = True
    old = signal.signal(signal.SIGTERM, stopping)
    done = 0
    try:
        while not stop["now"] and (rounds is None or done < rounds):
            try:
                h = open_history()
                try:
                    got = ingest(h, spool=spool, use_sacct=use_sacct, registered=False, clusters=clusters)
                finally:
                    h.close()
                for w in got.warnings:
                    say(w)
                say(got.summary(h.path))
            except (SlurmError, IngestRefused) as e:
                say(f"warning: this round did not merge ({e}); trying again in {interval_s:g} s")
            done += 1
            deadline = time.monotonic() + interval_s
            while not stop["now"] and (rounds is None or done < rounds) and time.monotonic() < deadline:
                time.sleep(min(0.2, interval_s))
    except KeyboardInterrupt:
        pass
    finally:
        signal.signal(signal.SIGTERM, old)
