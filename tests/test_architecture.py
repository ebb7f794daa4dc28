"""The house's shape (issue 26): no import circle among the package's modules, lazy imports
inside functions included (a circle there is one refactoring away from an import-time failure)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from helpers import ROOT

PACKAGES = {"pipeswift_slurm": ROOT / "pipeswift_slurm", "pipeswift_launch": ROOT / "launch" / "pipeswift_launch"}


def modules_of(root: Path) -> dict[str, Path]:
    """A package's modules by dotted name below it ("slurm.client"; a folder's __init__ is the folder)."""
    out = {}
    for p in sorted(root.rglob("*.py")):
        parts = p.relative_to(root).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        if name:
            out[name] = p
    return out


def imports_of(path: Path, package: str, modules: set[str], me: str) -> set[str]:
    """The modules of ``package`` that ``path`` (module ``me``) imports, anywhere in it."""
    folder = me.split(".") if path.name == "__init__.py" else me.split(".")[:-1]   # the package holding it
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = folder[: len(folder) - node.level + 1]
                rest = ".".join([*base, *([node.module] if node.module else [])])
            elif node.module and node.module.split(".")[0] == package:
                rest = node.module[len(package) + 1:]
            else:
                continue
            for a in node.names:
                sub = f"{rest}.{a.name}" if rest else a.name
                if sub in modules:
                    out.add(sub)
                elif rest in modules:
                    out.add(rest)
        elif isinstance(node, ast.Import):
            out.update(a.name[len(package) + 1:] for a in node.names
                       if a.name.startswith(package + ".") and a.name[len(package) + 1:] in modules)
    return out


def cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import circle of ``graph``, or None."""
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(m: str) -> list[str] | None:
        state[m] = 1
        stack.append(m)
        for d in sorted(graph[m]):
            if state.get(d) == 1:
                return stack[stack.index(d):] + [d]
            if d not in state and (found := visit(d)):
                return found
        stack.pop()
        state[m] = 2
        return None

    for m in sorted(graph):
        if m not in state and (found := visit(m)):
            return found
    return None


@pytest.mark.parametrize("package", sorted(PACKAGES))
def test_no_module_imports_itself_back(package):
    files = modules_of(PACKAGES[package])
    graph = {m: imports_of(p, package, set(files), m) - {m} for m, p in files.items()}
    assert cycle(graph) is None, " -> ".join(cycle(graph) or [])


# The login side's folders, lowest first: a module imports from its own folder, from a folder
# below it and from the contracts at the package's top, never from a folder above it.
FOLDERS = ["slurm", "planning", "history", "reports", "cli"]


def test_the_folders_import_only_downward():
    files = modules_of(PACKAGES["pipeswift_slurm"])
    assert {m.split(".")[0] for m in files if "." in m} == set(FOLDERS)
    upward = [f"{m} imports {d}" for m, p in files.items() if m.split(".")[0] in FOLDERS
              for d in imports_of(p, "pipeswift_slurm", set(files), m)
              if d.split(".")[0] in FOLDERS and FOLDERS.index(d.split(".")[0]) > FOLDERS.index(m.split(".")[0])]
    assert not upward, upward


def test_the_import_reader_sees_folders():
    files = modules_of(PACKAGES["pipeswift_slurm"])
    client = imports_of(files["slurm.client"], "pipeswift_slurm", set(files), "slurm.client")
    assert {"errors", "slurm.records", "slurm.cluster"} <= client, client
    assert "reports.jct" in imports_of(files["cli.admin"], "pipeswift_slurm", set(files), "cli.admin")


def test_the_cycle_finder_finds_one():
    assert cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert cycle({"a": {"b"}, "b": set()}) is None


def test_the_launcher_reads_plan_data_without_defaults():
    """plan.runnable checks every key the job reads when it starts; after it the launcher
    indexes plan data (a default there would be a second, silent home of a setting's default)."""
    import re
    pattern = re.compile(r"""(plan|\bt|\["training"\]|\["model"\]|\bmodel|\bspec)\.get\(""")
    found = [f"{p.name}:{i}: {line.strip()}" for p in sorted((ROOT / "launch" / "pipeswift_launch").glob("*.py"))
             for i, line in enumerate(p.read_text().splitlines(), 1) if pattern.search(line)]
    assert not found, found


