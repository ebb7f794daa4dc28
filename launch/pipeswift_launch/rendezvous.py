"""How a launch's ranks find each other, and prove they belong to it.

Rank 0 opens torch.distributed's store on a port the kernel chooses (none a formula gives, so
none another user can hold in advance) and publishes its address and a random secret of this
launch in ``rendezvous.json`` in the launch's own folder (``$PSWIFT_LAUNCH_DIR``: the batch
script makes one a launch, `pswift run` too), readable by the job's user only; the other ranks
read it there (the run directory is on the file system every node of the job shares). Store
keys live under a prefix made from the secret. Before anything else crosses the group, every
rank proves it knows the secret: an HMAC of its rank, all-gathered as a tensor and checked by
every rank. A process that reached the store without the file (another user who found the
port) is refused there, and the launch stops rather than train with it. No collective carries
pickles (:mod:`pipeswift_launch.collectives`).

A launch by hand, without ``$PSWIFT_LAUNCH_DIR``, rendezvouses as torch does (env://).
"""

from __future__ import annotations

import datetime
import hashlib
import hmac
import json
import os
import re
import secrets
import socket
import stat
import sys
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from pipeswift_slurm.userfiles import create_private

from .dist_env import LaunchEnvError

FILE = "rendezvous.json"
#: a run of members: the epoch's folder, where rank 0 publishes for every member's ranks
#: (pipeswift_launch.members); else the launch's own folder ($PSWIFT_LAUNCH_DIR)
EPOCH_ENV = "PSWIFT_RENDEZVOUS_DIR"


def folder_of(env: Any) -> str | None:
    """The folder this launch's rank 0 publishes the rendezvous in; None: a launch by hand."""
    folder = env.get(EPOCH_ENV) or env.get("PSWIFT_LAUNCH_DIR")
    return str(folder) if folder else None
#: how long the other ranks wait for rank 0's file, and the store for every rank
TIMEOUT_S = 600.0
#: a collective's timeout: longer than rank 0 may ask Slurm through an outage of slurmctld
#: (PSWIFT_SLURM_OUTAGE_S, 600 s in a job) while the others wait for its decision
GROUP_TIMEOUT = datetime.timedelta(seconds=1800)
_READ_MAX = 4096
#: a test hook: the rank that reads a wrong secret (a process that does not know it)
FAULT_WRONG_SECRET_ENV = "PSWIFT_FAULT_WRONG_SECRET"


class RendezvousError(LaunchEnvError):
    """The launch cannot rendezvous safely (one line; the launcher exits 2, no restart into it)."""


def _publish(folder: Path, record: dict[str, Any]) -> None:
    """Write the record readable by this user only, whole or not at all (never over an
    earlier launch's: each launch has its own folder)."""
    if not create_private(folder / FILE, json.dumps(record).encode()):
        raise RendezvousError(f"{folder / FILE} already exists: a launch folder serves one launch")


def _read(path: Path, deadline: float) -> dict[str, Any]:
    """Rank 0's record, once it is there: a regular file of this user that no one else may
    read, not a link, bounded."""
    while True:
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
            break
        except FileNotFoundError:
            if time.monotonic() > deadline:
                raise RendezvousError(f"rank 0 published no {path} within {TIMEOUT_S:.0f} s") from None
            time.sleep(0.05)
        except OSError as e:
            raise RendezvousError(f"{path} not read: {e.strerror} (a link is not followed)") from None
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(f.fileno())
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o077:
            raise RendezvousError(f"{path} is not this user's private file (mode {stat.S_IMODE(st.st_mode):o})")
        blob = f.read(_READ_MAX + 1)
    try:
        rec = json.loads(blob) if len(blob) <= _READ_MAX else None
    except ValueError:
        rec = None
    if not (isinstance(rec, dict) and isinstance(rec.get("host"), str) and isinstance(rec.get("port"), int)
            and isinstance(rec.get("secret"), str) and re.fullmatch(r"[0-9a-f]{64}", rec["secret"])):
        raise RendezvousError(f"{path} is not a rendezvous record")
    return rec


