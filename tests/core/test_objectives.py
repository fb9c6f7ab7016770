import math

import pytest
import torch

from pipeline.core.model import ModelConfig, SpeakerClassifier
from pipeline.core.objectives import make_loss, probabilities, validation_loss


def tiny(n_classes=3):
    return SpeakerClassifier(
        ModelConfig.from_preset("tiny", n_classes=n_classes, n_mels=40, window_samples=8000)
    )


def two_sounds(n=8):
    """A tone and noise: 4 clips of each, easy to tell apart."""
    wavs = torch.randn(n, 8000, generator=torch.Generator().manual_seed(1)) * 0.1
    wavs[: n // 2] = torch.sin(torch.arange(8000) * 0.05)[None] + 0.01 * wavs[: n // 2]
    return wavs


def train_losses(objective, targets, steps=15):
    torch.manual_seed(0)
    model = tiny(targets.shape[1] if targets.ndim == 2 else 2)
    loss_fn = make_loss(objective, 0.2, 30.0)
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    wavs, losses = two_sounds(), []
    for _ in range(steps):
        loss = loss_fn(model(wavs, torch.ones(8)), targets)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return model, wavs, losses


def test_aam_loss_decreases_with_a_few_steps():
    _, _, losses = train_losses("aam", torch.tensor([0] * 4 + [1] * 4))
    assert losses[-1] < 0.5 * losses[0]


@pytest.mark.parametrize("objective", ["bce", "focal"])
def test_multi_label_objectives_learn_independent_classes(objective):
    # Class 0: the tone, class 1: the noise, class 2: present in every clip.
    targets = torch.tensor([[1.0, 0.0, 1.0]] * 4 + [[0.0, 1.0, 1.0]] * 4)
    model, wavs, losses = train_losses(objective, targets, steps=25)
    assert losses[-1] < 0.5 * losses[0]
    with torch.no_grad():
        probs = probabilities(model.eval()(wavs, torch.ones(8)), 30.0, independent=True)
    assert (probs[:4, 0] > probs[4:, 0].max()).all() and (probs[4:, 1] > probs[:4, 1].max()).all()
    assert (
        probs[:, 2] > 0.5
    ).all()  # a class every clip has: no softmax would let two classes both be near 1


def test_bce_is_binary_cross_entropy_of_the_scaled_cosines_with_the_margin():
    cosines = torch.tensor([[0.3, -0.1, 0.8], [0.0, 0.5, -0.6]])
    targets = torch.tensor([[1.0, 0.0, 0.5], [0.0, 1.0, 0.0]])
    expected = 0.0
    for row in range(2):
        for k in range(3):
            t = float(targets[row, k])
            x = 30.0 * (float(cosines[row, k]) - 0.2 * (2 * t - 1))
            expected += max(x, 0.0) - x * t + math.log1p(math.exp(-abs(x)))  # -t log p - (1-t) log(1-p)
    torch.testing.assert_close(
        make_loss("bce", 0.2, 30.0)(cosines, targets).item(), expected / 2, rtol=1e-5, atol=1e-5
    )
    focal = make_loss("focal", 0.2, 30.0)(cosines, targets)
    assert 0 < focal < make_loss("bce", 0.2, 30.0)(cosines, targets)  # easy terms weigh less


def test_validation_loss_and_probabilities():
    cosines = torch.tensor([[0.5, -0.5], [-0.2, 0.1]], dtype=torch.float64)
    truth = torch.tensor([[1.0, 0.0], [0.0, 1.0]], dtype=torch.float64)
    ce = validation_loss("aam", cosines, truth, 10.0)
    torch.testing.assert_close(
        ce, torch.nn.functional.cross_entropy(10 * cosines, torch.tensor([0, 1]), reduction="none")
    )
    bce = validation_loss("bce", cosines, truth, 10.0)
    torch.testing.assert_close(
        bce,
        torch.nn.functional.binary_cross_entropy_with_logits(10 * cosines, truth, reduction="none").sum(1),
    )
    torch.testing.assert_close(probabilities(cosines, 10.0, False).sum(1), torch.ones(2, dtype=torch.float64))
    assert (probabilities(cosines, 10.0, True) == torch.sigmoid(10 * cosines)).all()


def test_unknown_objective_is_refused():
    with pytest.raises(ValueError, match="not one of"):
        make_loss("hinge", 0.2, 30.0)


@pytest.mark.parametrize("objective", ["aam", "bce", "focal"])
def test_an_ensembles_loss_is_the_sum_of_its_members_losses(objective):
    """Each member learns alone: the loss of [B, members, C] scores is the sum of each member's loss on the same
    targets, so a member's gradient is what it would be in a model of its own."""
    cosines = torch.rand(6, 3, 4, generator=torch.Generator().manual_seed(2)) * 2 - 1
    targets = torch.tensor([0, 1, 2, 3, 0, 1]) if objective == "aam" else (torch.rand(6, 4) > 0.5).float()
    loss = make_loss(objective, 0.2, 30.0)
    assert loss(cosines, targets) == pytest.approx(sum(float(loss(cosines[:, k], targets)) for k in range(3)))


def test_aam_soft_targets_give_the_hard_loss_for_one_class_and_a_blend_of_margins_between():
    cosines = torch.rand(6, 4, generator=torch.Generator().manual_seed(3)) * 2 - 1
    classes = torch.tensor([0, 1, 2, 3, 0, 1])
    loss = make_loss("aam", 0.2, 30.0)
    soft = torch.nn.functional.one_hot(classes, 4).float()
    torch.testing.assert_close(loss(cosines, soft), loss(cosines, classes), rtol=1e-5, atol=1e-5)
    # Half of class 0, half of class 1: each gets half the margin and half the cross-entropy.
    half = torch.tensor([[0.5, 0.5, 0.0, 0.0]])
    row = torch.tensor([[0.6, 0.1, -0.3, 0.2]])  # inside the range where the margin is cos(theta + m)
    phi = torch.cos(torch.acos(row) + 0.2)
    logits = 30.0 * (half * phi + (1 - half) * row)
    expected = -(half * torch.log_softmax(logits, dim=1)).sum()
    torch.testing.assert_close(loss(row, half), expected, rtol=1e-4, atol=1e-4)
    ensemble = torch.rand(6, 3, 4, generator=torch.Generator().manual_seed(4)) * 2 - 1
    assert loss(ensemble, soft) == pytest.approx(
        sum(float(loss(ensemble[:, k], soft)) for k in range(3)), rel=1e-5
    )