TESTS = ROOT / "tests"


def test_tests_read_events_through_the_schema():
    """A run's events.jsonl is read in tests through helpers.run_events (pipeswift_slurm.events),
    never parsed line by line again in a test file (a copy that would accept what the schema refuses)."""
    import re
    copy = re.compile(r"""events\.jsonl["']?\)?\.read_(text|bytes)\(\)\.splitlines""")
    found = [f"{p.name}:{i}" for p in sorted(TESTS.glob("*.py"))
             for i, line in enumerate(p.read_text().splitlines(), 1) if copy.search(line)]
    assert not found, found


def test_the_dev_cluster_defaults_have_one_home():
    """Folders and ports of the dev clusters are written in scripts/dev-cluster.env only; the
    scripts, the Makefile and the tests read them from there."""
    defaults = dict(line.split("=", 1) for line in (ROOT / "scripts" / "dev-cluster.env").read_text().splitlines()
                    if line and not line.startswith("#"))
    values = {v for k, v in defaults.items() if k.endswith(("_PORT", "_BASEPORT", "_DIR"))}
    assert len(values) >= 5 and defaults["PSWIFT_DEV_DIR"].startswith("/"), defaults
    readers = [*(ROOT / "scripts").iterdir(), ROOT / "Makefile", *TESTS.glob("*.py"), *(ROOT / ".ci").iterdir()]
    found = [f"{p.name}: {v}" for p in readers if p.name != "dev-cluster.env" and p.is_file()
             for v in values if v in p.read_text()]
    assert not found, found


def test_tests_import_shared_code_from_helpers_not_conftest():
    """conftest.py holds fixtures and hooks only; what tests import lives in helpers.py."""
    found = [f"{p.name}:{i}" for p in sorted(TESTS.glob("*.py")) if p.name != "conftest.py"
             for i, line in enumerate(p.read_text().splitlines(), 1)
             if line.strip().startswith(("from conftest import", "import conftest"))]
    assert not found, found


def test_no_test_module_imports_another():
    """What several test files share (cluster helpers, readers of a run's events and losses,
    small data) lives in helpers.py and fixtures in conftest.py: a test file is never another's
    helper module (a change to one test would break others)."""
    tests = {p.stem for p in TESTS.glob("test_*.py")}
    found = []
    for p in sorted(TESTS.glob("*.py")):
        for node in ast.walk(ast.parse(p.read_text())):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            found += [f"{p.name}: {n}" for n in names if n.split(".")[0] in tests]
    assert not found, found


def test_tests_read_steps_losses_through_one_reader():
    """A test compares losses through helpers.step_losses, never a copy of its own."""
    found = [p.name for p in sorted(TESTS.glob("test_*.py"))
             if re.search(r"^def (events|job_events|step_losses)\(", p.read_text(), re.M)]
    assert not found, found


def function_level_imports(path: Path) -> list[tuple[int, str]]:
    """(line, module) of every import inside a function of ``path``."""
    out = []
    for fn in ast.walk(ast.parse(path.read_text())):
        if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for node in ast.walk(fn):
                if isinstance(node, ast.Import):
                    out += [(node.lineno, a.name) for a in node.names]
                elif isinstance(node, ast.ImportFrom):
                    out.append((node.lineno, "." * node.level + (node.module or "")))
    return sorted(set(out))


