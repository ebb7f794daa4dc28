"""Stop requests: signal handlers only set a flag (no torch import: installed first thing)."""

from __future__ import annotations

import signal
from typing import Any

# stop codes, agreed across ranks by all-reduce(MAX): the larger code wins
STOP_NONE, STOP_TERM, STOP_TIME = 0, 1, 2
_stop = {"code": STOP_NONE}


def _on_signal(signum: int, frame: Any) -> None:
    code = STOP_TIME if signum == signal.SIGUSR2 else STOP_TERM
    _stop["code"] = max(_stop["code"], code)


def install() -> None:
    """SIGTERM (preemption, scancel), SIGINT and SIGUSR2 (time limit near) set the stop flag."""
    for s in (signal.SIGTERM, signal.SIGINT, signal.SIGUSR2):
        signal.signal(s, _on_signal)


def requested() -> int:
    return _stop["code"]
