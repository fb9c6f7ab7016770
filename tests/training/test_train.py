import json
import shutil
import warnings

import numpy as np
import pytest
import torch
from conftest import TINY_TRAIN

from pipeline.core.artifact import load_artifact
from pipeline.core.config import TrainConfig
from pipeline.training.checkpoint import TrainingState
from pipeline.training.train import format_epoch, train


def test_training_learns_and_records_provenance(tiny_artifact):
    artifact = load_artifact(tiny_artifact)
    provenance = artifact.manifest["provenance"]
    history = provenance["history"]
    assert len(history) == TINY_TRAIN["epochs"]
    assert history[-1]["train_loss"] < history[0]["train_loss"]
    assert provenance["accelerator"] == "cpu" and provenance["devices"] == 1
    assert provenance["batch_plan"]["global_batch"] == TINY_TRAIN["per_device_batch_size"]
    assert provenance["versions"]["torch"] == torch.__version__.split("+")[0]
    assert artifact.labels == sorted(artifact.labels) and len(artifact.labels) == 4
    assert artifact.manifest["model_config"]["window_samples"] == int(TINY_TRAIN["window_seconds"] * 16000)


def test_training_is_reproducible_with_a_fixed_seed(synthetic_data, tmp_path):
    settings = {**TINY_TRAIN, "epochs": 1}
    a = train(TrainConfig(data_dir=str(synthetic_data), artifact_dir=str(tmp_path / "a"), **settings))
    b = train(TrainConfig(data_dir=str(synthetic_data), artifact_dir=str(tmp_path / "b"), **settings))
    assert a.history[0]["train_loss"] == b.history[0]["train_loss"]
    wa = load_artifact(tmp_path / "a").model.state_dict()
    wb = load_artifact(tmp_path / "b").model.state_dict()
    assert all(torch.equal(wa[k], wb[k]) for k in wa)


def test_train_reads_the_training_table_once(synthetic_data, tmp_path, monkeypatch):
    """The table sizes the hardware plan and then becomes the training data: one read for both."""
    import pipeline.core.tables
    import pipeline.training.plan
    import pipeline.training.train

    reads = []
    real = pipeline.core.tables.read_train_table

    def counted(*args, **kwargs):
        reads.append(args)
        return real(*args, **kwargs)

    for module in (pipeline.core.tables, pipeline.training.plan):
        monkeypatch.setattr(module, "read_train_table", counted)
    monkeypatch.setattr(
        pipeline.training.train.policy, "run", lambda hardware, fn, plan, data, *_, **__: data
    )
    data = train(
        TrainConfig(data_dir=str(synthetic_data), artifact_dir=str(tmp_path / "model"), **TINY_TRAIN)
    )
    assert len(reads) == 1 and len(data.rows) == 48


def test_bad_training_row_stops_training_naming_the_line(synthetic_data, tmp_path):
    import shutil

    data = tmp_path / "data"
    shutil.copytree(synthetic_data, data)
    with open(data / "train.csv", "a") as handle:
        handle.write("audio/gone.wav,spk00\n")
    with pytest.raises(ValueError, match=r"train.csv line \d+ \('audio/gone.wav'\)"):
        train(TrainConfig(data_dir=str(data), artifact_dir=str(tmp_path / "a"), **TINY_TRAIN))
    assert not (tmp_path / "a").exists()
    result = train(TrainConfig(data_dir=str(data), artifact_dir=str(tmp_path / "a"), on_bad_row="skip",
                               **{**TINY_TRAIN, "epochs": 1}))  # fmt: skip
    manifest = json.loads((tmp_path / "a" / "manifest.json").read_text())
    assert [s["path"] for s in manifest["provenance"]["skipped_rows"]] == ["audio/gone.wav"]
    assert result.skipped_rows
    # Speech-like clips under 3.5 s: auto writes no embedding centre (training/plan.py).
    assert (
        "embedding_centre" not in manifest and manifest["provenance"]["config"]["centre_embeddings"] is False
    )


