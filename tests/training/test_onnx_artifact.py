"""pipeline/training/onnx_artifact.py: what training adds to the artifact for the ONNX engine, and what it costs."""

from __future__ import annotations

import copy
import dataclasses

import numpy as np
import pytest
from conftest import TINY_TRAIN
from onnx_fixtures import Unexportable

from pipeline.core import onnx as onnx_engine
from pipeline.core.artifact import load_artifact
from pipeline.core.config import TrainConfig
from pipeline.core.data import windows
from pipeline.core.onnx import int8_acceptable
from pipeline.training import onnx_artifact
from pipeline.training.onnx_artifact import export_for_artifact, files_to_judge, reserve_seconds

needs_onnx = pytest.mark.skipif(
    onnx_engine.onnxruntime_missing() is not None or onnx_engine.exporter_missing() is not None,
    reason=f"{onnx_engine.onnxruntime_missing() or onnx_engine.exporter_missing()}: the ONNX engine is off here",
)


@needs_onnx
def test_an_export_that_fails_costs_the_files_with_one_line_never_the_artifact(
    tiny_artifact, synthetic_training_data, tmp_path
):
    broken = copy.deepcopy(load_artifact(tiny_artifact).model)
    broken.embedding_model = Unexportable(broken.embedding_model)
    lines: list[str] = []
    config = TrainConfig(data_dir="unused", **TINY_TRAIN)
    found = export_for_artifact(broken, synthetic_training_data, config, "accuracy", tmp_path, lines.append)
    assert found.files == {} and not any(tmp_path.iterdir())
    assert "could not export the embedding model" in found.record["error"]
    assert len(lines) == 1 and lines[0].startswith("ONNX export: the artifact gets no ONNX files (")


@needs_onnx
def test_an_int8_failure_without_a_message_keeps_fp32_with_one_line(
    tiny_artifact, synthetic_training_data, tmp_path, monkeypatch
):
    """Seen on a GPU machine: quantisation raised an error whose message was empty, and the line that reports
    it raised IndexError, which cost the whole training run its artifact."""

    def quantize_fails(*args, **kwargs):
        raise AssertionError()  # what a bare `assert` inside onnxruntime.quantization raises

    monkeypatch.setattr(onnx_engine, "quantize_embedding_model", quantize_fails)
    model = load_artifact(tiny_artifact).model
    lines: list[str] = []
    config = TrainConfig(data_dir="unused", **TINY_TRAIN)
    found = export_for_artifact(model, synthetic_training_data, config, "accuracy", tmp_path, lines.append)
    assert list(found.files) == [onnx_engine.ONNX_FP32] and found.files[onnx_engine.ONNX_FP32].is_file()
    assert found.record["int8"] == {"error": "AssertionError: "}
    assert lines == ["ONNX int8: none in the artifact (AssertionError: (no message)); fp32 is there"]


def test_without_a_validation_split_int8_is_judged_on_training_files(tiny_artifact, synthetic_training_data):
    data = dataclasses.replace(synthetic_training_data, val_idx=[], soundscapes=None)
    where, files = files_to_judge(data)
    assert where == "training_files" and files and set(files) <= set(data.train_idx)
    assert len(files) <= onnx_artifact.JUDGED_TRAINING_FILES
    many = dataclasses.replace(data, train_idx=list(range(1000)))
    assert len(files_to_judge(many)[1]) == onnx_artifact.JUDGED_TRAINING_FILES
    # a class-sorted table's last rows are judged too (ESC-10's 320 rows: a stride cut stopped at row 255)
    sorted_table = files_to_judge(dataclasses.replace(data, train_idx=list(range(320))))[1]
    assert sorted_table[0] == 0 and sorted_table[-1] == 319 and len(set(sorted_table)) == len(sorted_table)
    assert files_to_judge(synthetic_training_data) == ("held_out", synthetic_training_data.val_idx)


@needs_onnx
def test_without_a_validation_split_the_int8_rule_is_judged_on_training_files(
    tiny_artifact, synthetic_training_data, tmp_path
):
    """The sound-event recipe trains on every clip (val_fraction 0): int8 is still judged, on training files."""
    data = dataclasses.replace(synthetic_training_data, val_idx=[], soundscapes=None)
    model = load_artifact(tiny_artifact).model
    config = TrainConfig(data_dir="unused", **TINY_TRAIN)
    lines: list[str] = []
    int8 = export_for_artifact(model, data, config, "accuracy", tmp_path, lines.append).record["int8"]
    assert set(int8["training_files"]) == {"fp32", "int8"} and "held_out" not in int8
    assert int8["passed"] == int8_acceptable(int8["training_files"]["fp32"], int8["training_files"]["int8"])
    assert "training_files accuracy fp32" in lines[-1]


def test_the_time_budget_keeps_back_what_the_export_will_take(tiny_artifact, synthetic_training_data):
    model_config = load_artifact(tiny_artifact).model.config
    data = synthetic_training_data
    on = TrainConfig(data_dir="unused", **{**TINY_TRAIN, "export_onnx": True})
    off = TrainConfig(data_dir="unused", **TINY_TRAIN)
    assert reserve_seconds(model_config, data, off) == 0.0
    assert reserve_seconds(model_config, data, on) > onnx_artifact.EXPORT_FIXED_SECONDS  # timed on this host
    # At 0.1 s a window: the calibration windows once, the validation files' inference windows (data.windows)
    # twice -- fp32 and int8 -- with a 1.5x margin.
    val_windows = sum(len(windows(np.zeros(int(data.store.lengths[int(data.items[i])])), on.window_samples, 64)[0])
                      for i in data.val_idx)  # fmt: skip
    assert val_windows > len(data.val_idx)  # files longer than a window count several
    expected = onnx_artifact.EXPORT_FIXED_SECONDS + 1.5 * 0.1 * (
        onnx_artifact.CALIBRATION_WINDOWS + 2 * val_windows
    )
    assert reserve_seconds(model_config, data, on, per_window=0.1) == pytest.approx(expected)


def test_training_without_export_writes_no_onnx_file(synthetic_data, tmp_path):
    from pipeline.training.train import train

    result = train(TrainConfig(data_dir=str(synthetic_data), artifact_dir=str(tmp_path / "a"),
                               **{**TINY_TRAIN, "epochs": 1}))  # fmt: skip
    manifest = load_artifact(tmp_path / "a").manifest
    assert not any(name.endswith(".onnx") for name in manifest["files"])
    assert manifest["provenance"]["onnx"] == result.onnx == {"skipped": "export_onnx=False"}


def test_any_export_failure_costs_the_onnx_files_never_the_trained_artifact(
    synthetic_data, tmp_path, monkeypatch
):
    from pipeline.training.train import train

    def export_breaks(*args, **kwargs):
        raise RuntimeError("out of host memory")

    monkeypatch.setattr(onnx_artifact, "export_for_artifact", export_breaks)
    result = train(TrainConfig(data_dir=str(synthetic_data), artifact_dir=str(tmp_path / "a"),
                               **{**TINY_TRAIN, "epochs": 1, "export_onnx": True}))  # fmt: skip
    manifest = load_artifact(tmp_path / "a").manifest
    assert not any(name.endswith(".onnx") for name in manifest["files"])
    assert manifest["provenance"]["onnx"]["error"] == "RuntimeError: out of host memory"
    assert result.onnx == manifest["provenance"]["onnx"]