#: the listening sockets of this process's stores (the store serves on their descriptors)
_LISTENING: list[socket.socket] = []


def _master_store(master_addr: str, world_size: int, timeout: datetime.timedelta) -> Any:
    """Rank 0's store, listening on the job's own address only (the one the other ranks are
    given), on a port the kernel chooses: a socket bound there is handed to the store. Where
    that address is not this host's (a site's odd MASTER_ADDR), on every interface, as torch's
    own store does, said in one line."""
    try:
        family = socket.AF_INET6 if ":" in master_addr else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.bind((master_addr, 0))
        sock.listen(max(128, world_size))
    except OSError as e:
        print(f"pswift: cannot listen on {master_addr} ({e.strerror or e}); the rendezvous store listens on every "
              f"interface (its secret still admits only this launch's ranks)", file=sys.stderr, flush=True)
        return dist.TCPStore("0.0.0.0", 0, world_size, True, timeout=timeout, wait_for_workers=False)
    _LISTENING.append(sock)
    return dist.TCPStore(master_addr, sock.getsockname()[1], world_size, True, timeout=timeout,
                         wait_for_workers=False, master_listen_fd=sock.fileno())


def init_group(backend: str, rank: int, world_size: int, master_addr: str, folder: str | None) -> str | None:
    """Initialise torch.distributed's default group for this launch; returns its secret (None
    for a launch by hand, env://)."""
    timeout = datetime.timedelta(seconds=TIMEOUT_S)
    if not folder:
        dist.init_process_group(backend, rank=rank, world_size=world_size, timeout=GROUP_TIMEOUT)
        return None
    path = Path(folder) / FILE
    if rank == 0:
        store = _master_store(master_addr, world_size, timeout)
        rec = {"host": master_addr, "port": int(store.port), "secret": secrets.token_hex(32)}
        _publish(Path(folder), rec)
        print(f"pswift: rendezvous at {master_addr}:{rec['port']} (rank 0's choice; its secret in {path})",
              flush=True)
    else:
        rec = _read(path, time.monotonic() + TIMEOUT_S)
        store = dist.TCPStore(rec["host"], rec["port"], world_size, False, timeout=timeout)
    secret = str(rec["secret"])
    if os.environ.get(FAULT_WRONG_SECRET_ENV) == str(rank):
        secret = secrets.token_hex(32)
    prefix = hashlib.sha256(f"pswift-store:{rec['secret']}".encode()).hexdigest()[:32]
    os.environ["MASTER_PORT"] = str(rec["port"])
    dist.init_process_group(backend, store=dist.PrefixStore(prefix, store), rank=rank, world_size=world_size,
                            timeout=GROUP_TIMEOUT)
    return secret


def proof(secret: str, rank: int) -> bytes:
    """What rank ``rank`` shows: an HMAC of its rank under the launch's secret (the secret never
    crosses the network; one rank's proof is no use as another's)."""
    return hmac.new(bytes.fromhex(secret), f"pswift-rank:{rank}".encode(), hashlib.sha256).digest()


def prove(secret: str | None, rank: int, world_size: int, device: Any) -> None:
    """Every rank, before any other collective: all-gather each rank's proof of the secret and
    check every one; raises RendezvousError naming a rank that did not prove it."""
    if secret is None:
        return
    mine = torch.frombuffer(bytearray(proof(secret, rank)), dtype=torch.uint8).to(device)
    got = [torch.empty_like(mine) for _ in range(world_size)]
    dist.all_gather(got, mine)
    for r, t in enumerate(got):
        if not hmac.compare_digest(bytes(t.cpu().tolist()), proof(secret, r)):
            raise RendezvousError(f"rank {r} of this launch did not prove its secret: a process that did not "
                                  f"read {FILE} joined the rendezvous; the launch stops rather than train with it")
