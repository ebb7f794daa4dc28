"""Human-readable durations, matplotlib set-up shared by the commands that draw, and the
progress bar of long admin commands."""

from __future__ import annotations

import contextlib
import sys
from typing import Any, Callable, Iterator

from pipeswift_slurm.errors import PswiftError
from pipeswift_slurm.terminal import raw_stderr

def duration(s: float | None, compact: bool = False) -> str:
    """``1.2 s``, ``3.5 min``, ``2.00 h`` (``compact``: ``1s``, ``3.5m``, ``2.00h``); signed."""
    if s is None:
        return "-"
    sign, a = ("-" if s < 0 else ""), abs(s)
    sep = "" if compact else " "
    if 0 < a < 1:
        return f"{sign}{a * 1000:.0f}{sep}ms"
    if a < 120:
        return f"{sign}{a:.0f}{sep}s"
    if a < 7200:
        return f"{sign}{a / 60:.1f}{sep}{'m' if compact else 'min'}"
    return f"{sign}{a / 3600:.2f}{sep}h"


def pyplot() -> Any:
    """matplotlib.pyplot on the Agg backend, or a one-line error saying how to install it. Text
    is never parsed as math nor handed to TeX: a label holds a user's words (a job name, an end
    reason), and ``$...$`` nested deep crashed the mathtext parser (issue 57)."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise PswiftError("--plot needs matplotlib: pip install 'pipeswift-slurm[plot]'") from None
    matplotlib.rcParams.update({"text.parse_math": False, "text.usetex": False})
    return plt


def save(fig: Any, path: Any) -> None:
    """The figure as a PNG at ``path``, through the one output opener (a link there is
    replaced, never written through)."""
    from pipeswift_slurm.userfiles import write_output
    plt = pyplot()
    try:
        write_output(path, lambda f: fig.savefig(f, dpi=110, format="png"))
    finally:
        plt.close(fig)


def growth_line(g: dict[str, Any]) -> str:
    """One growth, predicted against measured (``pswift status`` and ``pswift doctor``)."""
    def sec(v: Any) -> str:
        return "?" if v is None else f"{v:.3g} s"
    got = g["nodes_got"]
    return (f"grew at step {g['step']} of attempt {g['attempt']}: {g['nodes_from']} -> {got if got else '?'} "
            f"node(s) (asked up to {g['nodes_to']}); step {sec(g['step_s'])} -> {sec(g['measured_step_s'])} "
            f"(predicted {sec(g['predicted_step_s'])}); saved {sec(g['measured_gain_s'])} (predicted "
            f"{sec(g['predicted_gain_s'])}) for a cost of {sec(g['measured_cost_s'])} (predicted "
            f"{sec(g['predicted_cost_s'])})")


def crash_line(c: dict[str, Any]) -> str:
    """One crash of an attempt's ranks and what followed (``pswift status`` and ``pswift doctor``)."""
    when = "crashed" if c.get("step") is None else f"crashed after step {c['step']}"
    return f"{when}: {c.get('why') or c.get('how')}"


def relayout_line(r: dict[str, Any]) -> str:
    """One in-job re-layout, predicted against measured (``pswift status`` and ``pswift doctor``)."""
    def sec(v: Any, unit: str = "s") -> str:
        return "?" if v is None else f"{v:.3g} {unit}"
    return (f"re-laid out at step {r['step']}: {r['from']} -> {r['to']}; step {sec(r['step_s'])} -> "
            f"{sec(r['measured_step_s'])} (predicted {sec(r['predicted_step_s'])}); saved "
            f"{sec(r['measured_gain_s'])} (predicted {sec(r['predicted_gain_s'])}) for a cost of "
            f"{sec(r['measured_cost_s'])} (predicted {sec(r['predicted_cost_s'])})")



#: what a long loop reports to: advance(n) after n more items
Advance = Callable[[int], None]


def interactive() -> bool:
    """Whether someone watches stderr (a terminal): the rule for drawing progress at all."""
    return sys.stderr.isatty()


def _nothing(n: int = 1) -> None:
    return None


@contextlib.contextmanager
def no_progress(what: str, total: int | None = None) -> Iterator[Advance]:
    yield _nothing


@contextlib.contextmanager
def progress(what: str, total: int | None = None) -> Iterator[Advance]:
    """A progress bar on stderr (rich's) while a long admin command works, only when stderr is
    a terminal: piped, redirected or under cron, nothing is written. Yields ``advance(n)``."""
    if not interactive():
        yield _nothing
        return
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=Console(file=raw_stderr()), transient=True,
                  redirect_stdout=False, redirect_stderr=False) as bar:   # the data stays on stdout
        task = bar.add_task(what, total=total)

        def advance(n: int = 1) -> None:
            bar.advance(task, n)
        yield advance
