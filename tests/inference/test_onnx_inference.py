"""The ONNX engine wired into the infer stage and into the artifact (issue 19): the real exporter, ONNX Runtime,
artifact and infer stage on the tiny session artifact (trained with export_onnx=True).

Skipped where onnxruntime or torch's exporter is not installed, except the tests of what happens then.
"""

from __future__ import annotations

import csv
import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import ROOT

from pipeline.core import onnx as onnx_engine
from pipeline.core.artifact import ArtifactError, _file_record, load_artifact, verify_artifact
from pipeline.core.config import InferConfig
from pipeline.core.onnx import ONNX_FP32, ONNX_INT8, int8_acceptable
from pipeline.core.windows import cosine_scores
from pipeline.inference.predict import EngineSettings, make_engine
from pipeline.inference.submission import run_inference

needs_onnx = pytest.mark.skipif(
    onnx_engine.onnxruntime_missing() is not None or onnx_engine.exporter_missing() is not None,
    reason=f"{onnx_engine.onnxruntime_missing() or onnx_engine.exporter_missing()}: the ONNX engine is off here",
)


def infer(artifact: Path, data: Path, out: Path, **settings) -> tuple[dict, list[dict], np.ndarray]:
    """run_inference -> (its report, the submission's rows, every row's cosine scores from embeddings.npz)."""
    out.mkdir(parents=True)
    config = InferConfig(data_dir=str(data), artifact_dir=str(artifact), submission_path=str(out / "sub.csv"),
                         progress=False, write_embeddings=True, **settings)  # fmt: skip
    result = run_inference(config)
    with open(out / "sub.csv", newline="") as handle:
        rows = list(csv.DictReader(handle))
    model = load_artifact(artifact).model
    unit = torch.nn.functional.normalize(model.classifier.weight.detach(), dim=1)
    embeddings = torch.from_numpy(np.load(out / "embeddings.npz")["embeddings"])
    return result.report, rows, cosine_scores(embeddings, unit).numpy()


@needs_onnx
def test_an_artifact_trained_with_export_lists_verifies_and_records_its_onnx_files(tiny_artifact):
    manifest = verify_artifact(tiny_artifact)
    assert {ONNX_FP32, ONNX_INT8} <= set(manifest["files"])
    assert manifest["files"][ONNX_FP32]["sha256"] == _file_record(tiny_artifact / ONNX_FP32)["sha256"]
    record = manifest["provenance"]["onnx"]
    assert record["fp32"]["file"] == ONNX_FP32 and record["fp32"]["max_abs_diff_vs_torch"] < 1e-4
    assert record["torch"] == torch.__version__ and record["seconds"] > 0
    rule = record["int8"]
    assert rule["metric"] == "accuracy" and rule["calibration_windows"] > 0
    held_out = rule["held_out"]
    assert 0.0 <= held_out["int8"] <= 1.0 and rule["passed"] == int8_acceptable(
        held_out["fp32"], held_out["int8"]
    )
    # The validation split scored by ONNX fp32 is the validation the best epoch recorded (torch, same windows).
    assert held_out["fp32"] == pytest.approx(manifest["provenance"]["validation"]["val_accuracy"], abs=1e-9)


@needs_onnx
def test_the_infer_stage_on_onnx_predicts_torchs_labels_and_scores(tiny_artifact, synthetic_data, tmp_path):
    torch_report, torch_rows, torch_scores = infer(
        tiny_artifact, synthetic_data, tmp_path / "torch", engine="torch"
    )
    report, rows, scores = infer(tiny_artifact, synthetic_data, tmp_path / "onnx", engine="onnx",
                                 onnx_precision="fp32")  # fmt: skip
    assert torch_report["engine"]["ran"] == "torch" and torch_report["engine"]["precision"] == ["fp32"]
    assert report["engine"]["ran"] == "onnx-fp32" and report["engine"]["precision"] == ["fp32"]
    assert report["engine"]["lines"][0].startswith("inference engine: onnx-fp32")
    assert report["speed"]["engine"] == "onnx-fp32"
    assert rows == torch_rows and report["fallbacks"] == [] and len(rows) == 16
    np.testing.assert_allclose(scores, torch_scores, atol=1e-4)
    # auto precision: the int8 file exactly when training's rule passed it
    auto, _, _ = infer(tiny_artifact, synthetic_data, tmp_path / "auto", engine="onnx")
    passed = load_artifact(tiny_artifact).manifest["provenance"]["onnx"]["int8"]["passed"]
    assert auto["engine"]["ran"] == ("onnx-int8" if passed else "onnx-fp32")


