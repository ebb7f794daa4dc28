"""The benchmark figures of docs/benchmarks.md come from bench/results/*.json, each naming its command."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
import readme  # noqa: E402


def test_every_benchmark_has_a_full_result_with_its_command():
    scripts = {p.stem for p in (ROOT / "bench").glob("*.py")} - {"benchlib", "readme", "traces", "jctstats", "workload_outcome"}   # libraries
    assert set(readme.ORDER) == scripts
    results = readme.load()     # every benchmark has at least one (NAME.json, NAME.*.json or NAME-*.json)
    for key, r in results.items():
        name = next(n for n in readme.ORDER if key == n or key.startswith((n + ".", n + "-")))
        assert r["quick"] is False, f"{key}: a --quick result is committed"
        assert f"bench/{name}.py" in r["command"] and r["readme"]["figures"] and r["readme"]["what"]
    assert {n for n in readme.ORDER if not any(k == n or k.startswith((n + ".", n + "-")) for k in results)} == set()


def test_the_readme_table_is_the_one_made_from_the_results():
    text = (ROOT / "docs" / "benchmarks.md").read_text(encoding="utf-8")
    assert readme.with_table(text, readme.table(readme.load())) == text, \
        "docs/benchmarks.md's benchmark table is stale: run python bench/readme.py"


#: a measured ratio as the prose writes it: "0.91×" (a whole number before × is a rule or a
#: setting, "≥ 2× the requeue's cost", "10×", never a measurement)
RATIO = re.compile(r"(?<![\w.])(\d+\.\d+)×")


def figures_of_results() -> list[str]:
    return [json.loads(p.read_text())["readme"]["figures"] for p in sorted((ROOT / "bench" / "results").glob("*.json"))]


def backed(figure: str, figures: list[str]) -> bool:
    """Whether a result's figures hold ``figure``, as written or rounded to its decimals."""
    places = len(figure.split(".")[1])
    for text in figures:
        for n in re.findall(r"\d+\.\d+", text):
            if n == figure or (len(n.split(".")[1]) > places and f"{float(n):.{places}f}" == figure):
                return True
    return False


def prose(path: Path) -> str:
    """A page's text but the generated benchmark table."""
    text = path.read_text(encoding="utf-8")
    start, end = "<!-- bench-figures", "<!-- /bench-figures -->"
    return text[:text.index(start)] + text[text.index(end):] if start in text else text


@pytest.mark.parametrize("page", ["README.md", *sorted(p.relative_to(ROOT).as_posix() for p in (ROOT / "docs").glob("*.md"))])
def test_every_measured_ratio_in_the_prose_is_a_results_figure(page):
    """Issue 61: no figure by hand. Each ratio the README and docs state is one of
    bench/results/*.json's figures (as the table shows it, or rounded); a figure with no
    result behind it fails here: measure it with a benchmark, or take it out of the prose."""
    figures = figures_of_results()
    unbacked = [f for f in RATIO.findall(prose(ROOT / page)) if not backed(f, figures)]
    assert not unbacked, f"{page}: {unbacked} have no bench/results/*.json figure behind them"


def test_the_prose_check_finds_a_figure_by_hand():
    figures = ["step time pswift/bare 0.994 (90 % interval 0.987-1.003)"]
    assert backed("0.99", figures) and backed("0.994", figures) and not backed("1.05", figures)
    assert RATIO.findall("it took 1.046× before, ≥ 2× its cost, 10×") == ["1.046"]
