"""Where a job's micro-batches come from: every source is a pure function of
(seed, step, micro-batch index), so a resumed run -- in any layout -- reads exactly the samples
the uninterrupted run would have read, and a checkpoint's position is its step.

plan.json's ``training.data`` (checked at plan time by pipeswift_slurm.config) is one of:

- ``"module:function"``: ``function(step, index, micro_batch_size, seed, **model kwargs)`` returns
  ``(inputs, labels)``;
- ``{"tokens": path, "dtype": "uint16" | "uint32", "seq_len": L}``: a flat array of token ids on
  disk (the format nanoGPT-style pipelines write), memory-mapped; each sequence starts at an
  offset drawn from (seed, step, index); labels are the inputs shifted by one token;
- ``{"dataset": "module:function", "kwargs": {...}}``: ``function(**kwargs)`` returns a map-style
  torch Dataset of ``(inputs, labels)``; sample ``g`` of the run (``step x global batch + index
  x micro-batch size + j``) is item ``permutation(seed, epoch)[g mod len]``, a new permutation
  every epoch.

``index`` counts the micro-batches of one step over all data-parallel ranks (rank r's i-th is
``r x m + i``), so the split into ranks does not change which samples a step reads.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Literal

import numpy as np
import torch
from torch.utils.data import default_collate

from .pipe import resolve

if TYPE_CHECKING:
    from pipeswift_slurm.plan import Plan

Batch = tuple[torch.Tensor, torch.Tensor]


class TokenFile:
    """Random windows of a memory-mapped token file."""

    def __init__(self, path: str, dtype: str, seq_len: int) -> None:
        self.tokens: Any = np.memmap(path, dtype=np.dtype(dtype), mode="r")
        self.seq_len = int(seq_len)
        if len(self.tokens) < self.seq_len + 2:
            raise RuntimeError(f"{path} holds {len(self.tokens)} tokens, fewer than seq_len + 2 = "
                               f"{self.seq_len + 2}; use a longer file or a shorter seq_len")

    def __call__(self, step: int, index: int, micro_batch_size: int, seed: int, **_: Any) -> Batch:
        rng = np.random.default_rng([seed, step, index])
        starts = rng.integers(0, len(self.tokens) - self.seq_len, size=micro_batch_size)
        windows = np.stack([self.tokens[s:s + self.seq_len + 1] for s in starts]).astype(np.int64)
        return torch.from_numpy(windows[:, :-1].copy()), torch.from_numpy(windows[:, 1:].copy())


class MapDataset:
    """A map-style Dataset read in a permutation per epoch, by the run's global sample number."""

    def __init__(self, dataset: Any, global_batch_size: int) -> None:
        self.dataset, self.global_batch_size = dataset, int(global_batch_size)
        self.size = len(dataset)
        if self.size < 1:
            raise RuntimeError("the dataset is empty")
        self._perm: tuple[tuple[int, int], np.ndarray] | None = None

    def _item(self, seed: int, sample: int) -> Any:
        epoch, pos = divmod(sample, self.size)
        if self._perm is None or self._perm[0] != (seed, epoch):
            self._perm = ((seed, epoch), np.random.default_rng([seed, epoch]).permutation(self.size))
        return self.dataset[int(self._perm[1][pos])]

    def __call__(self, step: int, index: int, micro_batch_size: int, seed: int, **_: Any) -> Batch:
        first = step * self.global_batch_size + index * micro_batch_size
        batch: Batch = default_collate([self._item(seed, g) for g in range(first, first + micro_batch_size)])
        return batch


def source(plan: Plan, key: Literal["data", "eval_data"] = "data") -> Callable[..., Batch]:
    """The job's micro-batch function, ``f(step=, index=, micro_batch_size=, seed=, **kwargs)``,
    of [training] data, or (``key`` "eval_data") of the validation data when it has its own."""
    spec, model_dir = plan["training"][key], plan["model"]["dir"]
    if spec is None:
        raise ValueError(f"[training] {key} is not set")
    if isinstance(spec, str):
        return resolve(spec, model_dir)
    if "tokens" in spec:
        return TokenFile(spec["tokens"], spec["dtype"], spec["seq_len"])
    dataset = resolve(spec["dataset"], model_dir)(**spec["kwargs"])
    return MapDataset(dataset, plan["training"]["global_batch_size"])
