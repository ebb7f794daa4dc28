"""Epochs of a run made of members (pipeswift_launch.members): real files, members as real
concurrent processes joining through the run directory."""

from __future__ import annotations

import json
import multiprocessing
import os
import threading
import time
from dataclasses import asdict
from pathlib import Path

import pytest

from helpers import paced_example, pswift, slow_example
from pipeswift_launch import members
from pipeswift_launch.members import Seat


def seat(task: int, nodes: int = 1, at: float = 0.0) -> Seat:
    return Seat(task, f"10{task}", tuple(f"n{task}{k}" for k in range(nodes)), nodes, at)


def test_an_epoch_is_due_with_every_member_expected_or_with_the_bottom_after_the_wait():
    assert members.due([seat(0), seat(1), seat(2)], {0, 1, 2}, 3, now=0.0, wait_s=60)
    assert not members.due([seat(0), seat(1)], {0, 1, 2}, 2, now=59.0, wait_s=60)      # the bottom, still waiting
    assert members.due([seat(0), seat(1, at=5.0)], {0, 1, 2}, 2, now=60.0, wait_s=60)  # the first seat's wait is over
    assert members.due([seat(0)], {0}, 1, now=0.0, wait_s=60)     # the one member of the last epoch that stayed
    assert not members.due([seat(0)], {0, 1, 2}, 2, now=1e6, wait_s=60)                # below the bottom: never
    assert members.due([seat(0, nodes=2)], {0, 1, 2}, 2, now=60.0, wait_s=60)          # nodes count, not members
    assert not members.due([], set(), 0, now=1e6, wait_s=0)
    # member 2, back from the queue, sat down at 0 while the epoch before trained; its members 0
    # and 1 sit down again at 50 as it ends: the wait for 1 runs from 50, not from member 2's seat
    back = [seat(2, at=0.0), seat(0, at=50.0)]
    assert not members.due(back, {0, 1}, 2, now=55.0, wait_s=20)
    assert members.due(back, {0, 1}, 2, now=70.0, wait_s=20)
    assert members.due([*back, seat(1, at=52.0)], {0, 1}, 2, now=52.0, wait_s=20)   # every one expected


def test_the_epoch_after_one_waits_for_its_members_that_did_not_leave(tmp_path: Path):
    assert members.expected(tmp_path, 0, 3) == {0, 1, 2}            # the start: every member
    folder = tmp_path / "members" / "epoch-0"
    folder.mkdir(parents=True, mode=0o700)
    (folder / "sealed.json").write_text(json.dumps({"seats": [asdict(seat(t)) for t in (0, 1, 2)]}))
    (folder / "sealed.json").chmod(0o600)
    members.leave(folder, 1)
    assert members.expected(tmp_path, 1, 3) == {0, 2}
    members.leave(folder, 0)
    members.leave(folder, 2)
    assert members.expected(tmp_path, 1, 3) == {0, 1, 2}          # every member left: as at the start
    assert not members.finished(tmp_path)
    members.finish(tmp_path)
    assert members.finished(tmp_path)
    assert members.join(tmp_path, 0, "8", ("n0",), 1, 3, 1, 0.0, timeout_s=5) is None   # done: nothing to join


def test_with_every_member_gone_the_first_back_waits_for_the_others_no_longer_than_a_relaunch(tmp_path: Path):
    """Each member of the last epoch left (preempted, requeued): they come back from the queue
    each at its own time, so the first back waits for the others no longer than the run's
    relaunch (its newest start's setup and restore), then trains and grows onto them later; a
    member of the last epoch that did not say it left is waited for REJOIN_WAIT_S, as before."""
    from pipeswift_slurm import events
    folder = tmp_path / "members" / "epoch-0"
    folder.mkdir(parents=True, mode=0o700)
    (folder / "sealed.json").write_text(json.dumps({"seats": [asdict(seat(t)) for t in (0, 1)]}))
    (folder / "sealed.json").chmod(0o600)
    assert members.seat_wait(tmp_path, 0, 60.0) == 60.0                          # the start: member_wait_s
    members.leave(folder, 1)
    assert members.seat_wait(tmp_path, 1, 60.0) == members.REJOIN_WAIT_S         # member 0 is still in the run
    members.leave(folder, 0)
    assert members.seat_wait(tmp_path, 1, 60.0) == members.REJOIN_WAIT_S         # no launch measured yet
    layout = {"nodes": 2, "world_size": 2, "stages": 2, "data_parallel": 1, "micro_batches": 4, "micro_batch_size": 4}
    events.append(tmp_path, "start", 0, "101", step=0, setup_s=9.0, load_s=0.0, **layout)
    events.append(tmp_path, "start", 1, "101", step=40, setup_s=1.25, load_s=0.25, **layout)   # the newest
    assert members.seat_wait(tmp_path, 1, 60.0) == 1.5
    assert members.seat_wait(tmp_path, 1, 1.0) == 1.0                            # member_wait_s bounds it too
    began = time.monotonic()
    e = members.join(tmp_path, 0, "100", ("n00",), 1, 2, 1, 60.0, timeout_s=30, poll_s=0.02)
    waited = time.monotonic() - began
    assert e is not None and e.number == 1 and [s.task for s in e.seats] == [0], e
    assert 1.5 <= waited < members.REJOIN_WAIT_S / 2, waited                     # not the 20 s of before


