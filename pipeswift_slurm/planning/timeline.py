"""Draw simulated pipeline timelines: in the terminal (text lanes) and as a PNG (matplotlib).

One lane per stage; forward boxes, backward boxes (and weight-gradient boxes for zero-bubble)
per micro-batch; gaps are idle time. matplotlib is imported only when a picture is asked for.
"""

from __future__ import annotations

# Imports inside functions: matplotlib, only for a picture

from pathlib import Path
from typing import Sequence

from pipeswift_slurm.figures import pyplot, save
from pipeswift_slurm.planning.simulate import SimResult

_TEXT = {"F": "Ff", "B": "Bb", "W": "Ww"}  # upper/lower case alternate per micro-batch
_COLORS = {"F": "#4C72B0", "B": "#DD8452", "W": "#55A868"}


def text_timeline(res: SimResult, width: int = 96) -> list[str]:
    """Lanes of characters: F forward, B backward, W weight gradient, '.' idle (the case
    alternates between micro-batches so adjacent boxes stay apart); with a legend."""
    width = max(10, width)
    span = res.span
    scale = width / span if span > 0 else 0.0
    lanes = [["."] * width for _ in range(res.devices)]
    for op in res.ops:
        a = int(op.start * scale)
        z = max(a + 1, int(round(op.end * scale)))
        ch = _TEXT[op.kind][op.micro % 2]
        for i in range(a, min(z, width)):
            lanes[op.device][i] = ch
    label = max(len(f"stage {res.devices - 1}"), 7)
    out = [f"{'stage ' + str(d):>{label}} |{''.join(lane)}| idle {res.idle[d]:.4g}"
           for d, lane in enumerate(lanes)]
    out.append(f"{'':>{label}}  0{'':{width - 2 - len(f'{span:.4g}')}}{span:.4g}")
    out.append(f"{'':>{label}}  F/f forward, B/b backward, W/w weight gradient (case alternates per micro-batch), . idle")
    return out


def plot(results: Sequence[SimResult], path: Path, title: str = "") -> None:
    """One panel per schedule, one lane per stage, a box per operation labelled by micro-batch."""
    plt = pyplot()
    from matplotlib.patches import Patch
    n = len(results)
    lanes = max(r.devices for r in results)
    fig, axes = plt.subplots(n, 1, figsize=(13, 0.9 + 0.55 * lanes * n + 0.4 * n), squeeze=False,
                             sharex=True)
    t_max = max(r.span for r in results)
    for ax, r in zip(axes[:, 0], results):
        for op in r.ops:
            ax.broken_barh([(op.start, op.end - op.start)], (op.device - 0.4, 0.8),
                           facecolors=_COLORS[op.kind], edgecolor="white", linewidth=0.5)
            if (op.end - op.start) / t_max > 0.012:
                ax.text((op.start + op.end) / 2, op.device, str(op.micro), ha="center", va="center",
                        fontsize=7, color="white")
        ax.set_yticks(range(r.devices))
        ax.set_yticklabels([f"stage {d}" for d in range(r.devices)])
        ax.set_ylim(r.devices - 0.5, -0.5)
        name = r.schedule + (f" (v={r.chunks})" if r.chunks > 1 else "")
        ax.set_title(f"{name}: step {r.step_time:.4g} s, bubble {r.bubble_ratio:.1%}, "
                     f"peak in-flight {max(r.peak_in_flight)}", fontsize=10, loc="left")
        ax.grid(axis="x", alpha=0.3)
    axes[-1, 0].set_xlabel("time (s)")
    fig.legend(handles=[Patch(color=_COLORS[k], label=v) for k, v in
                        (("F", "forward"), ("B", "backward"), ("W", "weight grad"))],
               loc="upper right", fontsize=8, ncol=3, frameon=False)
    fig.suptitle(title or "pipeline schedule", fontsize=11, x=0.01, ha="left")
    fig.tight_layout(rect=(0, 0, 1, 0.97))
    save(fig, path)
