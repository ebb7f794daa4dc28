"""Submission as a library: prepare (plan + batch script) -> write the run directory -> sbatch.

The CLI's ``pswift sbatch`` and ``pswift run`` are option parsing and printing over these calls;
benchmarks and tests call them directly. Nothing is left behind when a step fails: the run
directory is written under a temporary name and committed whole, and removed again when sbatch
refuses the job.
"""

from __future__ import annotations

# Imports inside functions: the planner, the history and the waiting views load only for the path
# a submission takes (--dry-run, --wait, a node range)

import logging
import math
import sys
import time
from pathlib import Path
from typing import Any, Callable, NamedTuple, Sequence

from pipeswift_slurm.codes import to_stop_s
from pipeswift_slurm import runfiles
from pipeswift_slurm.history import rundir
from pipeswift_slurm.slurm import client as slurm
from pipeswift_slurm.config import TrainConfig, config_from_dict, describe_overrides, load_config
from pipeswift_slurm.errors import ConfigError, PswiftError, RunDirError, UsageError
from pipeswift_slurm.planning.layouts import rule_layouts
from pipeswift_slurm.plan import Plan, members_at_once, plan_bytes, write_plan
from pipeswift_slurm.planning.build import build_plan, limits_of, options_for
from pipeswift_slurm.slurm.sbatch import planned_option, render

Warn = Callable[[str], None]
#: where a library caller's warnings go unless it passes ``warn`` (the CLI prints them)
log = logging.getLogger("pipeswift_slurm")


def _logged(msg: str) -> None:
    log.warning(msg.removeprefix("warning: "))


class Prepared(NamedTuple):
    """What a submission would send: the plan (plan.json's content) and the batch script."""
    config: TrainConfig
    run_dir: Path
    plan: Plan
    script: str
    #: passed to sbatch unchanged (none of them contradicts the plan)
    sbatch_args: tuple[str, ...] = ()
    #: train.toml keys the command line set ({section: {key: value}}; pswift sbatch -p/-t/-N/...)
    overrides: dict[str, dict[str, Any]] = {}
    #: the TOML's text when it was given as a dict (the run directory's train.toml), else None
    toml_text: str | None = None

    def layout_line(self, nodes: int | None = None) -> str:
        """One line per planned node count: stages x dp, m, boundaries."""
        return layout_line(self.plan, nodes)


def layout_line(plan: Plan, nodes: int | None = None) -> str:
    """``plan``'s layouts, one part per node count: stages x dp, m, boundaries."""
    parts = []
    for n, lay in sorted(plan["layouts"].items(), key=lambda kv: int(kv[0])):
        if nodes is not None and int(n) != nodes:
            continue
        b = lay["boundaries"] if lay["boundaries"] else f"by {lay['partition']} in the job"
        parts.append(f"{n} node(s): {lay['stages']} stage(s) x {lay['data_parallel']} dp, "
                     f"m={lay['micro_batches']}, boundaries {b}")
    return "; ".join(parts)


#: the states in which a job has ended for good (Slurm may requeue a PREEMPTED attempt)
ENDED = frozenset({"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "OUT_OF_MEMORY", "NODE_FAIL", "BOOT_FAIL",
                   "DEADLINE"})


class JobFailed(PswiftError):
    """A job that ended otherwise than COMPLETED: its state and cause (``Job.exception``)."""


class Result(NamedTuple):
    """What a completed job made (``Job.result``): its last step, the loss there, its newest
    committed checkpoint (None without one) and its run directory."""
    step: int | None
    loss: float | None
    checkpoint: Path | None
    run_dir: Path


