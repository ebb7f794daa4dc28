"""job_submit.lua benchmark: the plugin's time per submission inside real Lua 5.1 and 5.3 interpreters
(the one slurmctld's job_submit/lua embeds; tests/lua/job_submit_harness.lua calls it as
slurmctld does) against the script's size, for every shape of the grammar below (blank lines,
whitespace runs, CR/CRLF, comments, long and short directives, the pswift marker's text, long
bodies, random mixes) in a pswift script and in another job's. The quadratic tokenizers of
earlier versions held slurmctld ~10 s on a 700 kB `#SBATCH` line and ~5 s on 32k blank lines.
The baseline, in the same run and alternated rounds: a plugin that does one plain string.find
over the whole script, the floor of any check that reads it all.
tests/test_job_submit_lua.py uses the same grammar (SHAPES, script) for its bounds.

    python bench/job_submit.py [--quick] [--out bench/results/job_submit.json]
"""

from __future__ import annotations

import argparse
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import benchlib  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
PLUGIN = ROOT / "plugins" / "job_submit.lua"
HARNESS = ROOT / "tests" / "lua" / "job_submit_harness.lua"
FLOOR = """function slurm_job_submit(job_desc, part_list, submit_uid)
   if string.find(job_desc.script, "pipeswift_launch", 1, true) then return slurm.SUCCESS end
   return slurm.SUCCESS
end
"""
MARK = "#!/bin/bash\n# Rendered by pipeswift-slurm BENCH for job x; edit train.toml\n"
COMMAND = "srun python -m pipeswift_launch plan.json\n"
#: the grammar of script shapes: name -> (where, prefix, unit): the unit repeated to the size
#: after the prefix, in the directive header (before the first command) or in the body after it
SHAPES = {
    "blank lines": ("head", "", "\n"), "space lines": ("head", "", " \n"),
    "tab runs": ("head", "", "\t" * 63 + "\n"), "CRLF blanks": ("head", "", "\r\n"),
    "comments": ("head", "", "#\n"), "long comments": ("head", "", "# " + "c" * 98 + "\n"),
    "short directives": ("head", "", "#SBATCH -H\n"), "empty directives": ("head", "", "#SBATCH\n"),
    "CRLF directives": ("head", "", "#SBATCH --open-mode=append\r\n"),
    "quoted directives": ("head", "", "#SBATCH '--comment=a b'\n"),
    "escapes": ("head", "#SBATCH ", "\\\\"),
    "one long directive": ("head", "#SBATCH --comment=", "x"), "space run": ("head", "#SBATCH", " "),
    "marker text": ("head", "", "#SBATCH --comment=pipeswift_launch\n"),
    "blank body": ("body", "", "\n"), "long body": ("body", "", "echo " + "z" * 1019 + "\n"),
    "marker body": ("body", "", "# Rendered by pipeswift-slurm \n"),
    "mix 1": ("mix", "", "1"), "mix 2": ("mix", "", "2"), "mix 3": ("mix", "", "3"),
}


