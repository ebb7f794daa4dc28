"""The trained model out of a run: ``python -m pipeswift_launch.export RUN_DIR [--step N] -o FILE``
(what `pswift export` runs, with the job's Python) writes one state dict, in the order of the
model's ``build_layers`` and loadable without pipelining; :func:`load_model` gives that model.

A checkpoint keeps each stage's part of DeepSpeed's ``PipelineModule``: a layer's parameters
under its global index (``3.attn.qkv.weight``), a weight tied across stages (``TiedLayerSpec``)
under ``tied_modules.KEY``. The unpipelined model is ``torch.nn.Sequential`` of the layers
``build_layers`` returns, built in order: a tied key's module is built once and shared by every
position that names it (its ``forward_fn``, if any, applied there), so the exported dict holds
the tied weight at each of those positions. The weights are the ones the pipeline computed
with (the model's, not the optimizer's fp32 master copy).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
from pathlib import Path
from typing import Any, Callable

import torch
from deepspeed.pipe import LayerSpec, TiedLayerSpec
from safetensors.torch import save
from torch import nn

from pipeswift_slurm import runfiles
from pipeswift_slurm.errors import OutputRefused
from pipeswift_slurm.userfiles import write_output

from . import ckptfiles as ckpt, gpt2
from .pipe import resolve


class ExportError(RuntimeError):
    """What keeps a run's model from being exported; ``str()`` is the one line to print."""


class _Applied(nn.Module):  # type: ignore[misc]
    """A tied layer's later position: the shared module, through its ``forward_fn``. The module
    is not registered again (its weights stay where it was first built)."""

    def __init__(self, module: nn.Module, fn: Callable[[nn.Module, Any], Any]) -> None:
        super().__init__()
        object.__setattr__(self, "_shared", module)
        self._fn = fn

    def forward(self, x: Any) -> Any:
        return self._fn(self._shared, x)


def _call(module: Any, x: Any) -> Any:
    return module(x)


class _Function(nn.Module):  # type: ignore[misc]
    """A plain function among the layers, as a module without parameters."""

    def __init__(self, fn: Callable[[Any], Any]) -> None:
        super().__init__()
        self._fn = fn

    def forward(self, x: Any) -> Any:
        return self._fn(x)


def _plan(run_dir: Path) -> dict[str, Any]:
    try:
        plan: dict[str, Any] = json.loads((run_dir / runfiles.PLAN).read_text())
    except (OSError, ValueError) as e:
        raise ExportError(f"{run_dir} is not a run directory (plan.json: {e})") from None
    return plan


def _specs(plan: dict[str, Any]) -> list[Any]:
    model = plan["model"]
    return list(resolve(model["entry"], model["dir"])(**model["kwargs"]))


def build_model(plan: dict[str, Any]) -> nn.Sequential:
    """The run's model without pipelining: its layers in order, a tied key's module shared."""
    tied: dict[str, nn.Module] = {}
    layers: list[nn.Module] = []
    for spec in _specs(plan):
        if isinstance(spec, TiedLayerSpec):
            if spec.key not in tied:
                tied[spec.key] = spec.build()
                layers.append(tied[spec.key] if spec.forward_fn is None else _Applied(tied[spec.key], spec.forward_fn))
            else:
                layers.append(_Applied(tied[spec.key], spec.forward_fn or _call))
        elif isinstance(spec, LayerSpec):
            layers.append(spec.build())
        elif isinstance(spec, nn.Module):
            layers.append(spec)
        else:                      # a plain function among the layers
            layers.append(_Applied(_Function(spec), _call))
    return nn.Sequential(*layers)


def checkpoint_at(run_dir: Path, step: int | None) -> Path:
    """The committed checkpoint of ``step`` (None: the newest) in the run directory."""
    done = ckpt.committed(run_dir / runfiles.CHECKPOINTS)
    if not done:
        raise ExportError(f"{run_dir} has no committed checkpoint yet: export it once it has trained and saved")
    if step is None:
        return done[-1]
    for path in done:
        if path.name == ckpt.tag_for(step):
            return path
    have = ", ".join(p.name.rsplit("_", 1)[-1].lstrip("0") or "0" for p in done)
    raise ExportError(f"{run_dir} has no committed checkpoint of step {step}; it has steps {have}")