class Job:
    """A submitted pswift job (what submitit's ``Job`` is to a function): its id and run
    directory, and what `pswift status/sbatch --wait/cancel/logs` do, as methods; ``Job.attach``
    finds one again by its id or run directory."""

    def __init__(self, job_id: str, run_dir: Path, prepared: Prepared | None = None) -> None:
        self.job_id, self.run_dir, self.prepared = job_id, Path(run_dir), prepared

    def __repr__(self) -> str:
        return f"Job({self.job_id!r}, {str(self.run_dir)!r})"

    @classmethod
    def attach(cls, job: str | Path) -> Job:
        """The pswift job ``job`` names: its Slurm id (this user's registry) or its run directory."""
        from pipeswift_slurm.reports.watch import NotAJob, UnknownJob, resolve
        ref = resolve(str(job))
        if ref.run is None:
            raise UnknownJob(f"job {job} is not in pswift's registry; attach by its run directory")
        if not ref.job_id:
            raise NotAJob(f"{job} is a local run (`pswift run`): it has no Slurm job to attach to")
        return cls(ref.job_id, ref.run)

    def _ref(self) -> Any:
        from pipeswift_slurm.reports.watch import JobRef
        return JobRef(self.job_id, self.run_dir, self.job_id)

    def done(self) -> bool:
        """Whether the job has ended for good (a requeued one has not), without waiting."""
        return self.state in ENDED

    def exception(self, timeout: float | None = None) -> JobFailed | None:
        """After the job ends (waiting up to ``timeout`` s): None if it COMPLETED, else a
        JobFailed saying its state and the cause its events give."""
        state = self.wait(timeout)
        if state == "COMPLETED":
            return None
        summary = rundir.summarize(self.run_dir)
        last = summary["attempts"][-1] if summary["attempts"] else {}
        crash = (last.get("crashes") or [{}])[-1]
        cause = crash.get("why") or crash.get("error") or last.get("ended")
        return JobFailed(f"job {self.job_id} ended {state}" + (f": {cause}" if cause else "")
                         + f" (pswift logs {self.job_id}; run directory {self.run_dir})")

    def result(self, timeout: float | None = None) -> Result:
        """After the job ends (waiting up to ``timeout`` s): what it made; JobFailed if it
        ended otherwise than COMPLETED."""
        failed = self.exception(timeout)
        if failed is not None:
            raise failed
        summary = rundir.summarize(self.run_dir)
        ckpts = sorted(p.parent for p in (self.run_dir / runfiles.CHECKPOINTS).glob("step_*/MANIFEST.json"))
        return Result(summary["step"], summary["last_loss"], ckpts[-1] if ckpts else None, self.run_dir)

    @property
    def state(self) -> str:
        """Slurm's state (PENDING, RUNNING, COMPLETED, ...), else sacct's, the history's or the events'."""
        from pipeswift_slurm.reports.watch import state
        return state(self._ref(), rundir.summarize(self.run_dir)).state

    def status(self) -> dict[str, Any]:
        """What `pswift status JOBID --json` prints: state, step N/M, ETA, attempts, losses, log."""
        from pipeswift_slurm.reports.watch import status_of
        return status_of(self._ref())

    def wait(self, timeout: float | None = None) -> str:
        """Until the job ends (requeues and restarts go on): its final state. TimeoutError after
        ``timeout`` seconds (the job goes on)."""
        from pipeswift_slurm.reports.watch import wait
        watched = wait(self.job_id, self.run_dir, lambda line: None, timeout)
        if watched.timed_out:
            raise TimeoutError(f"job {self.job_id} still {watched.state} after {timeout} s")
        return self.state if watched.state == "GONE" else watched.state

    def cancel(self, signal: str | None = None) -> None:
        """scancel it (recorded in the run directory); with ``signal``, only send that."""
        from pipeswift_slurm.reports.watch import cancel
        cancel(self._ref(), signal)

    def logs(self, lines: int | None = None) -> str:
        """The job's log (every attempt), or its last ``lines`` lines."""
        from pipeswift_slurm.reports.logs import log_path, show
        out: list[str] = []
        show(log_path(self.run_dir, self.job_id), out.append, lines=lines)
        return "".join(out)


#: the earlier name of :class:`Job`
Submission = Job