def test_the_launcher_imports_at_the_top_but_for_a_stated_reason():
    """The launcher's import graph is its modules' first lines (issue 39): an import inside a
    function is left only where the order of start-up, an optional dependency or a private
    module needs it, with the reason on its line or the line above; none is of the Slurm client
    (slurmport is the launcher's one port to it)."""
    lazy = []
    for path in sorted((ROOT / "launch" / "pipeswift_launch").glob("*.py")):
        lines = path.read_text().splitlines()
        for lineno, module in function_level_imports(path):
            assert not module.startswith("pipeswift_slurm.slurm"), f"{path.name}:{lineno} imports {module}"
            above = lineno - 2   # the reason: on the line, or above the block of imports it opens
            while above > 0 and lines[above].strip().startswith(("from ", "import ")) or not lines[above].strip():
                above -= 1
            assert "#" in lines[lineno - 1] or lines[above].strip().startswith("#"), \
                f"{path.name}:{lineno}: {module} without a reason"
            lazy.append(f"{path.name}:{module}")
    assert len(lazy) <= 12, lazy


#: modules the interpreter loads before any of ours (at start-up, through site): importing one
#: inside a function saves nothing
LOADED_AT_START_UP = {"os", "sys", "re", "time", "functools", "fnmatch", "pathlib", "stat", "io", "types", "enum",
                      "collections", "itertools", "contextlib", "abc", "warnings", "codecs", "operator", "keyword",
                      "reprlib", "errno"}
#: the login side's imports inside functions: this many at most (issue 60 counted 220 and moved 21
#: that saved nothing); a change may lower it, never raise it
MAX_LAZY_IMPORTS = 199


def test_the_login_side_imports_inside_functions_only_for_a_stated_reason():
    """Issue 60: pswift's commands start in tens of milliseconds because each loads only what
    it runs, so the login side keeps imports inside functions where start-up needs them. Each
    module that does says why, once, in a "# Imports inside functions: ..." line; none defers a
    module Python has loaded before ours; and their number only falls."""
    lazy = 0
    for path in sorted((ROOT / "pipeswift_slurm").rglob("*.py")):
        found = function_level_imports(path)
        if not found:
            continue
        rel = path.relative_to(ROOT).as_posix()
        free = sorted({m for _, m in found if m in LOADED_AT_START_UP})
        assert not free, f"{rel}: {free} are loaded at start-up: import them at the top"
        assert re.search(r"(?m)^# Imports inside functions: \S", path.read_text()), \
            f"{rel} imports inside functions without a '# Imports inside functions: <why>' line"
        lazy += len(found)
    assert lazy <= MAX_LAZY_IMPORTS, f"{lazy} imports inside functions (at most {MAX_LAZY_IMPORTS}): import at the top"


def test_python_loads_those_modules_before_ours():
    import subprocess
    import sys
    out = subprocess.run([sys.executable, "-c", "import sys; print(' '.join(sys.modules))"], capture_output=True,
                         text=True, check=True).stdout.split()
    assert LOADED_AT_START_UP <= set(out), LOADED_AT_START_UP - set(out)


#: the contracts at the package's top: what the login side and the job share, the ground floor
CONTRACTS = {"codes", "errors", "settings", "sections", "config", "configvalues", "plan", "events", "userfiles", "stats",
             "numeric", "durations", "eventlines", "figures", "progress", "terminal", "runfiles",
             "slurm.timespec"}   # Slurm's time syntax: its home is slurm/ (the format readers), the config checks [job] time by it


def test_the_contracts_are_the_ground_floor():
    """A contract imports only other contracts (lazily too): plan.json's builder lives in
    planning/ (it needs the planner), the layout rules there too (they cut by the partitioner);
    every other top-level module is a service over the folders (submit, autoplan, ...)."""
    files = modules_of(PACKAGES["pipeswift_slurm"])
    assert CONTRACTS <= set(files), CONTRACTS - set(files)
    above = [f"{m} imports {d}" for m in sorted(CONTRACTS)
             for d in sorted(imports_of(files[m], "pipeswift_slurm", set(files), m)) if d not in CONTRACTS]
    assert not above, above