@needs_onnx
def test_the_default_auto_engine_races_on_the_runs_batches_and_keeps_torchs_labels(
    tiny_artifact, synthetic_data, tmp_path
):
    """engine auto (the default): torch and ONNX Runtime race on the run's first batches. One window per batch:
    16 batches, so the race is decided; 64 windows per batch: 1 batch (an fp32 race then ends with it, and
    the report says that both engines ran; an int8 race is decided on it)."""
    _, torch_rows, torch_scores = infer(tiny_artifact, synthetic_data, tmp_path / "torch", engine="torch")
    passed = load_artifact(tiny_artifact).manifest["provenance"]["onnx"]["int8"]["passed"]
    onnx = "onnx-int8" if passed else "onnx-fp32"
    decided, rows, scores = infer(tiny_artifact, synthetic_data, tmp_path / "decided", batch_windows=1)
    lines = decided["engine"]["lines"]
    assert (
        len(lines) == 2 and f"torch and {onnx}" in lines[0] and "race on the run's first batches" in lines[0]
    )
    assert decided["engine"]["ran"] in ("torch", onnx) and lines[1].startswith(
        f"inference engine: {decided['engine']['ran']}"
    )
    assert rows == torch_rows or passed  # int8 may move a label; fp32 may not
    if not passed:
        np.testing.assert_allclose(scores, torch_scores, atol=1e-4)
    short, rows, _ = infer(tiny_artifact, synthetic_data, tmp_path / "short", batch_windows=64)
    if passed:  # int8 races on the first batch alone: every row from one engine, even in a one-batch run
        assert short["engine"]["ran"] in ("torch", "onnx-int8")
        assert len(short["engine"]["lines"]) == 2 and "run's first batch" in short["engine"]["lines"][1]
    else:  # fp32 races live: a one-batch run ends during the race, with torch's result for that batch
        assert short["engine"]["ran"] == "torch and onnx-fp32 in turn (the run ended during the race)"
        assert short["engine"]["precision"] == ["fp32"] and rows == torch_rows


@needs_onnx
def test_a_damaged_onnx_file_fails_verification_and_the_run(artifact_copy, synthetic_data, tmp_path):
    """The ONNX files are part of the artifact: a changed byte is a damaged artifact, named, as for any file."""
    path = artifact_copy / ONNX_FP32
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))
    with pytest.raises(ArtifactError, match=r"embedding_model\.onnx: sha256 does not match"):
        verify_artifact(artifact_copy)
    with pytest.raises(ArtifactError, match=r"embedding_model\.onnx"):
        run_inference(InferConfig(data_dir=str(synthetic_data), artifact_dir=str(artifact_copy),
                                  submission_path=str(tmp_path / "sub.csv"), progress=False, engine="torch"))  # fmt: skip


@needs_onnx
def test_an_onnx_file_the_runtime_cannot_load_falls_back_to_torch_and_loses_no_row(
    artifact_copy, synthetic_data, tmp_path
):
    """An artifact that verifies, but whose ONNX file this ONNX Runtime cannot run (here: cut short before
    the manifest was written, as a newer opset would fail): one line, torch computes every row."""
    for name in (ONNX_FP32, ONNX_INT8):
        path = artifact_copy / name
        path.write_bytes(path.read_bytes()[:4000])
    manifest = json.loads((artifact_copy / "manifest.json").read_text())
    for name in (ONNX_FP32, ONNX_INT8):
        manifest["files"][name] = _file_record(artifact_copy / name)
    (artifact_copy / "manifest.json").write_text(json.dumps(manifest))
    verify_artifact(artifact_copy)
    report, rows, scores = infer(artifact_copy, synthetic_data, tmp_path / "onnx", engine="onnx")
    reference, torch_rows, torch_scores = infer(
        artifact_copy, synthetic_data, tmp_path / "torch", engine="torch"
    )
    assert report["engine"]["ran"] == "torch"
    lines = report["engine"]["lines"]
    assert len(lines) == 1 and lines[0].startswith("inference engine: torch (ONNX Runtime unavailable:")
    assert rows == torch_rows and report["fallbacks"] == []
    np.testing.assert_array_equal(scores, torch_scores)


