"""checkpoint_interval = "auto" (issue 23, item 4): Young/Daly's interval from the checkpoint's
cost and the interruptions the history measured (a prior without history), priced by the
planner, printed by `pswift plan`, followed by the launcher in a real run."""

from __future__ import annotations

import json
import math
import time
from pathlib import Path

import pytest

from helpers import copy_example, pswift, run_events
from pipeswift_slurm.planning import interval
from pipeswift_slurm.history.store import History


def test_young_daly_is_the_square_root_of_twice_cost_times_mtbf():
    def yd(cost: float, mtbf: float) -> float:   # a write that costs the file system nothing
        return interval.every(cost, 0.0, mtbf, 1.0).seconds
    assert yd(2.0, 3600.0) == pytest.approx(120.0)
    assert yd(0.0001, 60.0) == interval.MIN_EVERY_S     # never a save every second
    assert yd(5.0, math.inf) == math.inf
    calm = interval.Interruptions()
    assert calm.mtbf_s(1) == pytest.approx(3600 / interval.PRIOR_FAILURES_PER_NODE_HOUR)
    assert calm.mtbf_s(8) == pytest.approx(calm.mtbf_s(1) / 8)        # more nodes, more failures
    stormy = interval.Interruptions(preemptions_per_hour=2.0)
    assert yd(2.0, stormy.mtbf_s(2)) < yd(2.0, calm.mtbf_s(2)) / 10


def test_a_write_takes_at_most_its_share_of_the_time_however_little_it_stalls():
    """The issue's case: a background checkpoint stalls training ~1 ms, its write takes 2.05 s;
    Young/Daly alone said every 2.85 s (writing back to back); the share says every 20.5 s."""
    mtbf = 3600 / 2.0
    rule = interval.every(0.001, 2.05, mtbf, 0.1)
    assert rule.seconds == pytest.approx(20.5) and rule.decided_by == "the file system's share"
    assert rule.young_daly_s == pytest.approx(math.sqrt(2 * 0.001 * mtbf))
    assert "the file system's share decided" in rule.line()
    assert interval.every(0.001, 2.05, mtbf, 1.0).seconds == pytest.approx(interval.MIN_EVERY_S)
    assert interval.every(0.001, 30.0, mtbf, 1.0).seconds == 30.0     # never before the last write ended
    slow = interval.every(30.0, 30.0, 3600.0 * 50, 0.1)
    assert slow.decided_by == "Young/Daly" and slow.seconds > slow.io_s


def test_the_history_moves_the_rate_from_the_prior_by_its_exposure():
    prior = interval.PRIOR_FAILURES_PER_NODE_HOUR
    assert interval.smoothed(0, 0, 0).failures_per_node_hour == pytest.approx(prior)
    assert interval.smoothed(0, 0, 0).source == "prior"
    few = interval.smoothed(1, 1, 0)        # one failure in one node-hour: not yet a rate of 1
    assert prior < few.failures_per_node_hour < 0.02
    many = interval.smoothed(10_000, 10_000, 0)
    assert many.failures_per_node_hour == pytest.approx(1.0, rel=0.02)
    assert "10000 failure(s) in 1e+04 node-hour(s)" in many.source
    rec = interval.smoothed(3, 50, 0.5).record()
    assert interval.from_record(json.loads(json.dumps(rec))) == interval.smoothed(3, 50, 0.5)


def test_expected_terms_count_checkpoints_losses_and_the_requeue_wait():
    inter = interval.Interruptions(preemptions_per_hour=1.0, failures_per_node_hour=0.5)
    x = interval.expected(7200, 2.0, 2, 30.0, 600.0, inter, interval_s=600.0)
    assert x.every_s == 600 and x.checkpoints == 13
    assert x.interruptions == pytest.approx(2 + 2)            # 1/h preemptions, 0.5 x 2 nodes / h failures
    assert x.loss_s == pytest.approx(2 * (30 + 300) + 2 * (30 + 300 + 600))
    never = interval.expected(7200, 2.0, 2, 30.0, 0.0, inter, interval_s=math.inf)
    assert never.checkpoints == 1 and never.loss_s == pytest.approx(4 * (30 + 3600))
    auto = interval.expected(7200, 2.0, 2, 30.0, 0.0, inter)
    assert auto.every_s == pytest.approx(max(20.0, math.sqrt(2 * 2.0 * 3600 / 2.0))) and auto.loss_s < never.loss_s
    assert "Young/Daly" in auto.why and "the file system's share" in auto.why


