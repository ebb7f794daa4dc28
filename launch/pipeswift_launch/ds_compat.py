"""Every DeepSpeed private access pswift makes, behind one fence with a version check.

DeepSpeed 0.19 has no public API for these, so they live here and nowhere else:

- ``PipelineModule._partition_layers`` (overridden), ``_layer_specs``, ``_topo``, ``_set_bounds``:
  explicit stage boundaries (:class:`ExplicitPipe`);
- ``PipelineModule.forward_funcs`` / ``_local_start``: this stage's layers and their indices in
  the whole model (per-layer profiling, ZB-H1's weight passes timed per layer);
- ``PipeEngine._INSTRUCTION_MAP``: timing each pipeline instruction while profiling, and
  ZB-H1's weight pass (:mod:`pipeswift_launch.zerobubble`);
- ``PipeEngine._exec_schedule`` (per engine) and ``TrainSchedule``'s arguments: ZB-H1's schedule
  where DeepSpeed builds its 1F1B one; ``using_bf16_optimizer`` and the bf16 optimizer's
  ``clear_lp_grads`` / ``update_hp_grads`` / ``immediate_grad_update``: a weight pass adds its
  gradients as a backward does (through autograd where the optimizer hooks gradients);
  ``grad_layer``: the received-gradient buffers, which a deferred weight gradient must not alias;
  ``p2p.recv`` (module attribute), ``next_stage``, ``dynamic_shape``, ``is_pipe_partitioned`` /
  ``is_grad_partitioned``: the next gradient's receive posted as soon as the last one was used
  (:func:`post_gradient_receive`), so that the next stage's send is not held up;
  ``pipe_recv_buf``, ``prev_stage``, ``_grad_layer_buf``: the next activation's receive posted
  as soon as the last one was taken, into a buffer that no gradient is received in
  (:func:`post_activation_receive`);
  ``pipe_buffers["outputs"]``, ``first_output_send``, ``has_attention_mask`` /
  ``has_bool_tensors``: an activation sent as soon as its forward is done
  (:func:`post_activation_send`);
- ``deepspeed.comm.torch.build_shm_op``: skipped on CPU (a ~36 s JIT build training never uses);
- ``engine.global_steps`` / ``global_samples`` and ``PipelineModule.micro_offset``: set when
  resuming from a checkpoint (the module seeds each layer's forward from (seed, micro-batches
  this rank ran, layer): dropout masks then continue as if never interrupted);
- ``Parameter.model_parallel``: each stage adds its own gradients to the clipping norm;
- the flat fp32 partitions of ZeRO-1 and bf16 optimizers (``bf16_groups`` /
  ``fp32_groups_flat_partition``, ``bit16_groups`` / ``single_partition_of_fp32_groups``) and
  ``lazy_init_hp_params_optimizer_state``: optimizer state created before the first step, so a
  checkpoint can be loaded into it (writing full per-parameter values goes through DeepSpeed's
  public ``safe_set_full_*``); each parameter's fragment link (``_hp_mapping``'s addresses) places
  it in the stage's whole flat buffer, recorded in each rank's shard file at save;
- ``optimizer.loss_scaler`` (ZeRO's): fp16's dynamic loss scale continues after a resume;
- ``PipeEngine.grid.stage_to_global``: the global rank of a neighbouring stage, for the
  point-to-point probe at start (:mod:`pipeswift_launch.probe`);
- ``optimizer.optimizer`` (the torch optimizer inside ZeRO's and bf16's): the one step that
  changes weights and optimizer state, fenced (torch's public ``register_step_pre_hook``) so a
  background checkpoint copies the state while the next forward and backward run;
- torch's own (``torch._compile._disable_dynamo``'s lazy wrapper, ``torch.optim``'s
  ``_use_grad_for_differentiable``): :func:`eager_optimizers` keeps a job that compiles nothing
  from importing ``torch._dynamo`` (~1.5 s of CPU a rank, each launch) for its optimizer.

:func:`check_version` refuses a DeepSpeed outside the range these were verified on, in one
line; ``tests/test_ds_compat.py`` exercises every access in seconds on CPU, without Slurm, so a
DeepSpeed upgrade that breaks one fails there first.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import re
from typing import Any, Callable, Iterable, Iterator

import torch
import deepspeed

from deepspeed.pipe import PipelineModule
from deepspeed.runtime.pipe.schedule import TrainSchedule

from . import stagefile

#: [lowest, first unsupported) DeepSpeed version
SUPPORTED = ((0, 19, 8), (0, 20, 0))


class DeepSpeedVersionError(RuntimeError):
    pass


def _version_tuple(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in re.findall(r"\d+", text)[:3])


def check_version(version: str | None = None) -> str:
    """The installed DeepSpeed version; DeepSpeedVersionError (one line, with the fix) outside
    the supported range."""
    if version is None:
        version = str(deepspeed.__version__)
    lo, hi = SUPPORTED
    if not lo <= _version_tuple(version) < hi:
        want = f">={'.'.join(map(str, lo))},<{'.'.join(map(str, hi[:2]))}"
        raise DeepSpeedVersionError(f"DeepSpeed {version} is outside the range pswift supports "
                                    f"({want}): pip install 'deepspeed{want}'")
    return version


def skip_shm_build() -> None:
    """CPU only: init_distributed() would JIT-compile the shm op that training never uses."""
    setattr(importlib.import_module("deepspeed.comm.torch"), "build_shm_op", lambda: None)


#: [lowest, first unsupported) torch version :func:`eager_optimizers` was verified on; outside
#: it nothing is changed (the job only pays torch._dynamo's import, as it would without pswift)
TORCH_EAGER_OPTIMIZERS = ((2, 13, 0), (2, 14, 0))
#: the modules whose ``torch._disable_dynamo`` wrappers a training step calls (activation
#: recompute's torch.utils.checkpoint reads torch._dynamo's config itself: a job with it imports it)
_DISABLE_DYNAMO_MODULES = ("torch.optim.optimizer",)


def eager_optimizers(version: str | None = None) -> int:
    """Let torch's optimizers run without importing torch._dynamo; the wrappers changed.

    torch wraps Optimizer's methods in ``_disable_dynamo`` (imports torch._dynamo at the first
    call, to tell a compiler to skip them) and every ``step`` in ``_use_grad_for_differentiable``
    (imports it at each call for a ``graph_break()``): in an eager job, ~1.5 s of CPU and 100 MB a
    rank, at each launch, for markers no compiler reads. Here the wrapped functions run directly
    and ``step`` keeps its grad-mode switch without the marker. The step's arithmetic is torch's
    own (test_ds_compat: the same weights bit for bit, no torch._dynamo). A job whose model
    compiles something imports torch._dynamo itself and is unaffected: pswift's engine never
    compiles the optimizer. A job with ZeRO (DeepSpeed's Muon module calls torch.compile at
    import) or activation recompute (torch's checkpoint reads torch._dynamo's config) imports it
    anyway: the saving is the plain data-parallel and pipeline job's."""
    if not TORCH_EAGER_OPTIMIZERS[0] <= _version_tuple(version or torch.__version__) < TORCH_EAGER_OPTIMIZERS[1]:
        return 0
    lazy = importlib.import_module("torch._compile")._disable_dynamo(lambda: None).__code__
    changed = 0
    for name in _DISABLE_DYNAMO_MODULES:
        for obj in list(vars(importlib.import_module(name)).values()):
            for fn in (vars(obj).values() if isinstance(obj, type) else (obj,)):
                fn = getattr(fn, "__func__", fn)
                if getattr(fn, "__code__", None) is lazy and hasattr(fn, "__wrapped__"):
                    fn.__wrapped__.__dynamo_disable = fn.__wrapped__   # what the wrapper caches
                    changed += 1
    for cls in vars(torch.optim).values():
        step = vars(cls).get("step") if isinstance(cls, type) else None
        if step is not None and hasattr(step, "__wrapped__") and {"graph_break", "set_grad_enabled"} <= set(step.__code__.co_names):
            cls.step = _eager_step(step.__wrapped__)
            changed += 1
    return changed


