"""The wheel an admin installs: built from the source, installed alone, it carries the Slurm-side
plugins, `pswift admin install-plugins` puts them where slurmctld looks and the installed
jobcomp wrapper merges a record; one version everywhere; the license declared once."""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import subprocess
import sys
import zipfile
from pathlib import Path

from helpers import JOBCOMP_ENV, ROOT

from pipeswift_slurm import __version__

SKIP = shutil.ignore_patterns(".git", ".venv", "__pycache__", "build", "*.egg-info", "test-artifacts",
                              "pswift-runs", "results", ".hypothesis")


def build_wheel(tmp_path: Path) -> Path:
    src = tmp_path / "src"
    shutil.copytree(ROOT, src, ignore=SKIP, symlinks=True)
    proc = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
                           "-w", str(tmp_path / "dist"), str(src)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "deprecat" not in proc.stderr.lower(), proc.stderr     # setuptools' license-table warning
    (whl,) = (tmp_path / "dist").glob("pipeswift_slurm-*.whl")
    return whl


def test_the_wheel_installs_alone_with_its_plugins_one_version_and_the_license(tmp_path):
    whl = build_wheel(tmp_path)
    names = zipfile.ZipFile(whl).namelist()
    assert {"pipeswift_plugins/job_submit.lua", "pipeswift_plugins/jobcomp_pswift.py"} <= set(names)
    (meta_name,) = [n for n in names if n.endswith(".dist-info/METADATA")]
    meta = zipfile.ZipFile(whl).read(meta_name).decode()
    assert f"\nVersion: {__version__}\n" in meta and "\nLicense-Expression: Apache-2.0\n" in meta
    assert "Classifier: Topic :: System :: Distributed Computing" in meta
    assert any(n.endswith(".dist-info/licenses/LICENSE") for n in names)
    # installed alone (its dependencies are this venv's), first on the path
    site = tmp_path / "site"
    proc = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(site),
                           str(whl)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    env = {**os.environ, "PYTHONPATH": str(site)}
    probe = subprocess.run([sys.executable, "-c", "import json, importlib.metadata as m, pipeswift_slurm as p; "
                            "print(json.dumps([p.__file__, m.version('pipeswift-slurm')]))"],
                           capture_output=True, text=True, env=env, check=True, cwd=tmp_path)
    where, version = json.loads(probe.stdout)
    assert Path(where).is_relative_to(site) and version == __version__
    pswift = [sys.executable, "-m", "pipeswift_slurm.cli.entry"]   # the console script's entry point
    got = subprocess.run([*pswift, "--version"], capture_output=True, text=True, env=env, check=True,
                         cwd=tmp_path).stdout
    assert got.strip() == f"pswift, version {version}"
    # the examples ship in it: `pswift init` from the wheel alone writes one that plans
    assert {"pipeswift_examples/tiny-gpt/train.toml", "pipeswift_examples/gpt2/make_tokens.py"} <= set(names)
    subprocess.run([*pswift, "init", "-p", "low", "proj"], env=env, check=True, cwd=tmp_path, capture_output=True)
    assert (tmp_path / "proj" / "model.py").read_bytes() == (ROOT / "examples" / "tiny-gpt" / "model.py").read_bytes()
    plan = subprocess.run([*pswift, "plan", "--no-live", "proj/train.toml"], env=env, cwd=tmp_path,
                          capture_output=True, text=True)
    assert plan.returncode == 0, plan.stderr
    # the plugins, from the installed package, where an admin's slurm.conf points
    etc, spool, db = tmp_path / "etc", tmp_path / "spool", tmp_path / "h.db"
    etc.mkdir()
    out = subprocess.run([*pswift, "admin", "install-plugins", "--prefix", str(etc), "--spool", str(spool),
                          "--db", str(db)], capture_output=True, text=True, env=env, check=True,
                         cwd=tmp_path).stdout
    assert f"installed {etc / 'job_submit.lua'}" in out and f"  JobCompLoc={etc / 'pswift-jobcomp'}" in out
    assert "  JobSubmitPlugins=lua" in out and "  JobCompType=jobcomp/script" in out
    assert (etc / "job_submit.lua").read_text() == (ROOT / "plugins" / "job_submit.lua").read_text()
    wrapper = etc / "pswift-jobcomp"
    assert os.stat(wrapper).st_mode & 0o777 == 0o755
    assert str(site / "pipeswift_plugins" / "jobcomp_pswift.py") in wrapper.read_text()
    # slurmctld's call: the job's record in the environment, nothing on the command line
    ran = subprocess.run([str(wrapper)], env={**env, **JOBCOMP_ENV}, capture_output=True, text=True, timeout=60,
                         cwd=tmp_path)
    assert ran.returncode == 0, ran.stderr
    (row,) = sqlite3.connect(db).execute("SELECT job_id, state, user FROM slurm_jobs").fetchall()
    assert row == ("777", "COMPLETED", "alice")


def test_install_plugins_refuses_a_link_or_relative_paths_in_one_line(tmp_path):
    (tmp_path / "real").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "real")
    pswift = [sys.executable, "-m", "pipeswift_slurm.cli.main", "admin", "install-plugins"]
    for args, says in (([ "--prefix", str(tmp_path / "link")], "is not a folder (a link is not followed)"),
                       (["--prefix", str(tmp_path / "real"), "--db", "h.db"], "--db h.db: give an absolute path")):
        proc = subprocess.run([*pswift, *args], capture_output=True, text=True)
        assert proc.returncode == 2 and says in proc.stderr, proc.stderr
        assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr
    assert list((tmp_path / "real").iterdir()) == []