def _history_with_failures(db, failures: int, node_hours: float) -> None:
    """One finished 2-node job of partition "low" whose attempt restarted ``failures`` times."""
    run = db.parent / f"past-{failures}"
    run.mkdir()
    (run / "plan.json").write_text(json.dumps({"version": 1, "job_name": "past", "partition": "low",
                                               "training": {"steps": 10}, "model": {}, "layouts": {}}))
    t0 = time.time() - 2 * 86400
    start = {"event": "start", "time": t0, "attempt": 0, "job_id": "5", "nodes": 2, "world_size": 2,
             "stages": 2, "data_parallel": 1, "micro_batches": 4, "micro_batch_size": 8, "step": 0, "setup_s": 0.0}
    evs = [start] + [{"event": "crash", "time": t0 + 1, "attempt": 0, "job_id": "5", "how": "signal 9",
                      "action": "restart", "restart": k + 1} for k in range(failures)]
    evs += [{"event": "step", "time": t0 + 2, "attempt": 0, "job_id": "5", "step": 10, "loss": 1.0, "step_time": 0.1},
            {"event": "end", "time": t0 + node_hours / 2 * 3600, "attempt": 0, "job_id": "5",
             "reason": "completed", "step": 10}]
    (run / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in evs))
    h = History(db)
    try:
        assert h.ingest_run_dir(str(run))
        assert h.failures("low") == (failures, pytest.approx(node_hours, rel=1e-3))
        assert h.failures("low", user="someone-else") == (0.0, 0.0)   # another user's plans ignore them
    finally:
        h.close()


def test_plan_prints_the_interval_and_a_failing_history_shortens_it(tmp_path):
    toml = copy_example(tmp_path / "ex")
    toml.write_text(toml.read_text().replace("checkpoint_interval = 20", "checkpoint_interval = \"auto\""))
    quiet = pswift("plan", "--no-live", "--db", str(tmp_path / "empty.db"), str(toml), check=True).stdout
    assert "checkpoints: only on a signal and at the end" in quiet or "checkpoints: every" in quiet, quiet
    assert "(prior)" in quiet
    _history_with_failures(tmp_path / "h.db", 2000, 4.0)
    out = json.loads(pswift("plan", "--no-live", "--json", "--db", str(tmp_path / "h.db"), str(toml), check=True).stdout)
    calm = json.loads(pswift("plan", "--no-live", "--json", "--db", str(tmp_path / "empty.db"), str(toml), check=True).stdout)
    every, every_calm = (o["chosen"]["estimate"]["checkpoint_every_s"] for o in (out, calm))
    assert every is not None and (every_calm is None or every < every_calm / 10), (every, every_calm)
    assert out["chosen"]["estimate"]["interruption_s"] > calm["chosen"]["estimate"]["interruption_s"]
    text = pswift("plan", "--no-live", "--db", str(tmp_path / "h.db"), str(toml), check=True).stdout
    assert "checkpoints: every" in text and "history: 2000 failure(s) in 4 node-hour(s)" in text


def test_plan_json_carries_what_the_launcher_needs_and_an_explicit_interval_wins(tmp_path):
    from pipeswift_slurm.config import load_config
    from pipeswift_slurm.planning.build import build_plan
    toml = copy_example(tmp_path / "ex")
    plan = build_plan(load_config(toml), tmp_path / "run")
    assert plan["checkpoint_auto"] is None and plan["training"]["checkpoint_interval"] == 20
    toml.write_text(toml.read_text().replace("checkpoint_interval = 20", ""))
    cfg = load_config(toml)
    assert cfg.training.checkpoint_interval == "auto"               # the default
    plan = build_plan(cfg, tmp_path / "run")
    assert plan["training"]["checkpoint_interval"] == 0
    auto = plan["checkpoint_auto"]
    assert auto["source"] == "prior" and auto["cost_s"] > 0
    assert auto["failures_per_node_hour"] == pytest.approx(interval.PRIOR_FAILURES_PER_NODE_HOUR)


