"""`pswift plot` (issue 42, item 4) on a run directory whose events say what a preempted and
requeued job's say (the real job's picture: tests/test_node_range.py's requeued job)."""

from __future__ import annotations

import json

from helpers import pswift


def _run_dir(tmp_path, attempts):
    run = tmp_path / "run"
    run.mkdir()
    (run / "plan.json").write_text("{}")
    lines = []
    for n, (nodes, first, last, why) in enumerate(attempts):
        lines.append({"event": "start", "time": 1e9 + n * 100, "attempt": n, "job_id": "77", "nodes": nodes,
                      "world_size": nodes, "stages": nodes, "data_parallel": 1, "micro_batches": 4,
                      "micro_batch_size": 8, "boundaries": [0, 6], "partition": "cost", "step": first,
                      "resumed_from": None, "setup_s": 1.0, "load_s": 0.0})
        lines += [{"event": "step", "time": 1e9 + n * 100 + s, "attempt": n, "job_id": "77", "step": s,
                   "loss": 5.0 - s / 10, "step_time": 0.2} for s in range(first + 1, last + 1)]
        lines.append({"event": "end", "time": 1e9 + n * 100 + 99, "attempt": n, "job_id": "77", "reason": why,
                      "step": last, "requeue": why != "completed"})
    (run / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in lines))
    (run / "JOB_ID").write_text("77\n")
    return run


def test_plot_marks_each_attempt_its_layout_and_its_cause(tmp_path):
    run = _run_dir(tmp_path, [(2, 0, 12, "preempted"), (1, 12, 30, "completed")])
    proc = pswift("plot", str(run), "-o", str(tmp_path / "p.png"))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == (f"wrote {tmp_path / 'p.png'}: attempt 0 2 node(s) x 2 stage(s): steps 0-12, "
                                   "ended: preempted; attempt 1 1 node(s) x 1 stage(s): steps 12-30, ended: completed")
    assert (tmp_path / "p.png").read_bytes()[:4] == b"\x89PNG"


def test_plot_of_a_run_that_has_not_trained_is_one_line(tmp_path):
    run = _run_dir(tmp_path, [(2, 0, 0, "cancelled")])
    proc = pswift("plot", str(run), "-o", str(tmp_path / "p.png"))
    assert proc.returncode == 1 and proc.stderr.count("\n") == 1 and "no training step logged yet" in proc.stderr
    assert not (tmp_path / "p.png").exists()
    gone = pswift("plot", "123456", "-o", str(tmp_path / "p.png"))
    assert gone.returncode == 2 and "pass its run directory" in gone.stderr and gone.stderr.count("\n") == 1
