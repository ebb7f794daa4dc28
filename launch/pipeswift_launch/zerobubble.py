"""ZB-H1 (Qi et al., "Zero Bubble Pipeline Parallelism", ICLR 2024) run by DeepSpeed's pipeline
engine: each backward pass B computes input gradients only, the weight gradients of the stage's
``nn.Linear`` layers wait in a queue and a weight pass W computes them later, in micro-batch
order, where the stage would otherwise wait for its neighbour. Activations in flight are 1F1B's:
the forward and backward passes and every transfer keep DeepSpeed's own order (so its pairing of
blocking sends and receives, which keeps the stages from deadlocking, is untouched); only the
weight passes move.

Exactness: W computes ``grad_out^T @ input`` as autograd's matrix-multiply backward does and
hands it to the weight through autograd (``Tensor.backward``), so gradient hooks see it and
each weight's gradient sums the micro-batches in 1F1B's order. With DeepSpeed's bf16 optimizer
(fp32 accumulation) each W is bracketed as DeepSpeed brackets B (low-precision gradients
cleared before, added to the fp32 ones after), so every gradient is added once, in the same order.

Layers other than ``nn.Linear`` (a convolution, transformers' ``Conv1D``, an embedding, a norm)
keep their whole backward in B: correct, with less of the bubble filled. The DeepSpeed accesses
this needs are :mod:`pipeswift_launch.ds_compat`'s.
"""

from __future__ import annotations

import functools
from collections import deque
from typing import Any, Callable, Iterator

import torch
import torch.nn.functional as F
from deepspeed.runtime.pipe import schedule as ds_schedule

from . import ds_compat


class WeightPass(ds_schedule.PipeInstruction):  # type: ignore[misc]
    """Compute the deferred weight gradients of the oldest micro-batch whose B has run."""


class PostRecvGrad(ds_schedule.PipeInstruction):  # type: ignore[misc]
    """Post the next RecvGrad's receive before the weight passes that fill its wait: the next
    stage's send (blocking until this stage receives) then completes while they run."""


class WeightGrads:
    """The deferred weight-gradient products, one list per backward pass, oldest first."""

    def __init__(self) -> None:
        self.pending: deque[list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]] = deque()
        self.collecting: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]] | None = None

    def backward(self, run_b: Callable[[], None], reused: Callable[[], list[torch.Tensor]] = list) -> None:
        """Run one backward pass (B), its weight gradients deferred to the next :meth:`weight`.
        ``reused()``: buffers the engine writes again before that W (DeepSpeed's received
        gradient, whose buffer also receives activations): an output gradient that is one of
        them (passed through a residual add) is copied."""
        self.collecting = []
        try:
            run_b()
            buffers = {t.untyped_storage().data_ptr() for t in reused()}
            self.pending.append([(w, g.clone() if g.untyped_storage().data_ptr() in buffers else g, x)
                                 for w, g, x in self.collecting])
        finally:
            self.collecting = None

    def weight(self) -> None:
        """W: the oldest backward pass's weight gradients, each accumulated through autograd."""
        for weight, grad_out, inputs in self.pending.popleft():
            weight.backward(grad_out.t().mm(inputs))

    def __len__(self) -> int:
        return len(self.pending)


