"""Events folded into attempts, streamed and bounded (issue 24): the fast reading of the
launcher's step lines gives exactly what reading every line through the schema gives, however
the file is cut into chunks; the bounds hold against a hostile log; the real jobcomp plugin,
as root, folds a log at the 256 MiB cap as its user within 256 MB."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import example, given, settings, strategies as st

from pipeswift_slurm import events
from pipeswift_slurm.history import eventfold
from pipeswift_slurm.history.eventfold import Fold


ROOT = Path(__file__).resolve().parents[1]


def step_line(attempt: int, step: int, t: float, loss: float, dt: float, job: str | None = "9") -> bytes:
    """A step line exactly as the launcher's events.Writer writes it."""
    return (json.dumps({"event": "step", "time": t, "attempt": attempt, "job_id": job, "step": step,
                        "loss": loss, "loss_hex": loss.hex(), "step_time": dt}) + "\n").encode()


def start_line(attempt: int, t: float, step: int = 0) -> bytes:
    return (json.dumps({"event": "start", "time": t, "attempt": attempt, "job_id": "9", "nodes": 2,
                        "world_size": 2, "stages": 2, "data_parallel": 1, "micro_batches": 4,
                        "micro_batch_size": 8, "boundaries": [0, 3, 6], "step": step,
                        "resumed_from": None, "setup_s": 1.5, "load_s": 0.0}) + "\n").encode()


OTHER_LINES = [
    b'{"event": "checkpoint", "time": 5.0, "attempt": 0, "step": 3, "seconds": 0.25, "reason": "periodic"}\n',
    b'{"event": "end", "time": 9.0, "attempt": 0, "reason": "preempted", "step": 4}\n',
    b'{"event": "crash", "time": 7.0, "attempt": 1, "how": "signal", "action": "restart", "rank": 1}\n',
    b'{"event":"step","time":3.0,"attempt":0,"step":99,"loss":1.0,"step_time":0.5}\n',   # other spacing
    b'{"event": "step", "time": 3.0, "attempt": 0, "job_id": "9", "step": 7, "loss": NaN, "step_time": 0.5}\n',
    b'{"event": "step", "time": 1e400, "attempt": 0, "job_id": "9", "step": 7, "loss": 1.0, "step_time": 0.5}\n',
    b'{"event": "step", "time": 3.0, "attempt": 0, "job_id": "9", "step": 99999999999999, "loss": 1.0, "step_time": 0.5}\n',
    b'{"event": "step", "time": 3.0, "attempt": 2, "job_id": null, "step": 8, "loss": -2.5e-3, "step_time": 12}\n',
    b'{"event": "step", "time": 3.0, "attempt": 0, "job_id": "9", "step": 8, "loss": 1.0, "step_time": 0.5, "x": 1}\n',
    b'garbage {"event": "step", "time": 3.0, "attempt": 0, "job_id": "9", "step": 8, "loss": 1.0, "step_time": 0.5}\n',
    b'{"event": "step", "time": 3.0, "attempt": 0, "job_id": "9", "step": 8, "loss": 1.0, "step_time": 0.5}{\n',
    b"\n", b"   \n", b"\xff\xfe\n", b'{"event": "start"}\n',
]


def reference(lines: list[bytes]) -> tuple[list[dict], int]:
    """Every line through the schema, in order: what the fold must equal."""
    evs, skipped = events.parse(lines)
    return eventfold.by_attempt(evs), skipped


def shape(attempts: list[dict]) -> list:
    def nan_none(v):
        return None if isinstance(v, float) and math.isnan(v) else v
    return [(a["attempt"], a["ended"], a["start"], a["end"], a["checkpoint_s"],
             [tuple(nan_none(e[k]) for k in ("step", "time", "loss", "step_time")) for e in a["steps"]],
             *(a[k] for k in ("checkpoints", "profiles", "starts", "relayouts", "grows", "crashes")))
            for a in attempts]


def folded(blob: bytes, cuts: list[int]) -> Fold:
    fold, pos = Fold(), 0
    for cut in sorted(c % (len(blob) + 1) for c in cuts) + [len(blob)]:
        fold.feed(blob[pos:cut])
        pos = max(pos, cut)
    fold.close()
    return fold


