"""The decision after a launch of the ranks ends (pipeswift_slurm.planning.decide): pure rules, a table of
cases, no torch and no Slurm; the batch script's helper over real record files; srun's report."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from helpers import FakeSlurm, plan_with, slurm_port
from pipeswift_slurm.planning import decide
from pipeswift_slurm.slurm import srun
from pipeswift_slurm.config import MAX_RESTARTS_DEFAULT
from pipeswift_slurm.slurm.records import expand_hostlist
from pipeswift_slurm.codes import Exit, Stop
from pipeswift_slurm.planning.decide import Budgets, Death, Launched, Stopped, what_follows

KILLED = Death("signal 9", 1, "node2")
LOST = Death("lost", 3, "node4")
BUG = Death("exception", 0, "node1", 5, "ValueError: bad batch at step 5")
GLOO = Death("exception", 0, "node1", 58, "RuntimeError: [gloo/pair.cc:537] Read error: Connection reset by peer")
OOM = Death("exception", 2, "node3", 9, "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2 GiB")
EXIT = Death("exit 7", 1, "node2")
HUNG = Death("hung", 2, "node3", 12, "no step finished for 9.1 s (limit 8.0 s, after step 12)")


def budgets(restarts=0, max_restarts=3, relayouts=0, attempt=0, max_requeues=3, in_slurm=True) -> Budgets:
    return Budgets(restarts, max_restarts, relayouts, attempt, max_requeues, in_slurm)


# (name, rc, ended by itself, deaths, signatures seen before, budgets, action, exit code, exclude)
CASES = [
    ("finished", 0, True, [], [], budgets(), "done", 0, None),
    ("finished, no records", 0, False, [], [], budgets(), "done", 0, None),
    ("re-layout", 75, True, [], [], budgets(), "relayout", 0, None),
    ("re-layout budget spent", 75, True, [], [], budgets(relayouts=2), "fail", 75, None),
    ("a refusal of the launcher", 2, True, [], [], budgets(), "done", 2, None),
    ("the requeue budget spent by the launcher", 3, True, [], [], budgets(), "done", 3, None),
    ("the watchdog's hang requeue, launched by hand", 76, True, [KILLED], [], budgets(), "done", 76, None),
    ("a hang: restart in the allocation", 137, False, [HUNG, KILLED], [], budgets(), "relaunch", 0, None),
    ("a hang nobody was singled out for", 137, False, [Death("hung", error="blocked")], ["hung on None"],
     budgets(), "relaunch", 0, None),
    ("a second hang on that node: requeue without it", 137, False, [HUNG], [HUNG.signature], budgets(),
     "requeue", 0, "node3"),
    ("a second hang on another node: restart", 137, False, [HUNG], ["hung on node1"], budgets(),
     "relaunch", 0, None),
    ("a second hang, requeues spent: restart", 137, False, [HUNG], [HUNG.signature], budgets(attempt=3),
     "relaunch", 0, None),
    ("SIGKILL of a rank", 143, False, [KILLED], [], budgets(), "relaunch", 0, None),
    ("SIGKILL, peer's gloo error first", 143, False, [GLOO, KILLED], [], budgets(), "relaunch", 0, None),
    ("a lost node", 143, False, [LOST], [], budgets(restarts=2), "relaunch", 0, None),
    ("an exit code of a rank", 143, False, [EXIT], [], budgets(), "relaunch", 0, None),
    ("nothing known", 137, False, [], [], budgets(), "relaunch", 0, None),
    ("out of memory is a fault", 143, False, [OOM], [OOM.signature], budgets(), "relaunch", 0, None),
    ("restarts spent: requeue without the node", 143, False, [KILLED], [], budgets(restarts=3), "requeue", 0, "node2"),
    ("restarts spent, gloo only: requeue with every node", 143, False, [GLOO], [], budgets(restarts=3), "requeue", 0, None),
    ("restarts and requeues spent", 143, False, [KILLED], [], budgets(restarts=3, attempt=3), "fail", 143, None),
    ("no restarts allowed", 143, False, [KILLED], [], budgets(max_restarts=0), "requeue", 0, "node2"),
    ("nothing allowed, pswift run", 143, False, [KILLED], [], budgets(max_restarts=0, in_slurm=False), "fail", 143, None),
    ("a bug, the first time", 143, False, [BUG, GLOO], [], budgets(), "relaunch", 0, None),
    ("a bug, the same again", 143, False, [GLOO, BUG], [BUG.signature], budgets(), "fail", 1, None),
    ("a bug again, restarts spent or not", 143, False, [BUG], [BUG.signature], budgets(restarts=3, attempt=3), "fail", 1, None),
    ("the same error at another step", 143, False, [Death("exception", 0, "n", 6, BUG.error)], [BUG.signature],
     budgets(), "relaunch", 0, None),
    ("a bug, restarts spent: requeue, no node left out", 143, False, [BUG], [], budgets(restarts=3), "requeue", 0, None),
]


@pytest.mark.parametrize("name,rc,itself,deaths,seen,b,action,code,exclude", CASES, ids=[c[0] for c in CASES])
def test_what_follows_a_launch(name, rc, itself, deaths, seen, b, action, code, exclude):
    d = what_follows(Launched(rc, itself, deaths, seen), b)
    assert (d.action, d.exit_code, d.exclude) == (action, code, exclude), d.why
    assert d.why and "\n" not in d.why
    if d.action == "relaunch":
        assert d.counts_as_restart and d.backoff_s == decide.backoff(b.restarts + 1)
        assert f"restart {b.restarts + 1} of {b.max_restarts}" in d.why


def test_the_reasons_name_the_rank_the_node_and_the_fix():
    d = what_follows(Launched(143, False, [KILLED], []), budgets())
    assert d.why.startswith("rank 1 on node2 was killed by signal 9 (fault): restart 1 of 3")
    d = what_follows(Launched(143, False, [BUG], [BUG.signature]), budgets())
    assert "rank 0 on node1 raised ValueError: bad batch at step 5 at step 5 again" in d.why
    assert "fix it and resubmit" in d.why
    d = what_follows(Launched(143, False, [KILLED], []), budgets(restarts=3, attempt=3))
    assert "max_restarts = 3 spent" in d.why and "max_requeues = 3 spent at attempt 3" in d.why
    assert "raise [job] max_restarts or max_requeues" in d.why


def test_faults_and_bugs_are_told_apart_by_how_a_rank_ended():
    assert KILLED.is_fault and LOST.is_fault and GLOO.is_fault and OOM.is_fault and EXIT.is_fault
    assert not BUG.is_fault
    assert not Death("exception", error="ModuleNotFoundError: No module named 'mymodel'").is_fault
    assert not Death("exception", error="RuntimeError: shape '[8, 32]' is invalid for input of size 100").is_fault
    assert Death("exception", error="torch.distributed.DistBackendError: NCCL error in: ...").is_fault
    assert decide.first_death([GLOO, KILLED]) is KILLED      # the peer's broken collective is a consequence
    assert decide.first_death([GLOO, KILLED, BUG]) is BUG    # the code's error explains it all
    assert decide.first_death([]) is None


def test_backoff_doubles_and_is_capped():
    assert [decide.backoff(k) for k in (1, 2, 3, 4, 5)] == [0, 1, 2, 4, 8]
    assert decide.backoff(50) == decide.BACKOFF_MAX_S


def test_the_budgets_are_one_function_each():
    assert [decide.requeues_left(a, 3) for a in (0, 2, 3, 4)] == [3, 1, 0, -1]
    assert decide.restart_left(0, 1) and not decide.restart_left(1, 1) and not decide.restart_left(0, 0)


def stopped(stop, step=5, steps=10, **facts) -> Stopped:
    return Stopped(stop, step, steps, **facts)


# (name, the stop's facts, budgets, action, end reason, who requeues, exit code, forbid Slurm's requeue)
STOPS = [
    ("the last step", stopped(Stop.NONE, step=10), budgets(), "done", "completed", None, 0, False),
    ("a signal at the last step", stopped(Stop.TERM, step=10), budgets(attempt=3), "done", "completed", None, 0, False),
    ("re-laid out", stopped(Stop.RELAYOUT), budgets(), "relayout", "relayout", None, Exit.RELAYOUT, False),
    ("growth", stopped(Stop.GROW), budgets(attempt=1), "grow", "grow", "pswift", 0, False),
    ("the time limit", stopped(Stop.TIME), budgets(), "requeue", "time_limit", "pswift", 0, False),
    ("the time limit, slurm would requeue preemptions", stopped(Stop.TIME, slurm_requeues=True), budgets(),
     "requeue", "time_limit", "pswift", 0, False),
    ("preempted, Slurm < 24.05", stopped(Stop.TERM, preempted=True), budgets(), "requeue", "preempted", "pswift", 0,
     False),
    ("preempted, Slurm requeues itself", stopped(Stop.TERM, preempted=True, slurm_requeues=True), budgets(),
     "requeue", "preempted", "slurm", 0, False),
    ("Slurm could not be asked: a preemption", stopped(Stop.TERM, preempted=None), budgets(), "requeue", "preempted",
     "pswift", 0, False),
    ("cancelled", stopped(Stop.TERM, preempted=False), budgets(), "done", "cancelled", None, 0, False),
    ("cancelled, budget spent", stopped(Stop.TERM, preempted=False), budgets(attempt=3), "done", "cancelled", None, 0,
     False),
    ("the last attempt preempted", stopped(Stop.TERM, preempted=True), budgets(attempt=3), "done", "preempted", None,
     Exit.BUDGET_SPENT, False),
    ("the last attempt preempted, Slurm would requeue", stopped(Stop.TERM, preempted=True, slurm_requeues=True),
     budgets(attempt=3), "done", "preempted", None, Exit.BUDGET_SPENT, True),
    ("the last attempt out of time", stopped(Stop.TIME), budgets(attempt=3), "done", "time_limit", None,
     Exit.BUDGET_SPENT, False),
    ("the one before the last may requeue", stopped(Stop.TIME), budgets(attempt=2), "requeue", "time_limit", "pswift",
     0, False),
    ("pswift run, out of time", stopped(Stop.TIME), budgets(in_slurm=False), "done", "time_limit", None, 0, False),
    ("pswift run, a signal", stopped(Stop.TERM), budgets(in_slurm=False), "done", "stopped", None, 0, False),
    ("a hang by hand", stopped(Stop.HUNG, hung_node="node3", hung_why="stalled"), budgets(), "requeue", "hung",
     "pswift", Exit.HUNG, False),
    ("a hang by hand, nobody singled out", stopped(Stop.HUNG, hung_why="stalled"), budgets(), "requeue", "hung",
     "pswift", Exit.HUNG, False),
    ("a hang by hand, budget spent", stopped(Stop.HUNG, hung_node="node3", hung_why="stalled"), budgets(attempt=3),
     "done", "hung", None, Exit.HUNG, False),
    ("a hang, pswift run", stopped(Stop.HUNG, hung_why="stalled"), budgets(in_slurm=False), "done", "hung", None,
     Exit.HUNG, False),
]


@pytest.mark.parametrize("name,facts,b,action,reason,by,code,forbid", STOPS, ids=[c[0] for c in STOPS])
def test_what_follows_a_stop(name, facts, b, action, reason, by, code, forbid):
    d = what_follows(facts, b)
    assert (d.action, d.reason, d.requeue_by, d.exit_code, d.forbid_requeue) == (action, reason, by, code, forbid), d.why
    assert d.why and "\n" not in d.why
    assert d.exclude == (facts.hung_node if d.action == "requeue" else None)


def test_the_requeue_budget_is_read_the_same_way_at_every_moment():
    """The four moments that once counted the budget each their own way (attempt - 1, attempt,
    attempt + 1): an attempt beyond it refuses to train, the last one trains but is not
    requeued, a growth needs one requeue to spare; all read requeues_left."""
    trains = {a for a in range(4) if decide.may_train(a, 2)}
    requeued = {a for a in range(4) if what_follows(stopped(Stop.TIME), budgets(attempt=a, max_requeues=2)).action
                == "requeue"}
    relaunched_fault = {a for a in range(4) if what_follows(Launched(143, False, [KILLED], []), budgets(
        restarts=3, attempt=a, max_requeues=2)).action == "requeue"}
    may_grow = {a for a in range(4) if decide.may_grow(a, 2)}
    assert trains == {0, 1, 2} and requeued == relaunched_fault == {0, 1} and may_grow == {0}


SRUN_22 = """\
srun: error: node2: task 1: Killed
srun: launch/slurm: _step_signal: Terminating StepId=176.0
slurmstepd-node1: error: *** STEP 176.0 ON node1 CANCELLED AT 2026-11-30T23:59:48 ***
srun: error: node1: task 0: Exited with exit code 1
srun: error: node3: tasks 2-3: Terminated
srun: Force Terminated StepId=176.0
"""


def test_srun_reports_are_read_in_order_and_its_own_terminations_left_out():
    got = decide.srun_deaths(SRUN_22 + "srun: error: node4: task 5: Exited with exit code 7\n"
                             "srun: error: Node failure on node9\nsrun: error: node9: task 6: Unknown\n")
    assert got == [Death("signal 9", 1, "node2"), Death("exit 1", 0, "node1"), Death("exit 7", 5, "node4"),
                   Death("lost", 6, "node9")]
    assert decide.srun_deaths("step 4 loss 3.1\nsrun: error: nonsense\n") == []


#: what srun says (22.05's and 25.11's words: slurm_errno.c) when a job's step cannot be made because
#: the job is completing: preempted or requeued between two launches of its batch script
STEP_REFUSED = "srun: error: Unable to create step for job 830: Job/step already completing or completed\n"


def test_a_step_refused_for_a_job_that_is_ending_is_not_a_fault_to_launch_again():
    assert srun.job_ending(STEP_REFUSED) == "Job/step already completing or completed"
    assert srun.job_ending("srun: error: Unable to create step for job 9: Requested node configuration is not "
                           "available\n") is None          # a step that can never start: a failure, as before
    assert srun.job_ending(SRUN_22) is None
    d = what_follows(Launched(1, job_ending="Job/step already completing or completed"), budgets())
    assert (d.action, d.exit_code, d.death, d.counts_as_restart) == ("done", 1, None, False), d
    assert "not launching again" in d.why
    assert what_follows(Launched(1), budgets()).action == "relaunch"   # without the words: a fault, restarted


def _plan(tmp_path, **over) -> dict:
    run = tmp_path / "run"
    run.mkdir(exist_ok=True)
    return plan_with(**{"run_dir": str(run), "max_requeues": 3, "max_restarts": MAX_RESTARTS_DEFAULT,
                        "layouts": {"2": {}}, **over})


def _launch(tmp_path, n: int, records: list[dict], srun: str = "") -> object:
    folder = tmp_path / "run" / "launches" / f"9.0.{n}"
    folder.mkdir(parents=True)
    for r in records:
        (folder / f"rank_{r['rank']}.json").write_text(json.dumps(r))
    (folder / "srun.err").write_text(srun)
    return folder


def test_the_helper_reads_the_records_and_remembers_a_bug_across_launches(tmp_path, capsys):
    from pipeswift_launch import afterlaunch
    from pipeswift_slurm import events
    from pipeswift_slurm.history import eventfold
    plan, env = _plan(tmp_path), {"SLURM_JOB_ID": "9", "SLURM_RESTART_COUNT": "0"}
    bug = {"rank": 1, "node": "node2", "step": 5, "error": "ValueError: bad batch"}
    for launch, (restarts, want) in enumerate([(0, "restart"), (1, "exit 1")]):
        folder = _launch(tmp_path, launch, [bug, {"rank": 0, "node": "node1", "step": 5,
                                                  "error": "RuntimeError: Connection closed by peer"}],
                         "srun: error: node2: task 1: Exited with exit code 1\n")
        d, last = afterlaunch.decide_after(plan, 143, folder, restarts, 0, env)
        assert afterlaunch.carry_out(plan, d, last, restarts, env) == want
    crashes = [e for e in events.read(plan["run_dir"])[0] if e["event"] == "crash"]
    assert [(c["how"], c["rank"], c["step"], c["action"], c["restart"]) for c in crashes] == [
        ("exception", 1, 5, "restart", 1), ("exception", 1, 5, "fail", None)]
    (a,) = eventfold.by_attempt(events.read(plan["run_dir"])[0])
    assert a["ended"] == "failed" and "ValueError: bad batch" in a["end"]["error"]
    assert "restart 1 of 3" in capsys.readouterr().err


def test_the_helper_restarts_a_hung_launch_then_requeues_without_the_node_that_hung_twice(tmp_path, capsys,
                                                                                           monkeypatch):
    from pipeswift_launch import afterlaunch
    from pipeswift_slurm import events
    plan, env = _plan(tmp_path), {"SLURM_JOB_ID": "9", "SLURM_RESTART_COUNT": "0"}
    hang = {"rank": 0, "node": "node1", "step": 12, "suspect_rank": 2, "suspect_node": "node3",
            "hang": "no step finished for 9.1 s (limit 8.0 s, after step 12): rank 2 on node node3 stopped running"}
    monkeypatch.setattr(afterlaunch.time, "sleep", lambda s: None)
    with slurm_port(FakeSlurm()) as fake:
        for launch, want in enumerate(["restart", "exit 0"]):
            folder = _launch(tmp_path, launch, [hang], "srun: error: node1: task 0: Exited with exit code 76\n"
                                                       "srun: error: node3: task 2: Killed\n")
            d, last = afterlaunch.decide_after(plan, 137, folder, launch, 0, env)
            assert afterlaunch.carry_out(plan, d, last, launch, env) == want, d.why
    crashes = [e for e in events.read(plan["run_dir"])[0] if e["event"] == "crash"]
    assert [(c["how"], c["rank"], c["node"], c["step"], c["action"]) for c in crashes] == [
        ("hung", 2, "node3", 12, "restart"), ("hung", 2, "node3", 12, "requeue")]
    assert fake.calls == [("requeue", "9", "node3")]
    assert "rank 2 on node3 hung (no step finished" in capsys.readouterr().err


def test_the_helper_follows_a_launch_that_ended_itself_and_removes_its_folder(tmp_path, capsys):
    from pipeswift_launch import afterlaunch
    plan = _plan(tmp_path)
    (tmp_path / "plan.json").write_text(json.dumps(plan))
    folder = _launch(tmp_path, 0, [{"rank": 0, "node": "n", "rc": 75}, {"rank": 1, "node": "n", "rc": 75}])
    from pipeswift_slurm import plan as plan_mod
    orig = plan_mod.read_plan
    try:
        plan_mod.read_plan = lambda p: plan   # the plan's full checks are test_plan's
        assert afterlaunch.main([str(tmp_path / "plan.json"), "75", str(folder), "0", "0"]) == 0
    finally:
        plan_mod.read_plan = orig
    assert capsys.readouterr().out == "relayout\n" and not folder.exists()


def test_a_member_whose_job_ends_between_launches_leaves_its_epoch_without_a_crash(tmp_path, capsys, monkeypatch):
    """A member sealed into an epoch as its job was being preempted: srun refuses the step. The
    helper ends the batch script (no restart, no crash recorded: no rank ran) and marks the
    member gone from its epoch, so the run's next epoch does not wait for it (REJOIN_WAIT_S)."""
    from pipeswift_launch import afterlaunch
    from pipeswift_slurm import events
    plan = _plan(tmp_path, members=2)
    epoch = tmp_path / "run" / "members" / "epoch-3"
    epoch.mkdir(parents=True)
    env = {"SLURM_JOB_ID": "830", "SLURM_RESTART_COUNT": "1", "SLURM_ARRAY_TASK_ID": "1",
           "PSWIFT_RENDEZVOUS_DIR": str(epoch)}
    monkeypatch.setattr(afterlaunch.os, "environ", env)
    for name in ("read_plan", "runnable"):
        monkeypatch.setattr(afterlaunch, name, lambda p, *_: plan)
    monkeypatch.setattr(afterlaunch, "for_partition", lambda p, _: p)
    folder = _launch(tmp_path, 0, [], STEP_REFUSED)
    with slurm_port(FakeSlurm(job=lambda job: pytest.fail("Slurm asked: srun said it all"))) as fake:
        assert afterlaunch.main([str(tmp_path / "plan.json"), "1", str(folder), "0", "0"]) == 0
    assert fake.calls == []
    out = capsys.readouterr()
    assert out.out == "exit 1\n", out
    from pipeswift_slurm.memberfiles import left_mark
    assert left_mark(epoch, 1).exists() and not left_mark(epoch, 0).exists()
    assert not [e for e in events.read(plan["run_dir"])[0] if e["event"] in ("crash", "end")]
    from pipeswift_launch import members
    members.finish(tmp_path / "run")        # a run trained to its end: its members' exits leave no mark
    env["SLURM_ARRAY_TASK_ID"] = "0"
    with slurm_port(FakeSlurm()):
        assert afterlaunch.main([str(tmp_path / "plan.json"), "1", str(_launch(tmp_path, 1, [], STEP_REFUSED)),
                                 "0", "0"]) == 0
    assert not left_mark(epoch, 0).exists()