def state_dict(run_dir: Path, step: int | None = None) -> tuple[dict[str, torch.Tensor], int]:
    """The model's state in ``torch.nn.Sequential``'s names, and the step it is of."""
    plan = _plan(run_dir)
    path = checkpoint_at(run_dir, step)
    try:
        saved = ckpt.read_all(path)["model"]
    except ckpt.CheckpointError as e:
        raise ExportError(str(e)) from None
    out = {name: t.clone() for name, t in saved.items() if not name.startswith("tied_modules.")}
    for i, spec in enumerate(_specs(plan)):
        if isinstance(spec, TiedLayerSpec):
            prefix = f"tied_modules.{spec.key}."
            out.update({f"{i}.{n[len(prefix):]}": t.clone() for n, t in saved.items() if n.startswith(prefix)})
    return out, int(ckpt.read_manifest(path)["step"])   # type: ignore[index]


def load_model(run_dir: str | os.PathLike[str], step: int | None = None) -> nn.Sequential:
    """The run's trained model, without pipelining (the newest committed checkpoint, or
    ``step``'s), in eval mode."""
    run = Path(run_dir)
    model = build_model(_plan(run))
    state, _ = state_dict(run, step)
    own = model.state_dict()
    missing = [k for k in own if k not in state]
    if missing:
        raise ExportError(f"the checkpoint of {run} holds no {', '.join(missing[:3])}: it was written by another model")
    model.load_state_dict({k: v for k, v in state.items() if k in own})
    return model.eval()


def export(run_dir: Path, out: Path, step: int | None = None) -> int:
    """Write the model's state dict (safetensors) to ``out`` whole (a new file renamed over it);
    returns the step it is of."""
    state, at = state_dict(run_dir, step)
    # shared storage (a tied weight) is written once per name: each name gets its own copy
    blob = save({k: v.contiguous().clone() for k, v in state.items()},
                metadata={"pswift_step": str(at), "pswift_run_dir": str(run_dir)})
    try:   # pswift's one output opener: a new file renamed over the name (a link there replaced)
        write_output(out, lambda f: f.write(blob))
    except OutputRefused as e:
        raise ExportError(str(e)) from None
    return at


def export_transformers(run_dir: Path, out: Path, step: int | None = None) -> int:
    """A Hugging Face folder (``GPT2LMHeadModel.from_pretrained(out)`` loads it) of a run of
    GPT-2 through pipeswift_launch.gpt2's layers; returns the step it is of."""
    specs = _specs(_plan(run_dir))
    if not gpt2.is_pipeline_of(specs):
        raise ExportError(f"{run_dir} is not a GPT-2 of pipeswift_launch.gpt2's layers: export it as one state "
                          f"dict (without --hf)")
    state, at = state_dict(run_dir, step)
    config, named = gpt2.transformers_state(specs, state)
    model = gpt2.transformers().GPT2LMHeadModel(config)
    missing, unexpected = model.load_state_dict(named, strict=False)
    missing = [k for k in missing if k != "lm_head.weight" and not k.endswith(".attn.bias")
               and not k.endswith(".attn.masked_bias")]   # tied to wte; buffers transformers makes
    if missing or unexpected:
        raise ExportError(f"{run_dir}: the checkpoint does not fill GPT2LMHeadModel (missing {missing[:3]}, "
                          f"unexpected {unexpected[:3]})")
    tmp = out.with_name(f".{out.name}.{os.getpid()}.tmp")
    model.save_pretrained(str(tmp))
    if out.is_dir() and not out.is_symlink():
        shutil.rmtree(out)
    elif out.exists() or out.is_symlink():
        out.unlink()
    os.replace(tmp, out)
    return at


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m pipeswift_launch.export")
    p.add_argument("run_dir", type=Path)
    p.add_argument("-o", "--output", type=Path, required=True)
    p.add_argument("--step", type=int)
    p.add_argument("--hf", action="store_true", help="a Hugging Face folder (GPT-2 runs)")
    a = p.parse_args(argv)
    try:
        at = (export_transformers if a.hf else export)(a.run_dir, a.output, a.step)
    except ExportError as e:
        print(f"Error: {e}", file=sys.stderr)
        return 1
    print(f"wrote {a.output}: the model of {a.run_dir} at step {at}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