def script(shape: str, size: int, pswift: bool = True) -> str:
    """A batch script of about ``size`` bytes in ``shape`` (a mix: 64 units drawn by its seed)."""
    where, prefix, unit = SHAPES[shape]
    if where == "mix":
        rng = random.Random(int(unit))
        picks = [SHAPES[rng.choice([s for s in SHAPES if not s.startswith("mix")])] for _ in range(64)]
        head = "".join(p + u * max(1, size // 64 // len(u)) + "\n" for w, p, u in picks if w == "head")
        body = "".join(u * max(1, size // 64 // len(u)) for w, _, u in picks if w == "body")
    else:
        head = prefix + unit * (size // len(unit)) + "\n" if where == "head" else ""
        body = unit * (size // len(unit)) if where == "body" else ""
    return (MARK if pswift else "#!/bin/bash\n") + head + COMMAND + body


def per_call(plugin: Path, path: Path, repeats: int, lua: str) -> tuple[float, int, list[str]]:
    """(seconds a call, the plugin's return code, its messages) for the script at ``path``."""
    out = subprocess.run([lua, str(HARNESS), str(plugin), str(path),
                          str(repeats)], capture_output=True, text=True, timeout=600, check=True).stdout.splitlines()
    fields = dict(kv.split("=", 1) for kv in out[-1].split())
    return float(fields["seconds_per_call"]), int(fields["rc"]), out[:-1]


def measure(lua: str, floor: Path, path: Path, rounds: int) -> dict[str, float]:
    size = path.stat().st_size
    repeats = max(3, min(200, 4_000_000 // size))
    mine, base = [], []
    for _ in range(rounds):   # alternated rounds
        mine.append(per_call(PLUGIN, path, repeats, lua)[0])
        base.append(per_call(floor, path, repeats, lua)[0])
    m, b = statistics.median(mine), statistics.median(base)
    return {"bytes": size, "plugin_ms": m * 1e3, "floor_ms": b * 1e3, "ratio": m / b if b > 0 else None,
            "plugin_ms_range": [min(mine) * 1e3, max(mine) * 1e3],
            "ms_per_mib": m * 1e3 / (size / 2**20)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "job_submit.json"))
    ap.add_argument("--quick", action="store_true", help="sizes up to 64 KiB, 1 round (CI: the bench still runs)")
    args = ap.parse_args()
    luas = {v: shutil.which(v) for v in ("lua5.1", "lua5.3")}   # Debian's 22.05 embeds 5.1, a 25.11 build 5.3
    if None in luas.values():
        raise SystemExit("bench/job_submit.py needs lua5.1 and lua5.3 (apt-get install lua5.1 lua5.3; "
                         "make tools installs them)")
    sizes = [1024, 65536] if args.quick else [65536, 524288, 4194304]
    rounds = 1 if args.quick else 5
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        floor = Path(tmp) / "floor.lua"
        floor.write_text(FLOOR)
        for version, lua in luas.items():
            for shape in SHAPES:
                for pswift in (True, False):
                    for size in sizes:
                        path = Path(tmp) / "job.sh"
                        path.write_text(script(shape, size, pswift))
                        row = {"lua": version, "shape": shape, "job": "pswift" if pswift else "other",
                               **measure(str(lua), floor, path, rounds)}
                        rows.append(row)
                        print(f"{version} {shape:18s} {row['job']:6s} {row['bytes']:>9,d} B  plugin "
                              f"{row['plugin_ms']:8.3f} ms  floor {row['floor_ms']:7.3f} ms")
    big = max(r["bytes"] for r in rows)
    at_big = [r for r in rows if r["bytes"] >= big * 0.9]
    worst = max(at_big, key=lambda r: r["plugin_ms"])
    flat = max(b["plugin_ms"] / a["plugin_ms"] for a, b in zip(rows, rows[1:])
               if a["lua"] == b["lua"] and a["shape"] == b["shape"] and a["job"] == b["job"] and b["bytes"] > a["bytes"])
    figures = (f"{len(SHAPES)} shapes x (pswift, other job) x (Lua 5.1, 5.3), medians of {rounds} alternated rounds: at "
               f"~{big / 2**20:.2g} MiB the slowest is {worst['shape']} ({worst['job']}, {worst['lua']}) at "
               f"{worst['plugin_ms']:.2f} ms = {worst['ms_per_mib']:.2f} ms/MiB (a plain scan of the whole "
               f"script: {worst['floor_ms']:.2f} ms); the largest growth from one size to the next "
               f"{flat:.2f}x (sizes {', '.join(f'{s // 1024} KiB' for s in sizes)})")
    benchlib.save(args.out, {"rows": rows, "worst_ms": worst["plugin_ms"], "worst_ms_per_mib": worst["ms_per_mib"],
                             "largest_growth": flat, "rounds": rounds}, quick=args.quick,
                  what="`plugins/job_submit.lua` per submission in real Lua 5.1 and 5.3 (slurmctld's job_submit/lua "
                       "interpreters) over a grammar of script shapes and sizes, pswift jobs and others; vs a "
                       "plugin that does one plain scan of the whole script, same run",
                  figures=figures)


if __name__ == "__main__":
    main()
