"""What each rank leaves of one launch for the batch script's helpers (launchwatch while the
launch runs, afterlaunch after it): ``began_R.json`` (``{"rank", "node"}``) when rank R starts,
and a small JSON file per rank in ``$PSWIFT_LAUNCH_DIR`` (set by the batch script, one folder a
launch) when it ends:
``{"rank", "node", "rc"}`` when the launcher returned by itself, ``{"rank", "node", "step",
"error"}`` when it raised, ``{"rank", "node", "hang", "suspect_rank", "suspect_node", "step"}``
when its watchdog ended a hung launch. A rank killed by a signal leaves nothing; srun's report says so.
No torch here: the helper reads these without it."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from pipeswift_slurm.userfiles import UnsafeFile, read_tail

ENV = "PSWIFT_LAUNCH_DIR"
#: srun's standard error of the launch (the batch script tees it here)
SRUN_ERR = "srun.err"
#: the most of one record or of srun's report that is read (its tail)
READ_MAX = 64 * 1024


#: written by launchwatch when it gave up on a launch whose ranks on some nodes went silent
LOST = "lost.json"


def _write(rank: int, record: dict[str, Any], name: str = "rank") -> None:
    folder = os.environ.get(ENV)
    if not folder:
        return   # pswift run, or a launch by hand: nobody reads records
    node = os.environ.get("SLURMD_NODENAME")
    path = Path(folder) / f"{name}_{int(rank)}.json"
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        tmp.write_text(json.dumps({"rank": int(rank), "node": node, **record}))
        os.replace(tmp, path)
    except OSError:
        pass   # the record helps the decision; a full disk must not hide the rank's own error


def began(rank: int) -> None:
    """This rank started (the node it runs on): a rank that began and never ended, while the
    others did, went silent with its node (launchwatch)."""
    _write(rank, {}, "began")


def exited(rank: int, rc: int) -> None:
    """The launcher returned ``rc`` by itself (done, re-laid out, refused, a spent budget)."""
    _write(rank, {"rc": int(rc)})


def raised(rank: int, step: int | None, error: str) -> None:
    """The launcher raised ``error`` (one line) while running ``step``."""
    _write(rank, {"step": step, "error": " ".join(error.split())[:500]})


def hung(rank: int, suspect_rank: int | None, suspect_node: str | None, step: int | None, why: str) -> None:
    """This rank's watchdog found the launch hung and ends it: ``suspect_*`` name the rank that
    stopped (None: blocked, nobody singled out), ``why`` says what was seen (one line)."""
    _write(rank, {"hang": " ".join(why.split())[:500], "suspect_rank": suspect_rank,
                  "suspect_node": suspect_node, "step": step})


def _records(folder: Path, name: str) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for f in sorted(folder.glob(f"{name}_*.json")):
        try:
            rec = json.loads(read_tail(str(f), READ_MAX) or b"")
        except (OSError, ValueError, UnsafeFile):
            continue
        if isinstance(rec, dict) and isinstance(rec.get("rank"), int):
            out.append(rec)
    return out


def read(folder: Path) -> tuple[list[dict[str, Any]], str]:
    """(every rank's end record, srun's report) of the launch in ``folder``; unreadable parts skipped."""
    try:
        report = (read_tail(str(folder / SRUN_ERR), READ_MAX) or b"").decode("utf-8", "replace")
    except (OSError, UnsafeFile):
        report = ""
    return _records(folder, "rank"), report


def began_on(folder: Path) -> dict[int, str]:
    """The node each rank of the launch began on (rank -> node)."""
    return {r["rank"]: str(r["node"]) for r in _records(folder, "began") if isinstance(r.get("node"), str)}


def lost(folder: Path) -> tuple[str, ...]:
    """The nodes launchwatch found silent (lost.json), if it stopped the launch."""
    try:
        rec = json.loads(read_tail(str(folder / LOST), READ_MAX) or b"{}")
    except (OSError, ValueError, UnsafeFile):
        return ()
    nodes = rec.get("nodes") if isinstance(rec, dict) else None
    return tuple(str(n) for n in nodes) if isinstance(nodes, list) else ()