def test_max_restarts_is_checked_where_the_config_is_built(tmp_path):
    from helpers import copy_example, pswift
    from pipeswift_slurm.config import load_config
    toml = copy_example(tmp_path / "ex")
    assert load_config(toml).job.max_restarts == MAX_RESTARTS_DEFAULT
    for bad, msg in (("-1", "must be >= 0"), ("101", "larger than pswift supports (100)"), ('"3"', "must be an integer")):
        toml.write_text(toml.read_text().replace("[job]\n", f"[job]\nmax_restarts = {bad}\n", 1))
        proc = pswift("plan", "--no-live", str(toml))
        assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and msg in proc.stderr, proc.stderr
        assert "[job] max_restarts" in proc.stderr
        toml.write_text(toml.read_text().replace(f"max_restarts = {bad}\n", ""))


def test_a_lost_node_goes_on_with_the_nodes_left_or_requeues_without_it():
    from pipeswift_slurm.planning.decide import Allocation
    stages = {2: 2, 3: 3, 4: 4}
    lost = Allocation(4, 3, ("node3",), stages)
    d = what_follows(Launched(143, False, [GLOO, Death("lost", 2, "node3")], [], lost), budgets())
    assert (d.action, d.nodes, d.death.node, d.death.how, d.counts_as_restart) == ("shrink", 3, "node3", "lost", True)
    assert d.why == "node3 lost: restart 1 of 3 on the 3 node(s) left, 4 -> 3 stage(s)"
    assert d.backoff_s == decide.backoff(1)
    # no layout for what is left, or no restart left: requeue without the node; nothing left: fail
    for alloc, b in ((Allocation(4, 3, ("node3",), {4: 4}), budgets()), (lost, budgets(restarts=3))):
        d = what_follows(Launched(143, False, [GLOO], [], alloc), b)
        assert (d.action, d.exclude) == ("requeue", "node3"), d.why
    d = what_follows(Launched(143, False, [GLOO], [], lost), budgets(restarts=3, attempt=3))
    assert d.action == "fail" and "node3 lost" in d.why and "resubmit" in d.why
    # the allocation as it was: the usual restart on every node
    same = Allocation(4, 4, (), stages)
    assert what_follows(Launched(143, False, [KILLED], [], same), budgets()).action == "relaunch"


