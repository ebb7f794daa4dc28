"""`pswift init` (issue 42, item 1): a project from nothing, from the examples shipped in the
wheel, planned on the site's partition, never replacing a file. Through Slurm:
tests/test_sbatch_cli.py asks the dev cluster for its default partition, and every test that
copies the example (tests/helpers.copy_example) trains what init writes."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from helpers import ROOT, pswift
from pipeswift_slurm import starter


@pytest.mark.parametrize("example", sorted(starter.EXAMPLES))
def test_init_writes_the_shipped_example_and_plan_accepts_it_as_written(tmp_path, example):
    dest = tmp_path / "new" / "project"
    proc = pswift("init", "--example", example, "-p", "batch", str(dest), env={"SLURM_CONF": "/nonexistent"})
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr
    shipped = sorted(p.name for p in (ROOT / "examples" / example).iterdir() if p.suffix in (".py", ".toml"))
    assert sorted(p.name for p in dest.iterdir()) == shipped
    for name in shipped:
        ours, theirs = (dest / name).read_text(), (ROOT / "examples" / example / name).read_text()
        if name != "train.toml":
            assert ours == theirs
    changed = [(a, b) for a, b in zip(theirs.splitlines(), ours.splitlines()) if a != b]
    assert len(changed) == 1 and changed[0][1].startswith('partition = "batch"') and "pswift init" in changed[0][1]
    assert f"wrote {dest / 'train.toml'}" in proc.stdout and f"pswift sbatch --wait {dest / 'train.toml'}" in proc.stdout
    for step in starter.EXAMPLES[example]:    # what init says to run first (gpt2: its token file)
        cmd = step.format(dir=dest).split()
        assert cmd[0] == "python"
        subprocess.run([sys.executable, *cmd[1:], "--min-tokens", "20000"], check=True, capture_output=True, timeout=120)
    if example == "tiny-gpt":      # its layer costs are measured: the planner ranks layouts
        plan = pswift("plan", "--no-live", "--json", str(dest / "train.toml"))
        assert plan.returncode == 0, plan.stderr
        assert json.loads(plan.stdout)["chosen"] is not None
    else:                          # none: the first run profiles it, on one stage per slot
        dry = pswift("sbatch", "--dry-run", str(dest / "train.toml"), env={"SLURM_CONF": "/nonexistent"})
        assert dry.returncode == 0 and dry.stdout.startswith("#!/bin/bash"), dry.stderr
        # issue 59: `plan` of it as written says what sbatch will run, not "nothing to plan with"
        plan = pswift("plan", "--no-live", str(dest / "train.toml"))
        assert plan.returncode == 0 and "no per-layer costs yet" in plan.stdout, plan.stderr
        assert "layouts: 2 node(s): 2 stage(s) x 1 dp" in plan.stdout and "request: --nodes=" in plan.stdout
        as_json = json.loads(pswift("plan", "--no-live", "--json", str(dest / "train.toml"), check=True).stdout)
        assert as_json["chosen"] is None and as_json["layouts"]


def test_init_without_slurm_keeps_the_examples_partition_and_says_so(tmp_path):
    proc = pswift("init", str(tmp_path / "p"), env={"SLURM_CONF": "/nonexistent"}, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.count("\n") == 1 and "set [job] partition in train.toml" in proc.stderr
    assert 'partition = "low"' in (tmp_path / "p" / "train.toml").read_text()


@pytest.mark.parametrize("setup, args, says", [
    ("model.py", [], "already has model.py: give another folder"),
    ("file", [], "is not a folder"),
    ("link", [], "is not a folder"),
    ("", ["-p", "a b"], "partition 'a b': give a Slurm partition name"),
    ("", ["--example", "llama"], "Invalid value for '--example'"),
])
def test_init_refuses_in_one_line_and_writes_nothing(tmp_path, setup, args, says):
    dest = tmp_path / "p"
    if setup == "file":
        dest.write_text("mine")
    elif setup == "link":
        dest.symlink_to(tmp_path / "nowhere")
    elif setup:
        dest.mkdir()
        (dest / setup).write_text("mine")
    before = sorted(tmp_path.rglob("*"))
    proc = pswift("init", *args, "-p", "batch", str(dest)) if "-p" not in args else pswift("init", *args, str(dest))
    assert proc.returncode == 2 and says in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr
    assert proc.stderr.count("\n") == 1   # click's usage errors too (issue 59): one line
    assert sorted(tmp_path.rglob("*")) == before
    if setup not in ("", "link"):
        assert (dest if setup == "file" else dest / setup).read_text() == "mine"


def test_the_gpt2_examples_token_script_works_outside_the_checkout(tmp_path):
    starter.init(tmp_path / "g", "gpt2")
    out = tmp_path / "g" / "tokens.bin"
    proc = subprocess.run([sys.executable, str(tmp_path / "g" / "make_tokens.py"), str(out), "--min-tokens", "5000"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert out.stat().st_size >= 10000 and b"def " in out.read_bytes()[::2]   # uint16 of the sources' bytes


def test_init_refuses_a_folder_of_someone_else_or_one_others_can_write(public_tmp, other_user):
    """Issue 57: the folder is opened once, checked (the caller's own, writable by no one else)
    and the files are made in it, never by a path looked up again."""
    import os
    theirs = public_tmp / "theirs"
    theirs.mkdir()
    os.chown(theirs, other_user.pw_uid, other_user.pw_gid)
    shared = public_tmp / "shared"
    shared.mkdir()
    shared.chmod(0o775)
    for dest, says in ((theirs, f"belongs to uid {other_user.pw_uid}"), (shared, "others can write to it")):
        proc = pswift("init", "-p", "batch", str(dest))
        assert proc.returncode != 0 and says in proc.stderr and proc.stderr.count("\n") == 1, proc.stderr
        assert list(dest.iterdir()) == []
