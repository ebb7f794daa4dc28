"""The job history: one SQLite file (sqlite-utils), shared by the planner and the admin reports.

Path: ``--db``, else ``$PSWIFT_DB``, else ``$PSWIFT_HOME/history.db`` (default
``~/.local/state/pswift/history.db``). Jobs write JSONL events into their run directories (a
shared filesystem is no place for SQLite writes from many nodes); the login-node side ingests
them here. Ingest is idempotent: a run directory's rows are replaced whole, in one transaction,
and skipped while its events file is unchanged. Schema changes are numbered migrations
(``PRAGMA user_version``).
"""

from __future__ import annotations

# Imports inside functions: sqlite_utils, threads and the views' modules load only for the
# commands that write or serve the history

import contextlib
import functools
import json
import os
import sqlite3
import time
from pathlib import Path
from typing import Any, Iterator, NamedTuple, TypeVar

from pipeswift_slurm import runfiles
from pipeswift_slurm import events as events_mod
from pipeswift_slurm.history import views as history_views
from pipeswift_slurm.errors import HistoryError, IngestRefused
from pipeswift_slurm.progress import no_progress
from pipeswift_slurm.history.queries import Queries
from pipeswift_slurm.history.schema import COLS as _COLS, MIGRATIONS, ROLLUP as _ROLLUP, UPSERT as _UPSERT
from pipeswift_slurm.history import spool
from pipeswift_slurm.history.rundir import state_dir
from pipeswift_slurm.history.rows import Owner, RunRows, rows, slurm_records, user_name
from pipeswift_slurm.slurm.accounting import normalise_record, sacct_read_mark


def default_path() -> Path:
    env = os.environ.get("PSWIFT_DB")
    return Path(env) if env else state_dir() / "history.db"


class _RunRead(NamedTuple):
    """A run directory read for the history (its events file's size and mtime: the next
    ingest skips it while they are the same)."""
    run: str
    rows: RunRows
    size: int
    mtime: float


