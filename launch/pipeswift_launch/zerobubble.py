"""ZB-H1 (Qi et al., "Zero Bubble Pipeline Parallelism", ICLR 2024) run by DeepSpeed's pipeline
engine: each backward pass B computes input gradients only, the weight gradients of the stage's
``nn.Linear`` layers wait in a queue and a weight pass W computes them later, in micro-batch
order, where the stage would otherwise wait for its neighbour. Activations in flight are 1F1B's:
the forward and backward passes and every transfer keep DeepSpeed's own order (so its pairing of
blocking sends and receives, which keeps the stages from deadlocking, is untouched); only the
weight passes move. Transfers only start earlier: an activation is sent as soon as its forward
is done, and a receive is posted as soon as its buffer is free (taken, and waited for, where
DeepSpeed receives), so that a send finds its receive posted; a middle stage's activations then
get a buffer of their own (DeepSpeed receives them into the one its gradients come in).

Exactness: W computes ``grad_out^T @ input`` as autograd's matrix-multiply backward does and
adds it to the weight's gradient as autograd's AccumulateGrad does (the first one taken as it
is, the others added in place), so each weight's gradient sums the micro-batches in 1F1B's
order. Not through autograd itself (``Tensor.backward`` clones the first gradient of each step
and starts the autograd engine once per weight: a few per cent of the backward on CPU), unless
the optimizer takes gradients from hooks autograd runs (``WeightGrads.hooked``). With DeepSpeed's bf16 optimizer
(fp32 accumulation) each W is bracketed as DeepSpeed brackets B (low-precision gradients
cleared before, added to the fp32 ones after), so every gradient is added once, in the same order.

Layers other than ``nn.Linear`` (a convolution, transformers' ``Conv1D``, an embedding, a norm)
keep their whole backward in B: correct, with less of the bubble filled. The DeepSpeed accesses
this needs are :mod:`pipeswift_launch.ds_compat`'s.
"""

from __future__ import annotations

import functools
from collections import deque
from typing import Any, Callable, Iterator, Protocol

import torch
import torch.nn.functional as F
from deepspeed.runtime.pipe import schedule as ds_schedule

from pipeswift_slurm.planning.simulate import weight_passes_due

from . import ds_compat


class WeightPass(ds_schedule.PipeInstruction):  # type: ignore[misc]
    """Compute the deferred weight gradients of the oldest micro-batch whose B has run."""


class PostRecvGrad(ds_schedule.PipeInstruction):  # type: ignore[misc]
    """Post the next RecvGrad's receive as soon as its buffer is free (after the backward that
    used the last gradient): the next stage's send (blocking until this stage receives) then
    completes at once, whatever this stage computes then."""


class PostRecvActivation(ds_schedule.PipeInstruction):  # type: ignore[misc]
    """Post the next RecvActivation's receive as soon as its buffer is free (after the last
    RecvActivation). Gloo writes a send whose receive is posted from the sender's own thread
    at once; one posted before its receive waits for the sender's gloo thread, which a stage
    busy with a backward pass delays by milliseconds (bench/gloo_posted.py): the receiving stage
    then waits for data sent long before."""


class PostSendActivation(ds_schedule.BufferOpInstruction):  # type: ignore[misc]
    """Send the forward's output as soon as the forward is done (non-blocking; waited for before
    that micro-batch's backward, whose gradient the next stage sends only after receiving it);
    DeepSpeed's own SendActivation of it, after the previous micro-batch's gradient, then sends
    nothing. Without it that send waits behind the weight passes filling that gradient's wait."""


class WeightWatch(Protocol):
    """Who times the weight passes per layer (:class:`pipeswift_launch.layerprofile.LayerProfiler`)."""
    active: bool

    def now(self) -> float: ...
    def weight_time(self, layer: int, seconds: float) -> None: ...
    def weight_pass_done(self) -> None: ...


#: one deferred product: (weight, output gradient, input, the weight's layer in the model)
Deferred = tuple[torch.Tensor, torch.Tensor, torch.Tensor, int]


