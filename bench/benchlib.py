"""What every benchmark writes: its figures as JSON, with the command that produced them and
the table row made from them (bench/readme.py puts the rows into docs/benchmarks.md; a test checks the
table matches bench/results/)."""

from __future__ import annotations

import datetime as _dt
import json
import os
import platform
import shlex
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def command_line() -> str:
    """How this benchmark was started, as one would type it from the checkout (no --out)."""
    args, skip = [], False
    for a in sys.argv[1:]:
        if skip:
            skip = False
            continue
        if a == "--out":
            skip = True
            continue
        if not a.startswith("--out="):
            args.append(a)
    script = Path(sys.argv[0]).resolve()
    try:
        script = script.relative_to(ROOT)
    except ValueError:
        pass
    version = os.environ.get("PSWIFT_SLURM_VERSION")  # set by scripts/with-slurm
    prefix = f"scripts/with-slurm {version} " if version else ""
    return prefix + shlex.join(["python", str(script), *args])


def median_interval(values: list[float], level: float = 0.9, draws: int = 4000) -> tuple[float, float]:
    """A bootstrap interval of the median of ``values``: the median of ``draws`` resamples (with
    replacement, a fixed seed), their central ``level`` share. Says what a run's rounds resolve."""
    import random
    import statistics
    rnd = random.Random(0)
    meds = sorted(statistics.median(rnd.choices(values, k=len(values))) for _ in range(draws))
    cut = int(draws * (1 - level) / 2)
    return meds[cut], meds[draws - 1 - cut]


def save(out: str | Path, result: dict[str, Any], *, quick: bool, what: str, figures: str) -> None:
    """Write ``result`` to ``out`` with the command, the host and the table row."""
    result = {**result, "command": command_line(), "quick": quick,
              "host": f"{platform.system()} {platform.machine()}, {os.cpu_count()} cores",
              "date": _dt.datetime.now(_dt.timezone.utc).date().isoformat(),
              "readme": {"what": what, "figures": figures}}
    path = Path(out)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=2) + "\n")
    print(figures)
    print(f"wrote {path}")
