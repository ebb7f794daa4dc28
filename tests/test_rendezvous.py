"""A launch's rendezvous nobody else can predict or join (issue 37): rank 0 chooses the port and
publishes it with a secret of the launch in a file only the job's user reads; every rank proves
the secret before anything else crosses the group (pipeswift_launch/rendezvous.py)."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from helpers import copy_example, pswift, run_events
from pipeswift_launch import rendezvous


GOOD = {"host": "127.0.0.1", "port": 29500, "secret": "ab" * 32}


def _write(path: Path, record: object, mode: int = 0o600) -> Path:
    path.write_text(json.dumps(record))
    path.chmod(mode)
    return path


@pytest.mark.parametrize("make,says", [
    (lambda d: _write(d / "rendezvous.json", GOOD, 0o644), r"not this user's private file \(mode 644\)"),
    (lambda d: (d / "rendezvous.json").symlink_to(_write(d / "elsewhere", GOOD)), "a link is not followed"),
    (lambda d: _write(d / "rendezvous.json", {**GOOD, "secret": "guessable"}), "is not a rendezvous record"),
    (lambda d: _write(d / "rendezvous.json", {**GOOD, "port": "29500"}), "is not a rendezvous record"),
    (lambda d: _write(d / "rendezvous.json", "x" * 10_000), "is not a rendezvous record"),
])
def test_the_rendezvous_file_is_read_only_as_this_users_private_record(tmp_path, make, says):
    make(tmp_path)
    with pytest.raises(rendezvous.RendezvousError, match=says):
        rendezvous._read(tmp_path / "rendezvous.json", time.monotonic() + 1)


def test_a_file_of_another_user_is_not_read(public_tmp, other_user):
    path = _write(public_tmp / "rendezvous.json", GOOD)
    os.chown(path, other_user.pw_uid, other_user.pw_gid)
    with pytest.raises(rendezvous.RendezvousError, match="not this user's private file"):
        rendezvous._read(path, time.monotonic() + 1)


def test_rank_0_never_writes_over_another_launchs_record(tmp_path):
    rendezvous._publish(tmp_path, GOOD)
    assert (tmp_path / "rendezvous.json").stat().st_mode & 0o777 == 0o600
    with pytest.raises(rendezvous.RendezvousError, match="a launch folder serves one launch"):
        rendezvous._publish(tmp_path, {**GOOD, "port": 1})
    assert json.loads((tmp_path / "rendezvous.json").read_text()) == GOOD
    assert [p.name for p in tmp_path.iterdir()] == ["rendezvous.json"]


def test_each_ranks_proof_is_its_own():
    assert rendezvous.proof(GOOD["secret"], 0) != rendezvous.proof(GOOD["secret"], 1)
    assert rendezvous.proof(GOOD["secret"], 1) != rendezvous.proof("cd" * 32, 1)


@pytest.mark.deepspeed
def test_a_rank_that_does_not_know_the_secret_stops_the_local_launch(tmp_path):
    toml = copy_example(tmp_path / "ex", {"steps": "4", "checkpoint_interval": "0"})
    proc = pswift("run", "--nodes", "2", "--run-dir", str(tmp_path / "run"), str(toml),
                  env={rendezvous.FAULT_WRONG_SECRET_ENV: "1"}, timeout=300)
    assert proc.returncode != 0
    assert "did not prove its secret" in proc.stdout + proc.stderr
    assert [e for e in run_events(tmp_path / "run") if e["event"] == "step"] == []


HOLD = r'''
import resource, socket, sys, time
resource.setrlimit(resource.RLIMIT_NOFILE, (resource.getrlimit(resource.RLIMIT_NOFILE)[1],) * 2)
held = []
for port in [*range(20000, 32000), 29500]:
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        s.bind(("0.0.0.0", port))
        s.listen(8)
        held.append(s)
    except OSError:
        s.close()
print(len(held), flush=True)
time.sleep(3600)
'''


@pytest.mark.slurm
@pytest.mark.deepspeed
def test_a_job_completes_while_another_user_holds_every_port_a_formula_could_give(
        cluster, tmp_path, other_user):
    """Another local user holds 20000-31999 (where the job-id formula of earlier versions put
    the port) and torch's 29500 before the job starts: the job completes on a port rank 0 chose.
    Then a job one of whose ranks reads a wrong secret (the test hook): refused, nothing trained."""
    holder = subprocess.Popen(["runuser", "-u", other_user.pw_name, "--", "/usr/bin/python3", "-c", HOLD],
                              stdout=subprocess.PIPE, text=True, start_new_session=True)
    try:
        assert int(holder.stdout.readline()) >= 11_900, "the other user could not hold the ports"
        toml = copy_example(tmp_path / "ex", {"steps": "6", "checkpoint_interval": "0"})
        run = tmp_path / "run"
        proc = pswift("sbatch", "--wait", "--run-dir", str(run), str(toml))
        assert proc.returncode == 0, proc.stdout + proc.stderr
        log = next(run.glob("slurm-*.out")).read_text()
        port = int(re.search(r"pswift: rendezvous at \S+:(\d+) \(rank 0's choice", log).group(1))
        assert not 20000 <= port < 32000 and port != 29500, log[-2000:]
        assert [e["step"] for e in run_events(run) if e["event"] == "step"] == list(range(1, 7))

        bad = tmp_path / "bad"
        proc = pswift("sbatch", "--wait", "--run-dir", str(bad), str(toml),
                      env={rendezvous.FAULT_WRONG_SECRET_ENV: "1"})
        assert proc.returncode == 1, proc.stdout + proc.stderr
        log = next(bad.glob("slurm-*.out")).read_text()
        assert "did not prove its secret" in log, log[-3000:]
        assert [e for e in run_events(bad) if e["event"] == "step"] == []
    finally:
        os.killpg(holder.pid, signal.SIGKILL)    # runuser and the holder it started
        holder.wait()


def test_rank_0s_store_listens_on_the_jobs_address_only():
    """Issue 57: the store listened unauthenticated on 0.0.0.0 (a local user could tie it up on
    any interface). It listens on the address the ranks are given: 127.0.0.2 on the same host
    is refused where 127.0.0.1 answers (with 0.0.0.0 both did)."""
    import datetime
    import socket
    store = rendezvous._master_store("127.0.0.1", 1, datetime.timedelta(seconds=10))
    store.set("k", "v")
    with socket.create_connection(("127.0.0.1", store.port), timeout=5):
        pass
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.2", store.port), timeout=5).close()
    assert store.get("k") == b"v"
