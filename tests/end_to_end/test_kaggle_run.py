"""A simulated Kaggle run: both notebooks through papermill in "Batch" (Save Version) mode on a fake /kaggle,
with no path parameters -- every input is found, every output lands in /kaggle/working."""

from __future__ import annotations

import csv
import shutil

import nbformat
import pytest
from helpers import run_papermill, venv_env

from pipeline.core.artifact import load_artifact
from pipeline.demo_data.synthetic import make_synthetic_competition

SLUG, OWNER, TRAIN_KERNEL = "speaker-id-2026", "alice", "speaker-id-2026-ecapa-train"
TINY = {"model_size": "tiny", "epochs": 2, "per_device_batch_size": 8, "base_batch_size": 8, "n_mels": 40,
        "window_seconds": 0.5, "accelerator": "cpu"}  # fmt: skip


def outputs(notebook) -> str:
    executed = nbformat.read(notebook, as_version=4)
    return "".join(o.get("text", "") for c in executed.cells for o in c.get("outputs", []))


@pytest.mark.slow
def test_train_then_infer_as_two_kaggle_save_versions(tmp_path):
    root = tmp_path / "kaggle"
    competition = make_synthetic_competition(root / "input" / "competitions" / SLUG, seed=3, n_speakers=4,
                                             train_per_speaker=12, test_per_speaker=4)  # fmt: skip
    (root / "working").mkdir()
    env = venv_env(KAGGLE_ROOT=str(root), KAGGLE_KERNEL_RUN_TYPE="Batch")

    train = run_papermill("notebooks/train.ipynb", tmp_path / "train.out.ipynb", TINY, env=env)
    assert train.returncode == 0, train.stderr[-3000:]
    log = outputs(tmp_path / "train.out.ipynb")
    assert f"data_dir: found {competition}" in log
    assert "time_budget_minutes: " in log and "session limit" in log
    model = root / "working" / "model"
    assert load_artifact(model).manifest["provenance"]["epochs_run"] == 2
    assert not (root / "working" / "checkpoints").exists()  # a finished run leaves no checkpoint behind

    # Next session: the train notebook's output is attached read-only; working starts empty.
    output = root / "input" / "notebooks" / OWNER / TRAIN_KERNEL
    shutil.move(root / "working", output)
    (root / "working").mkdir()

    infer = run_papermill("notebooks/infer.ipynb", tmp_path / "infer.out.ipynb", {}, env=env)
    assert infer.returncode == 0, infer.stderr[-3000:]
    assert f"artifact_dir: found {output / 'model'}" in outputs(tmp_path / "infer.out.ipynb")
    with open(root / "working" / "submission.csv") as handle:
        ids = [row["id"] for row in csv.DictReader(handle)]
    with open(competition / "sample_submission.csv") as handle:
        assert ids == [row["id"] for row in csv.DictReader(handle)]


@pytest.mark.slow
def test_a_save_version_that_ran_out_of_time_is_continued_by_the_next_one(tmp_path):
    """Version 1 stops on its time budget and keeps its checkpoint in /kaggle/working; version 2 starts with an
    empty working directory and version 1's output attached as an input, and continues instead of restarting."""
    root = tmp_path / "kaggle"
    make_synthetic_competition(root / "input" / SLUG, seed=3, n_speakers=4, train_per_speaker=12,
                               test_per_speaker=4)  # the old flat layout this time  # fmt: skip
    (root / "working").mkdir()
    env = venv_env(KAGGLE_ROOT=str(root), KAGGLE_KERNEL_RUN_TYPE="Batch")
    # No ONNX files: the checkpoint is the subject here, and the export cost both versions ~20 s each.
    params = {**TINY, "epochs": 2, "export_onnx": False}

    first = run_papermill("notebooks/train.ipynb", tmp_path / "v1.ipynb", {**params, "time_budget_minutes": 0.01},
                          env=env)  # fmt: skip
    assert first.returncode == 0, first.stderr[-3000:]
    assert "stopping early: time budget" in outputs(tmp_path / "v1.ipynb")
    assert len(list((root / "working" / "checkpoints").glob("*/latest.pt"))) == 1  # <fingerprint>/latest.pt

    shutil.move(root / "working", root / "input" / "notebooks" / OWNER / TRAIN_KERNEL)
    (root / "working").mkdir()
    second = run_papermill("notebooks/train.ipynb", tmp_path / "v2.ipynb", params, env=env)
    assert second.returncode == 0, second.stderr[-3000:]
    log = outputs(tmp_path / "v2.ipynb")
    assert "checkpoint: copied" in log and "resuming from checkpoint" in log and "epoch 1, step 1" in log
    provenance = load_artifact(root / "working" / "model").manifest["provenance"]
    assert provenance["resumed_from"] and provenance["stopped_early"] is None
    assert [int(r["epoch"]) for r in provenance["history"]] == [1, 2]
