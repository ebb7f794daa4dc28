"""Slurm's JSON parsed for every supported version, from real output recorded on each
(tests/slurm_json/<version>/, made by capture.sh in one fixed situation: 3 of 4 nodes held by a
60-minute job, a 4-node job pending, one job finished with exit 3). The live twin of these tests,
on whichever Slurm is running, is test_slurm_versions.py."""

import os
from pathlib import Path

import pytest

from pipeswift_slurm.slurm import client as slurm
from pipeswift_slurm.slurm import records as slurm_json
from pipeswift_slurm.errors import SlurmError
from pipeswift_slurm.slurm.cluster import cluster_view, estimate_wait

DATA = Path(__file__).parent / "slurm_json"
VERSIONS = sorted(p.name for p in DATA.iterdir() if p.is_dir())


def doc(version: str, name: str) -> dict:
    return slurm_json.load((DATA / version / name).read_text(), name)


def node_doc(version: str) -> dict:
    """What the CLI backend asks on that version: sinfo (22.05) or scontrol (23.02+)."""
    f = "scontrol_nodes.json" if (DATA / version / "scontrol_nodes.json").exists() else "sinfo.json"
    return doc(version, f)


def test_both_supported_versions_are_recorded():
    assert {"22.05", "25.11"} <= set(VERSIONS)


@pytest.mark.parametrize("version", VERSIONS)
def test_the_planner_view_is_the_same_on_every_version(version):
    nodes = slurm_json.nodes(node_doc(version))
    assert [(n.name, n.cpus, n.idle_cpus, n.partitions) for n in nodes] == [
        ("node1", 8, 8, ("low", "high")), ("node2", 8, 0, ("low", "high")),
        ("node3", 8, 0, ("low", "high")), ("node4", 8, 0, ("low", "high"))]
    assert nodes[0].state.startswith("idle") and nodes[1].state.startswith("allocated")
    jobs = {j.name: j for j in slurm_json.jobs(doc(version, "squeue.json"))}
    holder, waiter = jobs["holder"], jobs["waiter"]
    assert (holder.state, holder.node_names, holder.node_count, holder.time_limit_min) == (
        "RUNNING", ("node2", "node3", "node4"), 3, 60)
    assert holder.end_time - holder.start_time == 3600
    assert (waiter.state, waiter.node_names, waiter.node_count, waiter.time_limit_min) == (
        "PENDING", (), 4, 30)
    view = cluster_view(nodes, list(jobs.values()), now=holder.start_time)
    assert [(r.nodes, r.end_time - view.now) for r in view.running] == [(("node2", "node3", "node4"), 3600)]
    assert [(p.node_count, p.time_limit_s) for p in view.pending] == [(4, 1800)]
    four = estimate_wait(view, 4, 8, "low")
    assert (four.free_now, four.usable) == (1, 4)
    assert four.seconds == 3600 + 1800   # behind the holder, then behind the pending 4-node job


@pytest.mark.parametrize("version", VERSIONS)
def test_sinfo_node_groups_of_newer_slurm_are_refused_with_the_fix(version):
    d = doc(version, "sinfo.json")
    if "sinfo" in d:
        with pytest.raises(SlurmError, match="scontrol show nodes --json"):
            slurm_json.nodes(d)
    else:
        assert len(slurm_json.nodes(d)) == 4


@pytest.mark.parametrize("version", VERSIONS)
def test_sacct_records(version):
    (rec,) = slurm_json.sacct_records(doc(version, "sacct.json"))
    assert rec["JOBNAME"] == "finished" and rec["JOBSTATE"] == "FAILED" and rec["USERNAME"] == "root"
    assert rec["QOS"] == "normal" and rec["NODECNT"] == 1 and rec["LIMIT"] == 5
    assert rec["START"] and rec["END"] >= rec["START"] >= rec["SUBMIT"]
    assert rec["CLUSTER"] and rec["WORK_DIR"]
    assert rec["EXITCODE"] is not None