line_st = st.one_of(
    st.builds(step_line, st.integers(0, 3), st.integers(0, 10**6), st.floats(0, 2e9),
              st.floats(-1e6, 1e6), st.floats(0, 100), st.sampled_from(["9", "12_3", None])),
    st.builds(start_line, st.integers(0, 3), st.floats(0, 2e9)),
    st.sampled_from(OTHER_LINES))


@settings(max_examples=300, deadline=None)
@given(st.lists(line_st, max_size=60), st.lists(st.integers(0, 10**6), max_size=6),
       st.booleans())
def test_the_fast_reading_equals_the_schemas_reading_however_the_file_is_cut(lines, cuts, torn):
    blob = b"".join(lines)
    if torn and blob:
        blob = blob[:-1]          # a last line without its newline still counts
    want, skipped = reference(blob.split(b"\n"))
    fold = folded(blob, cuts)
    assert shape(fold.attempts()) == shape(want)
    assert fold.skipped == skipped and fold.dropped == 0


def test_a_long_run_of_launcher_lines_takes_the_fast_reading():
    blob = start_line(0, 1.0) + b"".join(step_line(0, s, 1.0 + s, 3.0 - s / 1e4, 0.5) for s in range(1, 20001))
    calls = []
    fold = Fold()
    fold._slow = lambda block: calls.append(block)   # noqa: SLF001 - the fallback must not be needed
    for i in range(0, len(blob), 1 << 16):
        fold.feed(blob[i:i + (1 << 16)])
    (a,) = fold.attempts()
    assert calls == [] and len(a["steps"]) == 20000 and a["steps"][-1]["step"] == 20000
    assert a["start"]["setup_s"] == 1.5 and a["ended"] == "running"


def test_attempts_beyond_the_cap_keep_the_newest_and_count_the_rest():
    n = eventfold.MAX_ATTEMPTS + 50
    blob = b"".join(start_line(a, float(a)) + step_line(a, 1, a + 0.5, 1.0, 0.1) for a in range(n))
    fold = folded(blob, [])
    got = fold.attempts()
    assert len(got) == eventfold.MAX_ATTEMPTS and got[0]["attempt"] == 50 and got[-1]["attempt"] == n - 1
    assert fold.dropped == 50 * 2
    late = folded(blob + start_line(3, 1.0), [])          # an old attempt's event after the cap
    assert late.dropped == 50 * 2 + 1