def _eager_step(step: Callable[..., Any]) -> Callable[..., Any]:
    """``_use_grad_for_differentiable(step)`` without its torch._dynamo.graph_break()."""
    @functools.wraps(step)
    def eager_step(self: Any, *args: Any, **kwargs: Any) -> Any:
        prev = torch.is_grad_enabled()
        try:
            torch.set_grad_enabled(self.defaults["differentiable"])
            return step(self, *args, **kwargs)
        finally:
            torch.set_grad_enabled(prev)
    return eager_step


def stage_layers(module: Any) -> list[tuple[int, torch.nn.Module]]:
    """This stage's layers that are modules, each with its index in the whole model."""
    start = int(module._local_start)
    return [(start + i, layer) for i, layer in enumerate(module.forward_funcs)
            if isinstance(layer, torch.nn.Module)]


def instruction_table(engine: Any) -> dict[Any, Callable[..., Any]]:
    """The engine's {instruction type: method} table (its own, else its class's)."""
    return dict(engine._INSTRUCTION_MAP)


def set_instruction_table(engine: Any, table: dict[Any, Callable[..., Any]] | None
                          ) -> dict[Any, Callable[..., Any]] | None:
    """Give this engine (only) its own table; None restores the class's. Returns the engine's
    own table before (None: it had the class's), for putting back."""
    before: dict[Any, Callable[..., Any]] | None = engine.__dict__.pop("_INSTRUCTION_MAP", None)
    if table is not None:
        engine._INSTRUCTION_MAP = table
    return before