def _join(run: str, task: int, ranks: int, n: int, lo: int, wait_s: float, out: "multiprocessing.Queue") -> None:
    try:
        e = members.join(Path(run), task, f"job{task}", tuple(f"node{task}-{k}" for k in range(ranks)), ranks,
                         n, lo, wait_s, timeout_s=20, poll_s=0.02)
        out.put((task, "done") if e is None else
                (task, e.number, e.offset(task), e.world_size, e.nodes, [s.task for s in e.seats]))
    except members.MembersError as err:
        out.put((task, "error", str(err)))


def _start(run: Path, task: int, ranks: int, n: int, lo: int, wait_s: float, out) -> multiprocessing.Process:
    p = multiprocessing.get_context("fork").Process(target=_join, args=(str(run), task, ranks, n, lo, wait_s, out))
    p.start()
    return p


def _results(procs, out) -> dict:
    got = {}
    for _ in procs:
        r = out.get(timeout=30)
        got[r[0]] = r[1:]
    for p in procs:
        p.join(10)
    return got


def test_members_joining_at_once_share_one_epoch_with_ranks_in_task_order(tmp_path: Path):
    out = multiprocessing.get_context("fork").Queue()
    procs = [_start(tmp_path, t, ranks, 3, 3, 60.0, out) for t, ranks in ((2, 1), (0, 2), (1, 1))]
    got = _results(procs, out)
    assert got == {0: (0, 0, 4, 4, [0, 1, 2]), 1: (0, 2, 4, 4, [0, 1, 2]), 2: (0, 3, 4, 4, [0, 1, 2])}
    assert members.newest_sealed(tmp_path) == 0
    for f in (tmp_path / "members" / "epoch-0").iterdir():
        assert f.stat().st_mode & 0o077 == 0, f


def test_the_bottom_starts_without_a_late_member_who_waits_for_the_next_epoch(tmp_path: Path):
    out = multiprocessing.get_context("fork").Queue()
    first = [_start(tmp_path, t, 1, 3, 2, 0.3, out) for t in (0, 1)]
    assert _results(first, out) == {0: (0, 0, 2, 2, [0, 1]), 1: (0, 1, 2, 2, [0, 1])}
    late = [_start(tmp_path, 2, 1, 3, 2, 0.3, out)]
    deadline = time.monotonic() + 10
    while not members.waiting(tmp_path, 0) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert [s.task for s in members.waiting(tmp_path, 0)] == [2]   # the running epoch can see it: grow
    again = [_start(tmp_path, t, 1, 3, 2, 0.3, out) for t in (1, 0)]   # epoch 0 ended: everyone joins epoch 1
    assert _results(late + again, out) == {t: (1, t, 3, 3, [0, 1, 2]) for t in (0, 1, 2)}


