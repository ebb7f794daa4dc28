"""The benchmark table of docs/benchmarks.md, made from bench/results/*.json (never typed by hand).

    python bench/readme.py           # rewrite the table in docs/benchmarks.md
    python bench/readme.py --check   # exit 1 when docs/benchmarks.md differs from bench/results/
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"
#: every benchmark, in the table's order (tests check this list against bench/*.py)
ORDER = ["checkpoint", "submit_latency", "step_time_model", "history_scale", "plan_worst_case",
         "slurm_backends", "simulator", "partition", "dynamic", "job_submit", "ingest_cap", "goodput", "members", "workload", "overhead",
         "schedules", "gloo_posted"]
BEGIN = "<!-- bench-figures: written by `python bench/readme.py` from bench/results/*.json -->"
END = "<!-- /bench-figures -->"


def load(results: Path = RESULTS) -> dict[str, dict]:
    """Every benchmark's result, in ORDER, each followed by its runs in another setting
    (``goodput.slurm-25.11.json``: the same benchmark on another Slurm; ``workload-TRACE.json``:
    on another input), one row each."""
    out = {}
    for name in ORDER:
        path = results / f"{name}.json"
        found = [*([path] if path.is_file() else []), *sorted(results.glob(f"{name}.*.json")),
                 *sorted(results.glob(f"{name}-*.json"))]
        if not found:
            raise SystemExit(f"{path} is missing: run `{name}`'s benchmark (make bench)")
        for each in found:
            out[each.name.removesuffix(".json")] = json.loads(each.read_text())
    return out


def table(results: dict[str, dict]) -> str:
    hosts = sorted({r["host"] for r in results.values()})
    lines = [BEGIN, f"Measured on {' and '.join(hosts)}; each row names the command and the date.",
             "", "| command | what | result |", "| --- | --- | --- |"]
    for name, r in results.items():
        if r.get("quick"):
            raise SystemExit(f"bench/results/{name}.json is a --quick run: run the full benchmark")
        lines.append(f"| `{r['command']}` ({r['date']}) | {r['readme']['what']} | {r['readme']['figures']} |")
    return "\n".join([*lines, END])


def with_table(readme: str, new: str) -> str:
    start, end = readme.find(BEGIN), readme.find(END)
    if start < 0 or end < start:
        raise SystemExit(f"docs/benchmarks.md has no benchmark table markers ({BEGIN} ... {END})")
    return readme[:start] + new + readme[end + len(END):]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--check", action="store_true", help="exit 1 when docs/benchmarks.md is out of date")
    args = ap.parse_args()
    path = ROOT / "docs" / "benchmarks.md"
    old = path.read_text(encoding="utf-8")
    new = with_table(old, table(load()))
    if args.check:
        if new != old:
            print("docs/benchmarks.md's benchmark table differs from bench/results/: run python bench/readme.py",
                  file=sys.stderr)
            sys.exit(1)
        return
    path.write_text(new, encoding="utf-8")
    print("docs/benchmarks.md: benchmark table rewritten from bench/results/")


if __name__ == "__main__":
    main()
