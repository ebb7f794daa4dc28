"""Build the user's model as a DeepSpeed PipelineModule with the plan's explicit stage boundaries."""

from __future__ import annotations

import functools
import importlib
import sys
from typing import TYPE_CHECKING, Any, Callable

import torch
import torch.nn.functional as F
import torch.utils.checkpoint
from deepspeed.pipe import LayerSpec

from pipeswift_slurm.settings import LIMITS

from .ds_compat import ExplicitPipe

if TYPE_CHECKING:
    from pipeswift_slurm.plan import LayoutSpec, Plan


def resolve(entry: str, search_dir: str) -> Callable[..., Any]:
    """``module:function`` with the TOML's folder first on sys.path."""
    if search_dir not in sys.path:
        sys.path.insert(0, search_dir)
    module, func = entry.split(":")
    try:
        obj = getattr(importlib.import_module(module), func)
    except (ImportError, AttributeError) as e:
        raise RuntimeError(f"cannot load {entry!r} from {search_dir}: {e}") from None
    if not callable(obj):
        raise RuntimeError(f"{entry!r} is not callable")
    fn: Callable[..., Any] = obj
    return fn


def lm_cross_entropy(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Default loss: cross-entropy over the last dimension (works for (B, V) and (B, T, V))."""
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1))


def build_pipe(plan: Plan, layout: LayoutSpec) -> ExplicitPipe:
    model = plan["model"]
    layers = list(resolve(model["entry"], model["dir"])(**model["kwargs"]))
    n_expected = model["num_layers"]
    if len(layers) > LIMITS["layers"]:   # the planner, the events and the history stop there
        raise RuntimeError(f"{model['entry']} returned {len(layers)} layers; pswift plans at most "
                           f"{LIMITS['layers']}: group layers into blocks (a LayerSpec of a Sequential)")
    if n_expected is not None and len(layers) != n_expected:
        raise RuntimeError(f"{model['entry']} returned {len(layers)} layers but train.toml says "
                           f"{n_expected}; fix [model] num_layers/layer_costs")
    if layout["stages"] > len(layers):
        raise RuntimeError(f"{layout['stages']} stages > {len(layers)} layers: use fewer stages")
    loss_fn = resolve(model["loss"], model["dir"]) if model["loss"] else lm_cross_entropy
    seed_ok = all(isinstance(x, LayerSpec) for x in layers)
    return ExplicitPipe(
        layers, parts=layout["boundaries"], num_stages=layout["stages"], loss_fn=loss_fn,
        partition_method=layout["partition"] if layout["partition"] in ("uniform", "parameters")
        else "parameters",
        # same initial weights whatever the split (needs LayerSpecs): resumes are layout-portable
        seed_layers=seed_ok, base_seed=int(plan["training"]["seed"]),
        activation_checkpoint_interval=int(plan["training"]["activation_checkpoint_interval"]),
        # non-reentrant: a stage whose input needs no gradient (token ids) still gets its
        # parameters' gradients; dropout masks are replayed exactly in the recomputation
        activation_checkpoint_func=functools.partial(torch.utils.checkpoint.checkpoint, use_reentrant=False),
    )