def test_a_member_back_from_the_queue_waits_while_the_run_trains_and_never_seals_an_epoch_beside_it(tmp_path: Path):
    """The workload bench found it: member 1, late, sat alone in epoch 1 while epoch 0 trained
    on member 0 and sealed it after its wait: two trainings of one run side by side. An epoch
    is sealed only once the one before is over."""
    folder = tmp_path / "members" / "epoch-0"
    folder.mkdir(parents=True, mode=0o700)
    (folder / "sealed.json").write_text(json.dumps({"seats": [asdict(seat(t)) for t in (0, 1)]}))
    (folder / "sealed.json").chmod(0o600)
    with pytest.raises(members.MembersError):   # past its wait, the bottom held, the run still trains
        members.join(tmp_path, 2, "j2", ("n2",), 1, 3, 1, 0.05, timeout_s=1.0, poll_s=0.02)
    assert members.sealed(tmp_path, 1) is None and members.newest_sealed(tmp_path) == 0
    assert not members.before_ended(tmp_path, 1, [seat(2)])
    assert members.before_ended(tmp_path, 1, [seat(2), seat(0)])      # member 0's launch ended: it sat down
    members.leave(folder, 0)
    assert not members.before_ended(tmp_path, 1, [seat(2)])           # member 1 still trains
    members.leave(folder, 1)
    assert members.before_ended(tmp_path, 1, [seat(2)])               # every member of it left
    assert members.before_ended(tmp_path, 0, [seat(2)])               # the first epoch has none before


def _running_epoch_0(run: Path) -> None:
    folder = run / "members" / "epoch-0"
    folder.mkdir(parents=True, mode=0o700)
    (folder / "sealed.json").write_text(json.dumps({"seats": [asdict(seat(t)) for t in (0, 1)]}))
    (folder / "sealed.json").chmod(0o600)


def _join_in_thread(run: Path) -> tuple[threading.Thread, dict]:
    """Member 2, back from the queue, joins while epoch 0 trains (in a thread: the test's patches hold)."""
    got: dict = {}
    t = threading.Thread(target=lambda: got.update(epoch=members.join(run, 2, "j2", ("n2",), 1, 3, 1, 0.05,
                                                                      timeout_s=20, poll_s=0.02)))
    t.start()
    deadline = time.monotonic() + 10
    while not members.waiting(run, 0) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert [s.task for s in members.waiting(run, 0)] == [2]
    return t, got


def test_a_member_the_running_epoch_declines_gives_its_seat_up_and_ends(tmp_path: Path, monkeypatch):
    """Issue 62: a member waiting to join that the run will not grow onto held its node idle to
    the run's end (other users' slowdown doubled in the workload bench). Declined, it ends."""
    monkeypatch.setattr(members, "SEAL_S", 0.5)
    _running_epoch_0(tmp_path)
    t, got = _join_in_thread(tmp_path)
    members.decline(members.epoch_dir(tmp_path, 1), 2)
    t.join(5)
    assert not t.is_alive() and got == {"epoch": None}        # it ends (the batch script exits 0)
    assert members.waiting(tmp_path, 0) == []                 # its seat is gone: nobody counts its node
    assert members.newest_sealed(tmp_path) == 0 and not members.finished(tmp_path)


def test_a_member_of_the_running_epoch_seated_for_the_next_is_not_waiting_to_join(tmp_path: Path):
    """A member of the running epoch sits down for the next one once its launch ended (the epoch
    is ending): its node is not one more for the run to grow onto, nor one to decline."""
    _running_epoch_0(tmp_path)
    folder = members.epoch_dir(tmp_path, 1)
    folder.mkdir(mode=0o700)
    for t in (1, 2):
        (folder / f"seat-{t}.json").write_text(json.dumps(asdict(seat(t, at=time.time()))))
        (folder / f"seat-{t}.json").chmod(0o600)
    assert [s.task for s in members.waiting(tmp_path, 0)] == [2]
    assert [s.task for s in members.seats(tmp_path, 1, time.time())] == [1, 2]


def test_a_declined_member_that_a_seal_took_first_trains(tmp_path: Path, monkeypatch):
    """The running epoch ended just as rank 0 declined the member, and a seal read its seat: the
    member must train in it (its ranks are in that epoch's world), not leave."""
    monkeypatch.setattr(members, "SEAL_S", 2.0)
    _running_epoch_0(tmp_path)
    t, got = _join_in_thread(tmp_path)
    fresh = members.seats(tmp_path, 1, time.time())
    members.decline(members.epoch_dir(tmp_path, 1), 2)
    folder = members.epoch_dir(tmp_path, 1)
    (folder / "sealed.json").write_text(json.dumps({"seats": [asdict(s) for s in (seat(0), *fresh)]}))
    (folder / "sealed.json").chmod(0o600)
    t.join(5)
    assert not t.is_alive() and got["epoch"] is not None and got["epoch"].number == 1
    assert [s.task for s in got["epoch"].seats] == [0, 2]


