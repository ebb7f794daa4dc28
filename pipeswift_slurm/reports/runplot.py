"""`pswift plot`: one run as a picture. Loss and step time against the step, over every attempt
of the job (one continuous step axis across requeues, re-layouts and restarts), each attempt's
start (with its node and stage count) and end (with its cause) marked. Read from the run's
events as every command that anyone may run reads them (bounded, no link followed)."""

from __future__ import annotations

# Imports inside functions: the package's figures, only for a picture

import math
from pathlib import Path
from typing import Any

from pipeswift_slurm import figures, runfiles
from pipeswift_slurm.errors import PswiftError
from pipeswift_slurm.history import eventfold
from pipeswift_slurm.terminal import inert


def attempts_of(run: Path) -> list[dict[str, Any]]:
    """The run's attempts (:func:`eventfold.by_attempt`), its events.jsonl read in chunks."""
    from pipeswift_slurm import userfiles
    fold = eventfold.Fold()
    try:
        userfiles.read_for_command(str(run), (runfiles.EVENTS,), events_sink=fold.feed)
    except userfiles.UnsafeFile as e:
        raise PswiftError(f"run directory not read: {e}") from None
    fold.close()
    return fold.attempts()


def _start_label(a: dict[str, Any]) -> str:
    start = a["start"] or {}
    layout = (f"{start.get('nodes')} node(s) x {start.get('stages')} stage(s)"
              if start.get("nodes") is not None else "")
    return f"attempt {a['attempt']} {layout}".strip()


def draw(attempts: list[dict[str, Any]], title: str, out: Path) -> list[str]:
    """Write the picture of ``attempts`` to ``out``; what it marks, an attempt a line."""
    drawn = [a for a in attempts if len(a["steps"])]
    if not drawn:
        raise PswiftError(f"{title}: no training step logged yet; plot it once it has trained")
    plt = figures.pyplot()
    fig, (loss_ax, time_ax) = plt.subplots(2, 1, sharex=True, figsize=(9, 6))
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for i, a in enumerate(drawn):
        steps, colour = list(a["steps"].step), colours[i % len(colours)]
        loss_ax.plot(steps, list(a["steps"].loss), color=colour, lw=1.2, label=_start_label(a))
        time_ax.plot(steps, list(a["steps"].step_time), color=colour, lw=0.8)
        if a["evals"]:   # validation losses ([training] eval_every): points on the loss's axis
            loss_ax.plot([e["step"] for e in a["evals"]], [e["loss"] for e in a["evals"]], "o", ms=4,
                         mfc="none", color=colour, label=f"attempt {a['attempt']} validation")
        first = (a["start"] or {}).get("step", steps[0] - 1)
        for ax in (loss_ax, time_ax):
            ax.axvline(first, color=colour, ls=":", lw=1)
            ax.axvline(steps[-1], color=colour, ls="--", lw=1)
        loss_ax.annotate(inert(f"ended: {a['ended']}"), (steps[-1], _finite_max(a["steps"].loss)), color=colour,
                         rotation=90, fontsize=8, ha="right", va="top", xytext=(-2, 0), textcoords="offset points")
    loss_ax.set_ylabel("loss")
    loss_ax.legend(fontsize=8, loc="upper right")
    time_ax.set_ylabel("step time (s)")
    time_ax.set_xlabel("step (dotted: an attempt starts; dashed: it ends, its cause above)")
    loss_ax.set_title(inert(title))
    fig.tight_layout()
    figures.save(fig, out)
    return [f"{_start_label(a)}: steps {(a['start'] or {}).get('step', a['steps'].step[0] - 1)}-{a['steps'].step[-1]}, "
            f"ended: {a['ended']}" for a in drawn]


def _finite_max(values: Any) -> float:
    finite = [v for v in values if math.isfinite(v)]
    return max(finite) if finite else 0.0
