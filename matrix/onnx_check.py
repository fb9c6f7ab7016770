"""The ONNX engine (pipeline/inference/engines.py) on a matrix leg's interpreter, as the two Kaggle images will run it.

    python -m matrix.onnx_check export ARTIFACT DATA OUT        # kaggle-tpu: torch 2.8's exporter
    python -m matrix.onnx_check compare ARTIFACT DATA ONNX_DIR  # kaggle-gpu: ONNX Runtime against torch

export: the artifact's embedding model to OUT/embedding_model.onnx (fp32, checked against torch by the export
itself) and OUT/embedding_model.int8.onnx (calibrated on windows of DATA's training files): the files training
is to write into the artifact.
compare: DATA's test files through inference.run_windows with torch, and with make_embedder (engine "onnx") on
ONNX_DIR's fp32 file and its int8 file (inference never exports: the files come from training). Exit status 1 if an engine
fell back to torch, or an fp32 engine's labels differ from torch's or its scores by more than 1e-4 (int8 is
reported, not judged: its accuracy rule needs held-out labels, which training has).
Prints one JSON line. Run by matrix/run.py with the leg's interpreter (compare: under the offline guard).
"""

from __future__ import annotations

import csv
import json
import sys
from pathlib import Path

import numpy as np
import torch


def windows_of(
    folder: Path, table: str, window: int, limit: int
) -> tuple[list[np.ndarray], list[np.ndarray]]:
    from pipeline.core.data import load_audio, windows

    with open(folder / table, newline="") as handle:
        paths = [folder / row["path"] for row in csv.DictReader(handle)][:limit]
    cut = [windows(load_audio(path)[0], window, 64) for path in paths]
    return [w for w, _ in cut], [r for _, r in cut]


def export(artifact: Path, data: Path, out: Path) -> dict:
    from pipeline.core.artifact import load_artifact
    from pipeline.core.onnx import ONNX_FP32, ONNX_INT8, export_embedding_model, quantize_embedding_model

    model = load_artifact(artifact).model
    out.mkdir(parents=True, exist_ok=True)
    report = export_embedding_model(model, out / ONNX_FP32)
    wavs, lens = windows_of(data, "train.csv", model.config.window_samples, limit=64)
    int8 = quantize_embedding_model(model, report.path, out / ONNX_INT8, torch.from_numpy(np.concatenate(wavs)),
                                    torch.from_numpy(np.concatenate(lens)))  # fmt: skip
    return {"torch": torch.__version__, "export_s": round(report.seconds, 1), "max_abs_diff": report.max_abs_diff,
            "fp32_mb": round(report.path.stat().st_size / 2**20, 2), "int8_mb": round(int8.stat().st_size / 2**20, 2)}  # fmt: skip


def compare(artifact: Path, data: Path, onnx_dir: Path) -> tuple[dict, list[str]]:
    from pipeline.core.artifact import load_artifact
    from pipeline.core.onnx import ONNX_FP32, ONNX_INT8
    from pipeline.core.windows import FileWindows, WindowPlan, run_windows
    from pipeline.inference.engines import make_embedder
    from pipeline.inference.runtime import EngineChoice, Runtime

    model = load_artifact(artifact).model
    wavs, lens = windows_of(data, "test.csv", model.config.window_samples, limit=10_000)
    windows = WindowPlan.for_model(model.config, 8)

    def predict(embed=None) -> np.ndarray:
        items = (
            FileWindows(i, w, r, np.full(len(w), i)) for i, (w, r) in enumerate(zip(wavs, lens, strict=True))
        )
        return run_windows(model, items, len(wavs), windows, torch.device("cpu"), embed=embed).scores

    reference = predict()
    lines: list[str] = []
    engines = {
        "fp32 (kaggle-tpu export)": ("fp32", onnx_dir / ONNX_FP32),
        "int8 (kaggle-tpu quantisation)": ("int8", onnx_dir / ONNX_INT8),
    }
    found, problems = {"torch": torch.__version__, "files": len(wavs), "engines": {}}, []
    for name, (precision, path) in engines.items():
        choice = EngineChoice("onnx", precision, "the matrix's check", str(path))
        embed = make_embedder(model, Runtime(torch.device("cpu"), windows, 0, 2, choice), lines.append)
        scores = predict(embed)
        agree = int((scores.argmax(1) == reference.argmax(1)).sum())
        diff = float(np.abs(scores - reference).max())
        found["engines"][name] = {"engine": embed.engine, "labels_agree": agree, "max_abs_score_diff": diff}
        if embed.engine == "torch":
            problems.append(f"{name}: fell back to torch ({lines[-1]})")
        elif name.startswith("fp32") and (agree != len(wavs) or diff > 1e-4):
            problems.append(
                f"{name}: {agree}/{len(wavs)} labels agree with torch, scores differ by {diff:.2e}"
            )
    found["log"] = lines
    return found, problems


def main(argv: list[str]) -> int:
    command, *paths = argv
    if command == "export":
        print(json.dumps(export(*(Path(p) for p in paths))))
        return 0
    if command == "compare":
        found, problems = compare(*(Path(p) for p in paths))
        print(json.dumps({**found, "problems": problems}))
        return 1 if problems else 0
    raise SystemExit(f"unknown command {command!r}: use export or compare")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
