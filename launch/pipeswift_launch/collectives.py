"""Collectives of plain data (JSON in uint8 tensors) instead of torch's object collectives,
which pickle what they send and unpickle what they receive: a rank takes nothing from another
but numbers, strings, lists and dicts. Sizes are all-gathered first, so every rank knows how
much comes; one message is at most MAX_BYTES."""

from __future__ import annotations

import json
from typing import Any

import torch
import torch.distributed as dist

#: the largest message (a profile of 512 layers with instruction times is well under 2 MiB)
MAX_BYTES = 64 << 20


def _encode(obj: Any, device: Any) -> Any:
    blob = json.dumps(obj, separators=(",", ":"), allow_nan=True).encode()
    if len(blob) > MAX_BYTES:
        raise ValueError(f"a collective message of {len(blob)} bytes (over {MAX_BYTES})")
    return torch.frombuffer(bytearray(blob), dtype=torch.uint8).to(device) if blob else \
        torch.zeros(0, dtype=torch.uint8, device=device)


def _decode(t: Any, n: int) -> Any:
    return json.loads(bytes(t[:n].cpu().tolist()).decode())


def all_gather(obj: Any, world_size: int, group: Any = None, device: Any = "cpu") -> list[Any]:
    """Every rank's ``obj``, in rank order, on every rank."""
    mine = _encode(obj, device)
    sizes = [torch.zeros(1, dtype=torch.int64, device=device) for _ in range(world_size)]
    dist.all_gather(sizes, torch.tensor([mine.numel()], dtype=torch.int64, device=device), group=group)
    n = [int(s.item()) for s in sizes]
    if max(n) > MAX_BYTES:
        raise ValueError(f"a rank sent a collective message of {max(n)} bytes (over {MAX_BYTES})")
    padded = torch.zeros(max(n), dtype=torch.uint8, device=device)
    padded[:mine.numel()] = mine
    out = [torch.empty_like(padded) for _ in range(world_size)]
    dist.all_gather(out, padded, group=group)
    return [_decode(t, k) for t, k in zip(out, n)]


def broadcast(obj: Any, src: int, rank: int, group: Any = None, device: Any = "cpu") -> Any:
    """``src``'s ``obj`` on every rank (the others pass anything, e.g. None)."""
    mine = _encode(obj if rank == src else None, device)
    size = torch.tensor([mine.numel()], dtype=torch.int64, device=device)
    dist.broadcast(size, src, group=group)
    n = int(size.item())
    if n > MAX_BYTES:
        raise ValueError(f"rank {src} sent a collective message of {n} bytes (over {MAX_BYTES})")
    buf = mine if rank == src else torch.empty(n, dtype=torch.uint8, device=device)
    dist.broadcast(buf, src, group=group)
    return _decode(buf, n)


class StepFlags:
    """Numbers every rank agrees on at each step's end, the largest over the ranks (stop, a
    checkpoint due...), on a gloo group of their own with CPU tensors: no device is synchronised
    for them, and nothing else (the pipeline's transfers, the background checkpoint's side
    group) shares their order.

    Two ways, every rank taking the same at the same step: :meth:`agree` all-reduces ``mine``
    and waits; :meth:`post` starts that all-reduce without waiting and :meth:`take` (at the next
    step's end) returns its result: the wait a step's end would spend on the slowest rank is
    spent inside the next step instead, and what the ranks agree on is a step late. Where every
    rank posted one slot set (a stop Slurm signalled to every task at once), :meth:`early` lets
    them all act on the posted flags at once instead."""

    def __init__(self, n: int) -> None:
        self.mine = [0.0] * n
        self.group = dist.new_group(backend="gloo")
        self.posted: tuple[Any, Any] | None = None     # (the all-reduce's work or None once waited, its tensor)
        self.sent: list[float] = []                      # ``mine`` as posted

    def agree(self) -> list[float]:
        """Every rank's ``mine``, the largest of each over the ranks (a collective: every rank
        calls), waiting for it: a post taken at once."""
        self.post()
        return self.take() or []

    def post(self) -> None:
        """Start the all-reduce of ``mine`` (every rank posts at the same step; :meth:`take` ends
        it). Each slot travels twice, as itself and negated: the largest of the negated ones is
        the smallest over the ranks, for :meth:`early`."""
        self.sent = list(self.mine)
        t = torch.tensor(self.sent + [-x for x in self.sent])
        self.posted = (dist.all_reduce(t, op=dist.ReduceOp.MAX, group=self.group, async_op=True), t)

    def _wait(self) -> tuple[list[float], list[float]]:
        """The posted all-reduce's largest and smallest of each slot over the ranks (waiting for it)."""
        assert self.posted is not None
        work, t = self.posted
        if work is not None:
            work.wait()
            self.posted = (None, t)
        both, n = [float(x) for x in t.tolist()], len(self.sent)
        return both[:n], [-x for x in both[n:]]

    def take(self) -> list[float] | None:
        """The posted all-reduce's result (waiting for it), or None where none was posted."""
        if self.posted is None:
            return None
        largest, _ = self._wait()
        self.posted = None
        return largest

    def early(self, slot: int) -> list[float] | None:
        """Where this rank posted ``slot`` set: wait for the posted flags now; when every rank
        posted it set, they are every rank's now (each of them waits here and acts on them at
        this step; nothing is left to take). Else None: a rank that did not set it does not wait,
        so every rank takes them at the next step's end, as :meth:`take` would."""
        if self.posted is None or not self.sent[slot]:
            return None
        largest, smallest = self._wait()
        if not smallest[slot]:
            return None
        self.posted = None
        return largest