@pytest.mark.parametrize("version", VERSIONS)
def test_a_jobs_exclusions_and_preemption_come_from_squeue_json(version):
    """What the launcher asks of its own job (state, nodes, partition, ExcNodeList, PreemptTime)
    comes from squeue's JSON on both versions: no text a job's comment could shape."""
    (j,) = [j for j in slurm_json.jobs(doc(version, "squeue.json")) if j.name == "holder"][:1]
    assert (j.state, j.nodes, j.excluded, j.preempt_time) == ("RUNNING", "node[2-4]", "", None)
    raw = doc(version, "squeue.json")
    for rec in raw["jobs"]:
        rec["excluded_nodes"], rec["comment"] = "node[1,3]", "x JobState=COMPLETED NodeList=node9"
        rec["preempt_time"] = 1796092180 if version == "22.05" else {"set": True, "infinite": False, "number": 1796092180}
    (j,) = [j for j in slurm_json.jobs(raw) if j.name == "holder"][:1]
    assert (j.state, j.nodes, j.excluded, j.preempt_time) == ("RUNNING", "node[2-4]", "node[1,3]", 1796092180)


def test_version_from_meta():
    assert slurm_json.version(doc("22.05", "squeue.json")) == (22, 5)
    assert slurm_json.version(doc("25.11", "squeue.json")) == (25, 11)


@pytest.mark.parametrize("text,names", [
    ("node[1-3,5],gpu07", ("node1", "node2", "node3", "node5", "gpu07")),
    ("n[08-10]", ("n08", "n09", "n10")),
    ("a1", ("a1",)), ("", ()),
    ("rack[1-2]-n", ("rack1-n", "rack2-n")),
    ("rack[1-2]-node[1-2]", ("rack1-node1", "rack1-node2", "rack2-node1", "rack2-node2")),
    ("r[1,3]n[08-09],x,c[2]", ("r1n08", "r1n09", "r3n08", "r3n09", "x", "c2")),
])
def test_expand_hostlist(text, names):
    assert slurm_json.expand_hostlist(text) == names


@pytest.mark.parametrize("text", ["n[1-2", "n1-2]", "n[a-b]", "n[3-1]", "n[[1]]", "n[0-99999999]"])
def test_a_host_list_that_cannot_be_read_is_one_error(text):
    with pytest.raises(slurm_json.SlurmError):
        slurm_json.expand_hostlist(text)


def test_numbers_states_and_garbage():
    assert slurm_json.number({"set": True, "infinite": False, "number": 4}) == 4
    assert slurm_json.number({"set": True, "infinite": True, "number": 0}) is None
    assert slurm_json.number({"set": False, "number": 7}) is None
    assert slurm_json.number(float("nan")) is None and slurm_json.number("12") is None
    assert slurm_json.state(["PENDING", "REQUEUED"]) == "PENDING" and slurm_json.state({"current": ["FAILED"]}) == "FAILED"
    assert slurm_json.state(None) == "UNKNOWN"
    with pytest.raises(SlurmError, match="did not print JSON"):
        slurm_json.load("Slurm says no", "squeue --json")
    with pytest.raises(SlurmError, match="not an object"):
        slurm_json.load("[1]", "squeue --json")
    # odd shapes in a newer layout are skipped or unknown, never an exception
    assert slurm_json.sacct_records({"jobs": [7, {"state": {"current": []}, "time": None}]})[0]["JOBSTATE"] == "UNKNOWN"


def test_run_reports_command_exit_code_and_stderr(monkeypatch):
    monkeypatch.delenv("SLURM_CONF", raising=False)
    with pytest.raises(SlurmError, match=r"`sh -c 'echo oops >&2; exit 3'` failed \(exit 3\): oops"):
        slurm._run(["sh", "-c", "echo oops >&2; exit 3"])


def test_missing_command():
    with pytest.raises(SlurmError, match="command not found"):
        slurm._run(["no-such-slurm-binary-xyz"])


