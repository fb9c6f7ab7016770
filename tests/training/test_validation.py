"""Validation during training: a fixed calibration sample for BatchNorm, and held-out files scored from the
cache, each process its share, every process ending with the same answer."""

import copy
import dataclasses

import numpy as np
import pytest
import torch
from conftest import TINY_TRAIN

from pipeline.core.config import TrainConfig
from pipeline.devices.ddp import ddp_entry
from pipeline.devices.launch import launch
from pipeline.devices.probe import detect_topology
from pipeline.devices.strategy import SingleDevice
from pipeline.training.validation import calibration_windows, evaluate


def test_calibration_windows_are_a_fixed_sample_of_training_crops(synthetic_data, synthetic_training_data):
    data = synthetic_training_data
    clips = [data.store.read(int(item)) for item in data.items]
    train_idx = list(range(0, len(clips), 2))
    config = TrainConfig(data_dir=str(synthetic_data), **{**TINY_TRAIN, "bn_calibration_windows": 10})
    wavs, lens = calibration_windows(data.store, data.items, train_idx, config)
    again, _ = calibration_windows(data.store, data.items, train_idx, config)
    assert wavs.shape == (10, config.window_samples) and lens.shape == (10,)
    assert torch.equal(wavs, again)  # every epoch and every rank: the same windows
    assert float(lens.min()) > 0 and float(lens.max()) <= 1
    # Every window is a piece of a training clip (never of a validation clip), zero-padded past its length.
    for window, rel in zip(wavs.numpy(), lens.tolist(), strict=True):
        valid = round(rel * config.window_samples)
        assert not window[valid:].any()
        assert any(piece_of(window[:valid], clips[i]) for i in train_idx)
        assert not any(piece_of(window[:valid], clips[i]) for i in range(1, len(clips), 2))
    huge = TrainConfig(data_dir=str(synthetic_data), **{**TINY_TRAIN, "bn_calibration_windows": 10_000})
    assert calibration_windows(data.store, data.items, train_idx, huge)[0].shape[0] == len(train_idx)
    off = TrainConfig(data_dir=str(synthetic_data), **{**TINY_TRAIN, "bn_calibration_windows": 0})
    assert calibration_windows(data.store, data.items, train_idx, off) is None
    frozen = copy.copy(config)
    object.__setattr__(frozen, "freeze_encoder", True)  # (a real config also needs init_from)
    assert (
        calibration_windows(data.store, data.items, train_idx, frozen) is None
    )  # the pretrained statistics stay


def piece_of(piece: np.ndarray, clip: np.ndarray) -> bool:
    starts = np.flatnonzero(clip[: clip.size - piece.size + 1] == piece[0])
    return any(np.array_equal(clip[start : start + piece.size], piece) for start in starts)


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_two_ranks_validate_half_each_and_both_get_the_one_process_answer(
    tiny_artifact, synthetic_data, synthetic_training_data
):
    from launch_fixtures.workers import evaluate_artifact

    data = synthetic_training_data
    config = TrainConfig(data_dir=str(synthetic_data), **TINY_TRAIN)
    assert len(data.val_idx) >= 2  # something to split
    alone = evaluate_artifact(SingleDevice(torch.device("cpu")), str(tiny_artifact), data, config)
    ranks = launch(ddp_entry, nprocs=2, args=(evaluate_artifact, (str(tiny_artifact), data, config),
                                              detect_topology("cpu", 2), "fp32", 60.0), timeout=180)  # fmt: skip
    assert ranks[0][1] == ranks[1][1] == alone[1]  # every file's predicted class, on every rank
    for metrics in (ranks[0][0], ranks[1][0]):
        assert metrics["val_accuracy"] == alone[0]["val_accuracy"]
        assert metrics["val_loss"] == pytest.approx(alone[0]["val_loss"], rel=1e-5)
    truth = data.targets[np.asarray(data.val_idx)]
    assert alone[0]["val_accuracy"] == pytest.approx(float((np.asarray(alone[1]) == truth).mean()))


def test_no_validation_split_means_no_validation(synthetic_data, synthetic_training_data):
    data = synthetic_training_data
    config = TrainConfig(data_dir=str(synthetic_data), **TINY_TRAIN)
    model = torch.nn.Identity()  # never called: there is nothing to score
    without = dataclasses.replace(data, val_idx=[])
    assert evaluate(model, SingleDevice(torch.device("cpu")), without, config, "accuracy") is None


def test_the_embedding_centre_is_the_mean_of_training_files_unit_embeddings(
    tiny_artifact, synthetic_data, synthetic_training_data
):
    from pipeline.core.artifact import load_artifact
    from pipeline.core.data import energy_weights, windows
    from pipeline.training.validation import embedding_centre

    data = synthetic_training_data
    config = TrainConfig(data_dir=str(synthetic_data), **TINY_TRAIN, centre_embeddings=True)
    model = load_artifact(tiny_artifact).model
    assert embedding_centre(model, data, dataclasses.replace(config, centre_embeddings=False)) is None
    centre = torch.tensor(embedding_centre(model, data, config))
    files = []  # each training file as inference computes it: its windows' energy-weighted mean unit embedding
    for row in data.train_idx:
        wavs, lens = windows(data.store.read(int(data.items[row])), config.window_samples, 8, quiet_db=40.0)
        weights = torch.from_numpy(energy_weights(wavs, lens))
        wavs, lens = torch.from_numpy(wavs), torch.from_numpy(lens)
        with torch.inference_mode():
            unit = torch.nn.functional.normalize(model.embed(model.features(wavs, lens), lens), dim=1)
        files.append(torch.nn.functional.normalize((unit * weights[:, None]).sum(0) / weights.sum(), dim=0))
    torch.testing.assert_close(centre, torch.stack(files).mean(0), atol=1e-5, rtol=1e-4)
    assert 0.0 < float(centre.norm()) < 1.0  # files differ, and share a direction
    multi_label = dataclasses.replace(data, objective="bce")
    assert (
        embedding_centre(model, multi_label, config) is None
    )  # its sigmoid scores are not cosines to centre


def test_files_are_spread_evenly_over_the_whole_table():
    from pipeline.training.validation import spread_evenly

    picked = spread_evenly(list(range(320)), 256)  # ESC-10's training files, sorted by class
    assert len(picked) == 256 and picked[0] == 0 and picked[-1] == 319
    assert max(np.diff(picked)) <= 2  # every class is in
    assert spread_evenly([5, 7], 256) == [5, 7] and spread_evenly([], 8) == []
