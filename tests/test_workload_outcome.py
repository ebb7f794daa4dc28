"""bench/workload.py's check of a training job's events: every step trained, and none trained
twice by launches that overlap (a run of members whose epochs overlapped did: issue 62)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from helpers import ROOT

sys.path.insert(0, str(ROOT / "bench"))
import workload  # noqa: E402


def outcome(tmp_path: Path, events: list[dict], steps: int) -> tuple[bool, int, int]:
    (tmp_path / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))
    return workload._train_outcome({"run": str(tmp_path), "state": "COMPLETED", "steps": steps})


def start(step: int) -> dict:
    return {"event": "start", "step": step}


def steps(*ns: int) -> list[dict]:
    return [{"event": "step", "step": n} for n in ns]


def test_a_restart_from_a_checkpoint_runs_steps_again_in_order_and_is_not_an_overlap(tmp_path):
    evs = [start(0), *steps(1, 2, 3, 4, 5), start(3), *steps(4, 5, 6), {"event": "end", "reason": "completed"}]
    assert outcome(tmp_path, evs, 6) == (True, 0, 0)


def test_two_trainings_of_one_run_side_by_side_are_counted(tmp_path):
    evs = [start(0), *steps(1, 2), start(1), *steps(3, 2, 4, 3, 5, 4, 6, 5, 6)]
    ok, _, overlapped = outcome(tmp_path, evs, 6)
    assert ok and overlapped == 4          # every step there, yet four went back without a launch


def test_a_step_missing_is_lost(tmp_path):
    assert outcome(tmp_path, [start(0), *steps(1, 2, 4)], 4)[0] is False
