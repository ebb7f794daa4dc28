"""`pswift plan`, `simulate`, `export` and `partition`: the model's layouts, schedules and
trained weights (loaded when one of them is asked for)."""

from __future__ import annotations

# Imports inside functions: each command imports the library it runs when it runs, so `pswift
# --help` and `pswift sbatch` load none of the others

import json
import os
import shutil
import sys
from pathlib import Path
from typing import Any

import click

from pipeswift_slurm import runfiles
from pipeswift_slurm.cli.common import CLIError, _db_option, _errors, _override_options, _warn


@click.command("plan")
@click.argument("toml", type=click.Path(dir_okay=False, path_type=Path))
@_override_options
@click.option("--json", "as_json", is_flag=True, help="{chosen, candidates} as JSON.")
@_db_option
@click.option("--no-live", is_flag=True, help="Do not ask Slurm for the live cluster state.")
@click.option("--test-only", is_flag=True,
              help="Ask `sbatch --test-only` for each node count's start (uses a job id each).")
@_errors
def plan_cmd(toml: Path, partition: str | None, time_limit: str | None, time_policy: str | None,
             nodes: str | None, account: str | None, qos: str | None, job_name: str | None, as_json: bool,
             db: Path | None, no_live: bool, test_only: bool) -> None:
    """Rank every candidate layout of TOML by estimated job completion time, and say why.

    JCT = queue wait (live sinfo/squeue) + setup + steps x step time (cost model on per-layer
    costs from the history or [model] layer_costs, calibrated by measured runs) + checkpoints +
    expected preemption loss. p10-p90: the JCT's band from the step model's measured error,
    step-time variance, past queue waits and the partition's preemption rate; [job] objective
    ranks by the mean (default), p50 or p90. Rejected candidates say why.

    Examples:

        pswift plan examples/tiny-gpt/train.toml

        pswift plan train.toml --json

        pswift plan -p high -t 30 -N 1-2 train.toml
    """
    from rich.console import Console
    from rich.table import Table

    from pipeswift_slurm.planning.limits import describe
    from pipeswift_slurm.planning.planner import explain
    from pipeswift_slurm.submit import plan_report

    from pipeswift_slurm.config import command_line_overrides
    overrides = command_line_overrides(partition=partition, time=time_limit, time_policy=time_policy, nodes=nodes,
                                       account=account, qos=qos, job_name=job_name)
    report = plan_report(toml, db, not no_live, _warn, test_only, overrides)
    if report.result is None:
        _print_unplanned(report, as_json)
        return
    res = report.result
    if as_json:
        click.echo(json.dumps(report.to_dict(), indent=2))
        if res.fits_nowhere():
            raise CLIError("no layout can run (see the candidates' reasons); change the TOML as they say", 2)
        return
    con = Console(highlight=False, markup=False, soft_wrap=True, color_system=None,
                  width=max(140, shutil.get_terminal_size().columns))
    con.print(f"profile: {res.profile_source}" + "".join(f"; {n}" for n in res.notes), markup=False)
    con.print(_candidates_table(Table, res))
    con.print(explain(res), markup=False)
    if report.limits is not None:
        con.print(describe(report.limits), markup=False)
    if res.fits_nowhere():
        raise CLIError("no layout can run (reasons above); change the TOML as they say", 2)
    for line in report.model_error_lines():
        con.print(line)


def _print_unplanned(report: Any, as_json: bool) -> None:
    """`pswift plan` of a TOML with no costs to rank by: the layouts `pswift sbatch` would run."""
    from pipeswift_slurm.planning.limits import describe
    from pipeswift_slurm.submit import layout_line
    plan = report.unplanned
    why = ("no per-layer costs yet ([model] layer_costs, or a profile in the history): `pswift sbatch` "
           "runs one stage per task slot, cut by parameters in the job, and profiles the model; the next "
           "plan ranks layouts by the measured times")
    if as_json:
        click.echo(json.dumps({"chosen": None, "candidates": [], "why": why, "nodes_request": plan["nodes_request"],
                               "layouts": plan["layouts"]}, indent=2))
        return
    click.echo(f"{why}\nlayouts: {layout_line(plan)}\nrequest: --nodes={plan['nodes_request']}\n"
               f"{describe(report.limits)}")