def test_a_seat_left_stale_is_not_counted_and_a_member_below_the_bottom_gives_up(tmp_path: Path, monkeypatch):
    folder = tmp_path / "members" / "epoch-0"
    folder.mkdir(parents=True, mode=0o700)
    stale = folder / "seat-1.json"
    stale.write_text('{"task": 1, "job_id": "9", "nodes": ["n1"], "ranks": 1, "at": 0}')
    stale.chmod(0o600)
    old = time.time() - members.FRESH_S - 5
    os.utime(stale, (old, old))
    assert [s.task for s in members.seats(tmp_path, 0, time.time())] == []
    with pytest.raises(members.MembersError, match="fewer than 2 node"):
        members.join(tmp_path, 0, "8", ("n0",), 1, 2, 2, 0.0, timeout_s=0.5, poll_s=0.05)
    assert [s.task for s in members.seats(tmp_path, 0, time.time())] == [0]
    assert members.newest_sealed(tmp_path) is None


def test_links_and_foreign_records_are_not_followed(tmp_path: Path):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "members").symlink_to(elsewhere)
    with pytest.raises(members.MembersError, match="not this user's folder"):
        members.join(tmp_path / "run", 0, "8", ("n0",), 1, 1, 1, 0.0, timeout_s=1)
    folder = tmp_path / "run2" / "members" / "epoch-0"
    folder.mkdir(parents=True)
    (folder / "sealed.json").symlink_to(elsewhere / "x.json")
    (elsewhere / "x.json").write_text('{"seats": [{"task": 5, "job_id": "1", "nodes": ["a"], "ranks": 1, "at": 0}]}')
    assert members.sealed(tmp_path / "run2", 0) is None      # a link is no seal
    (folder / "seat-3.json").write_text('{"task": 4, "job_id": "1", "nodes": ["a"], "ranks": 1, "at": 0}')
    os.chmod(folder / "seat-3.json", 0o600)
    assert members.seats(tmp_path / "run2", 0, time.time()) == []   # a seat must be its own task's file


def test_members_are_one_array_in_the_batch_script(tmp_path):
    """`pswift sbatch --dry-run` of a run of members: a job array, one task of member_nodes a member."""
    toml = slow_example(tmp_path / "ex", {"nodes": "[2, 4]", "steps": "4"})
    toml.write_text(toml.read_text().replace("[resources]\n", "[resources]\nmembers = 2\nmember_nodes = 2\n", 1))
    out = pswift("sbatch", "--dry-run", "--run-dir", str(tmp_path / "run"), str(toml), check=True).stdout
    assert "#SBATCH --array=0-1\n" in out and "#SBATCH --nodes=2\n" in out, out
    assert "-m pipeswift_launch.members" in out
    for wrong, said in (("members = 2\nmember_nodes = 3", "members = 2 of member_nodes = 3 make 6 nodes, but nodes' top is 4: "
                                              "write nodes = [2, 6]"),
                        ("members = 1", "members = 1 is one job"),
                        ("members = 4\nmember_nodes = 1", None)):
        toml.write_text(toml.read_text().replace("members = 2\nmember_nodes = 2", wrong))
        proc = pswift("sbatch", "--dry-run", "--run-dir", str(tmp_path / "run2"), str(toml))
        if said is None:   # 4 members of 1 node: the range [2, 4] holds, its bottom 2 members
            assert proc.returncode == 0 and "#SBATCH --array=0-3\n" in proc.stdout, proc.stderr
        else:
            assert proc.returncode == 2 and said in proc.stderr and proc.stderr.count("\n") == 1, proc.stderr
        assert not (tmp_path / "run2").exists()
        toml.write_text(toml.read_text().replace(wrong, "members = 2\nmember_nodes = 2"))