def test_a_slurm_conf_that_is_no_file_is_one_line_at_once(monkeypatch, tmp_path):
    """Slurm's clients wait for a configless server when SLURM_CONF names nothing; pswift says so
    without running them (22.05's `scontrol --version` too retries for a minute)."""
    monkeypatch.setenv("SLURM_CONF", str(tmp_path / "missing.conf"))
    with pytest.raises(SlurmError, match=r"`python3 --version` not run: SLURM_CONF=.*missing.conf is not a file"):
        slurm._run(["python3", "--version"], timeout=60)
    (tmp_path / "missing.conf").write_text("")
    assert slurm._run(["python3", "--version"]).returncode == 0


def test_a_hung_command_is_bounded_and_names_slurm_conf(monkeypatch):
    monkeypatch.delenv("SLURM_CONF", raising=False)
    monkeypatch.setenv("PSWIFT_SLURM_OUTAGE_S", "0")     # no retrying of the outage it looks like
    with pytest.raises(SlurmError, match="did not answer within 1 s; SLURM_CONF is not set"):
        slurm._run(["sleep", "5"], timeout=1)


@pytest.mark.parametrize("version", VERSIONS)
def test_squeue_active_text(version):
    """The planner's queue query: pending and running jobs only, in squeue's own text format."""
    import time
    jobs = {j.state: j for j in slurm_json.squeue_active((DATA / version / "squeue_active.txt").read_text())}
    run, pend = jobs["RUNNING"], jobs["PENDING"]
    assert run.node_names == ("node1", "node2", "node3") and run.node_count == 3
    assert run.time_limit_min == 60 and pend.time_limit_min == 30 and pend.node_count == 4
    assert pend.node_names == () and pend.partition == run.partition == "low"
    assert run.end_time == int(time.mktime(time.strptime(
        (DATA / version / "squeue_active.txt").read_text().splitlines()[1].split("|")[6], "%Y-%m-%dT%H:%M:%S")))
    assert run.priority > 0 and pend.priority > 0
    # the running job's start (its end less its limit) and whose jobs they are: queue.expected_ends
    assert run.start_time == run.end_time - 3600 and pend.start_time is None
    assert run.user_id == pend.user_id == 0


def test_squeue_active_text_odd_lines():
    text = "1|RUNNING|5|p|1|UNLIMITED|N/A|n1|1000|Unknown\nbroken line\n2|PENDING||p|2|1-00:00:00|N/A||x|N/A\n"
    a, b = slurm_json.squeue_active(text)
    assert (a.time_limit_min, a.end_time, a.node_names, a.start_time, a.user_id) == (None, None, ("n1",), None, 1000)
    assert (b.time_limit_min, b.priority, b.node_count, b.user_id) == (1440, 0, 2, None)


def test_a_partition_that_cannot_hold_the_job_is_named_with_the_fix():
    from pipeswift_slurm.slurm.cluster import ClusterState, NodeState, partition_problem
    nodes = [NodeState(f"n{i}", "down" if i == 3 else "idle", 4, 4, ("low", "high") if i < 3 else ("low",))
             for i in range(4)]
    state = ClusterState(now=0.0, nodes=nodes, running=[], pending=[])
    assert partition_problem(state, "low", 4) is None           # a down node still counts: it may return
    assert partition_problem(state, None, 99) is None           # the default partition: Slurm's to say
    assert "has 3; ask for 3 or fewer" in partition_problem(state, "high", 4)
    why = partition_problem(state, "gpu", 1)
    assert "no such partition" in why and "(here: high, low)" in why


def test_exclusions_never_leave_a_requeued_job_too_few_nodes():
    from pipeswift_slurm.slurm.cluster import exclusions
    usable = {"node1", "node2", "node3", "node4"}
    assert exclusions([], "node2", usable, 2) == ["node2"]
    assert exclusions(["node2"], "node4", usable, 2) == ["node2", "node4"]
    # a third would leave one node for a 2-node job: the oldest exclusion goes (the goodput
    # bench's baseline waited forever with ExcNodeList=node2,node4,node3 before)
    assert exclusions(["node2", "node4"], "node3", usable, 2) == ["node4", "node3"]
    assert exclusions(["node2", "node4"], "node2", usable, 2) == ["node4", "node2"]
    # not even the new one fits: none added, and the old ones cut back to what leaves enough
    assert exclusions(["node1", "node2", "node3"], "node4", usable, 4) == []
    assert exclusions(["node1"], "node4", {"node1", "node2", "node4"}, 2) == ["node4"]
    assert exclusions(["node1"], "node4", {"node1", "node2", "node4"}, 3) == []