def use_train_schedule(engine: Any, schedule_class: type) -> None:
    """``train_batch`` of this engine runs ``schedule_class`` (a TrainSchedule subclass, built
    with the same arguments) where DeepSpeed builds its TrainSchedule."""
    run = type(engine)._exec_schedule

    def exec_schedule(sched: Any) -> Any:
        if type(sched) is TrainSchedule:
            sched = schedule_class(micro_batches=sched.micro_batches, stages=sched.stages,
                                   stage_id=sched.stage_id)
        return run(engine, sched)
    engine._exec_schedule = exec_schedule


def received_gradients(engine: Any) -> list[Any]:
    """The buffers DeepSpeed receives the next stage's gradients into (reused for every
    micro-batch, and for received activations of the same shape until
    :func:`post_activation_receive` gives those a buffer of their own)."""
    layer = engine.grad_layer   # None until the first gradient is received
    if layer is None:
        return []
    return [layer] if torch.is_tensor(layer) else [t for t in layer if torch.is_tensor(t)]


def post_gradient_receive(engine: Any) -> tuple[Any, Any] | None:
    """(buffer, work): the next RecvGrad's receive posted now, non-blocking, into the buffer
    DeepSpeed receives it in (free again once the backward that used it ran), so the next
    stage's (blocking) send completes whatever this one computes then. None where that buffer is
    not one plain tensor (before the first gradient, tuple outputs, dynamic shapes,
    tensor-parallel partitioning): RecvGrad receives as usual."""
    layer = engine.grad_layer
    if (not torch.is_tensor(layer) or engine.dynamic_shape or engine.is_pipe_partitioned
            or engine.is_grad_partitioned):
        return None
    source = engine.grid.stage_to_global(stage_id=engine.next_stage)
    return layer, deepspeed.comm.irecv(layer, src=source)


def post_activation_receive(engine: Any) -> tuple[Any, Any] | None:
    """(buffer, work): the next RecvActivation's receive posted now, non-blocking, into the buffer
    DeepSpeed receives activations in (its RecvActivation clones each one out at once, so it is
    free again after it). None where that buffer is not one plain tensor (before the first
    activation, tuple inputs, dynamic shapes, tensor-parallel partitioning): RecvActivation
    receives as usual. A buffer DeepSpeed shares with its gradient receives (``_grad_layer_buf``,
    which it allocates both from) is replaced by one of its own first, so a middle stage can
    post both receives at once."""
    buffer = engine.pipe_recv_buf
    if not torch.is_tensor(buffer) or engine.dynamic_shape or engine.is_pipe_partitioned:
        return None
    shared = {t.untyped_storage().data_ptr() for t in engine._grad_layer_buf if torch.is_tensor(t)}
    if buffer.untyped_storage().data_ptr() in shared:
        # DeepSpeed receives a middle stage's gradients into this storage too: a receive posted
        # into it could be overwritten by a gradient received before it is taken
        buffer = engine.pipe_recv_buf = torch.empty_like(buffer)
    source = engine.grid.stage_to_global(stage_id=engine.prev_stage)
    return buffer, deepspeed.comm.irecv(buffer, src=source)


def post_activation_send(engine: Any, buffer_id: int) -> Any:
    """The work of the activation send of ``buffer_id``'s forward output, posted now
    (non-blocking), where DeepSpeed's SendActivation would send it later, after the previous
    micro-batch's gradient arrived: the next stage may start that forward while this one computes
    weight passes. None where DeepSpeed's own send must run (its first one, which sends the
    shape first; dynamic shapes; an output that is not one plain floating tensor)."""
    out = engine.pipe_buffers["outputs"][buffer_id]
    if (engine.first_output_send or engine.dynamic_shape or not torch.is_tensor(out) or not out.is_floating_point()
            or engine.has_attention_mask or engine.has_bool_tensors):
        return None
    return deepspeed.comm.isend(out, dst=engine.grid.stage_to_global(stage_id=engine.next_stage))


