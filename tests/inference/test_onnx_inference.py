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
from pipeline.inference.runtime import Hardware, choose_engine, resolve_runtime
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
    assert torch_report["engine"]["ran"] == "torch" and torch_report["engine"]["precision"] == "fp32"
    assert report["engine"]["ran"] == "onnx-fp32" and report["engine"]["precision"] == "fp32"
    assert report["engine"]["lines"][0].startswith("inference engine: onnx-fp32")
    assert report["speed"]["engine"] == "onnx-fp32"
    assert rows == torch_rows and report["fallbacks"] == [] and len(rows) == 16
    np.testing.assert_allclose(scores, torch_scores, atol=1e-4)
    # auto precision: the int8 file exactly when training's rule passed it
    auto, _, _ = infer(tiny_artifact, synthetic_data, tmp_path / "auto", engine="onnx")
    passed = load_artifact(tiny_artifact).manifest["provenance"]["onnx"]["int8"]["passed"]
    assert auto["engine"]["ran"] == ("onnx-int8" if passed else "onnx-fp32")


@needs_onnx
def test_the_default_auto_engine_races_int8_on_the_first_batch_or_runs_torch(
    tiny_artifact, synthetic_data, tmp_path
):
    """engine auto (the default): the artifact's int8 file, if it passed its rule at training, races torch on
    the run's first batch and every row comes from the winner; without a passing int8 file, torch."""
    _, torch_rows, torch_scores = infer(tiny_artifact, synthetic_data, tmp_path / "torch", engine="torch")
    passed = load_artifact(tiny_artifact).manifest["provenance"]["onnx"]["int8"]["passed"]
    for batch in (1, 64):  # 16 batches, or the whole test set in one
        report, rows, scores = infer(
            tiny_artifact, synthetic_data, tmp_path / f"auto{batch}", batch_windows=batch
        )
        lines = report["engine"]["lines"]
        assert report["engine"]["chosen"]["mode"] == ("race" if passed else "torch")
        if not passed:
            assert report["engine"]["ran"] == "torch" and rows == torch_rows
            assert lines == [
                "inference engine: torch on cpu (auto: the artifact's int8 did not pass its accuracy rule)"
            ]
            np.testing.assert_array_equal(scores, torch_scores)
            continue
        assert len(lines) == 2 and "torch and onnx-int8 race on the first batch" in lines[0]
        assert report["engine"]["ran"] in ("torch", "onnx-int8")
        assert lines[1].startswith(f"inference engine: {report['engine']['ran']}") and "median of" in lines[1]


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
    assert len(lines) == 1 and lines[0].startswith(
        f"inference engine: torch (onnx-{report['engine']['chosen']['precision']}"
    )
    assert "unavailable: InvalidProtobuf" in lines[0]
    assert rows == torch_rows and report["fallbacks"] == []
    np.testing.assert_array_equal(scores, torch_scores)


def test_the_engine_is_chosen_from_the_config_and_the_artifacts_onnx_files(tiny_artifact):
    artifact = load_artifact(tiny_artifact)

    def choice(passed=True, files=(ONNX_FP32, ONNX_INT8), device="cpu", **config):
        provenance = {**artifact.manifest.get("provenance", {}), "onnx": {"int8": {"passed": passed}}}
        manifest = {**artifact.manifest, "provenance": provenance,
                    "files": {name: {} for name in files}}  # fmt: skip
        faked = dataclasses.replace(artifact, manifest=manifest)
        return choose_engine(InferConfig(**config), faked, torch.device(device))

    assert (choice().mode, choice().precision, Path(choice().onnx_path).name) == ("race", "int8", ONNX_INT8)
    failed = choice(passed=False)
    assert (failed.mode, failed.onnx_path) == ("torch", None) and "did not pass" in failed.why
    assert choice(passed=False, onnx_precision="int8").precision == "int8"  # asked for: it runs
    assert (choice(onnx_precision="fp32").mode, choice(onnx_precision="fp32").precision) == ("race", "fp32")
    forced = choice(passed=False, engine="onnx")
    assert (forced.mode, forced.precision, Path(forced.onnx_path).name) == ("onnx", "fp32", ONNX_FP32)
    no_int8 = choice(files=(ONNX_FP32,), onnx_precision="int8")
    assert no_int8.mode == "torch" and "no int8 file" in no_int8.why
    assert choice(files=(ONNX_FP32,), engine="onnx", onnx_precision="int8").precision == "fp32"
    bare = choice(files=(), engine="onnx")
    assert bare.mode == "torch" and "no fp32 ONNX file" in bare.why  # nothing is exported at inference
    assert choice(engine="torch").mode == "torch"
    gpu = choice(device="cuda", engine="onnx")
    assert (gpu.mode, gpu.precision) == ("torch", "fp16") and "chooses the CPU engine" in gpu.why


def test_a_gpu_session_runs_torch_fp16_with_big_batches_and_spare_cores_decoding(tiny_artifact):
    artifact = load_artifact(tiny_artifact)
    config = InferConfig(engine="onnx", onnx_precision="int8")
    runtime = resolve_runtime(config, artifact, Hardware(gpus=2, cores=4))
    assert runtime.device == torch.device("cuda", 0)  # one device: a second T4 is not worth a process
    assert (runtime.windows.batch_windows, runtime.num_workers, runtime.threads) == (256, 3, None)
    assert runtime.engine.label == "torch" and runtime.engine.precision == "fp16"
    assert "cuda:0" in runtime.describe() and "torch fp16" in runtime.describe()
    cpu = resolve_runtime(InferConfig(engine="torch"), artifact, Hardware(gpus=0, cores=2))
    assert (cpu.device.type, cpu.num_workers, cpu.threads) == ("cpu", 0, 2)


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
    assert engine["ran"] == "torch" and engine["fallbacks"] == 0 and len(engine["lines"]) == 1
    if engine["chosen"]["why"].startswith("auto: its int8 passed"):  # else ONNX Runtime is not asked for
        assert "onnxruntime is not installed" in engine["lines"][0]
