"""pipeline.core.scaling: lr rules computed from their formulas, validation naming the notebook parameters."""

from __future__ import annotations

import math

import pytest

from pipeline.core.scaling import (
    WARMUP_MAX_FRACTION,
    WARMUP_STEPS_PER_LR_MULTIPLE,
    plan_batch,
    plan_schedule,
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
    plan = plan_batch(per_device, devices, accum, base_lr, base_batch, "sqrt", "tpu")
    global_batch = per_device * devices * accum
    assert plan.global_batch == global_batch
    assert plan.lr == pytest.approx(base_lr * math.sqrt(global_batch / base_batch))
    assert plan.to_dict()["global_batch"] == global_batch and plan.to_dict()["rule"] == "sqrt"


@pytest.mark.timeout(30)
def test_describe_contains_the_numbers() -> None:
    plan = plan_batch(32, 8, 1, 1e-3, 32, "linear", "tpu")
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
    assert "base batch 32" in text
    one = plan_batch(16, 1, 1, 1e-3, 32, "linear", "cpu").describe()
    assert "1 device x" in one


@pytest.mark.timeout(30)
def test_schedule_counts_steps_and_warms_up_for_the_given_epochs() -> None:
    plan = plan_batch(32, 8, 1, 1e-3, 32, "linear", "cuda")  # global batch 256
    schedule = plan_schedule(plan, train_rows=2600, epochs=12, warmup_epochs=1.5)
    assert (schedule.steps_per_epoch, schedule.total_steps) == (10, 120)
    assert (schedule.warmup_steps, schedule.warmup_source) == (15, "1.5 epochs")
    assert plan_schedule(plan, train_rows=10, epochs=3, warmup_epochs=1).steps_per_epoch == 1  # never zero
    assert schedule.describe() == "10 steps per epoch x 12 epochs = 120 steps; warmup 15 steps (1.5 epochs)"
    single = plan_schedule(plan, train_rows=256, epochs=1, warmup_epochs=1).describe()
    assert single == "1 step per epoch x 1 epoch = 1 steps; warmup 1 step (1 epoch)"


@pytest.mark.timeout(30)
def test_default_warmup_when_lr_is_scaled_up_and_no_epochs_are_given() -> None:
    base_lr = 1e-3
    plan = plan_batch(32, 8, 1, base_lr, 32, "linear", "cuda")
    long = plan_schedule(plan, train_rows=256 * 1000, epochs=10, warmup_epochs=0)
    assert long.warmup_source == "default (lr scaled up)"
    assert long.warmup_steps == math.ceil(WARMUP_STEPS_PER_LR_MULTIPLE * plan.lr / base_lr)
    assert plan_schedule(plan, 256 * 30, 10, 0).warmup_steps == int(300 * WARMUP_MAX_FRACTION)  # capped
    same = plan_batch(32, 1, 1, base_lr, 32, "linear", "cuda")  # same batch: same lr, nothing to warm up
    assert (
        plan_schedule(same, 3200, 10, 0).warmup_steps,
        plan_schedule(same, 3200, 10, 0).warmup_source,
    ) == (0, "none")
    unscaled = plan_batch(32, 8, 1, base_lr, 32, "none", "cuda")
    assert plan_schedule(unscaled, 3200, 10, 0).describe().endswith("no warmup")


@pytest.mark.timeout(30)
def test_lr_schedule_warms_up_then_decays() -> None:
    schedule = plan_schedule(plan_batch(10, 1, 1, 1e-3, 10, "none", "cpu"), 100, 10, warmup_epochs=1)
    factors = [schedule.factor(s) for s in range(100)]
    assert factors[0] == pytest.approx(0.1) and factors[9] == pytest.approx(1.0)
    assert all(a >= b for a, b in zip(factors[10:], factors[11:], strict=False))
    assert factors[-1] < 0.05


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
