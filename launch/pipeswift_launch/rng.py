"""Every random generator a rank draws from (torch CPU and CUDA, numpy, Python), as JSON.

A checkpoint keeps each rank's generators (``rng.json``, written by rank 0 with the manifest's
checksum). Resuming in the same layout restores each rank's own: a model with dropout then
resumes bitwise. In another layout a rank's generator has no counterpart (the layers it runs
drew from other processes' streams), so every rank is seeded from (seed, step, rank): a
resumed run is still deterministic, but its dropout masks differ from an uninterrupted run's.
"""

from __future__ import annotations

import base64
import random
from typing import Any

import numpy as np
import torch

#: the largest rng.json a rank reads (about 20 kB a rank)
MAX_BYTES = 64 << 20


def _b64(t: torch.Tensor) -> str:
    return base64.b64encode(t.numpy().tobytes()).decode()


def _tensor(text: str) -> torch.Tensor:
    return torch.frombuffer(bytearray(base64.b64decode(text)), dtype=torch.uint8)


def capture() -> dict[str, Any]:
    """This process's generator states, JSON-able."""
    name, keys, pos, has_gauss, gauss = np.random.get_state()
    version, internal, gauss_next = random.getstate()
    return {
        "torch": _b64(torch.get_rng_state()),
        "cuda": [_b64(s) for s in torch.cuda.get_rng_state_all()] if torch.cuda.is_available() else [],
        "numpy": [str(name), [int(k) for k in keys], int(pos), int(has_gauss), float(gauss)],
        "python": [version, list(internal), gauss_next],
    }


def restore(state: dict[str, Any]) -> None:
    """Set this process's generators to ``state`` (from :func:`capture`). rng.json is the user's
    file: anything that is not a generator state (a wrong shape, values out of range that
    overflow numpy's or Python's setters) raises ValueError, and the caller seeds instead."""
    try:
        torch.set_rng_state(_tensor(state["torch"]))
        if state.get("cuda") and torch.cuda.is_available():
            torch.cuda.set_rng_state_all([_tensor(s) for s in state["cuda"]])
        name, keys, pos, has_gauss, gauss = state["numpy"]
        np.random.set_state((name, np.array(keys, dtype=np.uint32), pos, has_gauss, gauss))
        version, internal, gauss_next = state["python"]
        random.setstate((version, tuple(internal), gauss_next))
    except Exception as e:   # OverflowError, TypeError, KeyError, RuntimeError, binascii.Error...
        raise ValueError(f"not a generator state ({type(e).__name__})") from None


def reseed(seed: int, step: int, rank: int) -> None:
    """Seed every generator from (seed, step, rank): deterministic, distinct per rank."""
    value = (seed * 1_000_003 + step) * 65_537 + rank
    torch.manual_seed(value)
    np.random.seed(value % 2**32)
    random.seed(value)
