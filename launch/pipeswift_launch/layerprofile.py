"""Per-layer forward+backward times measured during the first steps of an attempt.

Forward: module pre/post hooks. Backward: autograd hooks on the layer's output (its gradient
arrives: the layer's backward starts) and input (its gradient is ready: the backward ends). A
first layer whose input needs no gradient gets 2x its forward as backward. Under ZB-H1 that
backward is B (input gradients) and the layer's share of each weight pass W is timed apart
(:meth:`LayerProfiler.weight_time`): its seconds are F + B + W as 1F1B's are F + backward, and
W is reported on its own. Times are per
micro-batch on this rank's device, as the planner and the simulator use them. Memory: each
layer's output, and (without activation checkpointing, whose own saved-tensor hooks must stay
innermost) the bytes autograd saves for its backward: every tensor packed during its forward
once, parameters left out.
"""

from __future__ import annotations

import time
from collections import defaultdict
from typing import Any, Callable

import torch

from . import ds_compat

#: steps of each attempt (counted from its first step) that are profiled; step 1 is warm-up
PROFILE_STEPS = range(2, 5)


class LayerProfiler:
    def __init__(self, module: Any, sync: bool, saved: bool = True) -> None:
        self.sync, self.saved = sync, saved
        self.fwd: dict[int, list[float]] = defaultdict(list)
        self.bwd: dict[int, list[float]] = defaultdict(list)
        self.wgrad: dict[int, list[float]] = defaultdict(list)   # ZB-H1: each W's share per layer
        self._wgrad_pass: dict[int, float] = defaultdict(float)
        self.act_bytes: dict[int, int] = {}
        self.saved_bytes: dict[int, int] = {}
        self.param_bytes: dict[int, int] = {}
        self.handles: list[Any] = []
        self.active = False
        for idx, layer in ds_compat.stage_layers(module):
            # fp32 bytes whatever the precision: the cost model scales them (costmodel.STATE_BYTES)
            self.param_bytes[idx] = 4 * sum(p.numel() for p in layer.parameters())
            self.handles.append(layer.register_forward_pre_hook(self._pre(idx)))
            self.handles.append(layer.register_forward_hook(self._post(idx)))

    def weight_time(self, layer: int, seconds: float) -> None:
        """ZB-H1: ``seconds`` of the current weight pass spent on ``layer``'s weights."""
        self._wgrad_pass[layer] += seconds

    def weight_pass_done(self) -> None:
        """ZB-H1: one weight pass (one micro-batch's weight gradients) is over."""
        for layer, seconds in self._wgrad_pass.items():
            self.wgrad[layer].append(seconds)
        self._wgrad_pass.clear()

    def now(self) -> float:
        """A timestamp that (on CUDA) includes the device's work queued so far."""
        return self._now()

    def _now(self) -> float:
        if self.sync:
            torch.cuda.synchronize()
        return time.perf_counter()

    def _pre(self, idx: int) -> Callable[[Any, Any], None]:
        def hook(mod: Any, inputs: Any) -> None:
            if self.active:
                if self.saved:
                    mod._pswift_saved = self._saved_counter(idx)
                    mod._pswift_saved.__enter__()
                mod._pswift_t0 = self._now()
        return hook

    def _saved_counter(self, idx: int) -> Any:
        """Saved-tensor hooks counting what this layer's forward keeps for its backward (each
        storage once, parameters and their views left out); tensors pass through unchanged."""
        seen: set[int] = set()
        total = [0]

        def pack(t: Any) -> Any:
            base = t._base if t._base is not None else t
            if not (base.is_leaf and base.requires_grad):
                key = t.untyped_storage().data_ptr()
                if key not in seen:
                    seen.add(key)
                    total[0] += t.untyped_storage().nbytes()
            self.saved_bytes[idx] = total[0]
            return t

        return torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t)

    def _post(self, idx: int) -> Callable[[Any, Any, Any], None]:
        def hook(mod: Any, inputs: Any, output: Any) -> None:
            if not self.active:
                return
            self.fwd[idx].append(self._now() - mod._pswift_t0)
            if self.saved and getattr(mod, "_pswift_saved", None) is not None:
                mod._pswift_saved.__exit__(None, None, None)
                mod._pswift_saved = None
                self.saved_bytes.setdefault(idx, 0)
            out = output[0] if isinstance(output, (tuple, list)) else output
            inp: Any = inputs[0] if isinstance(inputs, (tuple, list)) and inputs else None
            if torch.is_tensor(out):
                self.act_bytes[idx] = out.numel() * out.element_size()
            if torch.is_tensor(out) and out.requires_grad and torch.is_tensor(inp) and inp.requires_grad:
                mark: dict[str, float] = {}

                def out_grad(g: Any) -> None:
                    mark["t"] = self._now()

                def in_grad(g: Any) -> None:
                    if "t" in mark:
                        self.bwd[idx].append(self._now() - mark["t"])

                out.register_hook(out_grad)
                inp.register_hook(in_grad)
        return hook

    def result(self) -> dict[str, Any]:
        """{seconds: {layer: fwd+bwd}, weight_seconds: {layer: ZB-H1's W, part of seconds},
        param_bytes, activation_bytes, samples} for this stage."""
        def med(xs: list[float]) -> float:
            return sorted(xs)[len(xs) // 2]
        seconds, weight_seconds = {}, {}
        for idx, f in self.fwd.items():
            fwd = med(f)
            bwd = med(self.bwd[idx]) if self.bwd.get(idx) else 2.0 * fwd
            seconds[str(idx)] = fwd + bwd
            if self.wgrad.get(idx):
                weight_seconds[str(idx)] = med(self.wgrad[idx])
                seconds[str(idx)] += weight_seconds[str(idx)]
        return {"seconds": seconds, "weight_seconds": weight_seconds,
                "param_bytes": {str(k): v for k, v in self.param_bytes.items()},
                "activation_bytes": {str(k): v for k, v in self.act_bytes.items()},
                "saved_bytes": {str(k): v for k, v in self.saved_bytes.items()},
                "samples": min((len(v) for v in self.fwd.values()), default=0)}

    def remove(self) -> None:
        for h in self.handles:
            h.remove()
        self.handles = []
        self.active = False


#: the instructions whose CPU time the timer keeps too (on CPU): the compute passes
CPU_TIMED = ("ForwardPass", "BackwardPass", "WeightPass")


class InstructionTimer:
    """Seconds per step this rank spends in each DeepSpeed pipeline instruction.

    Wraps the engine's instruction table on the instance (DeepSpeed looks it up through
    ``self``), so only this engine is affected; ``remove()`` puts back the table it had. The
    training loop adds each profiled step's wall time as ``step``. Receive times include
    waiting for the neighbour stage; the planner's cost model uses the others (forward,
    backward, loading, sending, the optimizer) to tell the engine's overheads apart. On CPU the
    passes' CPU time is kept beside their wall time (``ForwardPass:cpu`` and so on: this
    thread's, where torch computes with one thread a rank): where ranks share cores, a pass's
    wall time stretches with what runs beside it, its CPU time does not."""

    def __init__(self, engine: Any, sync: bool) -> None:
        self.engine, self.sync, self.active = engine, sync, False
        self.seconds: dict[str, float] = defaultdict(float)
        self.steps = 0
        table = ds_compat.instruction_table(engine)
        self.before = ds_compat.set_instruction_table(engine, {k: self._timed(k.__name__, f)
                                                               for k, f in table.items()})

    def _timed(self, name: str, fn: Any) -> Any:
        cpu = None if self.sync or name not in CPU_TIMED else f"{name}:cpu"

        def run(engine: Any, *args: Any, **kwargs: Any) -> Any:
            if not self.active:
                return fn(engine, *args, **kwargs)
            if self.sync:
                torch.cuda.synchronize()
            c0, t0 = time.thread_time(), time.perf_counter()
            try:
                return fn(engine, *args, **kwargs)
            finally:
                if self.sync:
                    torch.cuda.synchronize()
                self.seconds[name] += time.perf_counter() - t0
                if cpu:
                    self.seconds[cpu] += time.thread_time() - c0
        return run

    def result(self) -> dict[str, Any]:
        """{instruction (and ``step``): seconds per step} over the profiled steps."""
        n = max(1, self.steps)
        return {k: v / n for k, v in sorted(self.seconds.items())}

    def remove(self) -> None:
        ds_compat.set_instruction_table(self.engine, self.before)
        self.active = False
