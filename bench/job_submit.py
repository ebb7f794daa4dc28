"""job_submit.lua benchmark: the plugin's time per submission inside a real Lua 5.3 interpreter
(the one slurmctld's job_submit/lua embeds; tests/lua/job_submit_harness.lua calls it as
slurmctld does) against the script's size, for three shapes of a pswift batch script: one long
`#SBATCH` line (a --comment of that size: the quadratic tokenizer held slurmctld ~10 s at 700 kB),
many 1 KiB `#SBATCH` lines, and a long script body after the directives. The baseline, in the
same run and alternated rounds: a plugin that only recognises a pswift script (one plain
string.find over it), the floor of any check.

    python bench/job_submit.py [--quick] [--out bench/results/job_submit.json]
"""

from __future__ import annotations

import argparse
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
HEAD = "#!/bin/bash\n#SBATCH --nodes=2-4\n#SBATCH --open-mode=append\n#SBATCH --signal=USR2@180\n"
TAIL = "srun python -m pipeswift_launch plan.json\n"


def script(shape: str, size: int) -> str:
    if shape == "one_line":
        return HEAD + "#SBATCH --comment=" + "x" * size + "\n" + TAIL
    if shape == "lines":
        line = "#SBATCH --comment=" + "y" * 1005 + "\n"   # 1 KiB a line
        return HEAD + line * max(1, size // len(line)) + TAIL
    return HEAD + TAIL + ("echo " + "z" * 1019 + "\n") * max(1, size // 1024)   # body


def per_call(lua: str, plugin: Path, path: Path, repeats: int) -> float:
    out = subprocess.run([lua, str(HARNESS), str(plugin), str(path), str(repeats)], capture_output=True,
                         text=True, timeout=600, check=True).stdout.splitlines()[-1]
    return float(out.rsplit("seconds_per_call=", 1)[1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "job_submit.json"))
    ap.add_argument("--quick", action="store_true", help="sizes up to 64 KiB, 1 round (CI: the bench still runs)")
    args = ap.parse_args()
    lua = shutil.which("lua5.3")
    if lua is None:
        raise SystemExit("bench/job_submit.py needs lua5.3 (apt-get install lua5.3; make tools installs it)")
    sizes = [1024, 65536] if args.quick else [1024, 65536, 262144, 1048576]
    rounds = 1 if args.quick else 5
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        floor = Path(tmp) / "floor.lua"
        floor.write_text(FLOOR)
        for shape in ("one_line", "lines", "body"):
            for size in sizes:
                path = Path(tmp) / f"{shape}-{size}.sh"
                path.write_text(script(shape, size))
                repeats = max(3, min(200, 4_000_000 // size))
                mine, base = [], []
                for _ in range(rounds):   # alternated rounds
                    mine.append(per_call(lua, PLUGIN, path, repeats))
                    base.append(per_call(lua, floor, path, repeats))
                m, b = statistics.median(mine), statistics.median(base)
                rows.append({"shape": shape, "bytes": path.stat().st_size, "plugin_ms": m * 1e3,
                             "floor_ms": b * 1e3, "ratio": m / b if b > 0 else None,
                             "plugin_ms_range": [min(mine) * 1e3, max(mine) * 1e3]})
                print(f"{shape:9s} {path.stat().st_size:>9,d} B  plugin {m * 1e3:8.3f} ms  floor {b * 1e3:7.3f} ms")
    big = max(r["bytes"] for r in rows)
    at_big = {r["shape"]: r for r in rows if r["bytes"] >= big * 0.9}
    worst = max(r["plugin_ms"] for r in rows)
    names = {"one_line": "one long line", "lines": "1 KiB lines", "body": "a long body"}
    figures = (f"medians of {rounds} alternated rounds at ~{big / 2**20:.2g} MiB: "
               + ", ".join(f"{names[s]} {r['plugin_ms']:.2f} ms ({r['ratio']:.1f}x the floor {r['floor_ms']:.2f} ms)"
                           for s, r in at_big.items())
               + f"; slowest of every size and shape {worst:.2f} ms")
    benchlib.save(args.out, {"rows": rows, "worst_ms": worst, "rounds": rounds}, quick=args.quick,
                  what="`plugins/job_submit.lua` per submission in a real Lua 5.3 (slurmctld's job_submit/lua "
                       "interpreter) by script size: one long `#SBATCH` line, 1 KiB `#SBATCH` lines, a long body; "
                       "vs a plugin that only recognises a pswift script (one plain scan), same run",
                  figures=figures)


if __name__ == "__main__":
    main()