def test_non_step_events_are_kept_within_their_count_bytes_and_per_kind_bounds():
    crash = b'{"event": "crash", "time": 5.0, "attempt": %d, "how": "signal", "action": "restart"}\n'
    n = eventfold.MAX_KEPT_EVENTS + 100
    fold = folded(b"".join(crash % (i // 200) for i in range(n)), [])
    assert sum(len(a["crashes"]) for a in fold.attempts()) == eventfold.MAX_KEPT_EVENTS and fold.dropped == 100
    ckpt = b'{"event": "checkpoint", "time": 5.0, "attempt": 0, "step": 3, "seconds": 0.5, "reason": "grow"}\n'
    fold = folded(ckpt * 500, [])
    (a,) = fold.attempts()
    assert len(a["checkpoints"]) == eventfold.PER_ATTEMPT["checkpoints"] and fold.dropped == 300
    assert a["checkpoint_s"] == 0.5 * 500                  # the seconds of every checkpoint still count
    grow = (b'{"event": "grow", "time": 5.0, "attempt": 0, "step": 3, "nodes_from": 2, "nodes_to": 4}\n')
    fold = folded(grow * 500, [])
    assert len(fold.attempts()[0]["grows"]) == eventfold.PER_ATTEMPT["grows"] and fold.dropped == 400


def profile_line(attempt: int, mbs: int, t: float, instructions: bool) -> bytes:
    return (json.dumps({"event": "layer_profile", "time": t, "attempt": attempt, "micro_batch_size": mbs,
                        "seconds": {"0": t, "1": t}, "boundaries": [0, 1, 2], "micro_batches": 4,
                        **({"instructions": {"0": {"ForwardPass": t}}} if instructions else {})}) + "\n").encode()


def test_only_the_newest_profile_of_each_micro_batch_size_is_kept():
    """The history keeps one profile a micro-batch size (the newest) and the overheads of the
    newest with instruction times: the fold holds those, whatever the file repeats."""
    lines = [profile_line(a, mbs, 100.0 * a + mbs + i, instructions=(mbs == 2 and i == 0))
             for a in range(3) for mbs in (1, 2) for i in range(50)]
    fold = folded(b"".join(lines), [])
    kept = [(a["attempt"], p["micro_batch_size"], p["time"]) for a in fold.attempts() for p in a["profiles"]]
    assert kept == [(2, 1, 250.0), (2, 2, 202.0), (2, 2, 251.0)] and fold.kept_events == 3
    assert fold.dropped == 0
    many = folded(b"".join(profile_line(0, mbs, 1.0, False) for mbs in range(1, 40)), [])
    assert many.kept_events == eventfold.MAX_PROFILES and many.dropped == 39 - eventfold.MAX_PROFILES


def test_a_line_over_the_cap_is_skipped_to_its_end():
    huge = b'{"event": "crash", "how": "' + b"x" * (eventfold.MAX_LINE + 10) + b'"}\n'
    blob = step_line(0, 1, 1.0, 1.0, 0.1) + huge + step_line(0, 2, 2.0, 1.0, 0.1)
    fold = folded(blob, list(range(0, len(blob), 1 << 20)))
    (a,) = fold.attempts()
    assert [e["step"] for e in a["steps"]] == [1, 2] and fold.skipped == 1


def _write_cap_log(run: Path, size: int) -> int:
    """events.jsonl of launcher lines up to ``size`` bytes; returns its step count."""
    n = (size - 400) // len(step_line(0, 10**6, 1796092184.016, 4.736441612243652, 0.116868))
    with open(run / "events.jsonl", "wb") as fh:
        fh.write(start_line(0, 1796092180.0))
        for lo in range(1, n + 1, 100_000):
            fh.write(b"".join(step_line(0, s, 1796092180.0 + s, 4.736441612243652, 0.116868)
                              for s in range(lo, min(n + 1, lo + 100_000))))
    return n


#: runs one command and prints the largest resident set (KiB) of it and its waited-for children
PEAK = ("import resource, subprocess, sys; rc = subprocess.call(sys.argv[1:]); "
        "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss); sys.exit(rc)")


@pytest.mark.skipif(os.geteuid() != 0, reason="the plugin reads as the job's user only when root")
def test_the_plugin_as_root_folds_a_log_at_the_cap_within_256_mb(tmp_path, public_tmp, other_user):
    run = public_tmp / "big"
    run.mkdir()
    (run / "plan.json").write_text(json.dumps({
        "version": 1, "job_name": "big", "partition": "low", "training": {"steps": 10**7},
        "model": {"entry": "m:f"}, "prediction": {"nodes": 2, "step_s": 0.1, "jct_s": 10.0}}))
    steps = _write_cap_log(run, 256 << 20)
    assert (run / "events.jsonl").stat().st_size > 250 << 20
    for p in (run, run / "plan.json", run / "events.jsonl"):
        os.chown(p, other_user.pw_uid, other_user.pw_gid)
    env = {**os.environ, "JOBID": "77", "UID": str(other_user.pw_uid), "GID": str(other_user.pw_gid),
           "USERNAME": other_user.pw_name, "WORK_DIR": str(run), "JOBSTATE": "COMPLETED",
           "START": "1796092180", "END": "1796192180", "SUBMIT": "1796092100", "PARTITION": "low",
           "CLUSTER": "c", "NODECNT": "2"}
    db, spool = tmp_path / "h.db", tmp_path / "spool"
    proc = subprocess.run([sys.executable, "-c", PEAK, sys.executable, str(ROOT / "plugins" / "jobcomp_pswift.py"),
                           "--spool", str(spool), "--db", str(db), "--timeout", "120"],
                          env=env, capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr
    assert list(spool.glob("*.json")) == []                     # merged, not left in the spool
    peak_mb = int(proc.stdout.split()[-1]) / 1024
    assert peak_mb <= 256, peak_mb                              # the plugin and its reader child
    import sqlite3
    with sqlite3.connect(db) as conn:
        row = conn.execute("SELECT j.user, j.job_id, a.step_count, a.end_step FROM jobs j "
                           "JOIN attempts a ON a.job = j.id").fetchone()
    assert row == (other_user.pw_name, "77", steps - 1, steps)


def test_every_re_layout_is_measured_from_the_steps_under_its_own_cut():
    """One pass over the steps measures every re-layout (a hostile log's 100 included): each
    from the launch that followed it until the next re-layout, each with its own median."""
    n = 12
    lines = [start_line(0, 0.0)]
    for k in range(n):
        lines.append((json.dumps({"event": "relayout", "time": 10.0 * k + 1, "attempt": 0, "step": 10 * k,
                                  "boundaries_from": [0, 3, 6], "boundaries_to": [0, 2, 6], "step_s": 1.0,
                                  "predicted_step_s": 0.5, "gain_s": 9.0, "cost_s": 1.0}) + "\n").encode())
        lines.append(start_line(0, 10.0 * k + 2, step=10 * k))
        lines += [step_line(0, 10 * k + j, 10.0 * k + 2 + j * 0.1, 1.0, 0.5 + k / 100) for j in range(1, 10)]
    (a,) = eventfold.read_attempts(b"".join(lines)).attempts()
    out = eventfold.relayout_outcomes(a)
    assert [o["measured_step_s"] for o in out] == [0.5 + k / 100 for k in range(n)]
    assert [o["measured_gain_s"] for o in out] == [pytest.approx((0.5 - k / 100) * 9) for k in range(n)]
    assert [o["measured_cost_s"] for o in out] == [1.0] * n


def test_checkpoints_are_summed_and_only_a_re_layouts_or_growths_kept():
    """The fold's memory follows what readers use: the smallest checkpoint lines, as many as
    are read through the schema, become one sum, not a dict each; a re-layout's checkpoint is
    still found; past the schema's budget lines are counted unread (16 MiB of them: 479k)."""
    small = b'{"event":"checkpoint","attempt":0}\n'
    relayout_ckpt = b'{"event": "checkpoint", "attempt": 0, "step": 4, "seconds": 2.0, "reason": "relayout"}\n'
    fold = folded(small * (eventfold.MAX_SLOW_LINES - 1) + relayout_ckpt, [])
    (a,) = fold.attempts()
    assert a["checkpoints"] == [events.validate(json.loads(relayout_ckpt))] and fold.dropped == 0
    assert a["checkpoint_s"] == 2.0 and fold.kept_events == 1
    n = (16 << 20) // len(small)
    fold = folded(small * n + step_line(0, 1, 1.0, 1.0, 0.1), [])
    (a,) = fold.attempts()
    assert fold.dropped == n - eventfold.MAX_SLOW_LINES and len(a["steps"]) == 1 and fold.kept_events == 0


# ----------------------------------------------------------------------------- at the cap, any mix
def _hostile_lines() -> dict:
    """Legal lines of every kind, each the largest or most numerous the schema allows."""
    n = events.MAX_LAYERS
    by_layer = {str(i): 1000 for i in range(n)}
    profile = {"event": "layer_profile", "time": 1.0, "micro_batch_size": 1, "micro_batches": 4,
               "seconds": {str(i): 0.001 for i in range(n)}, "param_bytes": by_layer, "activation_bytes": by_layer,
               "saved_bytes": by_layer, "boundaries": list(range(n + 1)),
               "instructions": {str(s): {f"I{k}": 0.5 for k in range(events.MAX_INSTRUCTIONS)} for s in range(n)}}
    return {
        "step": lambda i: step_line(0, i, 1.0 + i, 1.5, 0.1),
        "compact step": lambda i: b'{"event":"step","step":%d,"loss":1,"step_time":1}\n' % i,
        "small checkpoint": lambda i: b'{"event":"checkpoint","attempt":%d}\n' % (i % 1000),
        "crash": lambda i: (json.dumps({"event": "crash", "attempt": i % 1000, "how": "x" * 100, "action": "restart",
                                        "why": "y" * 4000}) + "\n").encode(),
        "start": lambda i: (json.dumps({"event": "start", "time": 1.0 * i, "attempt": i % 1000, "nodes": 1,
                                        "world_size": 1, "stages": n, "data_parallel": 1, "micro_batches": 1,
                                        "micro_batch_size": 1, "step": 0, "boundaries": list(range(n + 1)),
                                        "partition": "p" * 4000}) + "\n").encode(),
        "relayout": lambda i: (json.dumps({"event": "relayout", "time": 1.0 * i, "attempt": i % 1000, "step": i,
                                           "boundaries_from": list(range(n + 1)),
                                           "boundaries_to": list(range(n + 1))}) + "\n").encode(),
        "profile": lambda i: (json.dumps({**profile, "micro_batch_size": 1 + i % 40, "attempt": i % 1000}) + "\n").encode(),
        "discarded": lambda i: (json.dumps({"event": "checkpoint_discarded", "attempt": 0,
                                            "names": ["n" * 4000] * 1000}) + "\n").encode(),
    }


def _write_mix(path: Path, mix: list[tuple[str, int]], size: int) -> None:
    """events.jsonl of ``size`` bytes: one 4 MiB block of the kinds in ``mix`` (by weight), repeated."""
    gens, total, block, i = _hostile_lines(), sum(w for _, w in mix), [], 0
    for kind, weight in mix:
        got = 0
        while got < (4 << 20) * weight // total:
            line = gens[kind](i)
            block.append(line)
            got, i = got + len(line), i + 1
    blob = b"".join(block)
    with open(path, "wb") as fh:
        for _ in range(size // len(blob)):
            fh.write(blob)


#: the ingest's CPU seconds (its own and its reader child's: the work, whatever else shares the host)
INGEST = ("import resource, sys; from pipeswift_slurm.history.store import History; h = History(sys.argv[2]); "
          "cpu = lambda: sum(getattr(resource.getrusage(w), f) for w in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN) "
          "for f in ('ru_utime', 'ru_stime')); t0 = cpu(); h.ingest_run_dir(sys.argv[1]); print(cpu() - t0)")


def _ingest_cpu_and_peak(mix: list[tuple[str, int]], size: int) -> tuple[float, float]:
    """(CPU seconds, peak MiB) of `history ingest` of a run directory whose events.jsonl is
    ``size`` bytes of ``mix``."""
    import tempfile
    with tempfile.TemporaryDirectory() as tmp:
        run = Path(tmp) / "run"
        run.mkdir()
        (run / "plan.json").write_text(json.dumps({"version": 1, "job_name": "cap", "partition": "low",
                                                   "training": {"steps": 10**7}, "model": {"entry": "m:f"}}))
        _write_mix(run / "events.jsonl", mix, size)
        proc = subprocess.run([sys.executable, "-c", PEAK, sys.executable, "-c", INGEST, str(run), str(Path(tmp) / "h.db")],
                              capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    seconds, peak_kib = (float(x) for x in proc.stdout.split())
    return seconds, peak_kib / 1024


@settings(max_examples=3, deadline=None, derandomize=True)
@given(st.lists(st.tuples(st.sampled_from(sorted(_hostile_lines())), st.integers(1, 30)), min_size=1, max_size=4))
@example([("step", 9), ("small checkpoint", 1)])
@example([("step", 30), ("start", 1)])
@example([("step", 30), ("relayout", 1), ("compact step", 1)])
def test_the_ingest_of_a_log_at_the_cap_is_linear_and_within_256_mb_whatever_its_mix(mix):
    """Any mix of legal lines at the readers' 256 MiB cap: `history ingest` of the run
    directory (read, fold, rows, database) peaks under 256 MB, and its CPU time grows linearly:
    4x the log (64 -> 256 MiB) costs at most 7x the CPU (the same mix and machine in one run: a
    ratio, not a clock; a quadratic fold costs 16x). Before, 16 MiB of the smallest checkpoint
    lines took 252 MB, and every re-layout re-read the attempt's steps. The absolute figure is
    bench/ingest_cap.py's."""
    quarter_s, _ = _ingest_cpu_and_peak(mix, 64 << 20)
    seconds, peak_mib = _ingest_cpu_and_peak(mix, 256 << 20)
    assert peak_mib <= 256, (mix, peak_mib)
    assert seconds <= 7 * max(quarter_s, 0.25), (mix, quarter_s, seconds)