def test_auto_makes_members_only_where_the_partition_preempts_and_a_preemption_costs_them_less(tmp_path):
    """planning.members: members = "auto" weighs the partition's preemptions over the run's
    expected hours on its nodes, then what one costs: one job waits for the bottom and starts
    again; members relaunch twice and train on the nodes left meanwhile. A partition that never
    preempted a pswift job, or a queue that gives a requeued job back at once: one job."""
    from types import SimpleNamespace

    from pipeswift_slurm.config import load_config
    from pipeswift_slurm.planning import interval, members as choice
    toml = slow_example(tmp_path / "ex", {"nodes": "[2, 4]"})
    toml.write_text(toml.read_text().replace("[resources]\n", '[resources]\nmembers = "auto"\n', 1))
    cfg = load_config(toml)

    def planned(per_hour: float, train_s: float, queue_s: float = 1800.0, steps: dict | None = None):
        steps = {2: 1.9, 3: 1.3, 4: 1.0} if steps is None else steps   # seconds a step per node count
        est = SimpleNamespace(setup_s=60.0, train_s=train_s, checkpoint_s=0.0, queue_s=queue_s, step_s=1.0)
        best = {n: SimpleNamespace(estimate=SimpleNamespace(**{**est.__dict__, "step_s": s,
                                                                   "queue_s": queue_s + 100 * (n == 2)}))
                for n, s in steps.items()}
        return SimpleNamespace(chosen=SimpleNamespace(estimate=est, est=est), best_per_nodes=lambda: best,
                               interruptions=interval.Interruptions(preemptions_per_hour=per_hour))
    n, why = choice.choose(cfg, planned(0.0, 36000.0))
    assert n == 0 and why.startswith("one job: partition low preempted 0 pswift job(s) an hour"), why
    n, why = choice.choose(cfg, planned(0.05, 540.0))     # 0.05 an hour over 10 minutes: 0.0083
    assert n == 0 and "0.0083 preemption(s)" in why and "members would not pay" in why, why
    # 0.5 an hour over an hour; one job waits 1900 s (the bottom's, 2 nodes) and sets up 60 s:
    # 1960 s; members 2 x 60 s + 1960 s x (1 - 1.0 / 1.3) = 572 s
    n, why = choice.choose(cfg, planned(0.5, 3540.0))
    assert n == 4 and why.startswith("4 members: ") and "0.5 preemption(s) expected" in why, why
    assert "each costing one job 1960 s and members 572 s" in why and "3 node(s) step 1.30x slower than 4" in why, why
    # the queue gives a preempted job back soon (110 s for the bottom): one job 170 s; members, a step
    # 1.5x slower on the nodes left, 120 + 170 x (1 - 1 / 1.5) = 177 s: one job
    n, why = choice.choose(cfg, planned(0.5, 3540.0, queue_s=10.0, steps={2: 1.9, 3: 1.5, 4: 1.0}))
    assert n == 0 and "each costing one job 170 s and members 177 s" in why and "members would not pay" in why, why
    n, why = choice.choose(cfg, planned(0.5, 3540.0, steps={2: 1.9, 4: 1.0}))   # no layout on 3 nodes
    assert n == 0 and "no step time for 3 node(s)" in why, why
    assert choice.choose(cfg, None) == (0, "one job: no estimate of the run to weigh members against")
    toml.write_text(toml.read_text().replace('members = "auto"', 'members = "auto"\nmember_nodes = 3'))
    n, why = choice.choose(load_config(toml), planned(0.5, 3540.0))
    assert n == 0 and "not a whole number of at least two members of member_nodes = 3" in why


def test_auto_without_preemptions_in_the_history_submits_one_job(tmp_path):
    """Through `pswift sbatch --dry-run` with an empty history: one job, and the reason said."""
    toml = slow_example(tmp_path / "ex", {"nodes": "[2, 4]", "steps": "4"})
    toml.write_text(toml.read_text().replace("[resources]\n", '[resources]\nmembers = "auto"\n', 1))
    proc = pswift("sbatch", "--dry-run", "--run-dir", str(tmp_path / "run"), str(toml), check=True)
    assert "--array" not in proc.stdout and "pipeswift_launch.members" not in proc.stdout
    assert "# members: one job: partition " in proc.stderr and "members would not pay" in proc.stderr, proc.stderr


