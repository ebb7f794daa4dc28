"""Stop requests: signal handlers only set a flag (no torch import: installed first thing)."""

from __future__ import annotations

import signal
from typing import Any

# stop codes, agreed across ranks by all-reduce(MAX): the larger code wins (a signal over a
# growth rank 0 asked for: the attempt ends either way, preemption and time limits come first)
STOP_NONE, STOP_GROW, STOP_TERM, STOP_TIME = 0, 1, 2, 3
_stop = {"code": STOP_NONE}


def _on_signal(signum: int, frame: Any) -> None:
    code = STOP_TIME if signum == signal.SIGUSR2 else STOP_TERM
    _stop["code"] = max(_stop["code"], code)


def install() -> None:
    """SIGTERM (preemption, scancel), SIGINT and SIGUSR2 (time limit near) set the stop flag."""
    for s in (signal.SIGTERM, signal.SIGINT, signal.SIGUSR2):
        signal.signal(s, _on_signal)


def request_grow() -> None:
    """Rank 0's growth watcher: stop at the next step boundary to come back bigger."""
    _stop["code"] = max(_stop["code"], STOP_GROW)


def requested() -> int:
    return _stop["code"]
