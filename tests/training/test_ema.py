"""Tests for pipeline.training.ema: the weight average and the BatchNorm statistics of the weights that are kept."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

from pipeline.core.model import ModelConfig, SpeakerClassifier
from pipeline.training.ema import WeightAverage, recompute_batchnorm


def tiny_classifier(seed: int = 0) -> SpeakerClassifier:
    torch.manual_seed(seed)
    return SpeakerClassifier(ModelConfig.from_preset("tiny", n_classes=3, n_mels=40, window_samples=8000))


@pytest.mark.parametrize("flat", [True, False])
def test_the_average_follows_the_ramped_decay(flat):
    model = torch.nn.Sequential(torch.nn.Linear(3, 2), torch.nn.BatchNorm1d(2))
    average = WeightAverage(
        model, horizon_steps=4, flat=flat
    )  # decay 0.75 once the ramp (1+n)/(10+n) passes it
    expected = {k: v.clone() for k, v in model.state_dict().items()}
    for step in range(1, 30):
        with torch.no_grad():
            for parameter in model.parameters():
                parameter.add_(torch.randn_like(parameter))
        model.train()(torch.randn(5, 3))  # moves the BatchNorm running statistics and its batch counter
        average.update(model)
        decay = min(0.75, (1 + step) / (10 + step))  # update number `step`
        for name, value in model.state_dict().items():
            if value.is_floating_point():
                expected[name] = decay * expected[name] + (1 - decay) * value
            else:
                expected[name] = value.clone()
    for name, value in average.module.state_dict().items():
        torch.testing.assert_close(value, expected[name], rtol=1e-5, atol=1e-6, msg=name)
    assert average.module.state_dict()["1.num_batches_tracked"] == 29  # integer buffers are copied


def test_a_checkpointed_average_resumes_identically():
    model = tiny_classifier()
    average = WeightAverage(model, horizon_steps=10)
    with torch.no_grad():
        next(model.parameters()).add_(1.0)
    average.update(model)
    restored = WeightAverage(tiny_classifier(seed=1), horizon_steps=10)
    restored.load_state_dict(average.state_dict())
    assert restored.updates == average.updates == 1
    for (name, a), b in zip(
        average.module.state_dict().items(), restored.module.state_dict().values(), strict=True
    ):
        torch.testing.assert_close(a, b, msg=name)


def moving(model: torch.nn.Module, average: WeightAverage, steps: int, seed: int = 0) -> None:
    """`steps` optimizer-like weight changes and training forwards of `model`, each followed by an update."""
    generator = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        with torch.no_grad():
            for parameter in model.parameters():
                parameter.add_(0.1 * torch.randn(parameter.shape, generator=generator))
            model.train().embed(model.features(0.1 * torch.randn(4, 8000, generator=generator), torch.ones(4)),
                                torch.ones(4))  # fmt: skip
        average.update(model)


def test_the_flat_average_is_the_per_tensor_average_exactly():
    """One vector instead of a tensor each (fewer operations and graph outputs on XLA), the same arithmetic."""
    per_tensor, flat = tiny_classifier(), tiny_classifier()
    averages = WeightAverage(per_tensor, horizon_steps=5, flat=False), WeightAverage(flat, horizon_steps=5)
    moving(per_tensor, averages[0], steps=6)
    moving(flat, averages[1], steps=6)
    saved = averages[1].state_dict()  # read from the vector, before the module has been written back
    for name, value in averages[0].module.state_dict().items():
        assert torch.equal(saved["weights"][name], value), name
        assert torch.equal(averages[1].module.state_dict()[name], value), name


def test_a_flat_average_resumed_from_its_checkpoint_goes_on_identically():
    straight, stopped = tiny_classifier(), tiny_classifier()
    straight_average, stopped_average = WeightAverage(straight, 5), WeightAverage(stopped, 5)
    moving(straight, straight_average, steps=3)
    moving(stopped, stopped_average, steps=3)
    saved = copy.deepcopy((stopped.state_dict(), stopped_average.state_dict()))
    resumed = tiny_classifier(seed=1)
    resumed_average = WeightAverage(resumed, 5)
    moving(resumed, resumed_average, steps=2, seed=2)  # a vector of its own, which the load must replace
    resumed.load_state_dict(saved[0])
    resumed_average.load_state_dict(saved[1])
    moving(straight, straight_average, steps=3, seed=1)
    moving(resumed, resumed_average, steps=3, seed=1)
    for (name, value), other in zip(
        straight_average.module.state_dict().items(),
        resumed_average.module.state_dict().values(),
        strict=True,
    ):
        assert torch.equal(value, other), name


def test_recompute_batchnorm_gives_the_statistics_of_these_weights_on_these_windows():
    model = tiny_classifier()
    wavs = 0.1 * torch.randn(12, 8000)
    lens = torch.ones(12)
    norms = [m for m in model.modules() if isinstance(m, torch.nn.modules.batchnorm._BatchNorm)]
    assert norms
    # What the first BatchNorm layer sees, recorded independently of its running statistics.
    seen: list[torch.Tensor] = []
    hook = norms[0].register_forward_hook(lambda module, args, out: seen.append(args[0].detach().clone()))
    with torch.no_grad():
        model.train()
        model.embed(model.features(wavs, lens), lens)
    hook.remove()
    inputs = seen[0]  # [batch, channels, time]
    reduce = [d for d in range(inputs.dim()) if d != 1]
    true_mean = inputs.mean(dim=reduce)
    true_var = inputs.var(dim=reduce, unbiased=True)

    for norm in norms:  # stale statistics, as averaged or momentum-tracked ones are
        norm.running_mean.fill_(5.0)
        norm.running_var.fill_(9.0)
    momenta = [norm.momentum for norm in norms]
    model.eval()
    recompute_batchnorm(model, wavs, lens)  # one batch: exactly its statistics
    torch.testing.assert_close(norms[0].running_mean, true_mean, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(norms[0].running_var, true_var, rtol=1e-4, atol=1e-5)
    assert [norm.momentum for norm in norms] == momenta  # the training-time momentum is back
    assert not model.training  # and the mode the caller had


def test_recomputed_statistics_are_a_cumulative_average_over_batches():
    model = tiny_classifier()
    wavs = 0.1 * torch.randn(8, 8000)
    lens = torch.ones(8)
    halves = []
    for part in (slice(0, 4), slice(4, 8)):
        recompute_batchnorm(model, wavs[part], lens[part])
        halves.append(
            [m.running_mean.clone() for m in model.modules() if isinstance(m, torch.nn.BatchNorm1d)]
        )
    recompute_batchnorm(model, wavs, lens, batch_size=4)
    whole = [m.running_mean for m in model.modules() if isinstance(m, torch.nn.BatchNorm1d)]
    # Equal-size batches weigh equally: not the 0.1-momentum average that would favour the last batch.
    for first, second, both in zip(*halves, whole, strict=True):
        torch.testing.assert_close(both, (first + second) / 2, rtol=1e-4, atol=1e-6)


def test_recompute_batchnorm_fixes_a_mismatched_average():
    """The failure it exists for: running statistics from other weights wreck the predictions of these weights;
    recomputed ones give back what the weights compute with their own batch statistics."""
    model = tiny_classifier()
    wavs = 0.1 * torch.randn(16, 8000)
    lens = torch.ones(16)
    with torch.no_grad():
        reference = copy.deepcopy(model)
        recompute_batchnorm(reference, wavs, lens)
        good = reference.eval().embed(reference.features(wavs, lens), lens)
        for m in model.modules():
            if isinstance(m, torch.nn.BatchNorm1d):
                m.running_mean.normal_(0, 3)
        bad = model.eval().embed(model.features(wavs, lens), lens)
        recompute_batchnorm(model, wavs, lens)
        fixed = model.eval().embed(model.features(wavs, lens), lens)
    assert not np.allclose(bad.numpy(), good.numpy(), atol=1e-3)
    torch.testing.assert_close(fixed, good, rtol=1e-4, atol=1e-5)


def test_a_parameter_vector_the_caller_gives_stands_for_the_parameters():
    """flat_parameters (flat Adam's vector) is used instead of flattening the parameters again: the same
    average when it holds them, and visibly its own values when it does not."""
    plain, given, wrong = tiny_classifier(), tiny_classifier(), tiny_classifier()
    averages = [WeightAverage(m, horizon_steps=5) for m in (plain, given, wrong)]
    generator = torch.Generator().manual_seed(3)
    for _ in range(4):
        change = [0.1 * torch.randn(p.shape, generator=generator) for p in plain.parameters()]
        for model, average in zip((plain, given, wrong), averages, strict=True):
            with torch.no_grad():
                for parameter, delta in zip(model.parameters(), change, strict=True):
                    parameter.add_(delta)
            vector = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
            average.update(
                model, None if model is plain else vector if model is given else torch.zeros_like(vector)
            )
    expected = averages[0].module.state_dict()
    for name, value in averages[1].module.state_dict().items():
        assert torch.equal(value, expected[name]), name
    first = next(averages[2].module.parameters())
    assert not torch.equal(first, next(averages[0].module.parameters()))
    assert first.abs().max() < next(averages[0].module.parameters()).abs().max()  # pulled towards the zeros


def test_buffers_not_averaged_are_the_live_models_copies():
    """average_buffers=False (training recomputes the statistics of the kept weights): the parameters are
    averaged as before, the BatchNorm statistics read as the live model's, in `module` and in checkpoints."""
    averaged_model, copied_model = tiny_classifier(), tiny_classifier()
    averaged = WeightAverage(averaged_model, horizon_steps=5)
    copied = WeightAverage(copied_model, horizon_steps=5, average_buffers=False)
    moving(averaged_model, averaged, steps=4)
    moving(copied_model, copied, steps=4)
    saved = copied.state_dict()["weights"]
    live = copied_model.state_dict()
    parameters = {name for name, _ in copied_model.named_parameters()}
    buffers = [name for name in live if name not in parameters]
    assert any(name.endswith("running_mean") for name in buffers)
    for name in buffers:
        assert torch.equal(saved[name], live[name]), name
        assert torch.equal(copied.module.state_dict()[name], live[name]), name
    assert not all(torch.equal(averaged.module.state_dict()[n], live[n]) for n in buffers if "running" in n)
    for name in parameters:
        assert torch.equal(copied.module.state_dict()[name], averaged.module.state_dict()[name]), name
