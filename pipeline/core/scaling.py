"""Batch-size topology and learning-rate scaling: pure functions, no torch.

global batch = per-device batch x devices x gradient-accumulation steps. When the global batch grows past
the batch the base learning rate was tuned for, the lr is scaled:

- ``linear``: lr = base_lr * global / base (Goyal et al. 2017, "Accurate, Large Minibatch SGD"), for SGD;
- ``sqrt``:   lr = base_lr * sqrt(global / base) (Malladi et al. 2022, "On the SDEs and Scaling Rules for
  Adaptive Gradient Algorithms"), the rule for Adam-family optimisers such as this project's Adam;
- ``none``:   lr = base_lr.

The schedule (`plan_schedule`) warms the learning rate up linearly, then decays it along a cosine to 2%.
Error messages name the notebook parameters (per_device_batch_size, devices, grad_accum, base_lr,
base_batch_size, lr_scaling, warmup_epochs) so a user knows which cell value to change.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

from .progress import plural

RULES = ("linear", "sqrt", "none")
TPU_BATCH_MULTIPLE = 8
# Default warmup when a scaled-up lr is used without one: 25 steps per multiple of base_lr. This matches
# Goyal et al.'s recipe (k=32 x lr reached after 5 epochs of ImageNet at batch 8k ~ 780 steps ~ 25 per
# multiple); capped at 10% of training (their 5 of 90 epochs is ~6%).
WARMUP_STEPS_PER_LR_MULTIPLE = 25
WARMUP_MAX_FRACTION = 0.1


@dataclass(frozen=True)
class BatchPlan:
    """The batch arithmetic and learning rate a run uses; printed at start and saved for provenance."""

    per_device_batch: int
    num_devices: int
    grad_accum: int
    global_batch: int
    base_lr: float
    base_batch: int
    rule: str
    lr: float
    accelerator: str = "cpu"

    def describe(self) -> str:
        """One line, e.g. "global batch 256 = 32 per device x 8 devices x 1 accum; lr 1.0e-03 -> ..."."""
        return (
            f"global batch {self.global_batch} = {self.per_device_batch} per device x "
            f"{plural(self.num_devices, 'device')} x {self.grad_accum} accum; "
            f"lr {self.base_lr:.1e} -> {self.lr:.1e} ({self.rule} rule, base batch {self.base_batch})"
        )

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass(frozen=True)
class Schedule:
    """Optimizer steps and the learning-rate multiplier of each: linear warmup, then cosine decay to 2%."""

    steps_per_epoch: int
    total_steps: int
    warmup_steps: int
    warmup_source: str  # "1 epoch", "default (lr scaled up)", "none"

    def factor(self, step: int) -> float:
        """Linear warmup (large scaled learning rates need it, Goyal et al. 2017), then cosine decay to 2%."""
        if step < self.warmup_steps:
            return warmup_lr_factor(step, self.warmup_steps)
        progress = min(1.0, (step - self.warmup_steps) / max(1, self.total_steps - self.warmup_steps))
        return 0.02 + 0.98 * 0.5 * (1 + math.cos(math.pi * progress))

    def describe(self) -> str:
        epochs = self.total_steps // max(1, self.steps_per_epoch)
        warm = (
            "no warmup"
            if not self.warmup_steps
            else (f"warmup {plural(self.warmup_steps, 'step')} ({self.warmup_source})")
        )
        return (
            f"{plural(self.steps_per_epoch, 'step')} per epoch x {plural(epochs, 'epoch', 'epochs')} = "
            f"{self.total_steps} steps; {warm}"
        )

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def _check_int(name: str, value: Any, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}; got {value!r}")
    return value


def _check_lr(name: str, value: Any) -> float:
    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    if not (number and math.isfinite(value) and value > 0):
        raise ValueError(f"{name} must be a finite number > 0; got {value!r}")
    return float(value)


def _check_rule(rule: Any) -> str:
    if rule not in RULES:
        raise ValueError(f"lr_scaling must be one of {', '.join(map(repr, RULES))}; got {rule!r}")
    return rule


def scale_lr(base_lr: float, base_batch: int, global_batch: int, rule: str) -> float:
    """Learning rate for ``global_batch`` given ``base_lr`` tuned at ``base_batch`` (see module doc)."""
    base_lr = _check_lr("base_lr", base_lr)
    _check_int("base_batch_size", base_batch)
    _check_int("global batch", global_batch)
    ratio = global_batch / base_batch
    return {"linear": base_lr * ratio, "sqrt": base_lr * math.sqrt(ratio), "none": base_lr}[_check_rule(rule)]


def warmup_lr_factor(step: int, warmup_steps: int) -> float:
    """Multiplier for the lr at 0-based ``step``: rises linearly from 1/warmup_steps to 1, then stays 1.

    Starts just above 0 rather than at 0 so the first optimiser step is not wasted.
    """
    return min(1.0, (step + 1) / warmup_steps) if warmup_steps > 0 else 1.0


def default_warmup_steps(lr: float, base_lr: float, total_steps: int) -> int:
    """Warmup used when none is given for a scaled-up lr (see WARMUP_STEPS_PER_LR_MULTIPLE)."""
    steps = math.ceil(WARMUP_STEPS_PER_LR_MULTIPLE * lr / base_lr)
    return min(steps, max(1, int(total_steps * WARMUP_MAX_FRACTION)))


def plan_batch(
    per_device_batch: int,
    num_devices: int,
    grad_accum: int,
    base_lr: float,
    base_batch: int,
    rule: str,
    accelerator: str,
    *,
    require_tpu_multiple: bool | None = None,
) -> BatchPlan:
    """Validate the batch topology and compute the scaled lr.

    On TPU the per-device batch must be a multiple of 8: XLA tiles the batch dimension in 8s, so other sizes
    pad and waste the chip. ``require_tpu_multiple=False`` lifts that for torch_xla's CPU stand-in (tests).
    """
    _check_int("per_device_batch_size", per_device_batch)
    _check_int("devices", num_devices)
    _check_int("grad_accum", grad_accum)
    base_lr = _check_lr("base_lr", base_lr)
    _check_int("base_batch_size", base_batch)
    _check_rule(rule)
    if accelerator not in ("tpu", "cuda", "cpu"):
        raise ValueError(f"accelerator must be 'tpu', 'cuda' or 'cpu'; got {accelerator!r}")

    if require_tpu_multiple is None:
        require_tpu_multiple = accelerator == "tpu"
    if require_tpu_multiple and per_device_batch % TPU_BATCH_MULTIPLE:
        lower = per_device_batch // TPU_BATCH_MULTIPLE * TPU_BATCH_MULTIPLE  # the multiples either side
        hint = f"{lower} or {lower + TPU_BATCH_MULTIPLE}" if lower else str(TPU_BATCH_MULTIPLE)
        raise ValueError(
            f"per_device_batch_size={per_device_batch} is not a multiple of {TPU_BATCH_MULTIPLE}, which TPU "
            f"needs to avoid padding every step; use {hint}"
        )

    global_batch = per_device_batch * num_devices * grad_accum
    lr = scale_lr(base_lr, base_batch, global_batch, rule)
    return BatchPlan(
        per_device_batch, num_devices, grad_accum, global_batch, base_lr, base_batch, rule, lr, accelerator
    )


def plan_schedule(plan: BatchPlan, train_rows: int, epochs: int, warmup_epochs: float) -> Schedule:
    """Steps for `train_rows` training files at the plan's global batch (at least one per epoch), and the
    warmup: `warmup_epochs` of them when given (> 0); otherwise, if the rule raised the lr, the default
    (default_warmup_steps: a large jump in lr at step 0 diverges early training, Goyal et al. sec. 2.2)."""
    _check_int("epochs", epochs)
    steps_per_epoch = max(1, train_rows // plan.global_batch)
    total = steps_per_epoch * epochs
    if warmup_epochs > 0:
        epochs_text = f"{warmup_epochs:g} {'epoch' if warmup_epochs == 1 else 'epochs'}"
        warmup, source = max(1, round(warmup_epochs * steps_per_epoch)), epochs_text
    elif plan.rule != "none" and plan.lr > plan.base_lr:
        warmup, source = default_warmup_steps(plan.lr, plan.base_lr, total), "default (lr scaled up)"
    else:
        warmup, source = 0, "none"
    return Schedule(steps_per_epoch, total, min(warmup, total), source)