def test_the_helper_asks_slurm_which_nodes_are_left(tmp_path, monkeypatch):
    from pipeswift_launch import afterlaunch
    from pipeswift_slurm import events
    plan = _plan(tmp_path, layouts={"2": {"stages": 2}, "3": {"stages": 3}, "4": {"stages": 4}})
    env = {"SLURM_JOB_ID": "9", "SLURM_RESTART_COUNT": "0", "SLURM_JOB_NODELIST": "node[1-4]"}
    answer = {"state": "RUNNING", "nodes": "node[1-2,4]"}
    fake = FakeSlurm(job=lambda job: SimpleNamespace(
        **answer, node_names=expand_hostlist(answer["nodes"]) if answer["state"] == "RUNNING" else ()))
    monkeypatch.setattr(afterlaunch.time, "sleep", lambda s: None)
    folder = _launch(tmp_path, 0, [], "srun: error: Node failure on node3\nsrun: error: node3: task 2: Unknown\n")
    with slurm_port(fake):
        d, last = afterlaunch.decide_after(plan, 143, folder, 0, 0, env)
        assert afterlaunch.carry_out(plan, d, last, 0, env) == "shrink 3 node[1-2,4]"
    (crash,) = [e for e in events.read(plan["run_dir"])[0] if e["event"] == "crash"]
    assert (crash["how"], crash["node"], crash["action"]) == ("lost", "node3", "restart")
    assert "on the 3 node(s) left, 4 -> 3 stage(s)" in crash["why"]
    # a job Slurm has requeued or is ending has no node list to go on with: no shrink
    for state, nodes in (("PENDING", ""), ("COMPLETING", "node[1-2,4]")):
        answer.update(state=state, nodes=nodes)
        with slurm_port(fake):
            assert afterlaunch.allocation(plan, env, lost_seen=False) is None


