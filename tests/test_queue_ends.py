"""Queue waits from what jobs really do (issue 40, item 2): a running job ends when its user's
jobs usually end (the history's share of their time limit) or, for the user's own pswift job,
at its prediction, not at its time limit (pipeswift_slurm.slurm.cluster.expected_ends,
pipeswift_slurm.autoplan.runtime_shares, History.limit_shares)."""

from __future__ import annotations

import json
import math
import os

from pipeswift_slurm import autoplan, submit
from pipeswift_slurm.history import rundir
from pipeswift_slurm.history.store import History
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeswift_slurm.slurm.cluster import (MIN_SHARES, ClusterState, FreeNodes, NodeState, PendingJob, RunningJob,
                                         RuntimeShares, estimate_wait, expected_ends)

from helpers import copy_example

NOW = 1_800_000_000.0


def _cluster(*running: RunningJob) -> ClusterState:
    nodes = [NodeState(f"n{i}", "allocated", 4, 0, ("low",)) for i in range(len(running))]
    return ClusterState(now=NOW, nodes=nodes, running=list(running))


def _job(jid: str, node: str, started_ago: float, limit_s: float, uid: int = 1000) -> RunningJob:
    start = NOW - started_ago
    return RunningJob(jid, (node,), start + limit_s, start, uid, "low")


def test_a_job_ends_after_its_share_of_the_limit_its_prediction_or_halfway_when_past_it():
    state = _cluster(_job("1", "n0", 600, 7200), _job("2", "n1", 600, 7200), _job("3", "n2", 5000, 7200),
                     _job("4", "n3", 600, 7200))
    shares = RuntimeShares(by_job={"1": 0.25, "3": 0.5}, by_partition={}, predicted_ends={"2": NOW + 60})
    ends = {j.job_id: j.end_time for j in expected_ends(state, shares).running}
    assert ends["1"] == NOW - 600 + 1800                  # a quarter of its 2 h limit
    assert ends["2"] == NOW + 60                          # the pswift job's prediction
    assert ends["3"] == (NOW + NOW - 5000 + 7200) / 2     # past its share: halfway to its limit
    assert ends["4"] == NOW - 600 + 7200                  # nothing known: its limit
    by_part = expected_ends(state, RuntimeShares({}, {"low": 0.5}, {}))
    assert [j.end_time for j in by_part.running][0] == NOW - 600 + 3600


def test_the_wait_shortens_with_what_jobs_really_do_and_says_so():
    state = _cluster(_job("1", "n0", 600, 7200))
    limit = estimate_wait(state, 1, 4, "low")
    shared = estimate_wait(expected_ends(state, RuntimeShares({"1": 0.25}, {}, {})), 1, 4, "low")
    assert limit.seconds == 6600 and shared.seconds == 1200
    assert "time limits" in limit.why and "expected ends" in shared.why
    unlimited = _cluster(RunningJob("9", ("n0",), math.inf, NOW - 60, 1000, "low"))
    assert math.isinf(expected_ends(unlimited, RuntimeShares({"9": 0.1}, {"low": 0.1}, {})).running[0].end_time)


def _record(jid: str, user: str, elapsed: float, limit_min: int, partition: str = "low") -> dict:
    start = NOW - 86400 + int(jid) * 60
    return {"JOBID": jid, "USERNAME": user, "PARTITION": partition, "JOBSTATE": "COMPLETED", "NODECNT": "1",
            "SUBMIT": start - 30, "START": start, "END": start + elapsed, "LIMIT": str(limit_min), "CLUSTER": "c"}


def test_the_history_gives_each_user_and_partition_their_median_share_with_enough_jobs(tmp_path):
    h = History(tmp_path / "h.db")
    recs = [_record(str(i), "alice", 15 * 60, 60) for i in range(1, MIN_SHARES + 1)]   # a quarter each
    recs += [_record(str(100 + i), "bob", 60 * 60, 60) for i in range(MIN_SHARES - 1)]  # too few to say
    h.add_slurm_records(recs, "sacct")
    by_user, by_part = h.limit_shares(["low", "high"], MIN_SHARES)
    assert by_user == {"alice": 0.25}
    assert by_part == {"low": 0.25}          # the median of five quarters and four wholes
    h.close()


def test_runtime_shares_reads_the_users_pswift_prediction_and_the_history(tmp_path):
    p = submit.prepare(copy_example(tmp_path / "ex"), tmp_path / "run", live=False, learn=False)
    submit.write_run_dir(p)
    rundir.register_job("77", p.run_dir)
    held = p.plan["prediction"]["jct_s"] - p.plan["prediction"]["queue_s"]
    h = History(tmp_path / "h.db")
    me = autoplan.runrows.current_user()
    h.add_slurm_records([_record(str(i), me, 30 * 60, 60) for i in range(1, MIN_SHARES + 1)], "sacct")
    state = _cluster(_job("77", "n0", 10, 900, uid=os.getuid()), _job("78", "n1", 10, 3600, uid=os.getuid()))
    shares = autoplan.runtime_shares(state, h)
    assert shares.predicted_ends == {"77": NOW - 10 + held}
    pending = ClusterState(NOW, state.nodes, state.running, [PendingJob("77", "low", 1, 900.0, os.getuid()),
                                                             PendingJob("79", "low", 1, 3600.0, os.getuid())])
    later = autoplan.runtime_shares(pending, h)
    assert later.predicted_holds == {"77": held} and later.by_job["79"] == 0.5   # a pending job's too
    assert shares.by_job == {"77": 0.5, "78": 0.5}            # both the user's: the prediction wins for 77
    ends = {j.job_id: j.end_time for j in expected_ends(state, shares).running}
    assert ends == {"77": NOW - 10 + held, "78": NOW - 10 + 1800}
    assert json.loads((p.run_dir / "plan.json").read_text())["prediction"]["jct_s"] > 0
    h.close()


