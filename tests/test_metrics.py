"""[training] metrics (issue 42, item 4): the scalars and the run's events in metrics.csv and
TensorBoard, one step axis over launches, read back with TensorBoard's own reader. A
preempted and requeued job through Slurm: tests/test_node_range.py."""

from __future__ import annotations

import csv
import re

import pytest

from pipeswift_slurm import events
from pipeswift_slurm.config import load_config
from pipeswift_slurm.errors import ConfigError
from helpers import copy_example, tensorboard_scalars

TRAINING = {"metrics": ["csv", "tensorboard"], "global_batch_size": 32}


def launch(run, attempt, first, last, loss_of, end="preempted", requeue=True):
    """What one launch's rank 0 writes: its start, steps first+1..last, a checkpoint, its end."""
    from pipeswift_launch import metrics
    w = events.Writer(run, True, attempt, "7")
    sink = metrics.attach(w, run, TRAINING)
    w.emit("start", nodes=2, world_size=2, stages=2, data_parallel=1, micro_batches=4, micro_batch_size=8,
           step=first)
    for s in range(first + 1, last + 1):
        w.emit("step", step=s, loss=loss_of(s), step_time=0.5, lr=1e-3)
    w.emit("checkpoint", step=last, seconds=0.25, write_s=1.5, reason="signal")
    w.emit("end", reason=end, step=last, requeue=requeue)
    w.close()
    sink.close()


def test_three_launches_make_one_curve_in_tensorboard_and_the_csv_keeps_every_row(tmp_path):
    """Launch 1 trains to 10 and is preempted; launch 2 resumes at 10, crashes after 14 and
    the helper restarts it; launch 3 resumes from the checkpoint at 12 and completes at 16."""
    launch(tmp_path, 0, 0, 10, lambda s: 5.0 - s / 10)
    launch(tmp_path, 1, 10, 14, lambda s: 4.0 - s / 100, end="crashed", requeue=False)
    from pipeswift_launch import metrics
    w = events.Writer(tmp_path, True, 1, "7")      # the after-launch helper's record of the crash
    sink = metrics.attach(w, tmp_path, TRAINING)
    w.emit("crash", how="signal 9", action="restart", step=14, restart=1)
    w.close()
    sink.close()
    launch(tmp_path, 1, 12, 16, lambda s: 3.0 - s / 1000, end="completed", requeue=False)

    loss = tensorboard_scalars(tmp_path, "train/loss")
    assert [s for s, _ in loss] == list(range(1, 17))                 # one continuous curve
    assert dict(loss)[11] == pytest.approx(4.0 - 11 / 100) and dict(loss)[13] == pytest.approx(3.0 - 13 / 1000)
    assert dict(tensorboard_scalars(tmp_path, "train/samples_per_s"))[5] == pytest.approx(64.0)   # 32 samples / 0.5 s
    assert dict(tensorboard_scalars(tmp_path, "train/lr"))[16] == pytest.approx(1e-3)
    assert tensorboard_scalars(tmp_path, "checkpoint/stall_s")[0] == (10, 0.25)
    assert [s for s, _ in tensorboard_scalars(tmp_path, "events/requeue")] == [10]
    assert [s for s, _ in tensorboard_scalars(tmp_path, "events/restart")] == [14]
    assert [s for s, _ in tensorboard_scalars(tmp_path, "events/start")] == [0, 10, 12]

    rows = list(csv.DictReader(open(tmp_path / "metrics.csv")))
    assert [r["event"] for r in rows if r["event"] not in ("step", "checkpoint")] == \
        ["start", "requeue", "start", "end", "restart", "start", "end"]
    steps = [int(r["step"]) for r in rows if r["event"] == "step"]
    assert steps == [*range(1, 11), *range(11, 15), *range(13, 17)]   # the last row of a step counts
    assert rows[0]["detail"] == "2 node(s) x 2 stage(s) x 1 data-parallel from step 0"


def test_every_launch_of_a_run_is_one_offline_wandb_run_id_read_back_by_wandb(tmp_path, monkeypatch):
    """W&B: each launch writes an offline run under RUN_DIR/wandb, all under the run directory's
    one id (`wandb sync` of them makes one run); the history read back with wandb's own reader."""
    from pipeswift_launch import metrics
    from helpers import wandb_history
    monkeypatch.delenv("WANDB_MODE", raising=False)
    for attempt, (first, last) in enumerate(((0, 3), (3, 5))):
        w = events.Writer(tmp_path, True, attempt, "7")
        sink = metrics.attach(w, tmp_path, {"metrics": ["wandb"], "global_batch_size": 32})
        w.emit("start", nodes=2, world_size=2, stages=2, data_parallel=1, micro_batches=4, micro_batch_size=8,
               step=first)
        for s in range(first + 1, last + 1):
            w.emit("step", step=s, loss=5.0 - s / 10, step_time=0.5, lr=1e-3)
        w.close()
        sink.close()
    runs = sorted((tmp_path / "wandb").glob("offline-run-*"))
    # offline-run-DATE_TIME-ID; wandb adds "-1" to the second where both launches began within
    # one second (here they do, at times; a job's launches never do)
    named = re.compile(r"offline-run-\d{8}_\d{6}-" + re.escape(metrics.wandb_run_id(tmp_path)) + r"(-\d+)?")
    assert len(runs) == 2 and all(named.fullmatch(r.name) for r in runs), [r.name for r in runs]
    assert wandb_history(tmp_path, "train/loss") == [(s, pytest.approx(5.0 - s / 10)) for s in range(1, 6)]
    assert [s for s, _ in wandb_history(tmp_path, "train/samples_per_s")] == [1, 2, 3, 4, 5]


