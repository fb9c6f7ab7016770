"""pipeline.scaling: lr rules computed from their formulas, validation naming the notebook parameters."""

from __future__ import annotations

import math

import pytest

from pipeline.scaling import (
    WARMUP_MAX_FRACTION,
    WARMUP_STEPS_PER_LR_MULTIPLE,
    plan_batch,
    scale_lr,
    warmup_lr_factor,
)


@pytest.mark.timeout(30)
@pytest.mark.parametrize(("base_batch", "global_batch"), [(32, 256), (32, 32), (64, 16), (32, 96)])
def test_rules_follow_their_formulas(base_batch: int, global_batch: int) -> None:
    base_lr = 1e-3
    k = global_batch / base_batch
    assert scale_lr(base_lr, base_batch, global_batch, "linear") == pytest.approx(base_lr * k)
    assert scale_lr(base_lr, base_batch, global_batch, "sqrt") == pytest.approx(base_lr * math.sqrt(k))
    assert scale_lr(base_lr, base_batch, global_batch, "none") == base_lr


@pytest.mark.timeout(30)
def test_plan_multiplies_out_the_topology() -> None:
    per_device, devices, accum, base_lr, base_batch = 32, 8, 2, 1e-3, 32
    plan = plan_batch(per_device, devices, accum, base_lr, base_batch, "sqrt", "tpu", warmup_steps=10)
    global_batch = per_device * devices * accum
    assert plan.global_batch == global_batch
    assert plan.lr == pytest.approx(base_lr * math.sqrt(global_batch / base_batch))
    assert (plan.warmup_steps, plan.warmup_source) == (10, "given")
    assert plan.to_dict()["global_batch"] == global_batch and plan.to_dict()["rule"] == "sqrt"


@pytest.mark.timeout(30)
def test_describe_contains_the_numbers() -> None:
    plan = plan_batch(32, 8, 1, 1e-3, 32, "linear", "tpu", warmup_steps=100)
    text = plan.describe()
    for piece in (
        "global batch 256",
        "32 per device",
        "8 devices",
        "1 accum",
        "1.0e-03",
        "8.0e-03",
        "linear",
    ):
        assert piece in text, (piece, text)
    assert "base batch 32" in text and "warmup 100 steps" in text
    one = plan_batch(16, 1, 1, 1e-3, 32, "linear", "cpu").describe()
    assert "1 device x" in one and "no warmup" in one  # the lr went down: no warmup added


@pytest.mark.timeout(30)
def test_default_warmup_when_lr_is_scaled_up() -> None:
    base_lr = 1e-3
    plan = plan_batch(32, 8, 1, base_lr, 32, "linear", "cuda")
    assert plan.warmup_source == "default"
    assert plan.warmup_steps == math.ceil(WARMUP_STEPS_PER_LR_MULTIPLE * plan.lr / base_lr)
    capped = plan_batch(32, 8, 1, base_lr, 32, "linear", "cuda", total_steps=300)
    assert capped.warmup_steps == int(300 * WARMUP_MAX_FRACTION)
    assert plan_batch(32, 8, 1, base_lr, 32, "none", "cuda").warmup_steps == 0  # lr unchanged
    assert plan_batch(32, 1, 1, base_lr, 32, "linear", "cuda").warmup_steps == 0  # same batch: same lr


@pytest.mark.timeout(30)
def test_warmup_factor_rises_linearly_to_one() -> None:
    w = 4
    assert [warmup_lr_factor(s, w) for s in range(6)] == [1 / w, 2 / w, 3 / w, 1.0, 1.0, 1.0]
    assert warmup_lr_factor(0, 0) == 1.0
    assert 0 < warmup_lr_factor(0, 1000) < 0.01  # starts near zero, not at zero


@pytest.mark.timeout(30)
@pytest.mark.parametrize(("per_device", "hint"), [(12, "8 or 16"), (5, "use 8"), (20, "16 or 24")])
def test_tpu_needs_multiples_of_8(per_device: int, hint: str) -> None:
    with pytest.raises(ValueError, match="per_device_batch_size") as info:
        plan_batch(per_device, 8, 1, 1e-3, 32, "linear", "tpu")
    assert hint in str(info.value)
    plan_batch(per_device, 2, 1, 1e-3, 32, "linear", "cuda")  # fine elsewhere
    plan_batch(per_device, 8, 1, 1e-3, 32, "linear", "tpu", require_tpu_multiple=False)  # XLA CPU tests


@pytest.mark.timeout(30)
@pytest.mark.parametrize(
    ("kwargs", "name"),
    [
        ({"per_device_batch": 0}, "per_device_batch_size"),
        ({"per_device_batch": 8.0}, "per_device_batch_size"),
        ({"num_devices": 0}, "devices"),
        ({"grad_accum": 0}, "grad_accum"),
        ({"grad_accum": True}, "grad_accum"),
        ({"base_lr": 0.0}, "base_lr"),
        ({"base_lr": -1e-3}, "base_lr"),
        ({"base_lr": float("nan")}, "base_lr"),
        ({"base_batch": 0}, "base_batch_size"),
        ({"rule": "cubic"}, "lr_scaling"),
        ({"accelerator": "gpu0"}, "accelerator"),
        ({"warmup_steps": -1}, "warmup_steps"),
    ],
)
def test_validation_names_the_parameter(kwargs: dict, name: str) -> None:
    args = {
        "per_device_batch": 8,
        "num_devices": 2,
        "grad_accum": 1,
        "base_lr": 1e-3,
        "base_batch": 32,
        "rule": "linear",
        "accelerator": "cpu",
        **kwargs,
    }
    with pytest.raises(ValueError, match=name):
        plan_batch(**args)


@pytest.mark.timeout(30)
def test_scale_lr_validates() -> None:
    with pytest.raises(ValueError, match="lr_scaling"):
        scale_lr(1e-3, 32, 64, "quadratic")
    with pytest.raises(ValueError, match="base_lr"):
        scale_lr(0, 32, 64, "linear")
    with pytest.raises(ValueError, match="base_batch_size"):
        scale_lr(1e-3, 0, 64, "linear")
