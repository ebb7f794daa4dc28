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


def test_plot_replaces_a_link_at_its_output_and_never_writes_through_it(tmp_path):
    """Issue 57: ``run.png -> victim.txt`` in the folder; the victim was overwritten with a PNG.
    The one output opener writes a new file and renames it over the name: the link is replaced,
    the victim untouched (root run inside a user's folder included)."""
    run = _run_dir(tmp_path, [(1, 0, 5, "completed")])
    victim = tmp_path / "victim.txt"
    victim.write_text("root's file\n")
    (tmp_path / "run.png").symlink_to(victim)
    proc = pswift("plot", str(run), cwd=str(tmp_path))
    assert proc.returncode == 0, proc.stderr
    assert victim.read_text() == "root's file\n"
    assert not (tmp_path / "run.png").is_symlink() and (tmp_path / "run.png").read_bytes()[:4] == b"\x89PNG"
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".run.png")] == []   # no temp file left


def test_plot_into_a_folder_or_an_unwritable_place_is_one_line(tmp_path):
    run = _run_dir(tmp_path, [(1, 0, 5, "completed")])
    (tmp_path / "adir").mkdir()
    for out, says in ((tmp_path / "adir", "is a folder"), (tmp_path / "none" / "p.png", "No such file")):
        proc = pswift("plot", str(run), "-o", str(out))
        assert proc.returncode != 0 and says in proc.stderr and proc.stderr.count("\n") == 1, proc.stderr
        assert "Traceback" not in proc.stderr


def test_an_end_reason_of_tex_math_is_drawn_as_text(tmp_path):
    """Issue 57: an end reason of ``$\\sqrt{...}$`` nested 300 deep crashed matplotlib's mathtext
    parser with a RecursionError; text is never parsed as math, so it is drawn as written."""
    why = "$" + "\\sqrt{" * 300 + "x" + "}" * 300 + "$"
    run = _run_dir(tmp_path, [(2, 0, 12, why), (1, 12, 30, "completed")])
    proc = pswift("plot", str(run), "-o", str(tmp_path / "p.png"))
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
    assert (tmp_path / "p.png").read_bytes()[:4] == b"\x89PNG"


def test_plot_draws_the_validation_losses(tmp_path):
    """Issue 59: [training] eval_every's losses reach `pswift plot` (points on the loss axis,
    in the legend); the fold keeps them per attempt."""
    from pipeswift_slurm.history import eventfold
    run = _run_dir(tmp_path, [(1, 0, 8, "completed")])
    with open(run / "events.jsonl", "a") as f:
        for s in (4, 8):
            f.write(json.dumps({"event": "eval", "time": 1e9 + s, "attempt": 0, "job_id": "77", "step": s,
                                "loss": 3.0, "batches": 4}) + "\n")
    proc = pswift("plot", str(run), "-o", str(tmp_path / "p.png"))
    assert proc.returncode == 0 and (tmp_path / "p.png").read_bytes()[:4] == b"\x89PNG", proc.stderr
    fold = eventfold.Fold()
    fold.feed((run / "events.jsonl").read_bytes())
    fold.close()
    assert [e["step"] for e in fold.attempts()[0]["evals"]] == [4, 8]
