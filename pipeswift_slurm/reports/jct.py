"""Admin reports over the history: JCT breakdown per job, attempts, preemption waste, aggregates.

Per job (one row per Slurm job id, all its attempts together):
  queue      = first start - submit, plus every requeue's wait until the next start
  setup      = pswift attempts' setup (imports, process group, model build, checkpoint load)
  training   = pswift attempts' step time
  checkpoint = pswift attempts' checkpoint writes + the rest of each attempt (cleanup, exit)
  JCT        = last end - submit
Plain (non-pswift) jobs have queue and run time only. Steps lost per preemption = last step
reached - step resumed from; CPU-hours wasted = (lost steps x median step time + the next
attempt's setup) x the stopped attempt's CPUs (Slurm's record of it) / 3600; a plain job's =
each stopped attempt's elapsed time x its CPUs / 3600.
"""

from __future__ import annotations

# Imports inside functions: the schedule simulator, only for a diagnosis that simulates

import statistics
from dataclasses import dataclass, field
from sqlite3 import Row
from typing import TYPE_CHECKING, Any, Callable, Iterator

from pipeswift_slurm.durations import duration
from pipeswift_slurm.figures import pyplot, save
from pipeswift_slurm.history.store import History
from pipeswift_slurm.history.queries import ROLLUP_KEYS
from pipeswift_slurm.history.selection import Selection
from pipeswift_slurm.history.queries import LISTING_SQL
from pipeswift_slurm.reports.tabular import Col, Renderer
from pipeswift_slurm.stats import median, median_of, quantile, quantiles

if TYPE_CHECKING:
    from pipeswift_slurm.plan import Plan


@dataclass
class JobReport:
    job_id: str
    name: str | None
    user: str | None
    partition: str | None
    state: str | None
    pswift: bool
    nodes: int | None
    slots: int | None
    attempts: int
    submit: float | None
    end: float | None
    queue_s: float
    setup_s: float
    training_s: float
    checkpoint_s: float
    jct_s: float | None
    preemptions: int
    steps_lost: int
    #: None: not on record (a plain job's attempt without its end or size)
    cpu_hours_wasted: float | None
    step_mean_s: float | None = None
    step_var: float | None = None
    predicted_jct_s: float | None = None
    config: str | None = None
    run_dir: str | None = None
    account: str | None = None
    qos: str | None = None
    attempt_rows: list[dict[str, Any]] = field(default_factory=list)
    #: a pswift job's whole-attempt waste as Slurm's records count it (the roll-up's, which the
    #: SQL report sums for every job): replaced there by the checkpointed figure above
    rollup_wasted_h: float = 0.0


def job_reports(h: History, sel: Selection = Selection()) -> list[JobReport]:
    """Full reports (every attempt) of the selected jobs; for one job or the pswift ones (the
    listings of many jobs stream :func:`write_listing` instead)."""
    groups: dict[tuple[str, str], list[Row]] = {}
    for r in h.slurm_attempts(sel):
        groups.setdefault((r["cluster"], r["job_id"]), []).append(r)
    # pswift jobs known only from their run directories (no plugin record yet) are included
    runs = h.pswift_runs()
    out = []
    seen_runs = set()
    for (cluster, jid), rows in groups.items():
        run = run_of(runs, rows[-1]["work_dir"], jid)
        if run is not None:
            seen_runs.add(run["id"])
        rep = _report(h, jid, rows, run, cluster)
        if sel.pswift_only and not rep.pswift:
            continue
        if sel.states and (rep.state or "").upper() not in sel.states:
            continue
        out.append(rep)
    recorded = {jid for _, jid in groups}
    for run in runs.values():
        # a run whose JOB_ID (its owner's word) names a job Slurm recorded elsewhere is not that job
        if run["id"] not in seen_runs and run["job_id"] not in recorded and _run_selected(run, sel) \
                and (not sel.clusters or run["cluster"] in sel.clusters):
            rep = _report(h, run["job_id"] or f"local:{run['id']}", [], run)
            if not sel.states or (rep.state or "").upper() in sel.states:
                out.append(rep)
    return out


