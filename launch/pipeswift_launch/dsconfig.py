"""DeepSpeed's configuration for one rank, built from plan.json's training section and the
rank's layout: the one place pswift's settings become DeepSpeed's keys."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pipeswift_slurm.planning.costmodel import zero_bucket_elements

if TYPE_CHECKING:
    from pipeswift_slurm.plan import LayoutSpec, Plan, TrainingSpec


def _deep_merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for k, v in over.items():
        out[k] = _deep_merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def _precision(t: TrainingSpec) -> dict[str, Any]:
    """DeepSpeed's precision settings for [training] precision and zero_stage."""
    precision, zero = t["precision"], int(t["zero_stage"])
    if precision == "bf16":
        # ZeRO-1 + bf16: DeepSpeed's BF16 optimizer accumulates gradients in fp32 (bf16
        # accumulation over many micro-batches loses precision)
        return {"bf16": {"enabled": True}, **({"data_types": {"grad_accum_dtype": "fp32"}} if zero else {})}
    if precision == "fp16":  # dynamic loss scaling; the scaler's state is in the optimizer's
        return {"fp16": {"enabled": True, "loss_scale": 0, "initial_scale_power": 16}}
    return {}


def _scheduler(t: TrainingSpec, lr: float) -> dict[str, Any]:
    """Linear warm-up, then constant or cosine decay to lr x lr_min_ratio at the last step."""
    warmup, decay = int(t["lr_warmup_steps"]), t["lr_decay"]
    if decay == "cosine":
        return {"scheduler": {"type": "WarmupCosineLR", "params": {
            "total_num_steps": int(t["steps"]), "warmup_num_steps": max(1, warmup),
            "warmup_min_ratio": 0.0 if warmup else 1.0, "warmup_type": "linear",
            "cos_min_ratio": float(t["lr_min_ratio"])}}}
    if warmup:
        return {"scheduler": {"type": "WarmupLR", "params": {
            "warmup_min_lr": 0.0, "warmup_max_lr": lr, "warmup_num_steps": warmup,
            "warmup_type": "linear"}}}
    return {}


def ds_config(plan: Plan, layout: LayoutSpec, stage_elements: int | None = None) -> dict[str, Any]:
    """DeepSpeed's configuration: every setting from plan.json's training section (train.toml
    refuses ds_config keys pswift sets or cannot checkpoint); with this rank's ``stage_elements``
    (parameters), ZeRO's gradient bucket no larger than the stage (costmodel.zero_bucket_elements)."""
    t = plan["training"]
    opt: dict[str, Any] = _deep_merge({"type": "AdamW", "params": {"lr": 1e-3}}, t["optimizer"])
    opt["params"].setdefault("torch_adam", True)  # FusedAdam would JIT-compile for a minute on CPU
    cfg = {
        "train_batch_size": t["global_batch_size"],
        "train_micro_batch_size_per_gpu": layout["micro_batch_size"],
        "gradient_accumulation_steps": layout["micro_batches"],
        "optimizer": opt,
        "zero_optimization": {"stage": int(t["zero_stage"]),
                              **({"reduce_bucket_size": zero_bucket_elements(stage_elements)}
                                 if stage_elements is not None and int(t["zero_stage"]) else {})},
        "steps_per_print": 10 ** 9,
        "wall_clock_breakdown": False,
        **_precision(t),
        **_scheduler(t, float(opt["params"]["lr"])),
    }
    if t["gradient_clipping"]:
        cfg["gradient_clipping"] = t["gradient_clipping"]
    return _deep_merge(cfg, t["ds_config"])
