"""The benchmark figures of docs/benchmarks.md come from bench/results/*.json, each naming its command."""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
import readme  # noqa: E402


def test_every_benchmark_has_a_full_result_with_its_command():
    scripts = {p.stem for p in (ROOT / "bench").glob("*.py")} - {"benchlib", "readme", "traces"}   # libraries
    assert set(readme.ORDER) == scripts
    for name in readme.ORDER:
        r = json.loads((ROOT / "bench" / "results" / f"{name}.json").read_text())
        assert r["quick"] is False, f"{name}: a --quick result is committed"
        assert f"bench/{name}.py" in r["command"] and r["readme"]["figures"] and r["readme"]["what"]


def test_the_readme_table_is_the_one_made_from_the_results():
    text = (ROOT / "docs" / "benchmarks.md").read_text(encoding="utf-8")
    assert readme.with_table(text, readme.table(readme.load())) == text, \
        "docs/benchmarks.md's benchmark table is stale: run python bench/readme.py"
