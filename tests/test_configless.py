"""Find Slurm as Slurm does (issue 38, item 2): a configless site (the controller serves its
configuration, each slurmd fetches it and links its copy at /run/slurm/conf), seen from a login
environment with no SLURM_CONF and no slurm.conf at the clients' default path. `pswift doctor`
is all OK, the example runs to COMPLETED through `pswift sbatch --wait`, and `install-plugins`
finds the folder of the controller's slurm.conf. Both Slurm versions."""

from __future__ import annotations

import fcntl
import os
import subprocess
import sys
from pathlib import Path
from typing import Iterator

import pytest

from helpers import CLUSTER, CLUSTER_DIR, DEV, PSWIFT, copy_example

pytestmark = [pytest.mark.slurm, pytest.mark.every_version]
CONFIGLESS_LOCK = "/tmp/pswift-configless.lock"


@pytest.fixture
def configless(cluster: str) -> Iterator[tuple[Path, dict[str, str]]]:
    """A configless dev cluster of this Slurm version (the main one runs beside it), and the
    environment of a login node that has no configuration of its own."""
    base = int(os.environ.get("PSWIFT_CLUSTER_CTLD_PORT") or DEV["PSWIFT_DEV_CTLD_PORT"])
    baseport = int(os.environ.get("PSWIFT_CLUSTER_BASEPORT") or DEV["PSWIFT_DEV_BASEPORT"])
    folder = Path(f"{CLUSTER_DIR}{DEV['PSWIFT_DEV_CONFIGLESS_SUFFIX']}")
    env = {**os.environ, "PSWIFT_PYTHON": sys.executable, "PSWIFT_CLUSTER_PLUGINS": "0",
           "PSWIFT_CLUSTER_DIR": str(folder), "PSWIFT_CLUSTER_NAME": "pswiftnoconf",
           "PSWIFT_CLUSTER_CTLD_PORT": str(base + int(DEV["PSWIFT_DEV_CONFIGLESS_CTLD_OFFSET"])),
           "PSWIFT_CLUSTER_BASEPORT": str(baseport + int(DEV["PSWIFT_DEV_CONFIGLESS_BASEPORT_OFFSET"])),
           "PSWIFT_CLUSTER_CONFIGLESS": "1", "PSWIFT_CLUSTER_NODES": "2"}
    # a configless slurmd links its copy at /run/slurm/conf, one per machine: `make test` runs
    # each version's configless cluster in a stream of its own, so they take turns
    with open(CONFIGLESS_LOCK, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        proc = subprocess.run([str(CLUSTER), "start"], capture_output=True, text=True, timeout=600, env=env)
        if proc.returncode != 0:
            pytest.fail(f"configless dev cluster did not start: {proc.stdout}\n{proc.stderr}")
        login = {k: v for k, v in os.environ.items() if k != "SLURM_CONF"}
        try:
            yield folder, login
        finally:
            subprocess.run([str(CLUSTER), "stop"], capture_output=True, text=True, timeout=300, env=env)


def run(args: list[str], env: dict[str, str], timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run([*PSWIFT, *args], capture_output=True, text=True, timeout=timeout, env=env)


def test_a_configless_site_from_a_login_node(configless, tmp_path):
    folder, login = configless
    assert Path("/run/slurm/conf/slurm.conf").is_file() and not Path("/etc/slurm/slurm.conf").exists()
    doctor = run(["doctor", "--db", str(tmp_path / "h.db")], login, timeout=300)
    assert doctor.returncode == 0, doctor.stdout + doctor.stderr
    assert "ok  Slurm configuration: /run/slurm/conf/slurm.conf (configless" in doctor.stdout, doctor.stdout
    assert "cluster pswiftnoconf" in doctor.stdout and "BAD" not in doctor.stdout
    toml = copy_example(tmp_path / "ex", {"steps": "6", "checkpoint_interval": "0"})
    done = run(["sbatch", "--wait", "--run-dir", str(tmp_path / "run"), str(toml)], login)
    assert done.returncode == 0 and "COMPLETED" in done.stdout, done.stdout + done.stderr
    plugins = run(["admin", "install-plugins", "--spool", str(tmp_path / "spool"), "--db", str(tmp_path / "h.db")],
                  login, timeout=120)
    assert plugins.returncode == 0, plugins.stderr
    assert f"installed {folder / 'etc' / 'job_submit.lua'}" in plugins.stdout, plugins.stdout