def _candidates_table(table_cls: Any, res: Any) -> Any:
    """The planner's candidates as a rich table, in its order: estimate columns, or the reason
    a candidate was rejected."""
    table = table_cls("nodes", "PxDP", "mbs", "m", "boundaries", "queue", "setup", "step", "train", "ckpt",
                      "interrupt", "JCT", "p10-p90", "node-h", "")

    from pipeswift_slurm.durations import duration as f     # the summary's units, each cell with its own
    for i, c in enumerate(res.candidates):
        e = c.estimate
        if e is None:
            table.add_row(str(c.nodes), f"{c.stages}x{c.data_parallel}", str(c.micro_batch_size),
                          str(c.micro_batches), "", "", "", "", "", "", "", "", "", "", f"rejected: {c.rejected}")
            continue
        table.add_row(str(c.nodes), f"{c.stages}x{c.data_parallel}", str(c.micro_batch_size),
                      str(c.micro_batches), str(c.boundaries), f(e.queue_s), f(e.setup_s), f(e.step_s), f(e.train_s),
                      f(e.checkpoint_s), f(e.interruption_s), f(e.jct_s),
                      f"{f(e.jct_p10_s)}-{f(e.jct_p90_s)}" if e.jct_p10_s is not None and e.jct_p90_s is not None else "",
                      f"{e.node_hours:.3g}", "chosen" if c is res.chosen else f"#{i + 1}")
    return table