def test_a_metrics_failure_is_said_once_and_training_events_go_on(tmp_path, capsys):
    from pipeswift_launch import metrics
    w = events.Writer(tmp_path, True, 0, "7")
    sink = metrics.attach(w, tmp_path, {"metrics": ["csv", "tensorboard"], "global_batch_size": 8})
    sink._sinks["csv"]._fh.close()            # as a full or vanished file system would fail it
    for s in (1, 2):
        w.emit("step", step=s, loss=1.0, step_time=0.1)
    w.close()
    sink.close()
    assert [e["step"] for e in events.read(tmp_path)[0]] == [1, 2]
    assert capsys.readouterr().err.count("metrics stopped (csv: ValueError") == 1
    assert [s for s, _ in tensorboard_scalars(tmp_path, "train/loss")] == [1, 2]   # the other sink goes on


def test_metrics_is_a_list_of_known_writers(tmp_path):
    toml = copy_example(tmp_path / "ex")
    assert load_config(toml).training.metrics == ["csv"]
    for bad in ('"csv"', '["csv", "mlflow"]', "[1]"):
        toml.write_text(toml.read_text().replace("seed = 1", f"seed = 1\nmetrics = {bad}", 1))
        with pytest.raises(ConfigError, match=r"\[training\] metrics = .*: give a list of 'csv', 'tensorboard', 'wandb'"):
            load_config(toml)
        toml = copy_example(tmp_path / f"ex{len(bad)}")
    toml.write_text(toml.read_text().replace("seed = 1", "seed = 1\nmetrics = []", 1))
    assert load_config(toml).training.metrics == []
    from pipeswift_launch import metrics              # the job writes every sink the config accepts
    from pipeswift_slurm.settings import SETTINGS
    (known,) = [s.choices for s in SETTINGS if (s.section, s.key) == ("training", "metrics")]
    assert set(metrics.SINKS) == set(known)


@pytest.mark.deepspeed
def test_a_validation_loss_reaches_tensorboard_wandb_csv_and_the_events(tmp_path):
    """Issue 59: [training] eval_every runs the pipeline without gradients over eval_batches
    micro-batches (DeepSpeed's eval_batch on every rank) and records the loss: events.jsonl,
    metrics.csv, TensorBoard's and W&B's `eval/loss`, each read back with the library's own
    reader; W&B's offline run holds the whole loss history."""
    from helpers import pswift, run_events, wandb_history
    toml = copy_example(tmp_path / "ex", {"steps": "6", "checkpoint_interval": "0", "eval_every": "2"})
    toml.write_text(toml.read_text().replace("eval_every = 2", 'eval_every = 2\neval_batches = 3\n'
                                             'metrics = ["csv", "tensorboard", "wandb"]'))
    run = tmp_path / "run"
    proc = pswift("run", "--nodes", "2", "--run-dir", str(run), str(toml), env={"PSWIFT_HOME": str(tmp_path / "h")},
                  timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    evals = [(e["step"], e["loss"]) for e in run_events(run) if e["event"] == "eval"]
    assert [s for s, _ in evals] == [2, 4, 6] and all(0 < loss < 20 for _, loss in evals), evals
    board = tensorboard_scalars(run, "eval/loss")
    assert [(s, round(v, 4)) for s, v in board] == [(s, round(v, 4)) for s, v in evals]
    rows = [r for r in csv.DictReader(open(run / "metrics.csv")) if r["event"] == "eval"]
    assert [int(r["step"]) for r in rows] == [2, 4, 6]
    steps = [e for e in run_events(run) if e["event"] == "step"]
    assert [e["step"] for e in steps] == [1, 2, 3, 4, 5, 6]           # validation takes no training step
    assert [(s, round(v, 4)) for s, v in wandb_history(run, "eval/loss")] == [(s, round(v, 4)) for s, v in evals]
    assert [(s, round(v, 5)) for s, v in wandb_history(run, "train/loss")] == \
        [(e["step"], round(e["loss"], 5)) for e in steps]
    # where the steps went: one steady step (5: after the profile window, before the last), with
    # its validation and the three metrics sinks that step's event fed (pipeswift_launch.stepparts)
    (parts,) = [e for e in run_events(run) if e["event"] == "step_parts"]
    sec = parts["seconds"]
    assert parts["steps"] == 1 and sec["train_batch"] > 0 and sec["metrics"] > 0, parts
    assert sec["eval"] < 0.001 < sec["train_batch"], parts    # step 5 validates nothing: the check alone
    assert abs(sec["train_batch"] - steps[4]["step_time"]) < 0.005, (parts, steps[4])   # the same call timed


def test_eval_settings_are_checked_as_the_tomls_own(tmp_path):
    toml = copy_example(tmp_path / "ex", {"eval_every": "-1"})
    with pytest.raises(ConfigError, match=r"\[training\] eval_every = -1 must be >= 0"):
        load_config(toml)
    toml = copy_example(tmp_path / "ex2", {"eval_every": "5"})
    toml.write_text(toml.read_text().replace("eval_every = 5", 'eval_every = 5\neval_data = { tokens = "none.bin", seq_len = 8 }'))
    with pytest.raises(ConfigError, match=r"\[training\] eval_data.tokens = 'none.bin': no such file"):
        load_config(toml)
    cfg = load_config(copy_example(tmp_path / "ex3", {"eval_every": "5"}))
    assert (cfg.training.eval_every, cfg.training.eval_batches, cfg.training.eval_data) == (5, 4, None)