def run_of(runs: dict[tuple[str, str | None], Row], work: str | None, job_id: str) -> Row | None:
    """The pswift run a Slurm record names: its work directory and job id (several jobs may
    have run at one path), else a run at that path whose job id was never known."""
    if work is None:
        return None
    return runs.get((work, job_id)) or runs.get((work, None))


def _run_selected(run: Row, sel: Selection) -> bool:
    """A pswift run with no Slurm record: selected by its job id when the selection names jobs,
    else by its partition when it names no user, account, QOS or window."""
    if sel.job_ids:   # a local run (no Slurm job id) by the id the listing gives it
        return run["job_id"] in sel.job_ids or f"local:{run['id']}" in sel.job_ids
    if sel.narrows:
        return False
    return not sel.partitions or run["partition"] in sel.partitions


def _queue_s(rows: list[Row], submit: float | None) -> float:
    """Time in the queue: before the first attempt and between attempts."""
    if not rows or submit is None:
        return 0.0
    queue: float = max(0.0, rows[0]["start"] - submit)
    for prev, nxt in zip(rows, rows[1:]):
        if prev["end"] is not None:
            queue += max(0.0, nxt["start"] - prev["end"])
    return queue


def _report(h: History, jid: str, rows: list[Row], run: Row | None, cluster: str = "") -> JobReport:
    """One job's report from Slurm's records of its attempts and, for pswift jobs, its run."""
    ends = [r["end"] for r in rows if r["end"] is not None]
    submit = rows[0]["submit"] if rows else (run["submit_time"] if run else None)
    last = rows[-1] if rows else None
    src = last if last is not None else run      # who names the job: Slurm's record, else the run
    if src is None:
        raise ValueError(f"job {jid}: neither a Slurm record nor a pswift run")
    rep = JobReport(job_id=jid, name=src["name"], user=src["user"], partition=src["partition"],
                    state=src["state"], pswift=run is not None,
                    nodes=last["node_count"] if last else None, slots=last["procs"] if last else None,
                    attempts=len(rows), submit=submit, end=max(ends) if ends else None,
                    queue_s=_queue_s(rows, submit), setup_s=0.0, training_s=0.0, checkpoint_s=0.0,
                    jct_s=None, preemptions=0, steps_lost=0, cpu_hours_wasted=0.0,
                    account=last["account"] if last else None, qos=last["qos"] if last else None)
    run_time = sum(r["end"] - r["start"] for r in rows if r["end"] is not None)
    rep.training_s = run_time
    if run is not None:
        _add_pswift_attempts(h, rep, rows, run, run_time, submit)
        rolled = h.rollup_of(cluster, jid) if rows else None
        rep.rollup_wasted_h = (rolled["wasted_s"] or 0.0) / 3600 if rolled is not None else 0.0
    else:
        _add_plain_waste(h, rep, cluster)
    if rep.end is None and run is not None and rep.attempt_rows:
        rep.end = rep.attempt_rows[-1]["end_time"]
    if rep.end is not None and submit is not None:
        rep.jct_s = rep.end - submit
    return rep


def _add_plain_waste(h: History, rep: JobReport, cluster: str) -> None:
    """A job without pswift checkpoints loses each preempted attempt whole (the roll-up's
    rule: elapsed x CPUs, else nodes); None when the records cannot say."""
    row = h.rollup_of(cluster, rep.job_id)
    if row is None:
        return
    rep.preemptions = row["preempted"] or 0
    rep.cpu_hours_wasted = None if row["wasted_s"] is None else row["wasted_s"] / 3600


