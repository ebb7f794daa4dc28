"""The hardware a launch runs on, measured at its start; the planner fits its model from it.

Every launch measures, in well under a second:

- **point-to-point latency and bandwidth between neighbouring stages**: a ping-pong of a
  4-byte and a 4 MiB tensor between stage s and s+1 of every pipeline (even links, then odd
  ones, so no rank is in two exchanges at once), each the fastest of its round trips; the
  bandwidth is the 4 MiB transfer's, latency included (:func:`link_figures`); the job reports
  its slowest link (the pipeline waits on it): the largest latency and the smallest bandwidth;
- **device memory per rank**: the GPU's total memory, or on CPU the host's memory divided by
  the ranks that share it;
- **ranks per host and the host's cores**: how many ranks of the job share one machine (the
  dev cluster's virtual nodes all run on one) and how many cores it has.

Rank 0 writes them in the launch's ``start`` event; the history keeps them per attempt and
:func:`pipeswift_slurm.history.queries` gives the planner their medians
(:func:`pipeswift_slurm.autoplan.hardware`).
"""

from __future__ import annotations

import hashlib
import os
import socket
import time
from typing import Any

import torch
import torch.distributed as dist

from . import ds_compat

SMALL_ELEMENTS = 1            # float32: 4 bytes, the latency
BIG_ELEMENTS = 1 << 20        # float32: 4 MiB, the bandwidth
SMALL_ROUNDS = 20
BIG_ROUNDS = 4
#: no transfer is timed faster than this (a timer's resolution): the figures stay finite
MIN_SECONDS = 1e-7
#: bytes/s: above any link there is (NVLink 4 is 0.9e12), below what the events schema keeps
MAX_BANDWIDTH = 5e12


def measure(engine: Any, device: str) -> dict[str, Any]:
    """This launch's hardware as the ``start`` event carries it (every rank calls it)."""

    stage, stages, ranks = ds_compat.stage_ranks(engine)
    where = torch.device("cuda", torch.cuda.current_device()) if device == "cuda" else torch.device("cpu")
    link = torch.zeros(2, dtype=torch.float64, device=where)   # [latency s, 1 / bandwidth s/B]
    for parity in (0, 1):
        dist.barrier()
        if stage % 2 == parity and stage + 1 < stages:
            link = torch.maximum(link, torch.tensor(_ping(ranks[stage + 1], where), dtype=torch.float64,
                                                    device=where))
        elif stage >= 1 and (stage - 1) % 2 == parity:
            _pong(ranks[stage - 1], where)
    dist.all_reduce(link, op=dist.ReduceOp.MAX)
    host = torch.tensor([_host_id()], dtype=torch.int64, device=where)
    hosts = [torch.zeros_like(host) for _ in range(dist.get_world_size())]
    dist.all_gather(hosts, host)
    sharing = sum(int(h.item() == host.item()) for h in hosts)
    latency, per_byte = (float(x) for x in link.tolist())
    return {"device": device, "p2p_latency_s": latency if stages > 1 else None,
            "p2p_bandwidth": 1.0 / per_byte if stages > 1 and per_byte > 0 else None,
            "device_memory": _device_memory(device, sharing), "ranks_per_host": sharing,
            "host_cores": os.cpu_count()}


def _exchange(peer: int, t: torch.Tensor, first: bool) -> None:
    if first:
        dist.send(t, peer)
        dist.recv(t, peer)
    else:
        dist.recv(t, peer)
        dist.send(t, peer)


def _timed(peer: int, where: torch.device, elements: int, rounds: int) -> float:
    """Seconds of one one-way transfer of ``elements`` float32: the fastest of ``rounds`` round
    trips, halved (the least disturbed by whatever else the host runs)."""
    t = torch.zeros(elements, dtype=torch.float32, device=where)
    _exchange(peer, t, True)    # warm-up: the peer may still be arriving
    best = float("inf")
    for _ in range(rounds):
        start = time.perf_counter()
        _exchange(peer, t, True)
        if where.type == "cuda":
            torch.cuda.synchronize()
        best = min(best, time.perf_counter() - start)
    return best / 2


def _ping(peer: int, where: torch.device) -> tuple[float, float]:
    """(latency s, seconds per byte) of the link to ``peer``, from the initiating side. The
    bandwidth is the 4 MiB transfer's own, latency included (a noisy latency can then never
    make it absurd), bounded to what the events schema keeps."""
    return link_figures(_timed(peer, where, SMALL_ELEMENTS, SMALL_ROUNDS),
                        _timed(peer, where, BIG_ELEMENTS, BIG_ROUNDS))


def link_figures(small_s: float, big_s: float) -> tuple[float, float]:
    """(latency s, seconds per byte) from the timed one-way transfers of the small and the big
    tensor, whatever the timer said (a big transfer timed faster than the small one included)."""
    return max(small_s, MIN_SECONDS), max(big_s, 4 * BIG_ELEMENTS / MAX_BANDWIDTH) / (4 * BIG_ELEMENTS)


def _pong(peer: int, where: torch.device) -> None:
    for elements, rounds in ((SMALL_ELEMENTS, SMALL_ROUNDS), (BIG_ELEMENTS, BIG_ROUNDS)):
        t = torch.zeros(elements, dtype=torch.float32, device=where)
        for _ in range(rounds + 1):
            _exchange(peer, t, False)


def _host_id() -> int:
    """The same number on every rank of one machine (its boot id and name), another elsewhere."""
    try:
        with open("/proc/sys/kernel/random/boot_id", "rb") as f:
            boot = f.read(64)
    except OSError:
        boot = b""
    digest = hashlib.sha256(boot + socket.gethostname().encode()).digest()
    return int.from_bytes(digest[:7], "big")


def _device_memory(device: str, sharing: int) -> int | None:
    if device == "cuda":
        return int(torch.cuda.get_device_properties(torch.cuda.current_device()).total_memory)
    try:
        return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")) // max(1, sharing)
    except (ValueError, OSError):
        return None
