"""Type checking as part of the test command (issue 26): mypy, configured in pyproject.toml,
strict on every module of pipeswift_slurm and the launcher."""

from __future__ import annotations

import subprocess
import sys

try:   # Python 3.11+
    import tomllib
except ModuleNotFoundError:   # pragma: no cover - 3.10
    import tomli as tomllib

from helpers import ROOT


def test_mypy_is_clean():
    proc = subprocess.run([sys.executable, "-m", "mypy"], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]


def test_no_module_is_left_unchecked_and_the_contracts_are_strict():
    """No override turns errors off or loosens a module's checks beyond subclassing torch's and
    DeepSpeed's classes (Any to mypy, not followed); the contracts get the whole of strict."""
    cfg = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["mypy"]
    assert cfg["strict"] is True and set(cfg["files"]) == {"pipeswift_slurm", "launch/pipeswift_launch"}
    ours = [o for o in cfg.get("overrides", []) if any(m.startswith("pipeswift") for m in o["module"])]
    for o in ours:
        assert set(o) == {"module", "disallow_subclassing_any"}, o
        assert set(o["module"]) <= {"pipeswift_launch.gpt2", "pipeswift_launch.ds_compat"}, o
    for contract in ("config", "plan", "events", "planning.decide", "settings"):
        assert not any(f"pipeswift_slurm.{contract}" in o["module"] for o in ours), contract