def test_install_plugins_never_replaces_a_sites_own_job_submit_silently(tmp_path):
    """A site's job_submit.lua there: the install stops, naming it and the diff to look at, the
    file byte for byte the same and nothing else written; --force replaces it and keeps the old
    one beside it; a second install of the same files changes nothing."""
    etc = tmp_path / "etc"
    etc.mkdir()
    site = "-- the site's own rules\nfunction slurm_job_submit() return slurm.SUCCESS end\n"
    (etc / "job_submit.lua").write_text(site)
    pswift = [sys.executable, "-m", "pipeswift_slurm.cli.main", "admin", "install-plugins", "--prefix", str(etc),
              "--spool", str(tmp_path / "spool"), "--db", str(tmp_path / "h.db")]
    proc = subprocess.run(pswift, capture_output=True, text=True)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
    assert f"{etc / 'job_submit.lua'} exists and differs" in proc.stderr and "diff " in proc.stderr
    assert (etc / "job_submit.lua").read_text() == site and sorted(p.name for p in etc.iterdir()) == ["job_submit.lua"]
    assert not (tmp_path / "spool").exists()
    out = subprocess.run([*pswift, "--force"], capture_output=True, text=True, check=True).stdout
    (backup,) = etc.glob("job_submit.lua.pswift-backup-*")
    assert backup.read_text() == site and f"kept the old one as {backup}" in out
    assert (etc / "job_submit.lua").read_text() == (ROOT / "plugins" / "job_submit.lua").read_text()
    assert (etc / "pswift_job_submit.lua").read_text() == (ROOT / "plugins" / "pswift_job_submit.lua").read_text()
    assert os.stat(tmp_path / "spool").st_mode & 0o7777 == 0o750
    again = subprocess.run(pswift, capture_output=True, text=True)
    assert again.returncode == 0 and len(list(etc.glob("*.pswift-backup-*"))) == 1, again.stderr
    moved = [*pswift[:-4], "--spool", str(tmp_path / "spool2"), "--db", str(tmp_path / "h2.db")]
    upgrade = subprocess.run(moved, capture_output=True, text=True)   # pswift's own files: replaced
    assert upgrade.returncode == 0 and len(list(etc.glob("*.pswift-backup-*"))) == 1, upgrade.stderr
    assert f"--spool {tmp_path / 'spool2'} --db {tmp_path / 'h2.db'}" in (etc / "pswift-jobcomp").read_text()


def test_install_plugins_refuses_an_interpreter_root_should_not_run(tmp_path):
    """slurmctld runs the wrapper's interpreter as root: one in a folder others can write to (a
    user's venv, a shared scratch) is refused, and nothing is written."""
    import pytest
    from pipeswift_slurm.errors import UsageError
    from pipeswift_slurm.slurm.plugins_install import install, root_safe
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)                                  # writable by all, no sticky bit
    py = shared / "python"
    py.symlink_to(sys.executable)
    etc = tmp_path / "etc"
    etc.mkdir()
    with pytest.raises(UsageError, match=r"slurmctld would run the interpreter .* as root, but .* is writable by other users"):
        install(etc, tmp_path / "spool", tmp_path / "h.db", python=str(py))
    assert list(etc.iterdir()) == []
    assert root_safe(Path(sys.executable)) is None and root_safe(Path("/tmp")) is None   # /tmp is sticky
    assert "writable by other users" in root_safe(shared)


def test_install_plugins_knows_its_files_by_hash_and_backs_up_an_edited_one(tmp_path):
    """Issue 57: a site job_submit.lua that kept pswift's first two lines but added its own rules
    was taken for pswift's and overwritten without a backup. pswift's files are recognised by the
    hashes the install recorded; an edited one is kept as a backup before it is replaced, and the
    wrapper runs Python isolated (-I)."""
    from pipeswift_slurm.slurm.plugins_install import MANIFEST, install
    etc = tmp_path / "etc"
    etc.mkdir()
    first = install(etc, tmp_path / "spool", tmp_path / "h.db")
    assert (etc / MANIFEST).exists() and first.backups == []
    assert " -I " in (etc / "pswift-jobcomp").read_text()
    ours = (etc / "job_submit.lua").read_text()
    edited = ours + "\n-- the site's own rule\nfunction site_rule() return 0 end\n"
    (etc / "job_submit.lua").write_text(edited)
    again = install(etc, tmp_path / "spool2", tmp_path / "h.db")       # the wrapper changes: recorded, replaced
    (backup,) = again.backups
    assert backup.name.startswith("job_submit.lua.pswift-backup-") and backup.read_text() == edited
    assert (etc / "job_submit.lua").read_text() == ours
    assert len(list(etc.glob("pswift-jobcomp.pswift-backup-*"))) == 0       # pswift's own, by its hash


def test_install_plugins_refuses_a_package_file_others_can_write(tmp_path, monkeypatch):
    """Issue 57: root_safe checked the interpreter and the plugin, not the package it imports.
    Every file the interpreter imports from must be root's and writable by no one else."""
    import pytest
    from pipeswift_slurm.errors import UsageError
    from pipeswift_slurm.slurm import plugins_install
    pkg = tmp_path / "site" / "pipeswift_slurm"
    pkg.mkdir(parents=True)
    (pkg / "store.py").write_text("# imported by the plugin, as root\n")
    (pkg / "store.py").chmod(0o664)
    assert "is writable by its group" in plugins_install.tree_unsafe(tmp_path / "site")
    real = plugins_install.import_roots
    monkeypatch.setattr(plugins_install, "import_roots", lambda python: [*real(python), tmp_path / "site"])
    etc = tmp_path / "etc"
    etc.mkdir()
    with pytest.raises(UsageError, match=r"importing from .*site, but .*store.py is writable by its group"):
        plugins_install.install(etc, tmp_path / "spool", tmp_path / "h.db")
    assert list(etc.iterdir()) == []