def _planned(cfg: TrainConfig, db: Path | str | None, live: bool, warn: Warn, learn: bool) -> Any:
    """The JCT planner's result, unless the TOML fixes the split method (uniform/parameters)."""
    if cfg.pipeline.partition in ("uniform", "parameters"):
        return None
    from pipeswift_slurm.autoplan import make_plan
    return make_plan(cfg, db, live, warn, learn=learn)[0]


def prepare(toml: Path | str | dict[str, Any], run_dir: Path | str | None = None, db: Path | str | None = None,
            live: bool = True, warn: Warn = _logged, sbatch_args: Sequence[str] = (),
            learn: bool = True, overrides: dict[str, dict[str, Any]] | None = None) -> Prepared:
    """Load and check TOML (a path, or the TOML's tables as a dict, its relative paths from the
    current directory), plan it (live cluster state unless ``live`` is False) and render the
    batch script for ``run_dir`` (default ./pswift-runs/NAME-DATE-XXXX). Writes nothing but,
    with ``learn``, the history of the runs that ended since (False: a dry run writes nothing).
    ``sbatch_args`` that contradict the plan (-N, --ntasks, -p, -t, ...) are refused first;
    ``overrides`` ({section: {key: value}}) replace the TOML's values, through the same checks."""
    conflict = planned_option(sbatch_args)
    if conflict:
        raise UsageError(conflict)
    if live:
        slurm.prefetch()   # the cluster query runs while the config loads and the planner imports
    cfg = config_from_dict(toml, ".", overrides) if isinstance(toml, dict) else load_config(toml, overrides)
    target = (Path(run_dir) if run_dir else rundir.default_run_dir(cfg.job.name)).resolve()
    rule_layouts(cfg)  # the TOML's own invariants first: a bad TOML fails before any planning
    from pipeswift_slurm.preflight import Check   # the job's interpreter can run the job: asked while this plans
    check = Check(cfg.job.python or sys.executable)
    planned = _planned(cfg, db, live, warn, learn)
    order = planned.partition_order() if planned is not None else ()
    if order:   # several partitions: the soonest-finishing one planned for, all in that order
        cfg = cfg._replace(job=cfg.job._replace(partition=order[0], partitions=order))
    plan = build_plan(cfg, target, planned=planned)
    why = check.problem() if check.python == plan["python"] else Check(plan["python"]).problem()
    if why:
        raise ConfigError(why)
    plan["submitted_at"] = time.time()
    opts = options_for(cfg, str(target), limits_of(plan), nodes=plan["nodes_request"], members=plan["members"],
                       at_once=members_at_once(plan))
    text = _toml_text(toml) if isinstance(toml, dict) else None
    return Prepared(cfg, target, plan, render(opts, str(target), plan["python"]), tuple(sbatch_args),
                    overrides or {}, text)


def _toml_text(doc: dict[str, Any]) -> str:
    import tomli_w
    return "# given to pipeswift_slurm.submit as a dict\n" + tomli_w.dumps(doc)


def _toml_copy(p: Prepared) -> bytes:
    """The run directory's train.toml: the TOML as given, and what the command line overrode."""
    text = p.toml_text.encode() if p.toml_text is not None else Path(p.config.path).read_bytes()
    if p.overrides:   # the copy says what the plan was made with
        text += f"\n# pswift sbatch's command line overrode: {describe_overrides(p.overrides)}\n".encode()
    return text


def dry_run_script(p: Prepared) -> str:
    """`pswift sbatch --dry-run`'s script: ``sbatch job.sh`` (any options on its command line)
    runs it. It carries its run directory (plan.json, train.toml) and makes it at the job's
    first start, records the job there and in the registry (status, logs and the history know
    it), and appends its output to the run directory's log; options after `--` are #SBATCH
    lines of it."""
    opts = options_for(p.config, str(p.run_dir), limits_of(p.plan), nodes=p.plan["nodes_request"],
                       members=p.plan["members"], at_once=members_at_once(p.plan))
    opts = opts._replace(output=None, extra=opts.extra + p.sbatch_args)
    return render(opts, str(p.run_dir), p.plan["python"],
                  carried={runfiles.TOML: _toml_copy(p), runfiles.PLAN: plan_bytes(p.plan)})