class WeightGrads:
    """The deferred weight-gradient products, one list per backward pass, oldest first."""

    def __init__(self, hooked: bool = False) -> None:
        #: the weight gradients go through autograd (``Tensor.backward``): hooks must see them
        self.hooked = hooked
        #: while its ``active``: each weight pass timed per layer
        self.watch: WeightWatch | None = None
        self.pending: deque[list[Deferred]] = deque()
        self.collecting: list[Deferred] | None = None

    def backward(self, run_b: Callable[[], None], reused: Callable[[], list[torch.Tensor]] = list) -> None:
        """Run one backward pass (B), its weight gradients deferred to the next :meth:`weight`.
        ``reused()``: buffers the engine writes again before that W (DeepSpeed's received
        gradient, whose buffer also receives activations): an output gradient that is one of
        them (passed through a residual add) is copied."""
        self.collecting = []
        try:
            run_b()
            buffers = {t.untyped_storage().data_ptr() for t in reused()}
            self.pending.append([(w, g.clone() if g.untyped_storage().data_ptr() in buffers else g, x, layer)
                                 for w, g, x, layer in self.collecting])
        finally:
            self.collecting = None

    def weight(self) -> None:
        """W: the oldest backward pass's weight gradients, each added to its weight's gradient."""
        deferred, watch = self.pending.popleft(), self.watch
        if watch is None or not watch.active:
            for weight, grad_out, inputs, _ in deferred:
                self._add(weight, grad_out, inputs)
            return
        before = watch.now()
        for weight, grad_out, inputs, layer in deferred:
            self._add(weight, grad_out, inputs)
            after = watch.now()
            watch.weight_time(layer, after - before)
            before = after
        watch.weight_pass_done()

    def _add(self, weight: torch.Tensor, grad_out: torch.Tensor, inputs: torch.Tensor) -> None:
        grad = grad_out.t().mm(inputs)
        if self.hooked or (weight.grad is None and grad.stride() != weight.stride()):
            weight.backward(grad)        # AccumulateGrad: hooks, and the weight's layout
        elif weight.grad is None:
            weight.grad = grad
        else:
            weight.grad.add_(grad)

    def __len__(self) -> int:
        return len(self.pending)


class _SplitLinear(torch.autograd.Function):  # type: ignore[misc]
    """``F.linear`` whose backward returns the input (and bias) gradient and defers the weight's."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                store: WeightGrads, layer: int) -> torch.Tensor:
        ctx.save_for_backward(x, weight)
        # the parameter itself: under saved-tensor hooks (pswift's layer profiler, activation
        # offloading) saved_tensors gives a new tensor object, whose .backward() may not reach
        # the parameter's gradient
        ctx.param, ctx.store, ctx.layer, ctx.has_bias = weight, store, layer, bias is not None
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
                ctx.store.collecting.append((ctx.param, g2, x2, ctx.layer))
        return gx, gw, gb, None, None


def _split_forward(linear: torch.nn.Linear, store: WeightGrads, layer: int, x: torch.Tensor) -> torch.Tensor:
    if torch.is_grad_enabled() and linear.weight.requires_grad:
        return _SplitLinear.apply(x, linear.weight, linear.bias, store, layer)
    return F.linear(x, linear.weight, linear.bias)


def split_linears(module: torch.nn.Module, store: WeightGrads, layer: int = -1) -> int:
    """Every ``nn.Linear`` (the class itself, not a subclass with its own forward) of ``module``
    defers its weight gradient to ``store``, which times it as ``layer``'s (-1: none); returns
    how many it split (one split already is left as it is)."""
    n = 0
    for linear in module.modules():
        if type(linear) is torch.nn.Linear and not isinstance(linear.__dict__.get("forward"), functools.partial):
            linear.forward = functools.partial(_split_forward, linear, store, layer)
            n += 1
    return n


def _with_weight_passes(steps: Iterator[list[Any]], stage_id: int, stages: int,
                        micro_batches: int) -> Iterator[list[Any]]:
    """DeepSpeed's 1F1B steps with a WeightPass for each BackwardPass, where ZB-H1 runs it
    (:func:`weight_passes_due`, the rule the planner simulates): on every stage but the last,
    the passes owed before the next RecvGrad, and each forward's output sent at once
    (PostSendActivation); on the last, before a forward that would hold more than ``stages``
    micro-batches (before its RecvActivation: they fill the wait for its input); the rest
    before the gradients are reduced. Each receive but a step's first is posted as soon as its
    buffer is free (PostRecvGrad after a backward on every stage but the last,
    PostRecvActivation after a RecvActivation on every stage but the first), so every send
    finds its receive posted."""
    last = stage_id == stages - 1
    # the last stage's forward first waits for its input (RecvActivation, in the forward's step):
    # the weight passes due before it fill that wait
    forward_at = ds_schedule.RecvActivation if last and stages > 1 else ds_schedule.ForwardPass
    owed = in_flight = backwards = received = 0
    for cmds in steps:
        out: list[Any] = []
        for cmd in cmds:
            op = ("end" if isinstance(cmd, ds_schedule.ReduceTiedGrads) else
                  "B" if isinstance(cmd, ds_schedule.RecvGrad) else
                  "F" if isinstance(cmd, forward_at) else None)
            due = 0 if op is None else weight_passes_due(op, last, owed, in_flight, stages)
            out += [WeightPass() for _ in range(due)]
            owed, in_flight = owed - due, in_flight - due
            out.append(cmd)
            if isinstance(cmd, ds_schedule.ForwardPass):
                in_flight += 1
                if not last:
                    out.append(PostSendActivation(cmd.buffer_id))
            if isinstance(cmd, ds_schedule.BackwardPass):
                owed, backwards = owed + 1, backwards + 1
                if not last and backwards < micro_batches:
                    out.append(PostRecvGrad())
            if isinstance(cmd, ds_schedule.RecvActivation):
                received += 1
                if received < micro_batches:
                    out.append(PostRecvActivation())
        yield out


class ZeroBubbleH1(ds_schedule.TrainSchedule):  # type: ignore[misc]
    """DeepSpeed's TrainSchedule with the weight passes of ZB-H1 added."""

    def steps(self) -> Iterator[list[Any]]:
        return _with_weight_passes(super().steps(), self.stage_id, self.stages, self.micro_batches)