# ----------------------------------------------------------------------------- a node that died silently
def test_a_node_whose_every_rank_stayed_silent_is_lost_after_the_grace():
    began = {0: "node1", 1: "node2", 2: "node3", 3: "node4", 4: "node4"}
    assert decide.silent_nodes(began, {0, 1, 2}, decide.SILENT_GRACE_S - 1) == ()
    assert decide.silent_nodes(began, {0, 1, 2}, decide.SILENT_GRACE_S) == ("node4",)
    assert decide.silent_nodes(began, {0, 1, 2, 4}, 60.0) == ()       # one of node4's ranks was heard
    assert decide.silent_nodes(began, {0, 1}, 60.0) == ("node3", "node4")


def test_srun_hears_every_rank_it_names_and_a_launch_it_could_not_make_is_a_lost_node():
    report = ("srun: error: node2: tasks 0-1,3: Terminated\nsrun: error: node1: task 5: Killed\n"
              "srun: error: Task launch for StepId=32.1 failed on node node4: Communication connection failure\n")
    assert srun.heard(report) == {0, 1, 3, 5}
    lost = [d for d in decide.srun_deaths(report) if d.how == "lost"]
    assert lost == [Death("lost", None, "node4", None, "Communication connection failure")]


def test_a_silent_node_restarts_the_ranks_at_once_on_the_others_and_blames_no_healthy_node(tmp_path):
    """The issue's case: node4's slurmd, step daemon and rank killed, Slurm not told. The ranks on
    node1-3 broke their collectives (connection reset) and srun killed one of them; launchwatch
    found node4 silent. The helper restarts on node1-3 at once, leaving node4 out itself; with
    no layout for 3 nodes it requeues without node4, never without a healthy node."""
    from pipeswift_launch import afterlaunch, launchrec
    plan = _plan(tmp_path, layouts={"2": {"stages": 2}, "3": {"stages": 3}, "4": {"stages": 4}})
    env = {"SLURM_JOB_ID": "9", "SLURM_RESTART_COUNT": "0", "SLURM_JOB_NODELIST": "node[1-4]"}
    reset = "DistBackendError: Connection reset by peer"
    folder = _launch(tmp_path, 0, [{"rank": r, "node": f"node{r + 1}", "step": 7, "error": reset} for r in (0, 2)],
                     "srun: error: node2: task 1: Killed\n")
    for r in range(4):
        (folder / f"began_{r}.json").write_text(json.dumps({"rank": r, "node": f"node{r + 1}"}))
    (folder / launchrec.LOST).write_text(json.dumps({"nodes": ["node4"], "why": "silent"}))
    d, _ = afterlaunch.decide_after(plan, 137, folder, 0, 0, env)
    assert (d.action, d.nodes, d.nodelist, d.exclude, d.backoff_s) == ("shrink", 3, "node1,node2,node3", "node4", 0.0)
    assert d.death.node == "node4" and "node4 lost (silent, before Slurm knew)" in d.why
    with slurm_port(FakeSlurm()) as fake:
        assert afterlaunch.carry_out(plan, d, 7, 0, env) == "shrink 3 node1,node2,node3 node4"
    assert fake.calls == [("shrink_job", "9", "node1,node2,node3")]   # Slurm no longer counts node4 in the job
    no_three = _plan(tmp_path, layouts={"2": {"stages": 2}, "4": {"stages": 4}})
    d, _ = afterlaunch.decide_after(no_three, 137, folder, 0, 0, env)
    assert (d.action, d.exclude) == ("requeue", "node4"), d