def write_run_dir(p: Prepared) -> Path:
    """The run directory with train.toml, plan.json and job.sbatch, created whole or not at all."""
    tmp = rundir.stage_run_dir(p.run_dir)
    try:
        (tmp / runfiles.TOML).write_bytes(_toml_copy(p))
        write_plan(p.plan, tmp / runfiles.PLAN)
        (tmp / runfiles.SBATCH).write_text(p.script, encoding="utf-8")
    except OSError as e:
        rundir.discard(tmp)
        raise RunDirError(f"cannot write run directory {p.run_dir}: {e.strerror}") from None
    rundir.commit_run_dir(tmp, p.run_dir)
    return p.run_dir


def requeue_limit_warning(max_requeues: int) -> str | None:
    """Why ``max_requeues`` cannot be reached on this Slurm (MaxBatchRequeue), or None."""
    try:
        limit = slurm.automatic_requeue_limit()
    except PswiftError:
        return None   # the submission itself will say what is wrong with Slurm
    if limit is not None and max_requeues >= limit:
        return (f"warning: [job] max_requeues = {max_requeues}, but this Slurm holds a job after "
                f"{limit - 1} automatic requeues (MaxBatchRequeue = {limit}; it requeues preempted "
                f"jobs itself): set max_requeues <= {limit - 1} or raise MaxBatchRequeue in slurm.conf")
    return None


def grace_warning(partition: str | None, step_s: float | None, checkpoint_s: float | None) -> str | None:
    """Why a preemption on ``partition`` would lose work: its GraceTime is shorter than the steps
    to the stop (codes.to_stop_s) plus the checkpoint the SIGTERM asks for (None: it fits, or
    nothing to say)."""
    if step_s is None or checkpoint_s is None:
        return None
    try:
        parts = slurm.partitions_preemption()
    except PswiftError:
        return None   # the submission itself will say what is wrong with Slurm
    p = next((x for x in parts if x.partition == partition or (partition is None and x.default)), None)
    to_stop = to_stop_s(step_s)
    need = to_stop + checkpoint_s
    if p is None or p.mode.startswith("OFF") or p.grace_s >= need:
        return None
    return (f"warning: partition {p.partition} preempts ({p.mode}) with GraceTime = {p.grace_s} s, but the "
            f"steps to the stop (~{to_stop:.3g} s) and its checkpoint (~{checkpoint_s:.3g} s) need ~{need:.3g} s: "
            f"a preemption loses the work since the last periodic checkpoint; ask for GraceTime >= "
            f"{math.ceil(need * 1.5)} s, or use a partition that is not preempted")


def submit(prepared: Prepared, warn: Warn = _logged) -> Submission:
    """Write the run directory and sbatch it; on refusal nothing is left behind."""
    pred, auto = prepared.plan.get("prediction") or {}, prepared.plan.get("checkpoint_auto") or {}
    for why in (requeue_limit_warning(prepared.config.job.max_requeues),
                grace_warning(prepared.plan.get("partition"), pred.get("step_s"),
                              pred.get("checkpoint_cost_s", auto.get("cost_s")))):
        if why:
            warn(why)
    target = write_run_dir(prepared)
    try:
        job_id = slurm.submit(str(target / runfiles.SBATCH), prepared.sbatch_args, cwd=str(target))
    except PswiftError:
        rundir.discard(target)  # nothing submitted: leave nothing behind
        raise
    (target / runfiles.JOB_ID).write_text(job_id + "\n")
    rundir.register_job(job_id, target)
    return Submission(job_id, prepared.run_dir, prepared)