def test_a_run_directorys_file_names_are_literals_in_runfiles_only():
    """Issue 60: runfiles names a run directory's files (submitit's JobPaths); no other module of
    the package, the launcher or the plugins spells one (code literals: a docstring may)."""
    import io
    import tokenize
    from pipeswift_slurm import runfiles
    names = {runfiles.PLAN, runfiles.EVENTS, runfiles.JOB_ID, runfiles.TOML, runfiles.SBATCH, runfiles.CANCEL,
             runfiles.SLURM_LOGS, runfiles.LAUNCHES, runfiles.HEARTBEATS, runfiles.METRICS_CSV}
    sources = [*PACKAGES["pipeswift_slurm"].rglob("*.py"), *PACKAGES["pipeswift_launch"].rglob("*.py"),
               *(ROOT / "plugins").rglob("*.py")]
    spelled = []
    for path in sources:
        if path.name == "runfiles.py":
            continue
        text = path.read_text()
        for tok in tokenize.generate_tokens(io.StringIO(text).readline):
            if tok.type == tokenize.STRING and tok.string[:1] in "'\"" and tok.string.strip("'\"") in names:
                spelled.append(f"{path.relative_to(ROOT)}:{tok.start[0]} {tok.string}")
    assert not spelled, spelled
    assert len(sources) > 50


def test_no_module_is_named_after_a_standard_library_module():
    """Issue 60: `numbers`, `queue` and `profile` read as the standard library's in a traceback
    and an import line; every module of the package and the launcher has a name of its own."""
    import sys
    names = {p.stem for root in PACKAGES.values() for p in root.rglob("*.py")} - {"__init__", "__main__"}
    assert len(names) > 40
    assert not names & sys.stdlib_module_names, sorted(names & sys.stdlib_module_names)


def test_slurms_text_formats_are_read_in_slurm_only():
    """Issue 60: srun's report and Slurm's time syntax have one reader each, in slurm/; no
    module outside it matches srun's words or parses a time with a pattern of its own."""
    formats = {"srun's report": re.compile(r"srun: error"), "Slurm's time syntax": re.compile(r"\(\?P<d>\\d\+\)-")}
    readers = {"srun's report": "slurm/srun.py", "Slurm's time syntax": "slurm/timespec.py"}
    root = PACKAGES["pipeswift_slurm"]
    sources = [*root.rglob("*.py"), *PACKAGES["pipeswift_launch"].rglob("*.py")]
    for what, pattern in formats.items():
        where = sorted(str(p.relative_to(root)) if p.is_relative_to(root) else p.name
                       for p in sources if pattern.search(p.read_text()))
        assert where == [readers[what]], (what, where)


def test_an_attempts_end_has_one_home_in_the_launcher():
    """Issue 60: the launcher builds decide's Budgets in one place and asks Slurm for a requeue
    in one place (outcome.py); train.py, afterlaunch.py and watchdog.py call it."""
    launcher = PACKAGES["pipeswift_launch"]
    budgets, requeues = [], []
    for path in sorted(launcher.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
                if node.func.attr == "Budgets":
                    budgets.append(path.name)
                if node.func.attr == "requeue" and isinstance(node.func.value, ast.Call):   # slurm().requeue(...)
                    requeues.append(path.name)
    assert budgets == ["outcome.py"] and requeues == ["outcome.py"], (budgets, requeues)
    # the requeued attempt's node count is the decision's: its rule is called from decide only
    callers = sorted(str(path.relative_to(ROOT)) for root in PACKAGES.values() for path in root.rglob("*.py")
                     if any(isinstance(n, ast.Call) and getattr(n.func, "id", getattr(n.func, "attr", None))
                            in ("requeue_target", "requeue_nodes") for n in ast.walk(ast.parse(path.read_text()))))
    assert callers == ["pipeswift_slurm/planning/decide.py"], callers


def test_the_cli_module_and_the_readme_stay_short():
    """Issue 60: cli/main.py is the group and the submit commands (the others load lazily from
    cli/runs.py, cli/model.py, cli/admin.py); the README is what a newcomer reads first."""
    assert len((PACKAGES["pipeswift_slurm"] / "cli" / "main.py").read_text().splitlines()) <= 400
    assert len((ROOT / "README.md").read_text().splitlines()) <= 300