def _add_pswift_attempts(h: History, rep: JobReport, rows: list[Row], run: Row, run_time: float,
                         submit: float | None) -> None:
    """What the pswift tables add to a job's report: its attempts' setup, training and
    checkpoint split, step-time statistics, preemptions and the work they cost."""
    attempts = h.job_attempts(run["id"])
    rep.attempt_rows = attempts
    rep.attempts = max(rep.attempts, len(attempts))
    rep.setup_s = sum(a["setup_s"] or 0.0 for a in attempts)
    rep.training_s = sum(a["train_s"] or 0.0 for a in attempts)
    rep.checkpoint_s = max(0.0, run_time - rep.setup_s - rep.training_s) if rows else \
        sum(a["checkpoint_s"] or 0.0 for a in attempts)
    steps = [a["step_p50"] for a in attempts if a["step_p50"]]
    med = median_of(steps) if steps else 0.0
    means = [(a["step_mean"], a["step_var"]) for a in attempts if a["step_mean"] is not None]
    if means:
        rep.step_mean_s = statistics.fmean(m for m, _ in means)
        rep.step_var = statistics.fmean(v for _, v in means)
    # each attempt's CPUs as Slurm allocated them (its own record of that attempt), so that the
    # waste is CPU-hours like a plain job's; unknown without Slurm's records of every attempt
    cpus = [r["procs"] for r in rows] if len(rows) == len(attempts) else [None] * len(attempts)
    for (a, b), n_cpus in zip(zip(attempts, attempts[1:]), cpus):
        if a["ended"] in ("preempted", "time_limit", "killed", "running"):
            rep.preemptions += a["ended"] != "time_limit"
            lost = max(0, (a["end_step"] or 0) - (b["start_step"] or 0))
            rep.steps_lost += lost
            if rep.cpu_hours_wasted is not None:
                rep.cpu_hours_wasted = (None if n_cpus is None else
                                        rep.cpu_hours_wasted + (lost * med + (b["setup_s"] or 0.0)) * n_cpus / 3600)
    if not rows:
        rep.state = attempts[-1]["ended"] if attempts else run["state"]
        if attempts and attempts[0]["start_time"] and submit:
            rep.queue_s = max(0.0, attempts[0]["start_time"] - submit)
    rep.predicted_jct_s = run["predicted_jct_s"]
    rep.run_dir = run["run_dir"]
    rep.config = attempts[-1]["config_key"] if attempts else None


GROUPS: dict[str, Callable[[JobReport], Any]] = {"partition": lambda r: r.partition, "user": lambda r: r.user, "nodes": lambda r: r.nodes,
          "account": lambda r: r.account, "qos": lambda r: r.qos,
          "config": lambda r: r.config or ("(no attempt)" if r.pswift else "(not pswift)")}


def aggregate(reps: list[JobReport], by: str) -> list[dict[str, Any]]:
    key = GROUPS[by]
    groups: dict[Any, list[JobReport]] = {}
    for r in reps:
        groups.setdefault(key(r), []).append(r)
    out = []
    for k, rs in sorted(groups.items(), key=lambda kv: str(kv[0])):
        waits = [r.queue_s for r in rs]
        jcts = [r.jct_s for r in rs if r.jct_s is not None]
        pred = [(r.predicted_jct_s, r.jct_s) for r in rs if r.predicted_jct_s and r.jct_s]
        out.append({
            by: k, "jobs": len(rs), "attempts": sum(r.attempts for r in rs),
            "wait_p50_s": quantile(waits, 0.5), "wait_p95_s": quantile(waits, 0.95),
            "jct_p50_s": quantile(jcts, 0.5), "jct_p95_s": quantile(jcts, 0.95),
            "preemption_rate": sum(r.preemptions for r in rs) / max(1, sum(r.attempts for r in rs)),
            "steps_lost": sum(r.steps_lost for r in rs),
            "wasted_hours": sum(r.cpu_hours_wasted or 0.0 for r in rs),  # what is on record
            "step_time_var": median(r.step_var for r in rs),
            "queue_s": sum(waits), "setup_s": sum(r.setup_s for r in rs),
            "training_s": sum(r.training_s for r in rs), "checkpoint_s": sum(r.checkpoint_s for r in rs),
            "predicted_vs_actual_jct": median(p / a for p, a in pred),
        })
    return out


