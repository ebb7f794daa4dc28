"""matplotlib set-up shared by the commands that draw, and the one way a figure is written."""

from __future__ import annotations

# Imports inside functions: matplotlib (about a second) loads only for a picture

from typing import Any

from pipeswift_slurm.errors import PswiftError


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