# ----------------------------------------------------------------------- backfill, and pending jobs' ends

def _four_nodes(busy: dict[int, float], pending: list[PendingJob]) -> ClusterState:
    """n0..n3 of partition low; n<i> busy until NOW + busy[i] (a running job each), else idle."""
    nodes = [NodeState(f"n{i}", "allocated" if i in busy else "idle", 4, 0 if i in busy else 4, ("low",))
             for i in range(4)]
    running = [RunningJob(f"r{i}", (f"n{i}",), NOW + s, NOW - 60, 1000, "low") for i, s in busy.items()]
    return ClusterState(now=NOW, nodes=nodes, running=running, pending=pending)


def test_a_short_job_backfills_into_the_hole_before_a_wide_job_ahead_and_a_long_one_waits():
    # 2 nodes idle, 2 busy for 10 min; a 4-node job ahead starts when they free, for an hour
    state = _four_nodes({2: 600, 3: 600}, [PendingJob("w", "low", 4, 3600.0)])
    short = estimate_wait(state, 2, 4, "low", hold_s=300)
    assert short.seconds == 0 and "backfill" in short.why and "70.0 min" in short.why   # after them
    long = estimate_wait(state, 2, 4, "low", hold_s=900)     # would delay the wide job: after it
    assert long.seconds == 600 + 3600 and "backfill" not in long.why
    assert estimate_wait(state, 2, 4, "low").seconds == 4200  # no limit known: never in a hole


def test_a_pending_job_holds_its_nodes_for_what_it_is_expected_to_run():
    state = _four_nodes({0: 600, 1: 600, 2: 600, 3: 600}, [PendingJob("p", "low", 4, 3600.0, 1000)])
    assert estimate_wait(state, 1, 4, "low").seconds == 600 + 3600
    shared = expected_ends(state, RuntimeShares({"p": 0.25}, {}, {}))
    assert shared.pending[0].hold_s == 900 and estimate_wait(shared, 1, 4, "low").seconds == 600 + 900
    predicted = expected_ends(state, RuntimeShares({"p": 0.25}, {}, {}, predicted_holds={"p": 120.0}))
    assert estimate_wait(predicted, 1, 4, "low").seconds == 600 + 120     # the prediction wins
    assert expected_ends(state, RuntimeShares({}, {}, {}, {"p": 9999.0})).pending[0].hold_s == 3600  # never past the limit


def _brute_earliest(free_at: list[float], taken: list[tuple[float, int, float]], count: int, hold: float) -> float:
    """The earliest of the candidate times at which ``count`` nodes stay free for ``hold``,
    checked at every breakpoint inside the window (the definition, quadratic)."""
    def free(t: float) -> int:
        return sum(1 for x in free_at if x <= t) - sum(c for s, c, d in taken if s <= t < s + d)
    points = sorted({NOW, *[x for x in free_at if NOW < x < math.inf], *[s for s, _, _ in taken],
                     *[s + d for s, _, d in taken if math.isfinite(d)]})
    for t in points:
        if all(free(u) >= count for u in points if t <= u < t + hold):
            return t
    return math.inf


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from([0, 10, 20, 30, 50, math.inf]), min_size=1, max_size=6),
       st.lists(st.tuples(st.integers(1, 6), st.sampled_from([5, 10, 25, 60, math.inf])), max_size=5),
       st.integers(1, 6), st.sampled_from([1, 10, 30, math.inf]))
def test_free_nodes_places_jobs_as_the_definition_says(offsets, jobs, count, hold):
    free_at = [NOW + o for o in offsets]
    profile, taken = FreeNodes(NOW, free_at), []
    for n, d in jobs:
        start = profile.earliest(n, d)
        assert start == _brute_earliest(free_at, taken, n, d)
        if math.isfinite(start):
            profile.take(start, n, d)
            taken.append((start, n, d))
    assert profile.earliest(count, hold) == _brute_earliest(free_at, taken, count, hold)


def test_the_jobs_ahead_are_placed_once_per_plan_and_a_changed_queue_is_placed_again():
    state = _four_nodes({2: 600, 3: 600}, [PendingJob("w", "low", 4, 3600.0)])
    first = [estimate_wait(state, n, 4, "low", hold) for n in (1, 2, 4) for hold in (300, 900, math.inf)]
    assert len(state.placed) == 1                       # every candidate read the same placement
    fresh = [estimate_wait(_four_nodes({2: 600, 3: 600}, [PendingJob("w", "low", 4, 3600.0)]), n, 4, "low", hold)
             for n in (1, 2, 4) for hold in (300, 900, math.inf)]
    assert first == fresh
    assert estimate_wait(state, 2, 4, "low", 300).seconds == 0        # the hole before the wide job
    state.pending.append(PendingJob("x", "low", 2, 600.0))             # ahead of us, and it fits the hole
    assert estimate_wait(state, 2, 4, "low", 300).seconds == 600 + 3600 and len(state.placed) == 2