#: the job listing's columns (`history jobs`, `export`, `show --json`), in sacct's spirit
LISTING = [
    Col("job_id", "JobID", "text", 8), Col("name", "JobName", "text", 10), Col("user", "User", "text", 9),
    Col("account", "Account", "text", 9), Col("partition", "Partition", "text", 9),
    Col("qos", "QOS", "text", 7), Col("state", "State", "text", 10), Col("exit_code", "ExitCode", "text", 8),
    Col("derived_exit_code", "DerivedExit", "text", 8), Col("pswift", "pswift", "bool", 6),
    Col("nodes", "NNodes", "int", 6), Col("cpus", "AllocCPUS", "int", 9), Col("gpus", "AllocGPUS", "int", 9),
    Col("alloc_tres", "AllocTRES", "text", 30), Col("attempts", "Attempts", "int", 8),
    Col("submit", "Submit", "time", 19), Col("start", "Start", "time", 19), Col("end", "End", "time", 19),
    Col("nodelist", "NodeList", "text", 12),
    Col("queue_s", "Queue", "s", 10), Col("setup_s", "Setup", "s", 10), Col("training_s", "Training", "s", 10),
    Col("checkpoint_s", "Ckpt/cleanup", "s", 12), Col("jct_s", "JCT", "s", 10),
    Col("elapsed_s", "Elapsed", "s", 10), Col("limit_s", "Timelimit", "s", 10),
    Col("cpu_time_s", "TotalCPU", "s", 10), Col("max_rss_mb", "MaxRSS", "mb", 8),
    Col("req_mem_mb", "ReqMem", "mb", 8), Col("time_eff", "TimeEff", "ratio", 7),
    Col("cpu_eff", "CPUEff", "ratio", 7), Col("mem_eff", "MemEff", "ratio", 7),
    Col("node_hours", "NodeHours", "h", 9), Col("cpu_hours", "CPUHours", "h", 9),
    Col("gpu_hours", "GPUHours", "h", 9), Col("preemptions", "Preempted", "int", 9),
    Col("steps_lost", "StepsLost", "int", 9), Col("wasted_hours", "Wasted", "h", 8),
    Col("step_mean_s", "StepMean", "s", 10), Col("predicted_jct_s", "PredJCT", "s", 10),
]
#: what a terminal shows without -o/--format
LISTING_DEFAULT = "job_id,name,user,account,partition,state,exit_code,nodes,attempts,queue_s,setup_s," \
                  "training_s,checkpoint_s,jct_s,preemptions,wasted_hours"


def listing_row(plain: tuple[Any, ...] | None, rep: JobReport) -> tuple[Any, ...]:
    """A pswift job's listing row: its Slurm figures (``plain``, the SQL row, when Slurm has a
    record of it) with the JCT split, waste and steps from its full report."""
    out = dict(zip(_KEYS, plain)) if plain is not None else dict.fromkeys(_KEYS)
    out.update(job_id=rep.job_id, name=rep.name, user=rep.user, partition=rep.partition,
               state=rep.state, pswift=True, attempts=rep.attempts, submit=rep.submit,
               queue_s=rep.queue_s, setup_s=rep.setup_s, training_s=rep.training_s,
               checkpoint_s=rep.checkpoint_s, jct_s=rep.jct_s, preemptions=rep.preemptions,
               steps_lost=rep.steps_lost, wasted_hours=rep.cpu_hours_wasted,
               step_mean_s=rep.step_mean_s, predicted_jct_s=rep.predicted_jct_s)
    if out["nodes"] is None:
        out["nodes"] = rep.nodes
    return tuple(out[k] for k in _KEYS)


