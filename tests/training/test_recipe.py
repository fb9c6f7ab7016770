"""The auto settings that the training table decides (recipe.py)."""

from __future__ import annotations

import json

import numpy as np

from pipeline.core.config import DEFAULT_EPOCHS, DEFAULT_VAL_FRACTION, TEST_TIME_SPEEDS, TrainConfig
from pipeline.training.recipe import EVENT_MAX_CROPS, auto_could_choose, follow_the_data, kind_of_data

ESC = np.full(320, 5.0)  # ESC-10: 5 s clips
FSDD = np.array([0.3, 0.4, 0.45, 0.6, 0.9])


def test_sound_events_are_long_one_label_clips_in_a_small_table_trained_from_scratch():
    auto = TrainConfig()
    assert kind_of_data(ESC, auto, "aam", 1600).name == "sound events"
    assert kind_of_data(FSDD, auto, "aam", 1600).name == "other"
    assert kind_of_data(np.full(100, 3.0), auto, "aam", 300).name == "other"  # the scale benchmark's speech
    assert kind_of_data(ESC, auto, "bce", 1600).name == "other"
    assert kind_of_data(ESC, TrainConfig(noise_dir="train_soundscapes"), "aam", 1600).name == "other"
    assert kind_of_data(ESC, TrainConfig(init_from="hub"), "aam", 1600).name == "other"
    crowded = kind_of_data(ESC, auto, "aam", EVENT_MAX_CROPS + 1)
    assert crowded.name == "other" and f"> {EVENT_MAX_CROPS}" in crowded.why
    assert kind_of_data(np.array([]), auto, "aam", 0).name == "other"


def test_sound_events_get_the_long_augmented_recipe_and_a_bigger_model_only_on_a_cpu():
    said: list[str] = []
    config, size = follow_the_data(TrainConfig(), "small", "cpu", ESC, "aam", 1600, said.append)
    assert (config.epochs, config.blend_probability, config.speed_probability, size) == (
        36,
        0.5,
        0.5,
        "medium",
    )
    assert config.val_fraction == 0.0 and "val_fraction 0" in said[-1]
    assert config.centre_embeddings is True and "centre_embeddings True" in said[-1]
    assert said[-1].startswith("data kind: sound events (one label per clip, median clip 5.0 s, 1600 crops")
    assert "model_size 'medium' (the CPU default is 'small')" in said[-1]
    assert "set a parameter to choose it" in said[-1]
    assert follow_the_data(TrainConfig(), "voxceleb", "cuda", ESC, "aam", 1600, said.append)[1] == "voxceleb"
    assert follow_the_data(TrainConfig(), "tiny", "tpu", ESC, "aam", 1600, said.append)[1] == "tiny"
    assert (
        follow_the_data(TrainConfig(model_size="small"), "small", "cpu", ESC, "aam", 1600, said.append)[1]
        == "small"
    )


def test_what_the_user_set_is_kept_and_other_data_gets_the_measured_defaults():
    said: list[str] = []
    mine = TrainConfig(epochs=5, blend_probability=0.0)
    config, _ = follow_the_data(mine, "small", "cpu", ESC, "aam", 1600, said.append)
    assert (config.epochs, config.blend_probability, config.speed_probability) == (5, 0.0, 0.5)
    assert "epochs" not in said[-1].split("auto:")[1] and "speed_probability 0.5" in said[-1]
    config, size = follow_the_data(TrainConfig(), "small", "cpu", FSDD, "aam", 100, said.append)
    assert (config.epochs, config.blend_probability, config.speed_probability) == (DEFAULT_EPOCHS, 0.0, 0.0)
    assert config.val_fraction == DEFAULT_VAL_FRACTION and size == "small"
    assert config.centre_embeddings is False  # speakers lost files to the centre
    assert said[-1].startswith(
        "data kind: other (one label per clip, median clip 0.45 s < 3.5 s); auto: epochs 12"
    )
    assert said[-1].endswith("centre_embeddings False")
    kept, _ = follow_the_data(
        TrainConfig(centre_embeddings=True), "small", "cpu", FSDD, "aam", 100, said.append
    )
    assert kept.centre_embeddings is True and "centre_embeddings" not in said[-1]


def test_train_decides_from_the_table_and_the_log_and_artifact_say_what_it_chose(tmp_path, capsys):
    from conftest import TINY_TRAIN

    from pipeline.core.artifact import load_artifact
    from pipeline.demo_data.synthetic import make_synthetic_competition
    from pipeline.training.train import train

    data = make_synthetic_competition(tmp_path / "data", n_speakers=2, train_per_speaker=5, test_per_speaker=1,
                                      clip_seconds=4.0)  # fmt: skip
    tiny = {**TINY_TRAIN, "epochs": None, "window_seconds": 1.0, "bn_calibration_windows": 16}
    result = train(TrainConfig(data_dir=str(data), artifact_dir=str(tmp_path / "model"), **tiny))
    out = capsys.readouterr().out
    assert "data kind: sound events (one label per clip, median clip 4.0 s" in out
    # model_size was set (tiny): not in the list
    assert (
        "auto: epochs 36, blend_probability 0.5, speed_probability 0.5, val_fraction 0, centre_embeddings True;"
        in out
    )
    assert "blend" in out.split("augmentation: ")[1].splitlines()[0]
    assert "validation: none; its 1 file train too" in out  # 10 clips: the split held out 1
    assert len(result.history) == 36 and result.train_files == 10 and result.best_val_metric is None
    manifest = json.loads((tmp_path / "model" / "manifest.json").read_text())
    provenance = manifest["provenance"]
    assert provenance["epochs_planned"] == 36 and provenance["config"]["val_fraction"] == 0.0
    # Trained with speed perturbation: the artifact asks the infer stage to read files at those speeds too.
    assert manifest["test_time_speeds"] == list(TEST_TIME_SPEEDS)
    assert len(manifest["embedding_centre"]) == load_artifact(tmp_path / "model").model.config.embedding_size
    assert "embedding centre: the training files' mean unit embedding" in out
    assert "test-time speeds: the infer stage reads each file at 0.8, 0.9, 1, 1.1, 1.25x" in out


def test_what_auto_can_choose_is_known_to_whoever_compares_a_recorded_config():
    for config in (follow_the_data(TrainConfig(), "small", "cpu", clips, "aam", 1600, lambda _: None)[0]
                   for clips in (ESC, FSDD)):  # fmt: skip
        for name in ("epochs", "blend_probability", "speed_probability", "val_fraction", "centre_embeddings"):
            assert auto_could_choose(name, getattr(config, name))
    assert not auto_could_choose("epochs", 5) and not auto_could_choose("seed", 0)