def test_the_configuration_is_found_as_slurm_finds_it(monkeypatch, tmp_path):
    """$SLURM_CONF, then the clients' built-in default (a prefix's etc/ for a source build), then
    a configless slurmd's or sackd's copy, else DNS; nothing here runs a client."""
    prefix = tmp_path / "slurm"
    (prefix / "bin").mkdir(parents=True)
    (prefix / "etc").mkdir()
    (prefix / "bin" / "scontrol").write_text("#!/bin/sh\nexit 0\n")
    (prefix / "bin" / "scontrol").chmod(0o755)
    monkeypatch.setenv("PATH", f"{prefix / 'bin'}:{os.environ['PATH']}")
    monkeypatch.setenv("SLURM_CONF", "/somewhere/slurm.conf")
    assert slurm.config_source() == slurm.ConfigSource("SLURM_CONF", "/somewhere/slurm.conf")
    monkeypatch.delenv("SLURM_CONF")
    cache = tmp_path / "run-slurm-conf" / "slurm.conf"
    monkeypatch.setattr(slurm, "CONFIGLESS_CACHE", str(cache))
    assert slurm.config_source() == slurm.ConfigSource("dns", None)
    cache.parent.mkdir()
    cache.write_text("")
    assert slurm.config_source() == slurm.ConfigSource("configless", str(cache))
    (prefix / "etc" / "slurm.conf").write_text("")
    assert slurm.config_source() == slurm.ConfigSource("default", str(prefix / "etc" / "slurm.conf"))


def test_a_json_answer_that_could_not_load_is_an_outage_not_an_empty_queue():
    """Slurm 22.05's squeue --json while slurmctld is down: exit 0, no jobs, and this error
    (recorded on the dev cluster): SlurmUnreachable, retried, never "the job is gone"."""
    down = {"errors": [{"description": "Failed while looking for jobs", "error_number": -1,
                        "error": "Unspecified error", "source": "slurm_load_jobs"}], "jobs": []}
    assert slurm_json.failed_loads(down) == "slurm_load_jobs: Failed while looking for jobs"
    assert slurm_json.failed_loads({"errors": [], "jobs": []}) is None        # a purged job id
    assert slurm_json.failed_loads(doc("25.11", "squeue.json")) is None


def test_what_slurm_says_while_slurmctld_restarts_is_an_outage_and_a_refusal_is_not():
    """Clients' words while slurmctld is down or shutting down (a restart saving its state
    answered `scontrol requeue` with "Unexpected message received" on 22.05) are retried; a
    refusal is not."""
    from pipeswift_slurm.slurm.outage import unreachable
    for said in ("scontrol: error: Unable to contact slurm controller (connect failure)",
                 "Unexpected message received for job 2520", "Socket timed out on send/recv operation"):
        assert unreachable(said), said
    for said in ("Invalid job id specified", "Requested operation is presently disabled for job 2520",
                 "Access/permission denied"):
        assert not unreachable(said), said


def test_one_epoch_reader_takes_every_form_slurm_writes_a_time_in():
    """records.epoch is the one reader of Slurm's times (squeue/sacct JSON, pyslurm, a jobcomp
    environment, filetxt's text)."""
    import datetime

    from pipeswift_slurm.slurm.records import epoch
    local = int(datetime.datetime(2026, 11, 30, 23, 59, 48).timestamp())
    assert epoch(1796092180) == epoch("1796092180") == epoch({"set": True, "number": 1796092180}) == 1796092180
    assert epoch(1796092180.7) == 1796092180 and epoch("2026-11-30T23:59:48") == local
    for unknown in (0, "0", None, "Unknown", "None", "", {"set": False, "number": 5}, float("nan"), "9" * 400, True):
        assert epoch(unknown) is None, unknown


