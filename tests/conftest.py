"""Shared fixtures. Tests marked `slurm` use the real local dev cluster (scripts/slurm-dev-cluster),
started here if it is not running; tests marked `deepspeed` train for real on CPU."""

from __future__ import annotations

import os
import pwd
import subprocess
import sys
from pathlib import Path
from typing import Iterator

import pytest

from helpers import CLUSTER, CLUSTER_DIR, DEV, USER, Reference, copy_example


@pytest.fixture
def example(tmp_path: Path) -> Path:
    return copy_example(tmp_path / "tiny-gpt", {"steps": "12", "checkpoint_interval": "0"})


@pytest.fixture
def background_reference(tmp_path: Path) -> Iterator:
    """Start the uninterrupted reference run of a TOML now (``helpers.Reference``); ``.wait()``
    gives its run directory. One still running when the test ends is killed."""
    started: list[Reference] = []

    def start(toml: Path, nodes: int) -> Reference:
        started.append(Reference(toml, tmp_path, nodes))
        return started[-1]
    yield start
    for ref in started:
        ref.kill()


@pytest.fixture(autouse=True)
def _pswift_home(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("PSWIFT_HOME", str(tmp_path_factory.mktemp("pswift-home")))


FAST_TIER = os.environ.get("PSWIFT_TEST_TIER") == "fast"
CLUSTER_FIXTURES = {"cluster", "acct_cluster"}


def pytest_collection_modifyitems(config, items):
    """A test that asks for a dev cluster is a Slurm test, marked or not (so `-m "not slurm"`,
    the fast tier, never selects it)."""
    for item in items:
        if CLUSTER_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.slurm)


def _refuse_in_fast_tier(what: str) -> None:
    if FAST_TIER:
        pytest.fail(f"the fast tier (make test-fast) starts no Slurm daemon, but this test asked for {what}: "
                    "mark it `slurm`", pytrace=False)


@pytest.fixture(scope="session")
def cluster() -> str:
    """SLURM_CONF of the running dev cluster (started if needed)."""
    _refuse_in_fast_tier("the dev cluster")
    proc = subprocess.run([str(CLUSTER), "start"], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PSWIFT_PYTHON": sys.executable})
    if proc.returncode != 0:
        pytest.fail(f"dev cluster did not start: {proc.stdout}\n{proc.stderr}")
    conf = CLUSTER_DIR / "etc" / "slurm.conf"
    if not conf.is_file():
        pytest.fail(f"the dev cluster started but {conf} is missing: {proc.stdout}")
    os.environ["SLURM_CONF"] = str(conf)
    return str(conf)


@pytest.fixture(scope="session")
def acct_cluster() -> Iterator[str]:
    """SLURM_CONF of a second dev cluster of the same Slurm version beside the main one, with real
    accounting (MariaDB + slurmdbd) and QOS preemption (standby preempted by normal); stopped at
    the end of the session. Tests point SLURM_CONF at it with monkeypatch."""
    _refuse_in_fast_tier("the accounting dev cluster")
    base = int(os.environ.get("PSWIFT_CLUSTER_CTLD_PORT") or DEV["PSWIFT_DEV_CTLD_PORT"])
    baseport = int(os.environ.get("PSWIFT_CLUSTER_BASEPORT") or DEV["PSWIFT_DEV_BASEPORT"])
    folder = f"{CLUSTER_DIR}{DEV['PSWIFT_DEV_ACCT_SUFFIX']}"
    env = {**os.environ, "PSWIFT_PYTHON": sys.executable, "PSWIFT_CLUSTER_PLUGINS": "0",
           "PSWIFT_CLUSTER_DIR": folder, "PSWIFT_CLUSTER_NAME": "pswiftacct",
           "PSWIFT_CLUSTER_CTLD_PORT": str(base + int(DEV["PSWIFT_DEV_ACCT_CTLD_OFFSET"])),
           "PSWIFT_CLUSTER_BASEPORT": str(baseport + int(DEV["PSWIFT_DEV_ACCT_BASEPORT_OFFSET"])),
           "PSWIFT_CLUSTER_ACCOUNTING": "1", "PSWIFT_CLUSTER_PREEMPT": "qos",
           "PSWIFT_CLUSTER_MAX_BATCH_REQUEUE": "5",   # Slurm's default (24.05+ only)
           # finished jobs leave the controller within ~90 s (MinJobAge + its 60 s purge pass):
           # `pswift status` of a forgotten job is tested here, against slurmdbd
           "PSWIFT_CLUSTER_MIN_JOB_AGE": "30"}
    proc = subprocess.run([str(CLUSTER), "start"], capture_output=True, text=True, timeout=600, env=env)
    if proc.returncode != 0:
        pytest.fail(f"accounting dev cluster did not start: {proc.stdout}\n{proc.stderr}")
    yield f"{folder}/etc/slurm.conf"
    subprocess.run([str(CLUSTER), "stop"], capture_output=True, text=True, timeout=300, env=env)


@pytest.fixture(scope="session")
def other_user() -> pwd.struct_passwd:
    """An unprivileged user (created once; tests run as root like the plugin)."""
    if os.geteuid() != 0:
        pytest.skip("needs root, as the jobcomp plugin runs")
    try:
        return pwd.getpwnam(USER)
    except KeyError:
        subprocess.run(["useradd", "--create-home", "--shell", "/bin/bash", USER], check=True)
        return pwd.getpwnam(USER)


@pytest.fixture
def public_tmp() -> Path:
    """A folder the unprivileged user can reach (pytest's own tmp_path is under a 0700 folder)."""
    import shutil
    import tempfile
    d = Path(tempfile.mkdtemp(prefix="pswift-sec-", dir="/tmp"))
    d.chmod(0o755)
    yield d
    shutil.rmtree(d, ignore_errors=True)
