"""The console script's entry point (pipeswift_slurm.cli.entry): a planning command that does not
--wait runs without the cyclic collector and leaves through os._exit once its output is
flushed. Nothing it prints or writes may be lost, and its exit status is the command's."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest
from click.testing import CliRunner

from helpers import copy_example, pswift
from pipeswift_slurm.cli import entry


@pytest.mark.parametrize("argv,short", [
    (["sbatch", "train.toml"], True),
    (["plan", "--no-live", "train.toml"], True),
    (["sbatch", "--wait", "train.toml"], False),      # follows a job for hours: keeps the collector
    (["sbatch", "train.toml", "--", "--wait"], False),  # sbatch's own --wait: as long
    (["history", "jobs"], False),
    ([], False),
])
def test_only_a_planning_command_that_does_not_wait_is_short_lived(argv, short):
    assert entry.short_lived(argv) is short


@pytest.mark.parametrize("code,status,says", [(None, 0, ""), (0, 0, ""), (2, 2, ""), (257, 1, ""),
                                              ("no such file", 1, "no such file\n")])
def test_an_exit_code_is_the_status_the_interpreter_would_give(code, status, says, capsys):
    assert entry.exit_code(code) == status
    assert capsys.readouterr().err == says


CHILD = r"""
import sys
from pipeswift_slurm.cli import entry
def command():
    sys.stdout.write("x" * 1_000_000 + "\n")   # more than a pipe holds: written through
    sys.stdout.write("end\n")                   # left in the buffer (a pipe's stdout is block-buffered)
    print("said on stderr", file=sys.stderr)
    raise SystemExit(int(sys.argv[1]))
entry.run_then_exit(command)
print("never reached")
"""


@pytest.mark.parametrize("status", [0, 3])
def test_a_fast_exit_flushes_everything_and_keeps_the_status(status):
    buffered = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}
    proc = subprocess.run([sys.executable, "-c", CHILD, str(status)], capture_output=True, text=True, env=buffered)
    assert proc.returncode == status
    assert proc.stdout == "x" * 1_000_000 + "\nend\n"
    assert proc.stderr == "said on stderr\n"


def test_the_real_command_through_the_entry_point_prints_and_writes_all_it_would(tmp_path, monkeypatch):
    """`pswift sbatch --dry-run` and `pswift plan --json` through the console script's entry (fast
    exit) print what the CLI prints in-process; a bad TOML is one line and exit 2."""
    from pipeswift_slurm.cli.main import cli
    toml = copy_example(tmp_path / "ex")
    monkeypatch.chdir(tmp_path)
    env = {"PSWIFT_HOME": str(tmp_path / "home"), "PSWIFT_DB": str(tmp_path / "h.db")}
    proc = pswift("plan", "--no-live", "--json", str(toml), env=env, cwd=str(tmp_path))
    assert proc.returncode == 0, proc.stderr
    in_process = CliRunner().invoke(cli, ["plan", "--no-live", "--json", str(toml)], env=env)
    assert in_process.exit_code == 0, in_process.output
    assert json.loads(proc.stdout)["chosen"] == json.loads(in_process.stdout)["chosen"]
    script = pswift("sbatch", "--dry-run", str(toml), env=env, cwd=str(tmp_path))
    assert script.returncode == 0, script.stderr
    assert masked(script.stdout) == masked(in_process_script(cli, toml, env))
    bad = copy_example(tmp_path / "bad", {"steps": '"many"'})
    proc = pswift("sbatch", str(bad), env=env, cwd=str(tmp_path))
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.strip() == f"Error: {bad.resolve()}: [training] steps must be an integer, got string 'many'"


def in_process_script(cli, toml, env) -> str:
    out = CliRunner().invoke(cli, ["sbatch", "--dry-run", str(toml)], env=env)
    assert out.exit_code == 0, out.output
    return out.stdout


def masked(script: str) -> str:
    """The batch script with its run directory's name (date and a random suffix) masked, and the
    files a --dry-run script carries (they hold that name and the time of the plan)."""
    assert script.startswith("#!/bin/bash\n") and script.count("\n") > 50
    script = re.sub(r"<<'PSWIFT_EOF'.*?\nPSWIFT_EOF\n", "<<'PSWIFT_EOF' CARRIED\n", script, flags=re.S)
    return re.sub(r"pswift-runs/[^/\s]+", "pswift-runs/RUN", script)


def test_every_usage_error_is_one_line(tmp_path):
    """Issue 59: a folder given where a file is expected (and any other usage error) got click's
    three lines of usage text; it is one line, saying where the options are listed."""
    for args, says in ((["plan", str(tmp_path)], "is a directory"), (["sbatch", "--nodez", "1", "t.toml"], "--nodez"),
                       (["nosuch"], "No such command"), (["simulate", "--width", "5"], "20<=x<=1000")):
        proc = pswift(*args)
        assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and says in proc.stderr, proc.stderr
        assert "--help`)" in proc.stderr
