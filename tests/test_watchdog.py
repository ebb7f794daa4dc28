"""The hang watchdog's heartbeats are per launch: a folder of an earlier attempt (or of a launch
before an in-job re-layout) is cleared by rank 0 and never read, so its stale files cannot name
a healthy node (they made the watchdog exclude one before). The watchdog through real Slurm is
in test_preemption.py (a stopped rank)."""

from __future__ import annotations

import json
import time

from pipeswift_launch.watchdog import Watchdog


def test_heartbeats_of_earlier_launches_are_cleared_and_never_read(tmp_path):
    old = tmp_path / "heartbeats" / "0.3.0"
    old.mkdir(parents=True)
    (old / "rank_3.json").write_text(json.dumps({"rank": 3, "node": "node4", "step": 7, "time": time.time() - 600}))
    (tmp_path / "heartbeats" / "rank_2.json").write_text(json.dumps({"rank": 2, "node": "node3", "time": 1.0}))
    hung = []
    other = Watchdog(tmp_path, 1, "node2", 10.0, 0.5, hung.append, launch="1.0.0")   # starts first
    dog = Watchdog(tmp_path, 0, "node1", 10.0, 0.5, hung.append, launch="1.0.0")
    assert sorted(p.name for p in (tmp_path / "heartbeats").iterdir()) == ["1.0.0"]
    dog.start()
    other.start()
    deadline = time.time() + 20
    # no step ever finishes: after 0.5 s, a hang; on a loaded host the second rank's first
    # heartbeat may come after that, so wait for both (bounded)
    while not (hung and {b["rank"] for b in dog.heartbeats()} == {0, 1}) and time.time() < deadline:
        time.sleep(0.2)
    dog.stop()
    other.stop()
    info = hung[0]
    assert info["suspect_rank"] in (0, 1) and info["suspect_node"] in ("node1", "node2"), info
    assert {b["rank"] for b in dog.heartbeats()} == {0, 1}