def test_fp16_with_a_gradient_scaler_trains(synthetic_data, tmp_path):
    """The T4 recipe (fp16 autocast + GradScaler), exercised on the CPU."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = train(TrainConfig(data_dir=str(synthetic_data), artifact_dir=str(tmp_path / "a"), precision="fp16",
                                   **{**TINY_TRAIN, "epochs": 4}))  # fmt: skip
    # Skipped optimizer steps must not put torch's call-order warning into every T4 log.
    assert not [w for w in caught if "lr_scheduler.step()" in str(w.message)]
    assert all(np.isfinite(r["train_loss"]) for r in result.history)
    # The scaler skips the first steps while it finds its scale (65536 overflows), then learning proceeds.
    assert min(r["val_loss"] for r in result.history[1:]) < result.history[0]["val_loss"]
    assert load_artifact(tmp_path / "a").manifest["provenance"]["precision"] == "fp16"


def test_best_epoch_higher_accuracy_wins_and_ties_go_to_the_later_epoch():
    state = TrainingState()
    assert state.is_better({"val_accuracy": 0.9, "val_loss": 0.5})
    state.history, state.best_epoch = [{"val_accuracy": 0.9, "val_loss": 0.5}], 1
    assert not state.is_better({"val_accuracy": 0.8, "val_loss": 0.01})
    assert state.is_better({"val_accuracy": 0.95, "val_loss": 0.9})
    # Equal accuracy: the later epoch, even with a (noise-level) higher loss.
    assert state.is_better({"val_accuracy": 0.9, "val_loss": 0.6})
    assert state.is_better({"train_loss": 1.0})  # no validation split: the latest epoch


def test_a_later_epoch_within_the_best_values_standard_error_is_kept():
    """Epochs that differ by less than the validation metric's noise: the later, lower-learning-rate one."""
    state = TrainingState()
    state.history = [{"val_macro_roc_auc": 0.981, "val_macro_roc_auc_se": 0.01}]
    state.best_epoch = 1
    key = "val_macro_roc_auc"
    assert state.is_better({"val_macro_roc_auc": 0.975, "val_macro_roc_auc_se": 0.01}, key)
    assert not state.is_better({"val_macro_roc_auc": 0.968, "val_macro_roc_auc_se": 0.01}, key)
    # Measured against the best value so far, not the kept epoch: no drift down in steps smaller than the error.
    state.history.append({"val_macro_roc_auc": 0.975, "val_macro_roc_auc_se": 0.01})
    state.best_epoch = 2
    assert not state.is_better({"val_macro_roc_auc": 0.969, "val_macro_roc_auc_se": 0.001}, key)
    # The record itself may already be in the history (training appends before asking).
    record = {"val_macro_roc_auc": 0.99, "val_macro_roc_auc_se": 0.001}
    state.history.append(record)
    assert state.is_better(record, key)


def test_the_epoch_line_shows_each_selection_value_with_its_standard_error():
    base = {"epoch": 3, "train_loss": 1.0, "val_loss": 0.5, "lr": 1e-3, "seconds": 10.0}
    line = format_epoch({**base, "val_accuracy": 0.97, "val_accuracy_se": 0.012}, 12)
    assert "val_acc 0.9700 +-0.0120 | val_loss 0.500 |" in line
    record = {**base, "val_accuracy": 1.0, "val_macro_roc_auc": 0.98, "val_macro_roc_auc_se": 0.015,
              "val_soundscape_macro_roc_auc": 0.9, "val_soundscape_macro_roc_auc_se": 0.02}  # fmt: skip
    line = format_epoch(record, 12, "macro_roc_auc")
    assert "val_acc 1.0000 | " in line and "val_macro_roc_auc 0.9800 +-0.0150 |" in line
    assert "soundscapes macro_roc_auc 0.9000 +-0.0200 |" in line


