"""One line for each of a run's events that `pswift status` and `pswift doctor` both tell: a
growth, a crash, a re-layout."""

from __future__ import annotations

from typing import Any


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
