"""The auto settings that the training table decides (recipe.py)."""

from __future__ import annotations

import numpy as np

from pipeline.core.config import TrainConfig
from pipeline.training.recipe import EVENT_MAX_CROPS, decide, kind_of_data, model_size_for_data

ESC = np.full(320, 5.0)  # ESC-10: 5 s clips
FSDD = np.array([0.3, 0.4, 0.45, 0.6, 0.9])


def test_the_kind_of_data_follows_clip_lengths_labels_and_noise_dir():
    assert kind_of_data(ESC, 1.0, "aam", None, 1600).name == "long clips"
    assert kind_of_data(FSDD, 1.0, "aam", None, 1600).name == "short clips"
    assert kind_of_data(ESC, 2.5, "aam", None, 1600).name == "long clips"  # two windows of 2.5 s
    assert kind_of_data(ESC, 3.0, "aam", None, 1600).name == "short clips"  # 1.7 windows of 3 s
    assert kind_of_data(ESC, 1.0, "bce", None, 1600).name == "multi-label"
    assert kind_of_data(ESC, 1.0, "aam", "train_soundscapes", 1600).name == "soundscapes"
    crowded = kind_of_data(ESC, 1.0, "aam", None, EVENT_MAX_CROPS + 1)
    assert crowded.name == "long clips" and f"more than {EVENT_MAX_CROPS}" in crowded.why


def test_long_clips_get_the_medium_model_on_a_cpu_only_when_the_size_is_left_to_auto():
    long = kind_of_data(ESC, 1.0, "aam", None, 1600)
    auto = TrainConfig()
    assert model_size_for_data(auto, "small", "cpu", long, 1600) == "medium"
    assert model_size_for_data(auto, "small", "cpu", long, EVENT_MAX_CROPS + 1) == "small"
    assert model_size_for_data(auto, "voxceleb", "cuda", long, 1600) == "voxceleb"
    assert model_size_for_data(auto, "tiny", "tpu", long, 1600) == "tiny"
    assert model_size_for_data(TrainConfig(model_size="small"), "small", "cpu", long, 1600) == "small"
    assert model_size_for_data(TrainConfig(init_from="hub"), "small", "cpu", long, 1600) == "small"
    short = kind_of_data(FSDD, 1.0, "aam", None, 1600)
    assert model_size_for_data(auto, "small", "cpu", short, 1600) == "small"


def test_the_log_says_the_kind_why_and_what_it_chose():
    said: list[str] = []
    assert decide(TrainConfig(), "small", "cpu", ESC, "aam", 1600, said.append) == "medium"
    assert said[-1].startswith("data kind: long clips (one label per clip, median clip 5.0 s = 5.0 windows")
    assert "model_size auto -> 'medium' (the CPU default is 'small'" in said[-1]
    assert decide(TrainConfig(model_size="tiny"), "tiny", "cpu", FSDD, "aam", 100, said.append) == "tiny"
    assert said[-1] == "data kind: short clips (one label per clip, median clip 0.45 s = 0.5 window(s))"
