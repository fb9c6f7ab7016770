"""The ONNX engine (pipeline/inference/engines.py) on a matrix leg's interpreter, as Kaggle's GPU image will run it.

    python -m matrix.onnx_check compare ARTIFACT DATA   # kaggle-gpu: ONNX Runtime against torch

DATA's test files through inference.run_windows with torch, and with make_embedder (engine "onnx") on the fp32
and int8 files that training wrote into ARTIFACT (kaggle-tpu's torch exported them; inference never exports).
Exit status 1 if an engine fell back to torch, or an fp32 engine's labels differ from torch's or its scores by
more than 1e-4 (int8 is reported, not judged: its accuracy rule needs held-out labels, which training has).
Prints one JSON line. Run by matrix/run.py with the leg's interpreter, under the offline guard.
"""

from __future__ import annotations

import csv
import json
import sys
from pathlib import Path

import numpy as np
import torch


def windows_of(folder: Path, table: str, window: int) -> tuple[list[np.ndarray], list[np.ndarray]]:
    from pipeline.core.data import load_audio, windows

    with open(folder / table, newline="") as handle:
        paths = [folder / row["path"] for row in csv.DictReader(handle)]
    cut = [windows(load_audio(path)[0], window, 64) for path in paths]
    return [w for w, _ in cut], [r for _, r in cut]


def compare(artifact: Path, data: Path) -> tuple[dict, list[str]]:
    from pipeline.core.artifact import load_artifact
    from pipeline.core.onnx import ONNX_FP32, ONNX_INT8
    from pipeline.core.windows import FileWindows, WindowPlan, run_windows
    from pipeline.inference.engines import make_embedder
    from pipeline.inference.runtime import EngineChoice, Runtime

    model = load_artifact(artifact).model
    wavs, lens = windows_of(data, "test.csv", model.config.window_samples)
    windows = WindowPlan.for_model(model.config, 8)

    def predict(embed=None) -> np.ndarray:
        items = (
            FileWindows(i, w, r, np.full(len(w), i)) for i, (w, r) in enumerate(zip(wavs, lens, strict=True))
        )
        return run_windows(model, items, len(wavs), windows, torch.device("cpu"), embed=embed).scores

    reference = predict()
    lines: list[str] = []
    engines = {
        "fp32 (kaggle-tpu's training)": ("fp32", artifact / ONNX_FP32),
        "int8 (kaggle-tpu's training)": ("int8", artifact / ONNX_INT8),
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
    if command == "compare":
        found, problems = compare(*(Path(p) for p in paths))
        print(json.dumps({**found, "problems": problems}))
        return 1 if problems else 0
    raise SystemExit(f"unknown command {command!r}: use compare")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