def test_status_reads_the_newest_epoch_and_who_waits(tmp_path: Path):
    """pipeswift_slurm.memberfiles.summary: what `pswift status` shows of a run of members."""
    from pipeswift_slurm import memberfiles
    assert memberfiles.summary(tmp_path) is None                      # one job: no members folder
    out = multiprocessing.get_context("fork").Queue()
    assert _results([_start(tmp_path, t, 1, 3, 2, 0.2, out) for t in (0, 1)], out)[0][0] == 0
    late = _start(tmp_path, 2, 1, 3, 2, 0.2, out)
    deadline = time.monotonic() + 10
    while not members.waiting(tmp_path, 0) and time.monotonic() < deadline:
        time.sleep(0.02)
    got = memberfiles.summary(tmp_path)
    assert got == {"epoch": 0, "nodes": 2, "done": False,
                   "members": [{"task": t, "job_id": f"job{t}", "nodes": [f"node{t}-0"]} for t in (0, 1)],
                   "waiting": [{"task": 2, "job_id": "job2", "nodes": ["node2-0"]}]}
    members.finish(tmp_path)
    assert out.get(timeout=10) == (2, "done")          # the member waiting ends: the run is done
    late.join(10)
    assert memberfiles.summary(tmp_path)["done"] is True


def test_a_members_time_limit_is_the_runs_at_the_bottom_of_its_range(tmp_path):
    """A member may train on alone: its predicted --time is the run's on the range's bottom (what
    a job fixed to that node count asks), not the chosen top's."""
    from helpers import paced_example

    def time_line(members: int, nodes: str) -> str:
        toml = paced_example(tmp_path / f"ex-{members}-{nodes[-2]}", steps=20000, members=members, nodes=nodes,
                             time_policy="predicted")
        toml.write_text(toml.read_text().replace('time = "30"\n', ""))   # no cap: the prediction alone
        if not members:
            toml.write_text(toml.read_text().replace("members = 0\n", ""))
        err = pswift("sbatch", "--dry-run", "--run-dir", str(tmp_path / "run"), str(toml), check=True).stderr
        return next(line for line in err.splitlines() if line.startswith("# time limit: "))
    run_of_members, one_job, at_the_bottom = time_line(2, "[1, 2]"), time_line(0, "[1, 2]"), time_line(0, "[1, 1]")
    assert run_of_members == at_the_bottom != one_job, (run_of_members, one_job, at_the_bottom)


def test_a_requeue_slurm_made_first_is_taken_as_done(tmp_path, monkeypatch):
    """A preempted member whose grace ran out is requeued by Slurm before its own requeue: that
    `scontrol requeue` answers "Job is pending execution", which is what was asked, not an error;
    any other refusal still is one."""
    from pipeswift_slurm.slurm import client
    from pipeswift_slurm.errors import PswiftError
    conf = tmp_path / "slurm.conf"
    conf.write_text("")
    for said, fails in (("240_2: Job is pending execution", False), ("240_2: Invalid job id specified", True)):
        bin_dir = tmp_path / f"bin{fails}"
        bin_dir.mkdir()
        (bin_dir / "scontrol").write_text(f"#!/bin/sh\necho '{said}' >&2\nexit 1\n")
        (bin_dir / "scontrol").chmod(0o755)
        monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
        monkeypatch.setenv("SLURM_CONF", str(conf))
        if fails:
            with pytest.raises(PswiftError, match="Invalid job id"):
                client.requeue("240_2")
        else:
            assert client.requeue("240_2") is False


@pytest.mark.parametrize("nodes", ["3", "6"])
def test_pswift_run_of_members_refuses_nodes_that_are_not_whole_members(tmp_path: Path, nodes: str):
    """`pswift run --nodes N` of a run of 2 members of 2 nodes: N must be 2 or 4 (whole members,
    at most all of them); anything else is one line that says so, exit 2, no run directory."""
    toml = paced_example(tmp_path / "ex", steps=10, members=2, nodes="[2, 4]")
    toml.write_text(toml.read_text().replace("members = 2\n", "members = 2\nmember_nodes = 2\n"))
    run = tmp_path / "run"
    got = pswift("run", "--run-dir", str(run), "--nodes", nodes, str(toml), timeout=120)
    assert got.returncode == 2, (got.stdout, got.stderr)
    lines = got.stderr.strip().splitlines()
    assert len(lines) == 1 and f"--nodes {nodes}" in lines[0] and "multiple of 2 up to 4" in lines[0], got.stderr
    assert "Traceback" not in got.stderr and not run.exists()


