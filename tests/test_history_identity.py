"""Identity from Slurm only (issue 24): a plan's queue waits come from Slurm's own submit and
start times, never from a user's plan.json; its step-model errors from its own user's runs."""

from __future__ import annotations

import json

from pipeswift_slurm.history import History
from pipeswift_slurm.runrows import Owner

from test_admin_reports import rec, H, T0


def _run(tmp_path, name: str, user: str, predicted: float, actual: float) -> tuple[str, Owner]:
    run = tmp_path / name
    run.mkdir()
    (run / "plan.json").write_text(json.dumps({
        "version": 1, "job_name": name, "partition": "low", "submitted_at": 1.0,   # a forged submit
        "training": {"steps": 2}, "model": {"entry": "m:f"},
        "prediction": {"nodes": 2, "step_s": predicted, "jct_s": 10.0}}))
    evs = [{"event": "start", "time": 1000.0, "attempt": 0, "nodes": 2, "world_size": 2, "stages": 2,
            "data_parallel": 1, "micro_batches": 2, "micro_batch_size": 1, "step": 0, "setup_s": 1.0}]
    evs += [{"event": "step", "time": 1000.0 + s, "attempt": 0, "step": s, "loss": 1.0, "step_time": actual}
            for s in (1, 2, 3)]
    evs.append({"event": "end", "time": 1004.0, "attempt": 0, "reason": "completed", "step": 3})
    (run / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in evs))
    return str(run), Owner(user, 0, 0, name[-1])


def test_waits_are_slurms_and_errors_are_the_users_own(tmp_path):
    h = History(tmp_path / "h.db")
    try:
        for name, user, pred, actual in (("mine-1", "alice", 1.0, 1.1), ("theirs-2", "mallory", 1.0, 50.0)):
            run, owner = _run(tmp_path, name, user, pred, actual)
            assert h.ingest_run_dir(run, owner)
        # the forged submitted_at = 1.0 would make a wait of ~1000 s: it is not read
        assert h.partition_waits("low", 2) == []
        h.add_slurm_records([rec("5", T0 + H, T0 + 2 * H, NODECNT="2", SUBMIT=T0 + H - 90),
                             rec("6", T0 + 3 * H, T0 + 4 * H, NODECNT="2", SUBMIT=T0 + 3 * H - 30),
                             rec("7", T0 + 5 * H, T0 + 6 * H, NODECNT="4", SUBMIT=T0 + 5 * H - 999)], "jobcomp")
        assert sorted(h.partition_waits("low", 2)) == [30.0, 90.0]
        mine = h.recent_errors(user="alice")
        assert [e["actual_step_s"] for e in mine] == [1.1]
        assert {e["actual_step_s"] for e in h.recent_errors()} == {1.1, 50.0}   # an admin's view: all
    finally:
        h.close()
