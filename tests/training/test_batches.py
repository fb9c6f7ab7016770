"""Training batches: crops read from the audio cache, made in spawned DataLoader workers, a pure function of
(seed, epoch, rank, position) so that worker count and resume never change what the model sees."""

import dataclasses

import numpy as np
import pytest
import torch

from pipeline.core.model import Frontend
from pipeline.training.batches import BatchRecipe, TrainingBatches, crops, epoch_order, training_loader


def test_epoch_order_is_a_shuffled_cover_and_fills_small_shards():
    order = epoch_order(list(range(10)), 10, seed=0, epoch=0)
    assert sorted(order) == list(range(10)) and order != list(range(10))
    assert epoch_order(list(range(10)), 10, seed=0, epoch=1) != order
    assert len(epoch_order([3, 4], 8, seed=0, epoch=0)) == 8


def test_crops_are_static_shape_deterministic_and_read_only_what_they_use(synthetic_training_data):
    data = synthetic_training_data
    items = data.items[:3]
    a = crops(data.store, items, 1000, np.random.default_rng([0, 0, 0, 0]))
    b = crops(data.store, items, 1000, np.random.default_rng([0, 0, 0, 0]))
    assert a[0].shape == (3, 1000) and torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    assert all(rel == 1.0 for rel in a[1].tolist())  # every synthetic clip is longer than 1000 samples
    short = crops(data.store, items, 10 * 16000, np.random.default_rng(1))  # 10 s windows: padded
    lengths = data.store.lengths[items]
    assert short[1].tolist() == pytest.approx((lengths / (10 * 16000)).tolist())


def _recipe(data, **changes) -> BatchRecipe:
    recipe = BatchRecipe(store=data.store, items=data.items, targets=data.targets, rows=list(data.train_idx),
                         rows_per_batch=4, batches_per_epoch=3, window=8000, seed=5)  # fmt: skip
    return dataclasses.replace(recipe, **changes)


def _batches(loader) -> list[dict[str, torch.Tensor]]:
    return list(loader)


def _same(a: list[dict[str, torch.Tensor]], b: list[dict[str, torch.Tensor]]) -> bool:
    return len(a) == len(b) and all(
        x.keys() == y.keys() and all(torch.equal(x[k], y[k]) for k in x) for x, y in zip(a, b, strict=True)
    )


@pytest.mark.timeout(180)
def test_spawned_workers_and_a_resume_see_the_batches_of_one_uninterrupted_run(synthetic_training_data):
    recipe = _recipe(synthetic_training_data)
    in_process = _batches(training_loader(recipe, 0, 0, epochs=2, workers=0, pin_memory=False))
    assert len(in_process) == 6 and all(b["inputs"].shape == (4, 8000) for b in in_process)
    assert not torch.equal(in_process[0]["inputs"], in_process[3]["inputs"])  # epochs differ
    two_workers = _batches(training_loader(recipe, 0, 0, epochs=2, workers=2, pin_memory=False))
    assert _same(two_workers, in_process)  # however many processes make them, in whatever order they finish
    resumed = _batches(training_loader(recipe, 1, 1, epochs=2, workers=2, pin_memory=False))
    assert _same(resumed, in_process[4:])  # epoch 1, batch 1 on: exactly the uninterrupted run's tail
    other_rank = _batches(training_loader(dataclasses.replace(recipe, rank=1), 0, 0, 1, 0, False))
    assert not torch.equal(other_rank[0]["inputs"], in_process[0]["inputs"])


def test_labels_follow_the_rows_cropped(synthetic_training_data):
    data = synthetic_training_data
    recipe = _recipe(data)
    batch = TrainingBatches(recipe)[(0, 1)]
    rows = epoch_order(recipe.rows, 3 * 4, seed=5, epoch=0)[4:8]
    assert batch["labels"].tolist() == data.targets[rows].tolist()
    assert batch["lens"].shape == (4,) and float(batch["lens"].min()) > 0


def test_xla_batches_carry_the_host_features_of_the_same_crops(synthetic_training_data):
    """On XLA the workers make the Fbank features (the TPU step takes features, not waveforms)."""
    waveforms = TrainingBatches(_recipe(synthetic_training_data))[(1, 2)]
    features = TrainingBatches(_recipe(synthetic_training_data, host_features_mels=40))[(1, 2)]
    with torch.no_grad():
        expected = Frontend(40)(waveforms["inputs"], waveforms["lens"])
    assert features["inputs"].shape == expected.shape and features["inputs"].shape[-1] == 40
    assert torch.allclose(features["inputs"], expected)
    assert torch.equal(features["labels"], waveforms["labels"]) and torch.equal(
        features["lens"], waveforms["lens"]
    )


def test_xla_host_features_go_through_the_models_front_end(synthetic_training_data):
    """A PCEN model's TPU batches carry PCEN features, computed as the model's own `features` computes them."""
    from pipeline.core.model import ModelConfig, SpeakerClassifier

    waveforms = TrainingBatches(_recipe(synthetic_training_data))[(1, 2)]
    recipe = _recipe(synthetic_training_data, host_features_mels=40, host_features_frontend="pcen")
    features = TrainingBatches(recipe)[(1, 2)]
    model = SpeakerClassifier(ModelConfig.from_preset("tiny", n_classes=3, n_mels=40, frontend="pcen"))
    with torch.no_grad():
        expected = model.features(waveforms["inputs"], waveforms["lens"])
        logmel = Frontend(40)(waveforms["inputs"], waveforms["lens"])
    torch.testing.assert_close(features["inputs"], expected)
    assert not torch.allclose(features["inputs"], logmel, atol=1e-2)