def sbatch(toml: Path | str, sbatch_args: Sequence[str] = (), run_dir: Path | str | None = None,
           db: Path | str | None = None, warn: Warn = _logged) -> Submission:
    """``pswift sbatch`` as one call: prepare, write the run directory, submit."""
    return submit(prepare(toml, run_dir, db, warn=warn, sbatch_args=sbatch_args), warn)


class PlanReport(NamedTuple):
    """What `pswift plan` says of a TOML, as a library result: the planner's ranking (every
    candidate, each rejection with its reason), the chosen layout's time limits, and how far
    the model's past predictions were from what ran."""
    config: TrainConfig
    result: Any                               # planning.planner.PlanResult; None: no costs to plan with
    limits: Any                               # plan.Limits of the chosen layout, or None
    model_errors: list[dict[str, Any]]        # the history's predicted against actual, newest first
    #: without costs, the plan `pswift sbatch` runs (one stage per task slot, cut in the job)
    unplanned: Plan | None = None

    def model_error_lines(self) -> list[str]:
        """The median relative error of the step time and the JCT, and the p10-p90 band's
        coverage, over the planned jobs that ran (none without any)."""
        from pipeswift_slurm.planning.risk import band_coverage
        from pipeswift_slurm.stats import median
        errors = self.model_errors
        se = [abs(e["predicted_step_s"] - e["actual_step_s"]) / e["actual_step_s"] for e in errors if e["actual_step_s"]]
        je = [abs(e["predicted_jct_s"] - e["actual_jct_s"]) / e["actual_jct_s"] for e in errors
              if e["actual_jct_s"] and e["predicted_jct_s"]]
        if not se:
            return []
        lines = [f"model error over the last {len(errors)} planned job(s): step time {median(se):.0%}"
                 + (f", JCT {median(je):.0%}" if je else "") + " (median |predicted - actual| / actual)"]
        inside, counted = band_coverage([(e["predicted_jct_p10_s"], e["predicted_jct_p90_s"], e["actual_jct_s"])
                                         for e in errors])
        if counted:
            lines.append(f"JCT band coverage: {inside} of {counted} actual JCT(s) inside the predicted "
                         f"p10-p90 band ({inside / counted:.0%}; 80% is calibrated)")
        return lines

    def to_dict(self) -> dict[str, Any]:
        """`pswift plan --json`: the planner's result, the model's errors and the time limits."""
        out: dict[str, Any] = {**self.result.to_dict(), "model_error": self.model_errors}
        if self.limits is not None:
            out["time_limits"] = self.limits._asdict()
        return out


def plan_report(toml: Path | str, db: Path | str | None = None, live: bool = True,
                warn: Warn = _logged, test_only: bool = False,
                overrides: dict[str, dict[str, Any]] | None = None) -> PlanReport:
    """Plan TOML without submitting (nothing written): estimate every candidate layout, choose,
    and say why; warns when the chosen partition's GraceTime is too short for a checkpoint.
    ``overrides``: the command line's keys, as for :func:`prepare`."""
    from pipeswift_slurm.autoplan import make_plan
    from pipeswift_slurm.planning.build import time_limits
    cfg = load_config(toml, overrides)
    rule_layouts(cfg)
    if overrides:
        warn(f"# from the command line: {describe_overrides(overrides)}")
    res, errors = make_plan(cfg, db, live, warn, test_only, learn=False)
    if res is None:   # no costs: what `pswift sbatch` runs (it profiles the model in the job)
        plan = build_plan(cfg, Path(".").resolve(), planned=None)
        return PlanReport(cfg, None, limits_of(plan), errors, plan)
    if res.chosen is not None and live:
        why = grace_warning((res.partition_order() or (cfg.job.partition,))[0], res.chosen.est.step_s,
                            res.checkpoint_cost_s)
        if why:
            warn(why)
    return PlanReport(cfg, res, time_limits(cfg, res) if res.chosen is not None else None, errors)