_KEYS = [c.key for c in LISTING]


def _ticking(rows: Any, tick: Any, every: int = 4096) -> Iterator[Any]:
    """``rows``, calling ``tick(n)`` after each ``every`` of them (a progress bar's advance)."""
    n = 0
    for row in rows:
        yield row
        n += 1
        if n == every:
            tick(n)
            n = 0
    tick(n)


def write_listing(h: History, sel: Selection, out: Renderer, limit: int | None = None,
                  tick: Any = None) -> int:
    """Print the listing of the selected jobs through ``out``, in numeric job-id order: plain
    jobs straight from the roll-up table, rendered by SQLite in the query that reads them (a
    million rows at sqlite3's pace); pswift jobs with their JCT split, steps and waste from the
    pswift tables; then pswift runs Slurm has no record of yet."""
    runs = h.pswift_runs()
    render = out.sql([LISTING_SQL[k] for k in _KEYS])
    out.start()
    rows = h.listing_rows(sel, _KEYS, render, limit)
    if tick is not None:
        rows = _ticking(rows, tick)
    if render is None:
        for row in rows:
            out.row(_job_values(h, runs, row[:-2], row[-2], row[-1]))
    else:
        out.lines(rows, {work for work, _ in runs},
                  lambda row: _job_values(h, runs, _values(h, row[-2], row[-1]), row[-2], row[-1]))
    if not limit or out.count < limit:
        for values in _runs_without_records(h, runs, sel, limit and limit - out.count):
            out.row(values)
    return out.finish()


def job_rows(h: History, sel: Selection = Selection(), limit: int | None = None) -> Iterator[tuple[Any, ...]]:
    """The listing of the selected jobs as Python tuples in LISTING's order (write_listing's rows)."""
    runs = h.pswift_runs()
    n = 0
    for row in h.listing_rows(sel, _KEYS, None, limit):
        n += 1
        yield _job_values(h, runs, row[:-2], row[-2], row[-1])
    yield from _runs_without_records(h, runs, sel, limit and limit - n)


def _values(h: History, job_id: str, work_dir: str | None) -> tuple[Any, ...]:
    """One job's listing values, from its roll-up row."""
    return next(v[:-2] for v in h.listing_rows(Selection(job_ids=(job_id,)), _KEYS) if v[-1] == work_dir)


def _job_values(h: History, runs: dict[tuple[str, str | None], Row], plain: tuple[Any, ...], job_id: str,
                work: str | None) -> tuple[Any, ...]:
    """A job's listing values: a pswift run's from its report, over Slurm's figures."""
    run = run_of(runs, work, job_id)
    if run is None:
        return plain
    rows = [r for r in h.slurm_attempts(Selection(job_ids=(job_id,))) if r["work_dir"] == work]
    if not rows:
        return plain
    return listing_row(plain, _report(h, job_id, rows, run, rows[-1]["cluster"]))


def _runs_without_records(h: History, runs: dict[tuple[str, str | None], Row], sel: Selection,
                          limit: int | None) -> Iterator[tuple[Any, ...]]:
    """Selected pswift runs that no Slurm record names (their work directory and job id)."""
    if limit is not None and limit <= 0:
        return
    seen = {(w, j) for (w, j) in h.conn.execute(
        "SELECT work_dir, job_id FROM job_rollup WHERE work_dir IN (SELECT run_dir FROM jobs)")}
    seen_dirs = {w for w, _ in seen}
    n = 0
    for (work, jid), run in runs.items():
        if (work, jid) in seen or (jid is None and work in seen_dirs) or not _run_selected(run, sel):
            continue
        rep = _report(h, run["job_id"] or f"local:{run['id']}", [], run)
        if not sel.states or (rep.state or "").upper() in sel.states:
            yield listing_row(None, rep)
            n += 1
            if limit and n >= limit:
                return