class _SplitLinear(torch.autograd.Function):  # type: ignore[misc]
    """``F.linear`` whose backward returns the input (and bias) gradient and defers the weight's."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                store: WeightGrads) -> torch.Tensor:
        ctx.save_for_backward(x, weight)
        # the parameter itself: under saved-tensor hooks (pswift's layer profiler, activation
        # offloading) saved_tensors gives a new tensor object, whose .backward() may not reach
        # the parameter's gradient
        ctx.param, ctx.store, ctx.has_bias = weight, store, bias is not None
        return F.linear(x, weight, bias)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:
        x, weight = ctx.saved_tensors
        g2 = grad.reshape(-1, grad.shape[-1])
        gx = g2.mm(weight).view(*grad.shape[:-1], weight.shape[1]) if ctx.needs_input_grad[0] else None
        gb = g2.sum(0) if ctx.has_bias and ctx.needs_input_grad[2] else None
        gw = None
        if ctx.needs_input_grad[1]:
            x2 = x.reshape(-1, x.shape[-1])
            if ctx.store.collecting is None:          # a backward outside the schedule: at once
                gw = g2.t().mm(x2)
            else:
                ctx.store.collecting.append((ctx.param, g2, x2))
        return gx, gw, gb, None


def _split_forward(layer: torch.nn.Linear, store: WeightGrads, x: torch.Tensor) -> torch.Tensor:
    if torch.is_grad_enabled() and layer.weight.requires_grad:
        return _SplitLinear.apply(x, layer.weight, layer.bias, store)
    return F.linear(x, layer.weight, layer.bias)


def split_linears(module: torch.nn.Module, store: WeightGrads) -> int:
    """Every ``nn.Linear`` (the class itself, not a subclass with its own forward) of ``module``
    defers its weight gradient to ``store``; returns how many."""
    n = 0
    for layer in module.modules():
        if type(layer) is torch.nn.Linear:
            layer.forward = functools.partial(_split_forward, layer, store)
            n += 1
    return n


def _with_weight_passes(steps: Iterator[list[Any]], last_stage: bool) -> Iterator[list[Any]]:
    """DeepSpeed's 1F1B steps with a WeightPass for each BackwardPass: before the next
    RecvGrad (the wait for the next stage's backward; its receive posted first), on the last
    stage (which waits for nobody's gradient) before its next ForwardPass, and the rest before
    the gradients are reduced."""
    owed = 0
    for cmds in steps:
        out: list[Any] = []
        for cmd in cmds:
            due = isinstance(cmd, (ds_schedule.RecvGrad, ds_schedule.ReduceTiedGrads)) or (
                last_stage and isinstance(cmd, ds_schedule.ForwardPass))
            if due:
                if owed and isinstance(cmd, ds_schedule.RecvGrad):
                    out.append(PostRecvGrad())
                out += [WeightPass() for _ in range(owed)]
                owed = 0
            out.append(cmd)
            owed += isinstance(cmd, ds_schedule.BackwardPass)
        yield out


class ZeroBubbleH1(ds_schedule.TrainSchedule):  # type: ignore[misc]
    """DeepSpeed's TrainSchedule with the weight passes of ZB-H1 added."""

    def steps(self) -> Iterator[list[Any]]:
        return _with_weight_passes(super().steps(), self.stage_id == self.stages - 1)


def install(engine: Any) -> WeightGrads:
    """Train ``engine`` with ZB-H1 from its next step: its Linear layers split, its schedule
    and instruction table extended. Returns the queue (empty after every step)."""
    store = WeightGrads()
    split_linears(engine.module, store)
    table = ds_compat.instruction_table(engine)
    backward = table[ds_schedule.BackwardPass]

    def run_backward(eng: Any, **kwargs: Any) -> None:
        store.backward(lambda: backward(eng, **kwargs), lambda: ds_compat.received_gradients(eng))

    def run_weight(eng: Any) -> None:
        with ds_compat.gradients_added(eng):
            store.weight()

    def run_reduce(eng: Any, **kwargs: Any) -> None:
        if store:
            raise RuntimeError(f"ZB-H1: {len(store)} weight pass(es) left at the step's end")
        reduce_tied(eng, **kwargs)

    posted: list[tuple[Any, Any]] = []

    def run_post(eng: Any) -> None:
        receive = ds_compat.post_gradient_receive(eng)
        if receive is not None:
            posted.append(receive)

    def run_recv_grad(eng: Any, **kwargs: Any) -> None:
        if not posted:
            recv_grad(eng, **kwargs)
            return
        with ds_compat.posted_receive(posted.pop()):
            recv_grad(eng, **kwargs)

    reduce_tied, recv_grad = table[ds_schedule.ReduceTiedGrads], table[ds_schedule.RecvGrad]
    ds_compat.set_instruction_table(engine, {**table, ds_schedule.BackwardPass: run_backward,
                                             ds_schedule.ReduceTiedGrads: run_reduce,
                                             ds_schedule.RecvGrad: run_recv_grad,
                                             PostRecvGrad: run_post, WeightPass: run_weight})
    ds_compat.use_train_schedule(engine, ZeroBubbleH1)
    return store