def _tree(root):
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.mark.parametrize(
    "where", ["data_dir itself", "inside data_dir", "a folder with a user's file", "the cwd"]
)
def test_training_refuses_an_artifact_dir_it_would_empty_and_deletes_nothing(
    synthetic_data, tmp_path, monkeypatch, where
):
    """Issue 14: `-p artifact_dir` equal to the data, holding notes, or `.` once emptied those folders."""
    from pipeline.core.staging import OutputRefused

    data = tmp_path / "data"
    shutil.copytree(synthetic_data, data)
    user = tmp_path / "mine"
    user.mkdir()
    (user / "notes.txt").write_text("precious")
    monkeypatch.chdir(user)
    artifact = {"data_dir itself": data, "inside data_dir": data / "model", "the cwd": ".",
                "a folder with a user's file": user}[where]  # fmt: skip
    before = {root: _tree(root) for root in (data, user)}
    with pytest.raises(OutputRefused, match="artifact_dir="):
        train(TrainConfig(data_dir=str(data), artifact_dir=str(artifact), **{**TINY_TRAIN, "epochs": 1}))
    assert {root: _tree(root) for root in (data, user)} == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["data", "mine"]


def test_training_replaces_an_earlier_artifact(tiny_artifact, synthetic_data, tmp_path):
    target = tmp_path / "model"
    shutil.copytree(tiny_artifact, target)
    train(TrainConfig(data_dir=str(synthetic_data), artifact_dir=str(target), **{**TINY_TRAIN, "epochs": 1}))
    assert len(load_artifact(target).manifest["provenance"]["history"]) == 1


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_thousand_classes_with_few_clips_each_train(tmp_path):
    """Issue 11: >= 1,000 labels of 3 clips each: the split still validates (one clip from 300 classes), the
    AAM head has 1,000 classes, and the report draws the most confused pairs, not a 1,000 x 1,000 matrix."""
    import soundfile as sf

    data = tmp_path / "data"
    (data / "audio").mkdir(parents=True)
    rng = np.random.default_rng(0)
    rows = []
    for k in range(1000):
        freq = 100 + 7 * k  # each class its own tone, plus noise
        for j in range(3):
            t = np.arange(4800) / 16000
            clip = 0.3 * np.sin(2 * np.pi * freq * t) + 0.01 * rng.standard_normal(t.size)
            sf.write(data / "audio" / f"c{k}_{j}.wav", clip.astype(np.float32), 16000)
            rows.append(f"audio/c{k}_{j}.wav,class_{k:04d}\n")
    (data / "train.csv").write_text("path,label\n" + "".join(rows))
    result = train(TrainConfig(data_dir=str(data), artifact_dir=str(tmp_path / "model"),
                               **{**TINY_TRAIN, "epochs": 1, "per_device_batch_size": 64}))  # fmt: skip
    artifact = load_artifact(tmp_path / "model")
    assert len(artifact.labels) == 1000 and artifact.model.config.n_classes == 1000
    assert result.best_val_accuracy is not None and 0.0 <= result.best_val_accuracy <= 1.0
    assert any("300 more came from classes that could spare a clip" in note for note in result.data_notes)
    files = set(artifact.manifest["files"])
    assert "most_confused_pairs.png" in files and "confusion_matrix.png" not in files


def test_one_label_training_learns_from_blended_crops(synthetic_data, tmp_path, capsys):
    """BC learning through the real step: every crop blended with another class's, the aam objective on soft
    targets; the training loss, a mean over each epoch's blended crops, falls. (The validation split holds 5
    clips: its loss rose over the same 3 epochs on 3 of 6 seeds on an AVX-512 Xeon, while the training loss fell
    by 1.0-2.3 on all 6.)"""
    result = train(TrainConfig(data_dir=str(synthetic_data), artifact_dir=str(tmp_path / "a"), blend_probability=1.0,
                               **{**TINY_TRAIN, "epochs": 3}))  # fmt: skip
    assert "two clips' crops blended at a random ratio" in capsys.readouterr().out
    assert all(np.isfinite(r["train_loss"]) and np.isfinite(r["val_loss"]) for r in result.history)
    assert result.history[-1]["train_loss"] < result.history[0]["train_loss"] - 0.5