def _floats(opt: str, text: str | None) -> list[float] | None:
    if text is None:
        return None
    try:
        return [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise CLIError(f"{opt} {text!r}: give comma-separated seconds, e.g. {opt} 1,1.5,1", 2) from None


def _stage_times_from_toml(toml: Path, nodes: int | None, db: Path | None
                           ) -> tuple[list[float], list[float], list[float], int, str, dict[str, Any]]:
    """The stages' forward, whole backward and weight-gradient seconds of the layout for
    ``nodes`` as the step model simulates them (the history's profile of the model, else
    [model] layer_costs), its micro-batches, a title, and the layout."""
    import tempfile

    from pipeswift_slurm.autoplan import read_profile
    from pipeswift_slurm.config import load_config
    from pipeswift_slurm.planning.build import build_plan
    from pipeswift_slurm.planning.costmodel import model_passes
    from pipeswift_slurm.planning.partition import balanced_boundaries

    cfg = load_config(toml)
    profile = read_profile(cfg, db, _warn)
    if profile is None:
        raise CLIError(f"{toml}: no per-layer costs to simulate: add [model] layer_costs (forward+backward "
                       f"seconds per micro-batch per layer), run the job once (the history keeps what it "
                       f"measured) or pass --fwd/--bwd", 2)
    plan = build_plan(cfg, Path(tempfile.gettempdir()) / "pswift-simulate")
    n = str(nodes or cfg.resources.nodes_min)
    if n not in plan["layouts"]:
        raise CLIError(f"--nodes {n}: {plan['infeasible'].get(n, 'outside [resources] nodes')}", 2)
    lay = plan["layouts"][n]
    bounds = lay["boundaries"] or balanced_boundaries(profile.costs, lay["stages"])
    fwd, bwd, wgrad = model_passes(profile, bounds, lay["micro_batch_size"])
    source = "the history's profile (measured)" if profile.source == "history" else "[model] layer_costs"
    title = f"{cfg.job.name}: {lay['stages']} stages {bounds}; stage times from {source}"
    return fwd, bwd, wgrad, lay["micro_batches"], title, {**lay, "boundaries": bounds}


def _planned_step(toml: Path, db: Path | None, lay: dict[str, Any]) -> str:
    """What `pswift plan` counts as this layout's step: measured (the history) and the step
    model's prediction (which adds the transfers, the step's fixed work and the calibration to
    the simulated passes), or "" where the planner does not weigh it."""
    from pipeswift_slurm.errors import PswiftError
    from pipeswift_slurm.planning.planner import step_line
    from pipeswift_slurm.submit import plan_report

    try:
        report = plan_report(toml, db, live=False)
    except PswiftError:
        return ""
    key = ("nodes", "stages", "data_parallel", "micro_batches", "micro_batch_size", "boundaries")
    same = [c for c in report.result.candidates if c.estimate is not None
            and all(getattr(c, k) == lay[k] for k in key)]
    if not same:
        return ""
    c = same[0]
    return f"pswift plan's step of this layout under {c.schedule}: {step_line(c.est)}"


@click.command()
@click.argument("toml", required=False, type=click.Path(dir_okay=False, path_type=Path))
@click.option("--fwd", help="Forward seconds per micro-batch, one per stage: 1,1.5,1")
@click.option("--bwd", help="Backward seconds per micro-batch, one per stage: 2,3,2")
@click.option("--wgrad", help="Weight-gradient seconds per micro-batch, one per stage; then --bwd is the "
              "input gradient alone (other schedules run both as one backward). Default: zb-h1 "
              "and zb-h2 take half of --bwd (with TOML: the model's weight-gradient shares).")
@click.option("-m", "--micro-batches", type=int, help="Micro-batches per step (default: the plan's).")
@click.option("--schedule", default="1f1b", show_default=True,
              help="Comma list of gpipe, 1f1b, interleaved, zb-h1, zb-h2 (zb-h2: 2p-1 micro-batches "
              "in flight and steps back to back, the paper's optimizer post-validation).")
@click.option("--chunks", type=int, default=2, show_default=True, help="Model chunks per device (interleaved).")
@click.option("--p2p", type=float, default=0.0, show_default=True, help="Point-to-point transfer seconds.")
@click.option("--nodes", type=int, help="With TOML: the node count whose layout to simulate.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.option("--plot", type=click.Path(path_type=Path), help="Write a timeline PNG.")
@click.option("--width", type=click.IntRange(20, 1000), default=96, show_default=True,
              help="Terminal timeline width (20-1000 characters).")
@_db_option
@_errors
def simulate(toml: Path | None, fwd: str | None, bwd: str | None, wgrad: str | None,
             micro_batches: int | None, schedule: str, chunks: int, p2p: float, nodes: int | None,
             as_json: bool, plot: Path | None, width: int, db: Path | None) -> None:
    """Simulate pipeline schedules on stage times; print step time, bubble and a timeline.

    Stage times come from --fwd/--bwd, or from TOML: the plan's layout, each stage's passes as
    pswift's step model simulates them (the layers' and the engine's times and the weight-gradient
    shares a run of the model measured, kept by the history; else [model] layer_costs). One look
    at the timeline shows the bottleneck stage. With TOML, the step `pswift plan` counts for that
    layout is printed too: the one measured beside the model's, which adds the transfers and the
    optimizer.

    Examples:

        pswift simulate --fwd 1,1.5,1 --bwd 2,3,2 -m 8 --schedule gpipe,1f1b,zb-h1

        pswift simulate --fwd 1,1,1,1 --bwd 1,1,1,1 --wgrad 1,1,1,1 -m 8 --schedule 1f1b,zb-h1,zb-h2

        pswift simulate examples/tiny-gpt/train.toml --schedule gpipe,1f1b,interleaved --plot t.png
    """
    from pipeswift_slurm.planning import timeline
    from pipeswift_slurm.planning.simulate import ZERO_BUBBLE, SimulationError
    from pipeswift_slurm.planning.simulate import simulate as run_sim

    w: list[float] | None
    if toml is not None:
        if fwd or bwd or wgrad:
            raise CLIError("give either a TOML or --fwd/--bwd/--wgrad, not both", 2)
        f, b, w, m_plan, title, lay = _stage_times_from_toml(toml, nodes, db)
        if not as_json:
            title = "\n".join(x for x in (title, _planned_step(toml, db, lay)) if x)
        micro_batches = micro_batches or m_plan
    else:
        f, b, w = _given_stage_times(fwd, bwd, wgrad)
        title = ""
        if micro_batches is None:
            raise CLIError("--micro-batches is required with --fwd/--bwd", 2)
    names = [x.strip() for x in schedule.split(",") if x.strip()]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise CLIError(f"--schedule names {', '.join(twice)} more than once: give each schedule once", 2)
    try:
        results = [run_sim(f, b, micro_batches, n, p2p=p2p, chunks=chunks, wgrad=w if n in ZERO_BUBBLE else None)
                   for n in names]
    except SimulationError as e:
        raise CLIError(str(e), 2) from None
    if plot is not None:
        timeline.plot(results, plot, title)
    if as_json:
        out = [r.to_dict() for r in results]
        click.echo(json.dumps(out[0] if len(out) == 1 else out, indent=2))
        return
    _print_simulations(results, title, width, plot)


def _given_stage_times(fwd: str | None, bwd: str | None, wgrad: str | None
                       ) -> tuple[list[float], list[float], list[float] | None]:
    """--fwd, --bwd (with --wgrad: the input gradient alone, made the whole backward here, which
    zero-bubble splits again) and --wgrad."""
    f, b, w = _floats("--fwd", fwd), _floats("--bwd", bwd), _floats("--wgrad", wgrad)
    if f is None or b is None:
        raise CLIError("give a train.toml, or --fwd and --bwd (one value per stage)", 2)
    if w is not None:
        if len(w) != len(b):
            raise CLIError(f"--wgrad has {len(w)} value(s) for {len(b)} stage(s): give one per stage", 2)
        b = [x + y for x, y in zip(b, w)]
    return f, b, w


def _print_simulations(results: list[Any], title: str, width: int, plot: Path | None) -> None:
    """`pswift simulate`'s table of schedules, then each one's timeline."""
    from rich.console import Console
    from rich.table import Table

    from pipeswift_slurm.planning import timeline

    con = Console(highlight=False, markup=False, soft_wrap=True, color_system=None)
    if title:
        con.print(title)
    table = Table("schedule", "step time", "bubble", "peak in-flight", "slowest stage (busy)")
    for r in results:
        slow = max(range(r.devices), key=lambda d: r.busy[d])
        table.add_row(r.schedule + (f" v={r.chunks}" if r.chunks > 1 else ""), f"{r.step_time:.4g}",
                      f"{r.bubble_ratio:.1%}", str(max(r.peak_in_flight)),
                      f"stage {slow} ({r.busy[slow]:.4g})")
    con.print(table)
    for r in results:
        con.print(f"\n{r.schedule}" + (f" (v={r.chunks})" if r.chunks > 1 else ""))
        for line in timeline.text_timeline(r, width):
            con.print(line, markup=False)
    if plot is not None:
        con.print(f"\ntimeline written to {plot}")


@click.command()
@click.argument("run_dir", type=click.Path(path_type=Path))
@click.option("-o", "--output", "out", type=click.Path(path_type=Path), required=True,
              help="The safetensors file to write (a link there is replaced, never written through).")
@click.option("--step", type=click.IntRange(0, None), help="The committed checkpoint of this step (default: the newest).")
@click.option("--hf", is_flag=True, help="A Hugging Face folder instead (-o DIR; GPT2LMHeadModel.from_pretrained "
              "loads it): a run of the gpt2 example (pipeswift_launch.gpt2's layers).")
@_errors
def export(run_dir: Path, out: Path, step: int | None, hf: bool) -> None:
    """The trained model of RUN_DIR as one state dict (safetensors), in the order of the model's
    build_layers and loadable without pipelining: torch.nn.Sequential of those layers, or
    pipeswift_slurm.api.load_model(RUN_DIR). Runs with the job's Python (torch, deepspeed).

    Example:

        pswift export pswift-runs/tiny-gpt-20261205-1200-ab12 -o model.safetensors

        pswift export pswift-runs/gpt2-20261205-1300-cd34 --hf -o gpt2-trained
    """
    import subprocess
    from pipeswift_slurm.errors import PswiftError
    try:
        python = json.loads((run_dir / runfiles.PLAN).read_text())["python"]
    except (OSError, ValueError, KeyError, TypeError):
        raise CLIError(f"{run_dir} is not a run directory (no readable plan.json); give the folder "
                       f"`pswift sbatch` printed", 2) from None
    cmd = [python if Path(python).exists() else sys.executable, "-m", "pipeswift_launch.export",
           os.path.abspath(run_dir), "-o", os.path.abspath(out)] + (["--step", str(step)] if step is not None else []) \
        + (["--hf"] if hf else [])
    # abspath, not resolve: a link at -o is replaced by the export, never followed
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=3600)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise PswiftError(f"export did not run ({e})") from None
    if proc.returncode != 0:
        lines = [x for x in proc.stderr.splitlines() if x.startswith("Error: ")] or proc.stderr.strip().splitlines()[-1:]
        raise CLIError((lines[-1] if lines else "export failed").removeprefix("Error: "), 1)
    click.echo(proc.stdout.strip().splitlines()[-1])   # its line, not the libraries' start-up notes


@click.command()
@click.option("--costs", required=True, help="Seconds per layer (forward+backward): 1,2,2,2,1")
@click.option("--stages", type=click.IntRange(1, None), help="Number of pipeline stages (required).")
@click.option("--memory", help="Bytes per layer, for --memory-cap: 4e8,1e8,...")
@click.option("--memory-cap", type=float, help="Most memory one stage may hold (bytes).")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@_errors
def partition(costs: str, stages: int | None, memory: str | None,
              memory_cap: float | None, as_json: bool) -> None:
    """Cut layers into contiguous stages that minimise the slowest stage (exact).

    For people who cut by hand: the result goes into [pipeline] partition = [0, ...].

    Examples:

        pswift partition --costs 5,1,1,1,1,1,1,1,1,6 --stages 4

        pswift partition --costs 1,1,1,1 --memory 3,1,1,3 --memory-cap 4 --stages 2 --json
    """
    from pipeswift_slurm.planning.partition import PartitionError, balanced_boundaries, stage_sums

    if stages is None:
        raise CLIError("give --stages N: the number of pipeline stages", 2)
    c = _floats("--costs", costs) or []
    mem = _floats("--memory", memory)
    if memory_cap is not None and mem is None:
        raise CLIError("--memory-cap needs --memory (bytes per layer)", 2)
    try:
        b = balanced_boundaries(c, stages, mem, memory_cap)
    except PartitionError as e:
        raise CLIError(str(e), 2) from None
    sums = stage_sums(c, b)
    out: dict[str, Any] = {"boundaries": b, "stage_costs": sums, "bottleneck": max(sums),
           "balance": (sum(sums) / len(sums)) / max(sums) if max(sums) > 0 else 1.0}
    if mem is not None:
        out["stage_memory"] = stage_sums(mem, b)
    if as_json:
        click.echo(json.dumps(out, indent=2))
        return
    click.echo(f"boundaries {b}  (TOML: partition = {b})")
    for s_, (a, z) in enumerate(zip(b, b[1:])):
        extra = f", memory {out['stage_memory'][s_]:g}" if mem is not None else ""
        click.echo(f"  stage {s_}: layers {a}-{z - 1}, cost {sums[s_]:g}{extra}")
    click.echo(f"bottleneck {max(sums):g}; balance {out['balance']:.1%} (mean stage / slowest)")
