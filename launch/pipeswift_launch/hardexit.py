"""How a process that built a torch.distributed group ends: the group destroyed, its output
flushed, and the interpreter's teardown skipped. gloo's C++ threads, finalised during that
teardown, can abort the process ("terminate called without an active exception", SIGABRT) after
its work is done and its answer printed. Every rank ends here, and so does every test or
benchmark child that builds a group or a DeepSpeed engine (tests/helpers.run_dist_child)."""

from __future__ import annotations

import os
import sys
from typing import NoReturn


def destroy_group() -> None:
    """Destroy torch.distributed's default group if one was made (nothing when torch was never
    imported: this module imports no torch itself)."""
    dist = sys.modules.get("torch.distributed")
    if dist is None or not dist.is_available() or not dist.is_initialized():
        return
    try:
        dist.destroy_process_group()
    except Exception:   # a peer already gone: the process ends anyway
        pass


def exit_now(code: int) -> NoReturn:
    """End the process with ``code`` once the group is destroyed and stdout/stderr are flushed."""
    destroy_group()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):   # a closed pipe: nothing more can be said
            pass
    os._exit(code)