def test_squeue_work_dirs_keep_a_directory_with_the_separator_whole():
    from pipeswift_slurm.slurm.records import HeldJob, squeue_work_dirs
    text = "12|alice|PENDING|/scratch/alice/run-a|ENDab12\n13|bob|RUNNING|/scratch/b|c d|ENDab12\n\nbroken line\n"
    assert squeue_work_dirs(text, "ab12") == [HeldJob("12", "alice", "PENDING", "/scratch/alice/run-a"),
                                              HeldJob("13", "bob", "RUNNING", "/scratch/b|c d")]


def test_a_work_dir_with_a_newline_is_one_directory_never_another_users_job():
    """Issue 57: a WorkDir of ``/home/m\\n77|alice|RUNNING|/home/m/fake`` parsed as alice's job
    77 when records were lines; each record now ends with the query's own random word."""
    from pipeswift_slurm.slurm.records import HeldJob, squeue_work_dirs, workdir_format
    assert workdir_format("c0ffee") == "%i|%u|%T|%Z|ENDc0ffee"
    forged = "/home/m\n77|alice|RUNNING|/home/m/fake"
    text = f"12|mallory|RUNNING|{forged}|ENDc0ffee\n13|bob|PENDING|/b|ENDc0ffee\n"
    assert squeue_work_dirs(text, "c0ffee") == [HeldJob("12", "mallory", "RUNNING", forged),
                                                HeldJob("13", "bob", "PENDING", "/b")]
    # a directory that guessed another word ends nothing
    guess = "/m|ENDbeef\n77|alice|RUNNING|/fake"
    assert squeue_work_dirs(f"12|mallory|RUNNING|{guess}|ENDc0ffee\n", "c0ffee") == [
        HeldJob("12", "mallory", "RUNNING", guess)]


def _slow_outage(seconds_per_try: float, answers_on_try: int | None):
    """A Slurm call that does not answer, each try taking ``seconds_per_try``, until its
    ``answers_on_try``-th try (None: never); the tries it was given."""
    import time
    from pipeswift_slurm.errors import SlurmUnreachable
    tries: list[float] = []

    def call() -> str:
        tries.append(time.monotonic())
        time.sleep(seconds_per_try)
        if answers_on_try is not None and len(tries) >= answers_on_try:
            return "answer"
        raise SlurmUnreachable("Unable to contact slurm controller")
    return call, tries


@pytest.mark.parametrize("per_try", [0.05, 0.7, 1.4])
def test_an_outage_is_retried_within_the_budget_and_no_try_ends_past_it(monkeypatch, per_try):
    """A 2 s budget: the call is tried again while tries fit, and none begins that would end past
    the budget if it took as long as the longest so far (a try that blocks counts)."""
    import time
    from pipeswift_slurm.errors import SlurmUnreachable
    from pipeswift_slurm.slurm import outage
    monkeypatch.setenv("PSWIFT_SLURM_OUTAGE_S", "2")
    monkeypatch.setattr(outage, "notice", lambda msg: None)
    monkeypatch.setattr(outage, "_gave_up_at", None)
    call, tries = _slow_outage(per_try, None)
    began = time.monotonic()
    with pytest.raises(SlurmUnreachable):
        outage.outlast("squeue", call)
    took = time.monotonic() - began
    assert took <= 2.0 + 0.3, (took, len(tries))
    # the second try at once, then waits of 1 s and 2 s: 0.05 s tries fit 3, 0.7 s ones 2, 1.4 s one
    assert len(tries) == {0.05: 3, 0.7: 2, 1.4: 1}[per_try], (per_try, len(tries))