def test_launchwatch_stops_srun_when_a_nodes_ranks_stay_silent(tmp_path):
    import subprocess
    import time
    from pipeswift_launch import launchrec, launchwatch
    folder = tmp_path / "launch"
    folder.mkdir()
    for r in range(3):
        (folder / f"began_{r}.json").write_text(json.dumps({"rank": r, "node": f"node{r + 1}"}))
    srun = subprocess.Popen(["sleep", "60"])
    (folder / "rank_0.json").write_text(json.dumps({"rank": 0, "node": "node1", "step": 3, "error": "x: reset"}))
    (folder / "srun.err").write_text("srun: error: node2: task 1: Terminated\n")
    t0 = time.monotonic()
    assert launchwatch.watch(folder, srun.pid, grace_s=1.0) == ("node3",)
    assert srun.wait(timeout=10) == -9 and time.monotonic() - t0 < 10
    assert launchrec.lost(folder) == ("node3",)
    quiet = tmp_path / "fine"
    quiet.mkdir()
    done = subprocess.Popen(["true"])
    done.wait()
    assert launchwatch.watch(quiet, done.pid, grace_s=0.5) == ()    # ended by itself: nothing to say


# ----------------------------------------------------------------------------- the launcher's port to Slurm
def test_the_slurm_client_and_the_tests_fake_implement_the_launchers_port():
    """Every call the launcher makes to Slurm goes through slurmport.SlurmPort: the client has
    each of its methods with the same parameters (mypy holds the types), and so has the fake."""
    import inspect

    from pipeswift_launch import slurmport
    from pipeswift_slurm.slurm import client
    wanted = {n: inspect.signature(f) for n, f in vars(slurmport.SlurmPort).items()
              if callable(f) and not n.startswith("_")}
    assert len(wanted) == 11
    for impl in (client, FakeSlurm()):
        for name, sig in wanted.items():
            got = inspect.signature(getattr(impl, name))
            want = [p.name for p in sig.parameters.values() if p.name != "self"]
            assert [p.name for p in got.parameters.values()] == want, (impl, name)
    assert slurmport.slurm() is client


