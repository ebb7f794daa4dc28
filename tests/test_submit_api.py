"""The submission library (`pipeswift_slurm.submit`): what `pswift sbatch` is, without a CLI."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from helpers import new_jobs_since, squeue_ids
from pipeswift_slurm import submit
from pipeswift_slurm.errors import ConfigError, SlurmError, UsageError


def test_prepare_writes_nothing_and_says_what_it_would_send(example, tmp_path):
    p = submit.prepare(str(example), str(tmp_path / "run"), live=False)   # paths as str work too
    assert not (tmp_path / "run").exists()
    assert p.plan["run_dir"] == str((tmp_path / "run").resolve()) and "#SBATCH --nodes=2" in p.script
    assert p.layout_line().startswith("2 node(s): 2 stage(s) x 1 dp")


def test_prepare_refuses_an_option_that_contradicts_the_plan_before_planning(tmp_path):
    with pytest.raises(UsageError, match="would override the planned"):
        submit.prepare(tmp_path / "no-such.toml", sbatch_args=["-N", "3"])


def test_prepare_takes_the_tomls_tables_as_a_dict_and_the_run_directory_keeps_them(example, tmp_path,
                                                                                    monkeypatch):
    import tomllib
    doc = tomllib.loads(example.read_text())
    doc["training"]["steps"] = 7
    monkeypatch.chdir(example.parent)            # [model] entry's module is found from here
    p = submit.prepare(doc, tmp_path / "run", live=False, learn=False)
    assert p.plan["training"]["steps"] == 7 and doc["training"]["steps"] == 7   # the dict is not changed
    submit.write_run_dir(p)
    assert tomllib.loads((tmp_path / "run" / "train.toml").read_text()) == doc
    doc["job"]["max_requeues"] = -1
    with pytest.raises(ConfigError, match=r"max_requeues"):
        submit.prepare(doc, live=False, learn=False)


def test_a_bad_toml_is_a_config_error(tmp_path):
    bad = tmp_path / "t.toml"
    bad.write_text("[job]\nname = 3\n")
    with pytest.raises(ConfigError):
        submit.prepare(bad)


@pytest.mark.slurm
@pytest.mark.every_version
def test_sbatch_submits_through_real_slurm_and_registers_the_job(cluster, example, tmp_path):
    job = submit.sbatch(example, ["--hold"], run_dir=tmp_path / "run")
    try:
        assert job.job_id in squeue_ids()
        assert (job.run_dir / "JOB_ID").read_text().strip() == job.job_id
        plan = json.loads((job.run_dir / "plan.json").read_text())
        assert plan["layouts"]["2"]["stages"] == 2 and (job.run_dir / "job.sbatch").is_file()
        # the job object: what `pswift status`, `--wait`, `cancel` and `logs` do, as methods
        assert job.state == "PENDING" and job.status()["reason"] == "JobHeldUser"
        with pytest.raises(TimeoutError, match="still PENDING"):
            job.wait(timeout=1)
        # found again, as submitit's jobs are: by its id and by its run directory
        from pipeswift_slurm import api
        again = api.Job.attach(job.job_id)
        assert (again.job_id, again.run_dir) == (job.job_id, job.run_dir) and not again.done()
        assert api.Job.attach(job.run_dir).job_id == job.job_id
        job.cancel()
        assert job.wait(timeout=60) == "CANCELLED" and job.logs() == ""
        assert job.status()["cancelled"]["user"] == "root"
        assert again.done() and "ended CANCELLED" in str(again.exception())
        with pytest.raises(api.JobFailed, match="ended CANCELLED"):
            again.result()
    finally:
        subprocess.run(["scancel", job.job_id])


@pytest.mark.slurm
@pytest.mark.every_version
def test_a_refused_submission_leaves_nothing_behind(cluster, example, tmp_path):
    before = squeue_ids()
    with pytest.raises(SlurmError, match="(?i)invalid feature"):
        submit.sbatch(example, ["--constraint=nosuchfeature"], run_dir=tmp_path / "run")
    assert not new_jobs_since(before)
    assert not (tmp_path / "run").exists() and not list(tmp_path.glob(".run*"))


def test_submitting_with_a_history_imports_neither_numpy_nor_sqlite_utils(example, tmp_path):
    """sqlite-utils pulls in numpy (~0.14 s): the submit path reads the history without it."""
    from pipeswift_slurm.history.store import History
    History(tmp_path / "h.db").close()
    code = ("import sys; from pipeswift_slurm import submit\n"
            "submit.prepare(sys.argv[1], live=False, db=sys.argv[2])\n"
            "print('HEAVY', sorted({m.split('.')[0] for m in sys.modules} & {'numpy', 'sqlite_utils', 'rich', 'torch'}))")
    proc = subprocess.run([sys.executable, "-c", code, str(example), str(tmp_path / "h.db")],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "HEAVY []" in proc.stdout


@pytest.mark.slurm
@pytest.mark.every_version
def test_a_prefetched_cluster_state_is_the_one_a_direct_query_gives(cluster, monkeypatch):
    from pipeswift_slurm.slurm import client as slurm
    slurm._cache.pop("prefetch", None)
    slurm._cache.pop("partitions", None)
    slurm.prefetch()
    assert "prefetch" in slurm._cache
    early = slurm.cluster_state(now=1.0)
    assert "prefetch" not in slurm._cache      # taken once
    assert early == slurm.cluster_state(now=1.0) and early.nodes
    # the partitions' preemption the submission warns from was asked ahead too, and is Slurm's
    with monkeypatch.context() as m:
        m.setattr(slurm, "_run", lambda *a, **k: pytest.fail(f"asked Slurm again: {a}"))
        ahead = slurm.partitions_preemption()     # waits for the prefetch's query, asks nothing
    slurm._cache.pop("partitions")
    assert ahead == slurm.partitions_preemption() and any(p.partition == "low" for p in ahead)


def test_nothing_is_prefetched_without_a_slurm_configuration(monkeypatch, tmp_path):
    """A client without slurm.conf may wait for a configless server: no background query then."""
    from pipeswift_slurm.slurm import client as slurm
    monkeypatch.setenv("SLURM_CONF", str(tmp_path / "missing.conf"))
    slurm._cache.pop("prefetch", None)
    slurm.prefetch()
    assert "prefetch" not in slurm._cache


def test_a_library_callers_warnings_go_through_logging(tmp_path, caplog):
    """Issue 59, item 8: warnings were dropped unless the caller passed ``warn``; they go to
    the "pipeswift_slurm" logger (the CLI prints them itself)."""
    import logging
    import shutil
    from helpers import ROOT
    shutil.copytree(ROOT / "examples" / "tiny-gpt", tmp_path / "ex")
    toml = tmp_path / "ex" / "train.toml"
    toml.write_text("\n".join(line for line in toml.read_text().splitlines() if not line.startswith("layer_costs")))
    with caplog.at_level(logging.WARNING, logger="pipeswift_slurm"):
        submit.prepare(toml, live=False, learn=False, db=tmp_path / "h.db")
    assert any(r.name == "pipeswift_slurm" and "no per-layer costs" in r.getMessage() for r in caplog.records), \
        caplog.records