def test_an_outage_that_ends_within_the_budget_is_ridden_out(monkeypatch):
    from pipeswift_slurm.slurm import outage
    monkeypatch.setenv("PSWIFT_SLURM_OUTAGE_S", "10")
    said: list[str] = []
    monkeypatch.setattr(outage, "notice", said.append)
    monkeypatch.setattr(outage, "_gave_up_at", None)
    call, tries = _slow_outage(0.01, 3)
    assert outage.outlast("squeue", call) == "answer" and len(tries) == 3
    assert "retrying for up to 10 s" in said[0] and "answers again" in said[-1], said


@pytest.mark.parametrize("version", VERSIONS)
def test_a_job_arrays_task_is_read_from_every_source_as_its_array_and_index(version):
    """A task of array 420 (its own job id 421, index 1) as sacct's JSON gives it on each
    version (22.05: plain numbers; later: ``{"set", "number"}``), as jobcomp/filetxt writes it
    and as the jobcomp plugin's environment holds it; a job that is no array's task (array id 0,
    index unset: NO_VAL in the environment) has neither."""
    from pipeswift_slurm.slurm import filetxt
    from pipeswift_slurm.slurm.accounting import normalise_record
    d = doc(version, "sacct.json")
    (plain,) = slurm_json.sacct_records(d)
    job = d["jobs"][0]
    set_number = isinstance(job["array"]["task_id"], dict)
    job["array"] = {**job["array"], "job_id": 420, "task_id": {"set": True, "infinite": False, "number": 1}
                    if set_number else 1}
    (task,) = slurm_json.sacct_records(d)
    line = ("JobId=421 UserId=root(0) GroupId=root(0) Name=m JobState=COMPLETED Partition=low TimeLimit=15 "
            "StartTime=2026-11-29T15:05:27 EndTime=2026-11-29T15:05:31 NodeList=node1 NodeCnt=1 ProcCnt=2 "
            "WorkDir=/w ReservationName= Tres=cpu=2,mem=1G,node=1 Account=a QOS=normal WcKey= Cluster=c "
            "SubmitTime=2026-11-29T15:05:26 EligibleTime=2026-11-29T15:05:26 ArrayJobId=420 ArrayTaskId=1 "
            "DerivedExitCode=0:0 ExitCode=0:0 \n")
    (from_filetxt,) = filetxt.parse(line, cutting=False).records
    env = {"JOBID": "421", "START": "1796600000", "ARRAYJOBID": "420", "ARRAYTASKID": "1"}
    for rec, source in ((task, "sacct"), (from_filetxt, "filetxt"), (env, "jobcomp")):
        got = normalise_record(rec, source)
        assert got is not None and (got["array_job_id"], got["array_task_id"]) == ("420", 1), (source, rec)
    for rec, source in ((plain, "sacct"), ({**env, "ARRAYJOBID": "0", "ARRAYTASKID": "4294967294"}, "jobcomp"),
                        ({"JOBID": "7", "START": "1796600000"}, "jobcomp")):
        got = normalise_record(rec, source)
        assert got is not None and (got["array_job_id"], got["array_task_id"]) == (None, None), (source, rec)


def test_an_attempt_the_plugin_records_as_pending_is_a_requeue():
    """Slurm 22.05's jobcomp/script gives an attempt `scontrol requeue` ended (a pswift job
    preempted requeues itself so) JOBSTATE=PENDING, with its end: a stopped attempt, REQUEUED as
    sacct names it, whose work counts as lost; a preempted one says PREEMPTED (both recorded
    through the plugin on the dev cluster)."""
    from pipeswift_slurm.slurm.accounting import normalise_record
    rec = {"JOBID": "452", "START": "1796614173", "END": "1796614177", "JOBSTATE": "PENDING"}
    assert normalise_record(rec, "jobcomp")["state"] == "REQUEUED"
    assert normalise_record({**rec, "JOBSTATE": "PREEMPTED"}, "jobcomp")["state"] == "PREEMPTED"
    assert normalise_record({**rec, "END": "0"}, "jobcomp")["state"] == "PENDING"   # no end: not an attempt that ran