class History(Queries):
    """An open history database (migrated to the newest schema); its reads are
    :class:`~pipeswift_slurm.history.queries.Queries`."""

    def __init__(self, path: Path | str | None = None, create: bool = True,
                 timeout: float = 30.0, read_only: bool = False) -> None:
        self.path = Path(path) if path else default_path()
        self.skipped_events = 0   # bad lines in the events files ingested through this handle
        self.dropped_events = 0   # valid events beyond eventfold's bounds (attempts, kept bytes)
        #: one line for a reader to say (a read of an older schema from a migrated copy), or ""
        self.notice = ""
        self._copy: Any = None    # the temporary folder of that copy, removed by close()
        if (not create or read_only) and not self.path.exists():
            raise HistoryError(f"no history database at {self.path}; run `pswift history ingest` "
                               f"or pass --db")
        if read_only:
            self._open_read_only(timeout)
            return
        try:
            self.path.parent.mkdir(mode=0o750, parents=True, exist_ok=True)
            _create_private(self.path)
            conn = sqlite3.connect(str(self.path), timeout=timeout, isolation_level=None)
            conn.execute(f"PRAGMA busy_timeout = {int(timeout * 1000)}")
            _retry_locked(lambda: conn.execute("PRAGMA journal_mode = WAL"), timeout)
            conn.execute("PRAGMA foreign_keys = ON")
            self.conn = conn
            self._db: Any = None
            _retry_locked(self._migrate, timeout)
            _retry_locked(lambda: history_views.ensure(conn), timeout)
        except sqlite3.OperationalError as e:
            raise _db_error(self.path, e) from None
        except sqlite3.DatabaseError as e:
            raise HistoryError(f"history database {self.path} is unusable ({e}); move it aside "
                               f"and run `pswift history ingest` to rebuild it") from None
        except OSError as e:
            raise HistoryError(f"cannot open history database {self.path}: {e.strerror}") from None

    @property
    def db(self) -> Any:
        """The database through sqlite-utils (imported on first use: it pulls in numpy, which a
        submission that only reads the history should not pay for)."""
        if self._db is None:
            import sqlite_utils
            self._db = sqlite_utils.Database(self.conn)
        return self._db

    def _migrate(self) -> None:
        conn = self.conn
        if conn.execute("PRAGMA user_version").fetchone()[0] == len(MIGRATIONS):
            return
        # a migration may rebuild a table that others reference: foreign keys are off while it
        # runs (the pragma works outside a transaction only), and checked before it commits
        conn.execute("PRAGMA foreign_keys = OFF")
        conn.execute("BEGIN IMMEDIATE")   # the version is read again under the write lock, so
        try:                              # two first openers cannot both create the tables
            version = conn.execute("PRAGMA user_version").fetchone()[0]
            if version > len(MIGRATIONS):
                raise HistoryError(f"history database {self.path} has schema {version}, newer than "
                                   f"this pswift ({len(MIGRATIONS)}); upgrade pipeswift-slurm")
            for (name,) in conn.execute("SELECT name FROM sqlite_master WHERE type = 'view'").fetchall():
                conn.execute(f'DROP VIEW "{name}"')   # derived: history_views.ensure makes them anew
            for i in range(version, len(MIGRATIONS)):
                for stmt in filter(str.strip, MIGRATIONS[i].split(";")):
                    conn.execute(stmt)
            if conn.execute("PRAGMA foreign_key_check").fetchone() is not None:
                raise HistoryError(f"history database {self.path}: a migration broke a reference")
            conn.execute(f"PRAGMA user_version = {len(MIGRATIONS)}")
            conn.execute("COMMIT")
        except Exception:
            conn.execute("ROLLBACK")
            raise
        finally:
            conn.execute("PRAGMA foreign_keys = ON")

    def close(self) -> None:
        self.conn.close()
        if self._copy is not None:
            self._copy.cleanup()
            self._copy = None

    def _open_read_only(self, timeout: float) -> None:
        """A reader's connection: the file opened read-only, never changed. At this pswift's
        schema, views that are stale or missing are made as TEMP views (the connection's own);
        an older schema is migrated in a private temporary copy, read from there (``notice``
        says so, and how to upgrade the file: `pswift history migrate`)."""
        from urllib.parse import quote
        try:
            src = sqlite3.connect(f"file:{quote(str(self.path.resolve()))}?mode=ro", uri=True,
                                  timeout=timeout, isolation_level=None)
            src.execute(f"PRAGMA busy_timeout = {int(timeout * 1000)}")
            version = src.execute("PRAGMA user_version").fetchone()[0]
        except sqlite3.DatabaseError as e:
            raise HistoryError(f"history database {self.path} is unusable ({e}); move it aside "
                               f"and run `pswift history ingest` to rebuild it") from None
        self._db = None
        if version > len(MIGRATIONS):
            src.close()
            raise HistoryError(f"history database {self.path} has schema {version}, newer than "
                               f"this pswift ({len(MIGRATIONS)}); upgrade pipeswift-slurm")
        if version == len(MIGRATIONS):
            self.conn = src
            history_views.ensure(src, temp=True)
            return
        import tempfile
        self._copy = tempfile.TemporaryDirectory(prefix="pswift-history-")   # 0700: this user's
        copy = sqlite3.connect(str(Path(self._copy.name) / "history.db"), isolation_level=None)
        src.backup(copy)
        src.close()
        self.conn = copy
        self._migrate()
        history_views.ensure(copy)
        self.notice = (f"note: {self.path} has schema {version}, older than this pswift's "
                       f"{len(MIGRATIONS)}: read from a migrated copy, the file unchanged; "
                       f"`pswift history migrate` upgrades it in place (keeping a backup)")

    def migrate_in_place(self) -> Path | None:
        """Nothing to do at this schema (None); else a backup beside the file first (SQLite's
        online backup, so a writer meanwhile is safe), then the migrations, in place. Returns
        the backup's path. For `pswift history migrate`, on a handle opened read-only."""
        from urllib.parse import quote
        src = sqlite3.connect(f"file:{quote(str(self.path.resolve()))}?mode=ro", uri=True)
        try:
            version = src.execute("PRAGMA user_version").fetchone()[0]
            if version >= len(MIGRATIONS):
                return None
            backup = self.path.with_name(f"{self.path.name}.schema{version}-{time.strftime('%Y%m%dT%H%M%S')}")
            _create_private(backup)
            dest = sqlite3.connect(str(backup))
            src.backup(dest)
            dest.close()
        finally:
            src.close()
        History(self.path, create=False).close()     # a writer's open migrates
        return backup

    # ------------------------------------------------------------------------- ingest
    def ingest_run_dir(self, run_dir: Path | str, owner: Owner | None = None,
                       timeout: float = 30.0, measured_only: bool = False) -> bool:
        """Replace the rows of one run directory; False if unchanged since the last ingest or
        not a run directory. ``owner``: Slurm's record of whose job it is (the jobcomp plugin's);
        without it, the directory's owner. Files are read through :mod:`userfiles` (no symlinks,
        the owner's regular files only, bounded; as the owner, killed at ``timeout``, when this
        process is root); a directory refused there raises :class:`IngestRefused`.
        ``measured_only``: skip a directory whose job has written no events yet (nothing to
        learn from; it is ingested once it has)."""
        read = self._read_run_dir(run_dir, owner, timeout, measured_only)
        if read is None:
            return False
        with self._writing():
            self._store_run(read)
        return True

    def _read_run_dir(self, run_dir: Path | str, owner: Owner | None, timeout: float,
                      measured_only: bool = False) -> _RunRead | None:
        """The run directory's rows, read outside any write transaction (the read may take up to
        ``timeout``: other writers are not held that long); None when unchanged or not a run."""
        run = os.path.abspath(run_dir)    # not resolve(): that would follow the user's symlinks
        try:
            st = os.stat(os.path.join(run, events_mod.FILE), follow_symlinks=False)
            size, mtime = st.st_size, st.st_mtime
        except OSError:
            size, mtime = 0, 0.0
        if measured_only and size == 0:
            return None
        row = self.conn.execute("SELECT size, mtime FROM ingest_state WHERE run_dir = ?",
                                   [run]).fetchone()
        if row is not None and row[0] == size and row[1] == mtime:
            return None
        from pipeswift_slurm import userfiles      # (the reading modules load only for a changed run:
        from pipeswift_slurm.history import eventfold   # a submission checks the user's runs)
        fold = eventfold.Fold()   # events.jsonl is folded as it is read, never held whole
        try:
            if owner is None:
                files = userfiles.read_run_files(run, events_sink=fold.feed)
                owner = Owner(user_name(files.owner), files.owner, -1)
            else:
                files = userfiles.read_run_files_as(run, owner.uid, owner.gid, timeout, fold.feed)
        except userfiles.UnsafeFile as e:
            raise IngestRefused(f"run directory not ingested: {e}") from None
        got = rows(run, files, owner, fold)
        return None if got is None else _RunRead(run, got, files.events_size, files.events_mtime)

    def _store_run(self, read: _RunRead) -> None:
        """Write what :meth:`_read_run_dir` read (inside the caller's :meth:`_writing`), unless
        another ingest stored a newer read meanwhile (two members' ends merge at once: the one
        that read less of the append-only events file must not write over the other)."""
        stored = self.conn.execute("SELECT size, mtime FROM ingest_state WHERE run_dir = ?", [read.run]).fetchone()
        if stored is not None and (stored[1], stored[0]) > (read.mtime, read.size):   # (a path reused: newer)
            return
        self.skipped_events += read.rows.skipped_events
        self.dropped_events += read.rows.dropped_events
        self._replace_run(read.run, read.rows, read.size, read.mtime)
        self._run_as_slurm_records(read.rows)

    @contextlib.contextmanager
    def _writing(self) -> Iterator[None]:
        """One write transaction (BEGIN IMMEDIATE .. COMMIT, ROLLBACK on error); inside another,
        part of it: a spool record and its run directory's rows land together or not at all."""
        if self.conn.in_transaction:
            yield
            return
        self.conn.execute("BEGIN IMMEDIATE")
        try:
            yield
            self.conn.execute("COMMIT")
        except BaseException:
            self.conn.execute("ROLLBACK")
            raise

    def _run_as_slurm_records(self, got: RunRows) -> None:
        """The run's attempts as Slurm's records (rows.slurm_records) where Slurm's own record of
        the job has not come: every report then sees the job; the derived rows are made anew at
        each ingest of the run, and gone once Slurm's own arrive (add_slurm_records)."""
        records = slurm_records(got)
        if not records:
            return
        job_id, cluster = got.job["job_id"], got.job.get("cluster") or ""
        # by the roll-up's job number (indexed), then each roll-up's own rows (the primary key)
        slurms = self.conn.execute(
            "SELECT COUNT(*) FROM job_rollup r WHERE r.job_num = CAST(? AS INTEGER) AND r.job_id = ? AND (r.cluster = ? OR ? = '') "
            "AND EXISTS (SELECT 1 FROM slurm_jobs s WHERE s.cluster = r.cluster AND s.job_id = r.job_id AND "
            "s.source != 'pswift')", [job_id, job_id, cluster, cluster]).fetchone()[0]
        if slurms:
            return
        self.conn.execute("DELETE FROM slurm_jobs WHERE job_id = ? AND cluster = ? AND source = 'pswift'",
                          [job_id, cluster])
        self.add_slurm_records(records, "pswift")

    def _replace_run(self, run: str, got: RunRows, size: int, mtime: float) -> None:
        conn = self.conn
        with self._writing():
            # the same job: its path, job id and user, on its cluster (an unknown cluster, '', is
            # any: a run dir ingested by hand is the job the plugin ingested with its cluster)
            same = ("FROM jobs WHERE run_dir = ? AND COALESCE(job_id, '') = ? AND COALESCE(user, '') = ? "
                    "AND (cluster = ? OR cluster = '' OR ? = '')")
            key = [run, got.job["job_id"] or "", got.job["user"] or "", got.job["cluster"], got.job["cluster"]]
            known = conn.execute(f"SELECT MAX(cluster) {same}", key).fetchone()[0]
            conn.execute(f"DELETE {same}", key)
            job_pk = _insert(conn, "jobs", [{**got.job, "cluster": got.job["cluster"] or known or ""}])
            _insert(conn, "attempts", [{**a, "job": job_pk} for a in got.attempts])
            _insert(conn, "layer_profiles", got.profiles, ("model_key", "micro_batch_size", "layer"),
                    keep=("weight_fraction",))   # a 1F1B profile cannot measure it
            _insert(conn, "pipe_overheads", got.overheads, ("model_key", "micro_batch_size"))
            _insert(conn, "plan_decisions", [{**d, "job": job_pk} for d in got.decisions])
            _insert(conn, "relayouts", [{**r, "job": job_pk} for r in got.relayouts], ("job", "attempt", "step"))
            _insert(conn, "ingest_state", [{"run_dir": run, "size": size, "mtime": mtime}], ("run_dir",))

    def ingest_registered(self, measured_only: bool = False, progress: Any = no_progress) -> int:
        """Ingest every run directory in the per-user job registry; returns how many changed
        (a directory refused as unsafe is skipped; with ``measured_only``, one without events).
        A job the history holds as completed is passed over unread while its registry entry is
        older than its end (an entry written since is a new job that reuses the id): each
        submission scans the user's whole registry, so a finished job costs one stat, not a read.
        ``progress(what, total)``: a context giving ``advance(n)`` (progress.progress draws a bar)."""
        n = 0
        jobs = state_dir() / "jobs"
        ended = dict(self.conn.execute("SELECT job_id, MAX(end_time) FROM jobs WHERE state = 'completed' "
                                       "AND end_time IS NOT NULL GROUP BY job_id"))
        try:
            with os.scandir(jobs) as found:
                entries = sorted(jobs / e.name for e in found
                                 if e.name.endswith(".json") and not _finished(e, ended.get(e.name[:-5])))
        except OSError:
            entries = []
        with progress("run directories", len(entries)) as advance:
            for f in entries:
                try:
                    run = json.loads(f.read_text())["run_dir"]
                    n += self.ingest_run_dir(str(run), measured_only=measured_only)
                except (OSError, ValueError, KeyError, TypeError, IngestRefused):
                    pass
                advance(1)
        return n

    def add_slurm_records(self, records: list[dict[str, Any]], source: str) -> int:
        """Upsert Slurm attempt records (normalised by :func:`normalise_record`); returns how
        many were new (an attempt already stored is updated, never duplicated)."""
        rows = [r for r in (normalise_record(x, source) for x in records) if r is not None]
        if not rows:
            return 0
        keys = {(r["cluster"], r["job_id"], r["start"]) for r in rows}
        conn = self.conn
        conn.execute("CREATE TEMP TABLE IF NOT EXISTS touched (cluster TEXT, job_id TEXT, "
                     "PRIMARY KEY (cluster, job_id)) WITHOUT ROWID")
        conn.execute("CREATE TEMP TABLE IF NOT EXISTS incoming (cluster TEXT, job_id TEXT, "
                     "start REAL, PRIMARY KEY (cluster, job_id, start)) WITHOUT ROWID")
        with self._writing():
            conn.execute("DELETE FROM temp.touched")
            conn.execute("DELETE FROM temp.incoming")
            conn.executemany("INSERT OR IGNORE INTO temp.incoming VALUES (?, ?, ?)", keys)
            if source != "pswift":   # Slurm's own record of a job replaces what pswift derived of it
                _drop_derived(conn, {(r["cluster"], r["job_id"]) for r in rows})
            known: int = conn.execute("SELECT COUNT(*) FROM temp.incoming i JOIN slurm_jobs s ON "
                                      "s.cluster = i.cluster AND s.job_id = i.job_id AND "
                                      "s.start = i.start").fetchone()[0]
            conn.executemany(_UPSERT, [tuple(r[c] for c in _COLS) for r in rows])
            conn.executemany("INSERT OR IGNORE INTO temp.touched VALUES (?, ?)",
                             {(r["cluster"], r["job_id"]) for r in rows})
            conn.execute(_ROLLUP)
        return len(keys) - known

    def sacct_since(self, cluster: str) -> float | None:
        """Where the next `ingest --sacct` of ``cluster`` starts reading (None: from the start)."""
        row = self.conn.execute("SELECT last_end FROM sacct_state WHERE cluster = ?",
                                   [cluster]).fetchone()
        return None if row is None else float(row[0])

    def add_sacct(self, cluster: str, records: list[dict[str, Any]], now: float | None = None) -> int:
        """Merge ``sacct`` records of ``cluster`` and move its read mark to the newest end time
        among them (running jobs have none: they are read again until they end). Returns how
        many attempts were new."""
        new = self.add_slurm_records(records, "sacct")
        mark = sacct_read_mark(records, time.time() if now is None else now)
        if mark is not None:
            self.conn.execute(
                "INSERT INTO sacct_state VALUES (?, ?) ON CONFLICT (cluster) DO UPDATE SET "
                "last_end = MAX(last_end, excluded.last_end)", [cluster, mark])
        return new

    def ingest_spool_file(self, path: Path | str, timeout: float = 30.0) -> str | None:
        """Merge one jobcomp spool record and, for a pswift job, its run directory (read as the
        record's UID/GID: identity comes from Slurm's record only), then delete the spool file.
        Returns why the run directory was not merged, or None. A spool file that cannot be read
        safely raises IngestRefused (a symlink, not a regular file, over 64 KiB, not JSON)."""
        rec = spool.read_record(Path(path))
        problem, read = None, None
        owner = spool.record_owner(rec)
        work = rec.get("WORK_DIR")
        if owner is not None and work and spool.regular_file(os.path.join(work, runfiles.PLAN)):
            try:
                read = self._read_run_dir(work, owner, timeout)
            except IngestRefused as e:
                problem = str(e)
        with self._writing():   # one transaction: whoever sees Slurm's record sees the run as of it
            self.add_slurm_records([rec], "jobcomp")
            if read is not None:
                self._store_run(read)
        Path(path).unlink(missing_ok=True)
        return problem

    def ingest_spool(self, spool_dir: Path | str, timeout: float = 30.0,
                     progress: Any = no_progress) -> tuple[int, list[str]]:
        """Merge every spooled record; returns (merged, problems). A spool file that cannot be
        read is moved to ``bad/`` beside them with a ``.why`` file, never lost; the rest merge.
        A spool folder that is a link, another user's or writable by others raises IngestRefused."""
        d = Path(spool_dir)
        unsafe = spool.unsafe_folder(d)
        if unsafe:
            raise IngestRefused(unsafe)
        files = sorted(d.glob("*.json")) if d.is_dir() else []
        with progress("spooled records", len(files)) as advance:
            return self._merge_spool(d, files, timeout, advance)

    def _merge_spool(self, d: Path, files: list[Path], timeout: float, advance: Any) -> tuple[int, list[str]]:
        merged, problems = 0, []
        for f in files:
            advance(1)
            try:
                with spool.deadline(timeout, f"merging took over {timeout:g} s"):   # reading and folding
                    problem = self.ingest_spool_file(f, timeout)
                merged += 1
                if problem:
                    problems.append(f"{f.name}: merged the Slurm record only; {problem}")
            except HistoryError as e:
                if "locked" in str(e):
                    raise   # the database, not the file: every file stays for the next ingest
                problems.append(spool.set_aside(d, f, e))
            except Exception as e:   # whatever one file does, the others still merge
                problems.append(spool.set_aside(d, f, e))
        return merged, problems