@contextlib.contextmanager
def posted_receive(posted: tuple[Any, Any]) -> Iterator[None]:
    """Within: DeepSpeed's p2p.recv into the posted buffer waits for the posted receive instead
    of receiving again; leaving it unused is an error (the sender's data would go astray)."""
    p2p: Any = importlib.import_module("deepspeed.runtime.pipe.p2p")
    plain, (buffer, work) = p2p.recv, posted
    used: list[Any] = []

    def recv(tensor: Any, src_stage: int, async_op: bool = False) -> Any:
        if tensor is buffer and not used:
            used.append(work.wait())
            return None
        return plain(tensor, src_stage, async_op)

    p2p.recv = recv
    try:
        yield
    finally:
        p2p.recv = plain
    if not used:
        raise RuntimeError("ZB-H1: a gradient receive posted early was not taken by RecvGrad")


def hooks_gradients(engine: Any) -> bool:
    """Whether the optimizer takes each weight gradient from a hook as autograd accumulates it
    (the bf16 optimizer's ``immediate_grad_update``): a gradient added outside autograd would
    bypass it."""
    return bool(getattr(engine, "using_bf16_optimizer", False)) and bool(
        getattr(engine.optimizer, "immediate_grad_update", False))


@contextlib.contextmanager
def gradients_added(engine: Any) -> Iterator[None]:
    """Around gradients added outside DeepSpeed's backward pass, what its pipeline backward does
    around one: with the bf16 optimizer (fp32 accumulation, not immediate), the low-precision
    gradients are cleared before and added to the fp32 ones after."""
    opt = engine.optimizer
    bf16 = bool(getattr(engine, "using_bf16_optimizer", False)) and not hooks_gradients(engine)
    if bf16:
        opt.clear_lp_grads()
    yield
    if bf16:
        opt.update_hp_grads(clear_lp_grads=False)


def set_progress(engine: Any, steps: int, samples: int, micro_batches: int) -> None:
    """Where training resumes: the step and sample counters the engine schedules from, and the
    count of forward passes the module seeds its layers from (``micro_batches`` a step)."""
    engine.global_steps = int(steps)
    engine.global_samples = int(samples)
    engine.module.micro_offset = int(steps) * int(micro_batches)


def mark_model_parallel(params: Iterable[Any]) -> None:
    """DeepSpeed 0.19 (fp32, ZeRO-0, >1 stage) counts only stage 0's gradients in the clipping
    norm unless parameters are marked model-parallel; each stage then adds its own."""
    for p in params:
        p.model_parallel = True


#: (low-precision groups, flat fp32 partitions) attribute names of DeepSpeed's optimizers that
#: keep fp32 master weights apart from the model: BF16_Optimizer, DeepSpeedZeroOptimizer
_MASTER_GROUPS = (("bf16_groups", "fp32_groups_flat_partition"),
                  ("bit16_groups", "single_partition_of_fp32_groups"))


def master_groups(engine: Any) -> list[tuple[list[Any], Any]] | None:
    """Per parameter group: (the model's parameters, this rank's flat fp32 partition) for an
    optimizer with separate master weights (ZeRO-1, bf16); None for a plain torch optimizer."""
    opt = engine.optimizer
    for lp_attr, hp_attr in _MASTER_GROUPS:
        if hasattr(opt, lp_attr) and hasattr(opt, hp_attr):
            return list(zip(getattr(opt, lp_attr), getattr(opt, hp_attr)))
    return None


def master_state(engine: Any) -> dict[Any, Any]:
    """The wrapped torch optimizer's state, keyed by flat fp32 partition."""
    state: dict[Any, Any] = engine.optimizer.optimizer.state
    return state


def create_master_state(engine: Any, elementwise: list[str], scalars: dict[str, Any]) -> None:
    """Before the first step: optimizer state for every flat partition (zeros for the
    ``elementwise`` keys, ``scalars`` as given) with each parameter's fragment views linked
    into it, as DeepSpeed does after the first step; values are then set per parameter."""
    # a private module: imported where it is used, so that its absence fails this call, not every import
    from deepspeed.utils.mixed_precision_linkage import lazy_init_hp_params_optimizer_state
    state = master_state(engine)
    for params, flat in master_groups(engine) or []:
        state[flat] = {k: torch.zeros_like(flat) for k in elementwise}
        state[flat].update({k: (v.clone() if torch.is_tensor(v) else v) for k, v in scalars.items()})
        lazy_init_hp_params_optimizer_state(params, flat, state)