def plot(reps: list[JobReport], groups: list[dict[str, Any]] | None, by: str | None, path: Any,
         waits_s: list[float] | None = None, selection: str = "all jobs") -> None:
    """Stacked JCT breakdown (per job, or per group) and the queue-wait CDF, one PNG; the
    titles name the ``selection``."""
    plt = pyplot()
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(14, 5), gridspec_kw={"width_ratios": [2, 1]})
    parts = (("queue_s", "queue", "#8172B3"), ("setup_s", "setup", "#CCB974"),
             ("training_s", "training", "#4C72B0"), ("checkpoint_s", "checkpoint/cleanup", "#DD8452"))
    if groups is not None and by is not None:
        labels = [str(g[by]) for g in groups]
        vals = {k: [g[k] / 3600 for g in groups] for k, _, _ in parts}
        ax1.set_title(f"JCT breakdown per {by} (sum over jobs; {selection})", loc="left")
    else:
        shown = reps[-40:]
        labels = [f"{r.job_id}\n{(r.name or '')[:10]}" for r in shown]
        vals = {k: [getattr(r, k) / 3600 for r in shown] for k, _, _ in parts}
        ax1.set_title(f"JCT breakdown per job ({selection})", loc="left")
    top = max((sum(vals[k][i] for k, _, _ in parts) for i in range(len(labels))), default=0.0)
    unit, scale = ("seconds", 3600.0) if top < 120 / 3600 else ("minutes", 60.0) if top < 2 else ("hours", 1.0)
    vals = {k: [v * scale for v in vs] for k, vs in vals.items()}
    bottom = [0.0] * len(labels)
    for k, label, color in parts:
        ax1.bar(range(len(labels)), vals[k], bottom=bottom, label=label, color=color)
        bottom = [b + v for b, v in zip(bottom, vals[k])]
    ax1.set_xticks(range(len(labels)))
    ax1.set_xticklabels(labels, fontsize=7, rotation=0 if len(labels) < 12 else 90)
    ax1.set_ylabel(unit)
    ax1.legend(fontsize=8)
    waits = sorted(w / 60 for w in (waits_s if waits_s is not None else [r.queue_s for r in reps]))
    if waits:
        ax2.step(waits, [(i + 1) / len(waits) for i in range(len(waits))], where="post")
    ax2.set_title("queue wait CDF", loc="left")
    ax2.set_xlabel("minutes")
    ax2.set_ylabel("fraction of jobs")
    ax2.grid(alpha=0.3)
    fig.tight_layout()
    save(fig, path)