def _posted_receives(post: Callable[[Any], Any], receive: Callable[..., None], posted: list[tuple[Any, Any]],
                     others: list[tuple[Any, Any]]) -> tuple[Callable[[Any], None], Callable[..., None]]:
    """(run the Post instruction, run the receive it posts for): the next ``receive`` takes what
    ``post`` posted (kept in ``posted`` until then; nothing where it returned None) and otherwise
    receives as DeepSpeed does. A post into a buffer that a receive in ``posted`` or ``others``
    still fills is an error (DeepSpeed's activation and gradient buffers can share storage)."""

    def run_post(eng: Any) -> None:
        work = post(eng)
        if work is None:
            return
        storage = work[0].untyped_storage().data_ptr()
        if any(buffer.untyped_storage().data_ptr() == storage for buffer, _ in (*posted, *others)):
            raise RuntimeError("ZB-H1: a receive posted into a buffer another posted receive still fills")
        posted.append(work)

    def run_receive(eng: Any, **kwargs: Any) -> None:
        if not posted:
            receive(eng, **kwargs)
            return
        with ds_compat.posted_receive(posted.pop()):
            receive(eng, **kwargs)

    return run_post, run_receive


def install(engine: Any) -> WeightGrads:
    """Train ``engine`` with ZB-H1 from its next step: its Linear layers split, its schedule
    and instruction table extended. Returns the queue (empty after every step)."""
    store = WeightGrads(hooked=ds_compat.hooks_gradients(engine))
    for idx, layer in ds_compat.stage_layers(engine.module):
        split_linears(layer, store, idx)
    split_linears(engine.module, store)      # a tied layer called through its forward_fn: untimed
    table = ds_compat.instruction_table(engine)
    backward = table[ds_schedule.BackwardPass]

    sent: dict[int, Any] = {}     # buffer id: its activation send posted by PostSendActivation

    def run_post_send(eng: Any, buffer_id: int) -> None:
        if buffer_id in sent:
            raise RuntimeError(f"ZB-H1: buffer {buffer_id}'s activation posted again before its backward")
        work = ds_compat.post_activation_send(eng, buffer_id)
        if work is not None:
            sent[buffer_id] = work

    def run_send_activation(eng: Any, buffer_id: int, **kwargs: Any) -> None:
        if buffer_id not in sent:
            send_activation(eng, buffer_id=buffer_id, **kwargs)

    def run_backward(eng: Any, **kwargs: Any) -> None:
        work = sent.pop(kwargs.get("buffer_id", -1), None)
        if work is not None:     # the next stage received it: its gradient came back
            work.wait()
        store.backward(lambda: backward(eng, **kwargs), lambda: ds_compat.received_gradients(eng))

    def run_weight(eng: Any) -> None:
        with ds_compat.gradients_added(eng):
            store.weight()

    grads_posted: list[tuple[Any, Any]] = []
    acts_posted: list[tuple[Any, Any]] = []
    grad_post, grad_recv = _posted_receives(ds_compat.post_gradient_receive, table[ds_schedule.RecvGrad],
                                            grads_posted, acts_posted)
    act_post, act_recv = _posted_receives(ds_compat.post_activation_receive, table[ds_schedule.RecvActivation],
                                          acts_posted, grads_posted)

    def run_reduce(eng: Any, **kwargs: Any) -> None:
        if store or sent or grads_posted or acts_posted:
            raise RuntimeError(f"ZB-H1: {len(store)} weight pass(es), {len(sent)} activation send(s), "
                               f"{len(grads_posted) + len(acts_posted)} posted receive(s) left at the step's end")
        reduce_tied(eng, **kwargs)

    reduce_tied = table[ds_schedule.ReduceTiedGrads]
    send_activation = table[ds_schedule.SendActivation]
    ds_compat.set_instruction_table(engine, {**table, ds_schedule.BackwardPass: run_backward,
                                             ds_schedule.ReduceTiedGrads: run_reduce,
                                             ds_schedule.RecvGrad: grad_recv,
                                             ds_schedule.RecvActivation: act_recv,
                                             ds_schedule.SendActivation: run_send_activation,
                                             PostSendActivation: run_post_send,
                                             PostRecvGrad: grad_post, PostRecvActivation: act_post,
                                             WeightPass: run_weight})
    ds_compat.use_train_schedule(engine, ZeroBubbleH1)
    return store