@pytest.mark.parametrize("bad,msg", [('"aut"', "must be an integer >= 0 or \"auto\""),
                                     ("-5", "must be >= 0"), ("2.5", "must be an integer")])
def test_a_misspelled_auto_is_one_line_and_exit_2(tmp_path, bad, msg):
    toml = copy_example(tmp_path / "ex", {"checkpoint_interval": bad})
    proc = pswift("plan", "--no-live", str(toml))
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
    assert "[training] checkpoint_interval" in proc.stderr and msg in proc.stderr, proc.stderr


SLOW = '''
import time
from model import batch as _batch


def batch(**kw):
    time.sleep(0.05)
    return _batch(**kw)
'''


def _frequent_failures(tmp_path: Path, steps: int) -> tuple[Path, Path, Path]:
    """(a history of 20,000 failures in 2 node-hours, the slow example of ``steps`` steps with
    checkpoint_interval "auto", its run directory)."""
    db = tmp_path / "h.db"
    _history_with_failures(db, 20_000, 2.0)
    toml = copy_example(tmp_path / "ex", {"steps": str(steps)})
    (toml.parent / "slow.py").write_text(SLOW)
    toml.write_text(toml.read_text().replace("checkpoint_interval = 20", "")
                    .replace('data = "model:batch"', 'data = "slow:batch"'))
    return db, toml, tmp_path / "run"


@pytest.mark.deepspeed
def test_the_launcher_checkpoints_by_time_when_interruptions_are_frequent(tmp_path):
    """A history of 20,000 failures in 2 node-hours: an interruption every ~9 s on 2 nodes, so
    Young/Daly says save every 10 s (the floor); ~20 s of training saves once or twice by time."""
    db, toml, run = _frequent_failures(tmp_path, 80)
    proc = pswift("run", "--db", str(db), "--run-dir", str(run), str(toml))
    assert proc.returncode == 0, proc.stderr[-2000:]
    plan = json.loads((run / "plan.json").read_text())
    assert plan["checkpoint_auto"]["failures_per_node_hour"] > 100    # smoothed: 20,000 / (2 + 100)
    evs = run_events(run)
    periodic = [e["step"] for e in evs if e["event"] == "checkpoint" and e["reason"] == "periodic"]
    at = {e["step"]: e["time"] for e in evs if e["event"] == "step"}
    start = next(e["time"] for e in evs if e["event"] == "start")
    end = next(e["time"] for e in evs if e["event"] == "end")
    assert len(periodic) >= 1 and len(periodic) <= (end - start) / interval.MIN_EVERY_S + 1, periodic
    # spaced from when each was begun (its step's end): a background checkpoint's event comes
    # at its commit, a step or more later, and how much later depends on the machine's load
    begun = [start] + [at[s] for s in periodic]
    gaps = [b - a for a, b in zip(begun, begun[1:])]
    assert all(g >= interval.MIN_EVERY_S - 0.5 for g in gaps), (periodic, gaps)


@pytest.mark.deepspeed
def test_a_slow_file_system_spaces_the_checkpoints_by_the_io_share(tmp_path):
    """Interruptions every ~9 s (Young/Daly: the 10 s floor) and every checkpoint's write slowed
    to 1.5 s (a fault hook): with checkpoint_io_share = 0.1 the job writes at most every
    1.5 / 0.1 = 15 s of training, never back to back; what decided is the file system's share."""
    db, toml, run = _frequent_failures(tmp_path, 200)
    proc = pswift("run", "--db", str(db), "--run-dir", str(run), str(toml),
                  env={"PSWIFT_FAULT_SLOW_CHECKPOINT": "*:1.5"}, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    evs = run_events(run)
    at = {e["step"]: e["time"] for e in evs if e["event"] == "step"}
    periodic = [e["step"] for e in evs if e["event"] == "checkpoint" and e["reason"] == "periodic"]
    starts = [next(e["time"] for e in evs if e["event"] == "start")] + [at[s] for s in periodic]
    gaps = [b - a for a, b in zip(starts, starts[1:])]
    assert len(periodic) >= 1 and all(g >= 15.0 - 0.5 for g in gaps[1:]), (periodic, gaps)
    span = at[max(at)] - starts[0]
    assert len(periodic) <= span / 15.0 + 1, (periodic, span)
