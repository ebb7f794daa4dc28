"""The one finiteness check for numbers that come from outside pswift (a train.toml, an events
line, a time filter): a finite float, or None for what is not one (a bool, a non-number, NaN,
an infinity, an integer too large for a float, such as a 400-digit TOML value)."""

from __future__ import annotations

import math
from typing import Any


def finite(v: Any) -> float | None:
    """``v`` as a finite float, or None."""
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    try:
        f = float(v)
    except OverflowError:
        return None
    return f if math.isfinite(f) else None