def diagnose(rep: JobReport, plan: Plan | None = None, log_text: str = "") -> list[str]:
    """The seed's symptom table applied to one job; every finding cites the numbers it used."""
    from pipeswift_slurm.planning.simulate import simulate

    out: list[str] = []
    jct = rep.jct_s or 0.0
    if jct > 0 and rep.queue_s / jct > 0.3:
        out.append(f"queue: {rep.queue_s / jct:.0%} of the JCT ({duration(rep.queue_s)} of {duration(jct)}) was waiting "
                   f"in the queue; allow a node range ([resources] nodes = [min, max]) so it starts on "
                   f"what is free, or list less busy partitions too ([job] partition = [\"a\", \"b\"]: `pswift plan` estimates each and Slurm gets them soonest-finishing first)")
    if rep.preemptions and not rep.pswift:
        waste = ("an unknown amount of work" if rep.cpu_hours_wasted is None
                 else f"{_hours(rep.cpu_hours_wasted)} CPU-hours")
        out.append(f"preemption: preempted {rep.preemptions} time(s) with no checkpoints pswift knows of: "
                   f"each stop lost its whole attempt, {waste}; checkpoint and resume (pswift sbatch "
                   f"does both) or use a non-preemptible partition")
    elif rep.preemptions:
        out.append(f"preemption: preempted {rep.preemptions} time(s), {rep.steps_lost} step(s) lost, "
                   f"{_hours(rep.cpu_hours_wasted)} CPU-hours wasted; "
                   + ("each stop checkpointed at a step boundary, so the waste is restarts: a "
                      "non-preemptible partition removes it" if rep.steps_lost == 0 else
                      "checkpoint more often ([training] checkpoint_interval) or make GraceTime cover "
                      "the checkpoint"))
    for a, b in zip(rep.attempt_rows, rep.attempt_rows[1:]):
        if a["ended"] in ("preempted", "time_limit") and a["end_time"] and b["start_time"]:
            wait = b["start_time"] - a["end_time"]
            fixed = plan is not None and len(plan.get("layouts") or {}) <= 1
            if wait > 600 and fixed:
                out.append(f"requeue: attempt {b['attempt']} waited {duration(wait)} for {a['nodes']} node(s) after "
                           f"attempt {a['attempt']} stopped; the job cannot continue on fewer nodes: allow a "
                           f"node range ([resources] nodes = [1, {a['nodes']}]) so it resumes with fewer stages")
        if b["load_s"] and b["setup_s"] and b["load_s"] > max(30.0, 0.3 * b["setup_s"]):
            out.append(f"restore: attempt {b['attempt']} spent {duration(b['load_s'])} loading its checkpoint "
                       f"({b['load_s'] / b['setup_s']:.0%} of setup); keep checkpoints on a fast filesystem "
                       f"near the nodes and with the stage layout metadata, so each rank reads only its part")
    for a in rep.attempt_rows:
        P, m = a["stages"] or 1, a["micro_batches"] or 1
        bubble = (P - 1) / (m + P - 1)
        if a["step_p50"] and a["step_p95"] and a["step_p95"] > 1.5 * a["step_p50"]:
            out.append(f"variance: attempt {a['attempt']} step time p95 {duration(a['step_p95'])} vs p50 "
                       f"{duration(a['step_p50'])}: stragglers or noisy neighbours; variance hurts JCT more than "
                       f"a higher mean (exclusive nodes, fewer ranks per node)")
        prediction = plan.get("prediction") if plan else None
        if prediction and a["step_p50"]:
            pred = prediction["step_s"]
            if a["step_p50"] > 1.3 * pred and bubble < 0.25:
                out.append(f"slow steps: attempt {a['attempt']} ran {a['step_p50'] / pred:.1f}x the predicted "
                           f"{duration(pred)} per step with a small bubble ({bubble:.0%} at P={P}, m={m}): "
                           f"communication or too many micro-batches; try fewer, larger micro-batches or "
                           f"fewer stages (`pswift simulate` shows the schedule)")
            elif a["step_p50"] > 1.3 * pred:
                sim = simulate([1.0] * P, [2.0] * P, m, "1f1b")
                out.append(f"bubble: attempt {a['attempt']} has a pipeline bubble of {sim.bubble_ratio:.0%} "
                           f"(P={P}, m={m}); raise micro_batches or balance stages by measured time")
    if "out of memory" in log_text.lower() or "outofmemory" in log_text.lower():
        out.append("memory: the job log reports out-of-memory; rebalance stages by time and memory: "
                   "`pswift partition --costs ... --memory ... --memory-cap ...` or more stages")
    if not out:
        out.append(f"no problem found: JCT {duration(jct)} = queue {duration(rep.queue_s)} + setup {duration(rep.setup_s)} + "
                   f"training {duration(rep.training_s)} + checkpoint/cleanup {duration(rep.checkpoint_s)}")
    return out


