"""``python -m pipeswift_launch.launchwatch LAUNCH_DIR SRUN_PID``: beside each launch of the
ranks (the batch script starts it), it finds a node that died before Slurm knows. Such a node's
ranks went silent with it: its step daemon is gone, so srun waits for their end until Slurm
marks the node DOWN (SlurmdTimeout: 300 s by default), while the ranks on the other nodes have
long failed (their collectives broke within a second). Once the launch has failed (a rank's
record of an error or hang, or srun's word of a rank's end) and a node's every rank stayed
silent for SILENT_GRACE_S (pipeswift_slurm.planning.decide.silent_nodes), it writes lost.json
(the nodes, and why) and stops srun; the after-launch helper then starts the ranks again at once
on the nodes that answer. No torch; polls a small folder once a second."""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path

from pipeswift_slurm.codes import Exit
from pipeswift_slurm.planning import decide
from pipeswift_slurm.slurm import srun

from . import launchrec

POLL_S = 1.0


def _heard(folder: Path, began: dict[int, str]) -> tuple[set[int], bool]:
    """(ranks whose end is known: their own record or srun's word, whether the launch failed);
    srun's word is read for the ranks that ``began`` only (a range it reports is cut to them)."""
    records, report = launchrec.read(folder)
    said = decide.srun_deaths(report)
    ended = {r["rank"] for r in records} | srun.heard(report, max(began, default=-1) + 1)
    failed = any(r.get("error") or r.get("hang") for r in records) or bool(said) \
        or any(r.get("rc", 0) not in (Exit.OK, Exit.RELAYOUT) for r in records)
    return ended, failed


def watch(folder: Path, srun_pid: int, grace_s: float = decide.SILENT_GRACE_S) -> tuple[str, ...]:
    """Until srun ends: the silent nodes it was stopped for (empty: it ended by itself)."""
    failed_at: float | None = None
    while _alive(srun_pid):
        # the ranks' begin records are read once a launch failed (before, srun's word is not needed)
        began = launchrec.began_on(folder) if failed_at is not None else {}
        ended, failed = _heard(folder, began)
        if failed and failed_at is None:
            failed_at = time.monotonic()
        if failed_at is not None:
            silent = decide.silent_nodes(began, ended, time.monotonic() - failed_at, grace_s)
            if silent:
                (folder / launchrec.LOST).write_text(json.dumps({"nodes": list(silent), "why": (
                    f"every rank on {', '.join(silent)} stayed silent {grace_s:g} s after the launch failed: "
                    f"the node died before Slurm knew")}))
                os.kill(srun_pid, signal.SIGKILL)
                return silent
        time.sleep(POLL_S)
    return ()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:   # a zombie (srun ended, its parent not yet waited) is not alive
        return open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except OSError:
        return False


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: python -m pipeswift_launch.launchwatch LAUNCH_DIR SRUN_PID", file=sys.stderr)
        return 2
    silent = watch(Path(argv[0]), int(argv[1]))
    if silent:
        print(f"pswift: {', '.join(silent)} went silent with its ranks: stopped srun, which would wait for "
              f"Slurm to notice", file=sys.stderr, flush=True)
    return 0


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))   # the batch script ends the watch with its launch
    sys.exit(main(sys.argv[1:]))