def master_parts(engine: Any) -> list[stagefile.Part]:
    """This rank's share of the fp32 master weights and their optimizer state, per parameter
    group: ([(name, shape, numel) of its parameters], {None: flat partition, state key: its
    flat state}, the scalar state such as Adam's step, {name: where the parameter begins,
    counted from this partition's first element (negative: in an earlier rank's)} for the
    parameters with a piece here). The live tensors, no copy and no collective: each rank
    writes its own to a shard file (stagefile.write_shard)."""
    names = {id(p): n for n, p in engine.module.named_parameters()}
    state = master_state(engine)
    parts: list[stagefile.Part] = []
    for params, flat in master_groups(engine) or []:
        flat_state = state.get(flat, {})
        keys = [k for k, v in flat_state.items() if torch.is_tensor(v) and v.shape == flat.shape]
        tensors = {key: (flat if key is None else flat_state[key]).detach() for key in (None, *keys)}
        scalars = {k: v for k, v in flat_state.items() if k not in keys}
        mine = {names[id(p)]: p._hp_mapping.hp_fragment_address.start - p._hp_mapping.lp_fragment_address.start
                for p in params if getattr(p, "_hp_mapping", None) is not None}
        parts.append(([(names[id(p)], p.shape, p.numel()) for p in params], tensors, scalars, mine))
    return parts


def before_optimizer_step(engine: Any, wait: Callable[[], None]) -> Any:
    """Run ``wait()`` before every optimizer step of ``engine``, before anything the step
    changes is changed: the weights and optimizer state (the torch optimizer's step; inside
    ZeRO's and bf16's, the fp32 masters are stepped first, the model's weights copied from them
    after). Returns the hook's handle (``.remove()``)."""
    inner = engine.optimizer.optimizer if master_groups(engine) is not None else engine.optimizer
    if not isinstance(inner, torch.optim.Optimizer):
        raise TypeError(f"cannot fence the optimizer step of {type(inner).__name__} (not a torch optimizer)")
    return inner.register_step_pre_hook(lambda _opt, _args, _kwargs: wait())


#: what a dynamic loss scaler must carry over a resume (a static one has the first two)
_SCALER_FIELDS = ("cur_scale", "cur_iter", "last_overflow_iter", "cur_hysteresis")


def loss_scale_state(engine: Any) -> dict[str, Any] | None:
    """The ZeRO optimizer's loss scaler as numbers (fp16: the dynamic scale); None without one."""
    scaler = getattr(engine.optimizer, "loss_scaler", None)
    if scaler is None:
        return None
    return {k: float(getattr(scaler, k)) if k == "cur_scale" else int(getattr(scaler, k))
            for k in _SCALER_FIELDS if hasattr(scaler, k)}


def set_loss_scale_state(engine: Any, state: dict[str, Any]) -> None:
    scaler = getattr(engine.optimizer, "loss_scaler", None)
    for k, v in state.items():
        if scaler is not None and k in _SCALER_FIELDS and hasattr(scaler, k):
            setattr(scaler, k, v)


class ExplicitPipe(PipelineModule):
    """PipelineModule whose stage s owns layers ``parts[s]:parts[s+1]`` (``parts=None``:
    DeepSpeed's own partition method)."""
    parts: list[int]   # DeepSpeed's attribute: the stage boundaries

    def __init__(self, layers: list[Any], parts: list[int] | None = None, **kw: Any) -> None:
        object.__setattr__(self, "_explicit_parts", None if parts is None else [int(p) for p in parts])
        super().__init__(layers, **kw)

    # called from PipelineModule.__init__ before the layers are built
    def _partition_layers(self, method: str = "uniform") -> None:
        parts: list[int] | None = self._explicit_parts
        if parts is None:
            super()._partition_layers(method)
            # 'parameters' returns numpy ints; with seed_layers=True DeepSpeed then calls
            # random.seed(base + np.int64), a TypeError on Python 3.11. Cast to int.
            parts = [int(p) for p in self.parts]
        n = len(self._layer_specs)
        if (len(parts) != self.num_stages + 1 or parts[0] != 0 or parts[-1] != n
                or any(a >= b for a, b in zip(parts, parts[1:]))):
            raise RuntimeError(f"stage boundaries {parts} do not fit {self.num_stages} stages "
                               f"of {n} layers; fix [pipeline] partition or [model] num_layers")
        self.parts = parts
        stage_id = self._topo.get_coord(self.global_rank).pipe
        self._set_bounds(start=parts[stage_id], stop=parts[stage_id + 1])


def stage_ranks(engine: Any) -> tuple[int, int, list[int]]:
    """(this rank's stage, stage count, the global rank of every stage of this rank's pipeline)."""
    stages = int(engine.num_stages)
    return int(engine.stage_id), stages, [int(engine.grid.stage_to_global(s)) for s in range(stages)]