def aggregate_sql(h: History, by: str, sel: Selection = Selection()) -> list[dict[str, Any]]:
    """:func:`aggregate` computed in SQLite (per-job roll-up, window-function percentiles), for
    millions of jobs; pswift-only figures (setup, checkpoints, steps lost, waste, step-time
    variance, predicted JCT) come from the pswift tables, which are small."""
    if by not in ROLLUP_KEYS:
        raise ValueError(by)
    # one narrow row per job from the roll-up table (plain tuples: a million in about a second);
    # per group: jobs, attempts, preempted, queue sum, run sum, waits, JCTs
    acc: dict[Any, list[Any]] = {}
    for key, attempts, preempted, queue, run, jct, wasted in h.rollups(by, sel):
        g = acc.get(key)
        if g is None:
            g = acc[key] = [0, 0, 0, 0.0, 0.0, [], [], 0.0]
        g[0] += 1
        if wasted is not None:   # what is on record, as the listing's column
            g[7] += wasted / 3600
        g[1] += attempts
        g[2] += preempted or 0
        if queue is not None:
            g[3] += queue
            g[5].append(queue)
        if run is not None:
            g[4] += run
        if jct is not None:
            g[6].append(jct)
    out: dict[Any, dict[str, Any]] = {}
    for k, (jobs, attempts, pre, queue, run, waits, jcts, wasted_h) in acc.items():
        w50, w95 = quantiles(waits, (0.5, 0.95), clean=True)
        j50, j95 = quantiles(jcts, (0.5, 0.95), clean=True)
        out[k] = {by: k, "jobs": jobs, "attempts": attempts, "preemption_rate": pre / max(1, attempts),
                  "queue_s": queue, "setup_s": 0.0, "training_s": run, "checkpoint_s": 0.0, "steps_lost": 0,
                  "wasted_hours": wasted_h, "step_time_var": None, "predicted_vs_actual_jct": None,
                  "wait_p50_s": w50, "wait_p95_s": w95, "jct_p50_s": j50, "jct_p95_s": j95}
    _add_pswift_figures(h, out, by, sel)
    cols = [by, "jobs", "attempts", "wait_p50_s", "wait_p95_s", "jct_p50_s", "jct_p95_s", "preemption_rate",
            "steps_lost", "wasted_hours", "step_time_var", "queue_s", "setup_s", "training_s",
            "checkpoint_s", "predicted_vs_actual_jct"]
    return [{c: g.get(c) for c in cols} for _, g in sorted(out.items(), key=lambda kv: str(kv[0]))]


def _add_pswift_figures(h: History, out: dict[Any, dict[str, Any]], by: str, sel: Selection) -> None:
    """pswift jobs: split their run time into setup / training / checkpoint and add their waste."""
    runs = h.run_dirs()
    if not runs:
        return
    reps = [r for r in job_reports(h, sel._replace(pswift_only=True))
            if r.pswift and r.attempts and r.run_dir in runs and r.submit is not None]
    per: dict[Any, list[JobReport]] = {}
    for r in reps:
        per.setdefault(GROUPS[by](r), []).append(r)
    for k, rs in per.items():
        g = out.get(k)
        if g is None:
            continue
        for r in rs:
            g["training_s"] -= r.setup_s + r.checkpoint_s
            g["setup_s"] += r.setup_s
            g["checkpoint_s"] += r.checkpoint_s
            g["steps_lost"] += r.steps_lost
            g["wasted_hours"] += (r.cpu_hours_wasted or 0.0) - r.rollup_wasted_h   # what is on record
        g["step_time_var"] = median(r.step_var for r in rs)
        pred = [(r.predicted_jct_s, r.jct_s) for r in rs if r.predicted_jct_s and r.jct_s]
        g["predicted_vs_actual_jct"] = median(p / a for p, a in pred)


def wait_quantiles(h: History, sel: Selection, points: int = 200) -> list[float]:
    """The selected jobs' queue waits at ``points`` quantiles, for the CDF plot."""
    xs = h.queue_waits(sel)
    if not xs:
        return []
    step = max(1, len(xs) // points)
    return xs[::step] + [xs[-1]]


def _hours(h: float | None) -> str:
    return "unknown" if h is None else f"{h:.3g}"