@needs_onnx
@pytest.mark.slow
@pytest.mark.timeout(400)
def test_two_cpu_processes_each_run_their_own_engine_on_their_share_of_the_cores(
    tiny_artifact, synthetic_data, tmp_path
):
    from pipeline.devices.threads import available_cores

    one, one_rows, one_scores = infer(tiny_artifact, synthetic_data, tmp_path / "one", engine="torch")
    two, two_rows, two_scores = infer(tiny_artifact, synthetic_data, tmp_path / "two", engine="onnx",
                                      onnx_precision="fp32", device="cpu", devices=2)  # fmt: skip
    assert two["engine"]["per_device"] == {"cpu#0": "onnx-fp32", "cpu#1": "onnx-fp32"}
    share = max(1, available_cores() // 2)
    assert two["engine"]["threads"] == {"cpu#0": share, "cpu#1": share}
    assert two_rows == one_rows
    np.testing.assert_allclose(two_scores, one_scores, atol=1e-4)


def test_engine_settings_choose_the_files_the_rule_allows():
    both = EngineSettings("auto", "auto", "a.onnx", "a.int8.onnx", int8_passed=True)
    assert both.files()[:2] == ("a.onnx", "a.int8.onnx")
    failed = dataclasses.replace(both, int8_passed=False)
    assert failed.files()[:2] == ("a.onnx", None) and "did not pass" in failed.files()[2]
    assert dataclasses.replace(failed, precision="int8").files()[:2] == ("a.onnx", "a.int8.onnx")
    assert dataclasses.replace(both, precision="fp32").files()[:2] == ("a.onnx", None)
    no_int8 = EngineSettings("onnx", "int8", "a.onnx", None)
    assert no_int8.files()[:2] == ("a.onnx", None) and "no int8 file" in no_int8.files()[2]
    assert EngineSettings("auto").files()[:2] == (None, None)  # no files: the engine exports one


def test_gpus_run_torch_fp16_whatever_the_cpu_engine_says(tiny_artifact):
    model = load_artifact(tiny_artifact).model
    lines: list[str] = []
    embed = make_engine(model, torch.device("cuda", 0), EngineSettings("onnx", "int8"), 2, 8, lines.append)
    assert embed.engine == "torch-fp16" and lines == [
        "inference engine: torch fp16 on cuda:0 (engine='onnx' chooses the CPU engine)"
    ]


def test_without_onnxruntime_the_infer_stage_says_so_once_and_runs_torch(
    tiny_artifact, synthetic_data, tmp_path
):
    """A session without onnxruntime (Python 3.10, a bare image): engine auto says why in one line and torch
    predicts every row."""
    script = f"""
import json, sys
sys.modules["onnxruntime"] = None  # as if not installed: any import of it raises
from pipeline.core.config import InferConfig
from pipeline.inference.submission import run_inference
result = run_inference(InferConfig(data_dir={str(synthetic_data)!r}, artifact_dir={str(tiny_artifact)!r},
                                   submission_path={str(tmp_path / "sub.csv")!r}, progress=False))
print(json.dumps(dict(result.report["engine"], fallbacks=result.n_fallbacks)))
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=ROOT, timeout=300,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    engine = json.loads(done.stdout.strip().splitlines()[-1])
    assert engine["ran"] == "torch" and engine["fallbacks"] == 0
    assert len(engine["lines"]) == 1 and "onnxruntime is not installed" in engine["lines"][0]