def _quote(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _insert(conn: sqlite3.Connection, table: str, rows: list[dict[str, Any]],
            upsert_on: tuple[str, ...] | None = None, keep: tuple[str, ...] = ()) -> int | None:
    """Insert ``rows`` (dicts; a key missing in one is NULL there) into ``table``, updating the
    row with the same ``upsert_on`` key instead when given (the ``keep`` columns keep their value
    where the new row has none); returns the last rowid."""
    if not rows:
        return None
    cols = list(dict.fromkeys(k for r in rows for k in r))
    sql = (f"INSERT INTO {_quote(table)} ({', '.join(map(_quote, cols))}) "
           f"VALUES ({', '.join('?' * len(cols))})")
    if upsert_on:
        sets = [f"{_quote(c)} = COALESCE(excluded.{_quote(c)}, {_quote(c)})" if c in keep else
                f"{_quote(c)} = excluded.{_quote(c)}" for c in cols if c not in upsert_on]
        sql += (f" ON CONFLICT ({', '.join(map(_quote, upsert_on))}) DO "
                + (f"UPDATE SET {', '.join(sets)}" if sets else "NOTHING"))
    values = [tuple(r.get(c) for c in cols) for r in rows]
    if len(values) == 1:
        return conn.execute(sql, values[0]).lastrowid
    conn.executemany(sql, values)
    return None


def _db_error(path: Path, e: sqlite3.Error) -> HistoryError:
    if "locked" in str(e) or "busy" in str(e):
        return HistoryError(f"history database {path} is locked by another writer; try again "
                            f"in a moment")
    return HistoryError(f"history database {path}: {e}")


_C = TypeVar("_C", bound=type)


def _guarded(cls: _C) -> _C:
    """Every public method of History raises HistoryError (one line), never sqlite3's errors."""

    for name, fn in list(vars(cls).items()):
        if callable(fn) and not name.startswith("_"):
            def wrap(fn: Any) -> Any:
                @functools.wraps(fn)
                def inner(self: Any, *a: Any, **kw: Any) -> Any:
                    try:
                        return fn(self, *a, **kw)
                    except sqlite3.Error as e:
                        raise _db_error(self.path, e) from None
                return inner
            setattr(cls, name, wrap(fn))
    return cls


History = _guarded(History)  # type: ignore[misc]  # the same class, its methods wrapped in place


def _create_private(path: Path) -> None:
    """A new database file is 0640 (owner and an admin group), whatever the umask."""
    try:
        os.close(os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY | os.O_CLOEXEC, 0o640))
    except FileExistsError:
        pass