def test_no_launcher_module_imports_the_slurm_client_but_the_port():
    from helpers import ROOT
    import ast
    for path in sorted((ROOT / "launch" / "pipeswift_launch").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("pipeswift_slurm.slurm"):
                names = {a.name for a in node.names}
                assert path.name == "slurmport.py" or "client" not in names, path.name


def test_a_stop_is_carried_out_through_the_port(monkeypatch):
    """The training rank's side, without torch's process group: the facts gathered through the
    port, the decision, and what rank 0 asks of Slurm afterwards."""
    from pipeswift_launch import train
    plan = plan_with(max_requeues=1, time_policy="fixed")
    plan["layouts"] = {"2": {"tasks_per_node": 1}}
    denv = SimpleNamespace(rank=0, attempt=0, job_id="9", job_ref="9", nodes=2)
    att = SimpleNamespace(plan=plan, denv=denv, step=5, layout=plan["layouts"]["2"], grow_to=0, trained_from=(0, 0.0))
    for preempted, slurm_requeues, want in ((True, False, [("requeue", "9", None)]), (True, True, []),
                                            (False, False, [])):
        with slurm_port(FakeSlurm(preempted=preempted, requeues_preempted=slurm_requeues)) as fake:
            d = decide.what_follows(train._stopped(att, Stop.TERM), train._budgets(att))
            train._carry_out(att, d)
        assert fake.calls == want, (preempted, slurm_requeues, d)
    denv.job_ref = "8_1"   # a member of a run: task 1 of array 8 (its own id 9): never "9", which may be the array's
    with slurm_port(FakeSlurm(preempted=True, requeues_preempted=False)) as fake:
        train._carry_out(att, decide.what_follows(train._stopped(att, Stop.TERM), train._budgets(att)))
    assert fake.calls == [("requeue", "8_1", None)]
    denv.job_ref = "9"
    denv.attempt = 1   # the last attempt: Slurm 24.05+ would requeue it, so it is forbidden to
    with slurm_port(FakeSlurm(preempted=True, requeues_preempted=True)) as fake:
        d = decide.what_follows(train._stopped(att, Stop.TERM), train._budgets(att))
        train._carry_out(att, d)
    assert fake.calls == [("forbid_requeue", "9")] and d.exit_code == Exit.BUDGET_SPENT


def test_a_local_launch_is_reported_as_srun_reports_one():
    """pswift run's launches go to the same helper as the batch script's (issue 39): each rank's
    end written in srun's words, the launch's code as srun's."""
    srun_rc = srun.exit_code
    assert srun_rc([0, 0]) == 0 and srun_rc([75, 75]) == 75
    assert srun_rc([2, -15]) == 2              # rank 1 stopped because rank 0 ended: rank 0's code
    assert srun_rc([-9, -15]) == 137 and srun_rc([1, -9]) == 1 and srun_rc([-15, -15]) == 143
    report = srun.report("localhost", [-9, 1, -15, 0])
    assert report.splitlines() == ["srun: error: localhost: task 0: Killed",
                                   "srun: error: localhost: task 1: Exited with exit code 1",
                                   "srun: error: localhost: task 2: Terminated"]
    deaths = decide.srun_deaths(report)
    assert [(d.how, d.rank) for d in deaths] == [("signal 9", 0), ("exit 1", 1)]   # srun's own SIGTERM left out


FAKE_RANK = r'''#!{python}
"""A stand-in for the job's interpreter: the helper (afterlaunch) runs for real; a rank plays
launch N's part of the script: re-lay out, then die (rank 1 SIGKILLed, rank 0's collective
broken), then finish."""
import json, os, signal, sys
if sys.argv[1:3] == ["-m", "pipeswift_launch.afterlaunch"]:
    os.execv({python!r}, [{python!r}, *sys.argv[1:]])
folder, rank = os.environ["PSWIFT_LAUNCH_DIR"], int(os.environ["RANK"])
counter = os.path.join(os.path.dirname(os.path.dirname(folder)), f"launches_of_rank_{{rank}}")
launch = (int(open(counter).read()) if os.path.exists(counter) else 0) + 1
open(counter, "w").write(str(launch))
def record(**rec):
    with open(os.path.join(folder, f"rank_{{rank}}.json"), "w") as f:
        json.dump({{"rank": rank, "node": None, **rec}}, f)
if launch == 1:
    record(rc=75); sys.exit(75)
if launch == 2:
    if rank == 1:
        os.kill(os.getpid(), signal.SIGKILL)
    import time; time.sleep(0.5)
    record(step=7, error="RuntimeError: [gloo] Connection reset by peer"); sys.exit(1)
record(rc=0); sys.exit(0)
'''


def test_pswift_run_relaunches_as_the_batch_script_does(tmp_path, capsys):
    """`pswift run`'s driver (pipeswift_slurm.local) asks the batch script's helper after every
    launch (issue 39): a launch that re-laid out is launched again, a rank killed by SIGKILL
    restarts the ranks (restart 1 of max_restarts), a finished one ends the run with 0. The ranks
    are a stand-in; the helper, its decision and its records are the real ones."""
    import sys
    from pipeswift_slurm.local import run_local
    from pipeswift_slurm.plan import write_plan
    fake = tmp_path / "python"
    fake.write_text(FAKE_RANK.format(python=sys.executable))
    fake.chmod(0o755)
    run = tmp_path / "run"
    run.mkdir()
    plan = plan_with(run_dir=str(run), python=str(fake), max_restarts=3)
    write_plan(plan, run / "plan.json")
    assert run_local(plan, str(run / "plan.json"), 2, grace_s=5) == 0
    out = capsys.readouterr().out
    assert "re-layout 1: launching the ranks again" in out and "restart 1: launching the ranks again" in out
    from pipeswift_slurm import events
    (crash,) = [e for e in events.read(run)[0] if e["event"] == "crash"]
    assert (crash["how"], crash["rank"], crash["action"], crash["restart"]) == ("signal 9", 1, "restart", 1), crash


def test_srun_report_is_bounded_by_the_launchs_world_and_digits():
    """Issue 57: "tasks 0-20000000" used 1.1 GB and 3.3 s, re-read every second; a rank of more
    than 4,300 digits raised ValueError (the script fell back to `exit rc`). A range is cut to
    the ranks that began, an absurd number is no rank."""
    huge = "9" * 5000
    report = (f"srun: error: node1: tasks 0-20000000: Killed\n"
              f"srun: error: node2: task {huge}: Exited with exit code 1\n"
              f"srun: error: node2: tasks 2-{huge}: Terminated\n")
    assert srun.heard(report, 4) == {0, 1, 2, 3}
    assert srun.heard(report, 0) == set()
    assert len(srun.heard(report)) == srun.MAX_RANKS     # never past the bound
    deaths = decide.srun_deaths(report)
    assert [(d.how, d.rank, d.node) for d in deaths] == [("signal 9", 0, "node1"), ("exit 1", None, "node2")]


def test_events_stream_holds_a_line_at_a_time_and_decodes_only_wanted_kinds(tmp_path):
    """Issue 57: events.read loaded the whole file (300k steps: 300 MB) after a failed launch;
    the launcher now streams the kinds it needs, skipping a line longer than MAX_LINE."""
    from pipeswift_slurm import events
    lines = [{"event": "start", "attempt": 0, "time": 1.0, "nodes": 1, "world_size": 1, "stages": 1,
              "data_parallel": 1, "micro_batches": 2, "micro_batch_size": 1, "boundaries": [0, 2], "step": 0}]
    lines += [{"event": "step", "attempt": 0, "time": 2.0 + s, "step": s, "loss": 1.0, "step_time": 0.1,
               "job_id": "7"} for s in range(1, 2001)]
    lines.insert(5, {"event": "crash", "attempt": 0, "time": 3.0, "how": "exception", "action": "restart",
                     "error": "E", "job_id": "7"})
    text = "".join(__import__("json").dumps(e) + "\n" for e in lines)
    (tmp_path / events.FILE).write_text(text[:200] + '{"event": "crash", "pad": "' + "x" * (events.MAX_LINE + 10)
                                        + '"}\n' + text[200:])
    got = list(events.stream(tmp_path, ("crash",)))
    assert [e["error"] for e in got] == ["E"]
    steps = [e["step"] for e in events.stream(tmp_path, ("step",))]
    assert steps[-1] == 2000 and len(steps) >= 1999


def test_a_decision_holds_one_of_the_actions_even_rebuilt_from_its_broadcast():
    """Issue 60: Decision.action is codes.Action; rank 0's decision reaches the others as JSON
    (collectives.broadcast) and is built again there as the same action; a word that is no
    action is refused where the decision is built."""
    import json
    from dataclasses import asdict
    from pipeswift_slurm.codes import Action
    from pipeswift_slurm.planning.decide import Decision
    d = what_follows(stopped(Stop.TIME), budgets(attempt=0, max_requeues=2))
    again = Decision(**json.loads(json.dumps(asdict(d))))
    assert d.action is Action.REQUEUE and again.action is Action.REQUEUE and again.why == d.why
    with pytest.raises(ValueError, match="'explode' is not a valid Action"):
        Decision("explode", "no such action")