def test_the_array_holds_back_the_members_beyond_the_planners_node_count(tmp_path):
    """planning.members.at_once: as many members run at once as the planner's chosen node count
    holds (one job would ask no more), never fewer than the range's bottom; the batch script's
    --array carries it as ``%K`` only where it holds members back."""
    from types import SimpleNamespace

    from pipeswift_slurm.config import load_config
    from pipeswift_slurm.planning import build, members as choice
    toml = slow_example(tmp_path / "ex", {"nodes": "[2, 4]"})
    toml.write_text(toml.read_text().replace("[resources]\n", "[resources]\nmembers = 4\n", 1))
    cfg = load_config(toml)
    chose = lambda n: SimpleNamespace(chosen=SimpleNamespace(nodes=n))   # noqa: E731
    assert [choice.at_once(cfg, chose(n), 4) for n in (1, 2, 3, 4)] == [2, 2, 3, 4]
    assert choice.at_once(cfg, None, 4) == 4 and choice.at_once(cfg, chose(3), 0) == 0
    assert [build._array(4, k) for k in (2, 4, 0)] == ["0-3%2", "0-3", "0-3"] and build._array(0, 2) is None


def test_a_run_of_members_counts_free_nodes_without_its_own_held_back_tasks_and_records_a_raise(tmp_path):
    """grow.members_free: idle nodes less what pending jobs ask for, the array's own held-back
    tasks (one pending job holding the array's id) aside; a requeued member (its own job id)
    counts, as it starts first. grow.let_members_run sets the throttle through the port and says
    so in plan.json, which the next launch reads."""
    from helpers import FakeSlurm, plan_with
    from pipeswift_launch import grow
    from pipeswift_slurm.plan import members_at_once, read_plan, write_plan
    from pipeswift_slurm.slurm.cluster import ClusterState, NodeState, PendingJob
    nodes = [NodeState(f"n{i}", "idle" if i < 3 else "allocated", 2, 2 if i < 3 else 0, ("low",)) for i in range(4)]
    array, requeued, theirs = (PendingJob(j, "low", 1, 600.0) for j in ("100", "103", "200"))
    assert grow.members_free(ClusterState(0.0, nodes, [], [array]), "low", 2, "100") == 3
    assert grow.members_free(ClusterState(0.0, nodes, [], [array, requeued, theirs]), "low", 2, "100") == 1
    as_text = [PendingJob(j, "low", 1, 600.0) for j in ("100_[2-3%2]", "100_1", "200")]   # 22.05's squeue text
    assert grow.members_free(ClusterState(0.0, nodes, [], as_text), "low", 2, "100") == 1
    plan = plan_with(members=4, members_at_once=2, member_nodes=1, run_dir=str(tmp_path))
    write_plan(plan, tmp_path / "plan.json")
    assert grow.held_back(plan)
    fake = FakeSlurm()
    grow.let_members_run(plan, "100", 3, fake.set_array_throttle)
    assert fake.calls == [("set_array_throttle", "100", 3)]
    assert members_at_once(read_plan(tmp_path / "plan.json")) == 3 == members_at_once(plan) and grow.held_back(plan)
    grow.let_members_run(plan, "100", 4, fake.set_array_throttle)
    assert not grow.held_back(plan) and members_at_once(read_plan(tmp_path / "plan.json")) == 4


def test_a_throttle_raise_waits_for_a_relayout_being_written_and_keeps_it(tmp_path):
    """The watcher's throttle raise (a read of plan.json, then a write) takes turns with rank 0's
    re-layout write (grow.PLAN_WRITES): begun while the re-layout holds the turn, it writes only
    after it, onto the re-laid-out plan, and the re-layout's copy carries the raise made before."""
    import threading
    from helpers import FakeSlurm, plan_with
    from pipeswift_launch import grow
    from pipeswift_slurm.plan import members_at_once, read_plan, relaid_out, write_plan
    path = tmp_path / "plan.json"
    plan = plan_with(members=4, members_at_once=2, member_nodes=1, run_dir=str(tmp_path))
    write_plan(plan, path)
    raising = threading.Thread(target=grow.let_members_run, args=(plan, "100", 3, FakeSlurm().set_array_throttle))
    with grow.PLAN_WRITES:   # rank 0 writes a re-layout from its copy meanwhile
        raising.start()
        raising.join(0.5)
        assert raising.is_alive() and members_at_once(read_plan(path)) == 2 == members_at_once(plan)
        write_plan(relaid_out(plan, {}, {"reason": "test"}), path)
    raising.join(5)
    got = read_plan(path)
    assert not raising.is_alive() and members_at_once(got) == 3 and got["revision"] == plan.get("revision", 0) + 1
