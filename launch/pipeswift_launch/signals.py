"""Stop requests: signal handlers only set a flag (no torch import: installed first thing)."""

from __future__ import annotations

import signal
from typing import Any

from pipeswift_slurm.codes import Stop

# agreed across ranks by all-reduce(MAX): the larger code wins (pipeswift_slurm.codes.Stop)
_stop = {"code": Stop.NONE}


def _on_signal(signum: int, frame: Any) -> None:
    code = Stop.TIME if signum == signal.SIGUSR2 else Stop.TERM
    _stop["code"] = max(_stop["code"], code)


def install() -> None:
    """SIGTERM (preemption, scancel), SIGINT and SIGUSR2 (time limit near) set the stop flag."""
    for s in (signal.SIGTERM, signal.SIGINT, signal.SIGUSR2):
        signal.signal(s, _on_signal)


def request_grow() -> None:
    """Rank 0's growth watcher: stop at the next step boundary to come back bigger."""
    _stop["code"] = max(_stop["code"], Stop.GROW)


def requested() -> int:
    return int(_stop["code"])
