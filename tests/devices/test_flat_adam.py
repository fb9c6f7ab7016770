"""Tests for pipeline.devices.flat_adam: torch's clip + Adam step on one flat vector (eager CPU, fast)."""

from __future__ import annotations

import copy

import pytest
import torch

from pipeline.devices.flat_adam import FlatAdam

CLIP = 0.2  # below the gradient norms of these steps: clipping is active


def small_model(seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Tanh(), torch.nn.Linear(8, 3))


def adam(model: torch.nn.Module, **overrides) -> torch.optim.Adam:
    return torch.optim.Adam(
        model.parameters(), **{"lr": 0.05, "weight_decay": 0.1, "foreach": True, **overrides}
    )


def batches(count: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    generator = torch.Generator().manual_seed(7)
    return [(3 * torch.randn(16, 6, generator=generator), torch.randint(0, 3, (16,), generator=generator))
            for _ in range(count)]  # fmt: skip


def torch_step(model, optimizer, inputs, targets, clip: float = CLIP) -> float:
    loss = torch.nn.functional.cross_entropy(model(inputs), targets)
    loss.backward()
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
    assert (norm > clip) == (clip == CLIP)  # clipped, or (a large clip) left alone
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return float(loss.detach())


def flat_step(model, stepper: FlatAdam, inputs, targets, clip: float = CLIP) -> float:
    loss = torch.nn.functional.cross_entropy(model(inputs), targets)
    loss.backward()
    stepper.step(clip)
    stepper.optimizer.zero_grad(set_to_none=True)
    return float(loss.detach())


@pytest.mark.parametrize("clip", [CLIP, 100.0])
def test_the_flat_step_is_torchs_clip_and_adam(clip):
    reference, model = small_model(), small_model()
    reference_optimizer, stepper = adam(reference), FlatAdam(adam(model))
    for inputs, targets in batches(6):
        expected = torch_step(reference, reference_optimizer, inputs, targets, clip)
        assert abs(flat_step(model, stepper, inputs, targets, clip) - expected) <= 1e-5 * abs(expected)
    for ours, theirs in zip(model.parameters(), reference.parameters(), strict=True):
        torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-6)
    # torch's own checkpoint format, with the moments the flat vectors hold
    ours, theirs = stepper.optimizer.state_dict(), reference_optimizer.state_dict()
    assert ours["param_groups"] == theirs["param_groups"]
    assert ours["state"].keys() == theirs["state"].keys()
    for index, state in theirs["state"].items():
        assert ours["state"][index].keys() == state.keys()
        for key, value in state.items():
            torch.testing.assert_close(ours["state"][index][key], value, rtol=1e-5, atol=1e-7)


def test_a_checkpoint_taken_from_the_flat_vectors_resumes_exactly():
    straight, first_half = small_model(), small_model()
    straight_stepper, first_stepper = FlatAdam(adam(straight)), FlatAdam(adam(first_half))
    steps = batches(6)
    for inputs, targets in steps:
        flat_step(straight, straight_stepper, inputs, targets)
    for inputs, targets in steps[:3]:
        flat_step(first_half, first_stepper, inputs, targets)
    saved = copy.deepcopy(
        {"model": first_half.state_dict(), "optimizer": first_stepper.optimizer.state_dict()}
    )

    resumed = small_model(seed=1)
    resumed.load_state_dict(saved["model"])
    optimizer = adam(resumed)
    optimizer.load_state_dict(saved["optimizer"])
    resumed_stepper = FlatAdam(optimizer)
    for inputs, targets in steps[3:]:
        flat_step(resumed, resumed_stepper, inputs, targets)
    assert not optimizer.state  # the flat vectors took the loaded state over
    for ours, theirs in zip(resumed.parameters(), straight.parameters(), strict=True):
        assert torch.equal(ours, theirs)


def test_a_parameter_without_a_gradient_gets_torchs_own_step():
    """torch skips such a parameter (its step count falls behind): the state goes back to torch, exactly."""
    reference, model = small_model(), small_model()
    reference_optimizer, stepper = adam(reference), FlatAdam(adam(model))
    for step, (inputs, targets) in enumerate(batches(5)):
        frozen = step in (2, 3)
        for network in (reference, model):
            network[0].bias.requires_grad_(not frozen)
        torch_step(reference, reference_optimizer, inputs, targets)
        flat_step(model, stepper, inputs, targets)
    counts = {float(state["step"]) for state in stepper.optimizer.state.values()}
    assert counts == {3.0, 5.0}  # still torch's: two counts cannot share one vector
    for ours, theirs in zip(model.parameters(), reference.parameters(), strict=True):
        torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-6)


def test_only_a_plain_adam_is_taken_over():
    model = small_model()
    assert FlatAdam.supports(adam(model))
    assert not FlatAdam.supports(torch.optim.AdamW(model.parameters()))
    assert not FlatAdam.supports(adam(model, amsgrad=True))
    assert not FlatAdam.supports(adam(model, maximize=True))
    assert not FlatAdam.supports(adam(model, lr=torch.tensor(0.01), foreach=False))
    first, second = list(model.parameters())[:2], list(model.parameters())[2:]
    assert not FlatAdam.supports(torch.optim.Adam([{"params": first}, {"params": second, "lr": 0.1}]))
    assert not FlatAdam.supports(torch.optim.Adam(model.double().parameters()))


def test_the_next_step_starts_from_the_vector_unless_a_parameter_changed_in_between():
    """The parameter vector a step leaves is reused by the next step (and lent to the weight average); a
    parameter changed in place in between (a loaded state_dict) is seen, and the step is still torch's."""
    reference, model = small_model(), small_model()
    reference_optimizer, stepper = adam(reference), FlatAdam(adam(model))
    steps = batches(4)
    torch_step(reference, reference_optimizer, *steps[0])
    flat_step(model, stepper, *steps[0])
    vector = stepper.flat_parameters()
    assert vector is not None and torch.equal(vector, torch.cat([p.reshape(-1) for p in model.parameters()]))
    torch_step(reference, reference_optimizer, *steps[1])
    flat_step(model, stepper, *steps[1])
    assert stepper.flat_parameters() is vector  # the same vector, stepped in place
    with torch.no_grad():
        for network in (reference, model):
            network[2].weight.mul_(-1.0)
    assert stepper.flat_parameters() is None  # stale: the next step flattens the changed parameters
    for inputs, targets in steps[2:]:
        torch_step(reference, reference_optimizer, inputs, targets)
        flat_step(model, stepper, inputs, targets)
    for ours, theirs in zip(model.parameters(), reference.parameters(), strict=True):
        torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-6)
    assert FlatAdam(adam(small_model()), reuse_vector=False).flat_parameters() is None