def _retry_locked(fn: Any, timeout: float) -> Any:
    """SQLite answers "locked" at once (no busy wait) to a few first-open steps, such as
    switching to WAL while another process creates the file: retry those until ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return fn()
        except sqlite3.OperationalError as e:
            if "locked" not in str(e) or time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def _finished(entry: os.DirEntry[str], end_time: float | None) -> bool:
    """Is the registry ``entry`` a job that completed at ``end_time`` (and not one written later)?"""
    if end_time is None:
        return False
    try:
        return entry.stat(follow_symlinks=False).st_mtime <= end_time
    except OSError:
        return False


def _drop_derived(conn: sqlite3.Connection, jobs: set[tuple[str, str]]) -> None:
    """The rows a run's events stood in for (source 'pswift', rows.slurm_records) of ``jobs``
    (cluster, job id), on their cluster or none known (''), and the roll-ups of the latter: each
    by the primary key (the jobcomp plugin merges at every job's end: no scan of the table)."""
    pairs = [(c, j) for c, j in jobs] + [("", j) for c, j in jobs if c]
    conn.executemany("DELETE FROM job_rollup WHERE cluster = '' AND job_id = ? AND EXISTS (SELECT 1 FROM "
                     "slurm_jobs s WHERE s.cluster = '' AND s.job_id = ? AND s.source = 'pswift')",
                     [(j, j) for c, j in pairs if c == ""])
    conn.executemany("DELETE FROM slurm_jobs WHERE cluster = ? AND job_id = ? AND source = 'pswift'", pairs)


def safe_open(path: Path | str | None = None, warn: Any = None, create: bool = True) -> History | None:
    """Open for the planner: a bad DB degrades to no history, with a warning, never a crash;
    ``create=False`` (a read-only command): no database is made where there is none."""
    if not create and not Path(path or default_path()).exists():
        return None
    try:
        h = History(path, timeout=5.0, read_only=not create)
        if h.notice and warn is not None:
            warn(h.notice)
        return h
    except HistoryError as e:
        if warn is not None:
            warn(f"warning: {e}; planning without history")
        return None
