"""The ONNX Runtime files training writes into the artifact: the fp32 export, the int8 file calibrated on
training windows, and the int8 accuracy rule judged on the validation split (or, with none, training files).

Why at training, not at inference: only training has labelled held-out data, which the int8 rule needs, and
training windows to calibrate on; the export (~20 s) is then paid once instead of in every submission run, and
by a known torch (the Kaggle TPU image's 2.8 exports files that ONNX Runtime runs beside the GPU image's 2.10;
the matrix checks both). Artifacts without the files (export_onnx=False, an export that failed, earlier
versions) still work: the infer stage exports the fp32 file from the loaded weights when it needs one.

Everything runs on the host CPU copy of the kept weights (train.finish's `final`), on rank 0, after the last
step: on TPU the XLA device is never involved. A failure costs the files, never the artifact: ExportError (or
a quantisation error) is reported in one line and recorded in the provenance (`provenance["onnx"]`).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from ..core import onnx as core_onnx
from ..core.config import MAX_WINDOWS_PER_FILE, TrainConfig
from ..core.model import ModelConfig, SpeakerClassifier, embed_waveforms
from ..core.onnx import ONNX_FP32, ONNX_INT8, ExportError, OnnxEmbedder, int8_acceptable
from ..core.progress import first_line
from ..devices.threads import available_cores
from .validation import chunk_scores, file_scores, sampled_crops, score_or_nan, spread_evenly

if TYPE_CHECKING:
    from .dataset import TrainingData

CALIBRATION_WINDOWS = 256  # training crops whose activation ranges set int8's scales
JUDGED_TRAINING_FILES = 128  # what int8 is judged on when there is no validation split (files_to_judge)
# Time kept back from the training budget for the export, beyond the CPU passes estimated from the model:
# the export itself took 18.6 s for the tiny model and 20.9 s for 'voxceleb' on a slow day (tracing and
# conversion dominate, not the weights; benchmarks/raw/onnx_export.json), ONNX Runtime's sessions and the
# quantiser's graph passes a few more. An ensemble's export grows with its members (38.4 s for 3 tiny ones).
EXPORT_FIXED_SECONDS = 45.0


@dataclass
class OnnxFiles:
    """What training adds to the artifact: artifact name -> file, and the provenance record."""

    files: dict[str, Path] = field(default_factory=dict)
    record: dict[str, Any] = field(default_factory=dict)


def export_for_artifact(
    model: SpeakerClassifier,
    data: TrainingData,
    config: TrainConfig,
    metric: str,
    folder: Path,
    log: Callable[[str], Any] = print,
) -> OnnxFiles:
    """The fp32 and int8 ONNX files of `model` (CPU, eval) in `folder`, int8 judged on the validation split by
    `metric` (accuracy for one-class models). Never raises for an export or quantisation problem."""
    try:
        exported = core_onnx.export_embedding_model(model, folder / ONNX_FP32)
    except ExportError as error:
        log(
            f"ONNX export: the artifact gets no ONNX files ({error}); the infer stage runs torch or exports again"
        )
        return OnnxFiles(record={"error": str(error)})
    result = OnnxFiles({ONNX_FP32: exported.path})
    result.record = {
        "torch": exported.torch_version,
        "opset": exported.opset,
        "fp32": {
            "file": ONNX_FP32,
            "export_s": round(exported.seconds, 1),
            "max_abs_diff_vs_torch": exported.max_abs_diff,
        },
    }
    started = time.perf_counter()
    try:
        # One training crop per file (real audio: random noise has other activation ranges).
        wavs, lens = sampled_crops(
            data.store, data.items, data.train_idx or data.val_idx, CALIBRATION_WINDOWS, config, salt=2039
        )
        int8_path = core_onnx.quantize_embedding_model(model, exported.path, folder / ONNX_INT8, wavs, lens)
        rule = int8_rule(model, data, config, metric, exported.path, int8_path)
    except Exception as error:  # noqa: BLE001 - onnxruntime.quantization raises many types; fp32 still ships
        log(f"ONNX int8: none in the artifact ({type(error).__name__}: {first_line(error)}); fp32 is there")
        result.record["int8"] = {"error": f"{type(error).__name__}: {error}"[:500]}
        return result
    result.files[ONNX_INT8] = int8_path
    result.record["int8"] = {
        "file": ONNX_INT8,
        "calibration_windows": len(wavs),
        "seconds": round(time.perf_counter() - started, 1),
        **rule,
    }
    log(f"ONNX files for CPU inference: fp32 (export {exported.seconds:.0f} s), int8 {describe(rule)}")
    return result


def int8_rule(
    model: SpeakerClassifier,
    data: TrainingData,
    config: TrainConfig,
    metric: str,
    fp32_path: Path,
    int8_path: Path,
) -> dict[str, Any]:
    """fp32 and int8 ONNX Runtime scored as validation scores (files_to_judge's files; labelled soundscape
    chunks too when there are), and whether int8 stays within the rule on each."""
    name = "accuracy" if data.objective == "aam" else metric
    where, judged_files = files_to_judge(data)
    data = replace(data, val_idx=judged_files)
    threads = available_cores()
    found: dict[str, dict[str, float]] = {}
    for precision, path in (("fp32", fp32_path), ("int8", int8_path)):
        embed = OnnxEmbedder(model, path, threads, precision)  # this process, all of the split, on the CPU
        if data.val_idx:
            scores = file_scores(model, data, config, embed).numpy()
            found.setdefault(where, {})[precision] = score_or_nan(name, data.truth(data.val_idx), scores)
        if (scapes := data.soundscapes) is not None:
            scores = chunk_scores(model, scapes, config, embed).numpy()
            found.setdefault("soundscapes", {})[precision] = score_or_nan(name, scapes.truth, scores)
    judged = {k: v for k, v in found.items() if not np.isnan(v["fp32"])}
    passed = bool(judged) and all(int8_acceptable(v["fp32"], v["int8"]) for v in judged.values())
    rounded = {k: {p: round(x, 5) for p, x in v.items()} for k, v in found.items()}
    return {"passed": passed, "metric": name, **rounded}


def files_to_judge(data: TrainingData) -> tuple[str, list[int]]:
    """The files int8 is judged on: the held-out files; with none (val_fraction 0, the sound-event recipe) and
    no labelled soundscapes, JUDGED_TRAINING_FILES training files, which still show what quantisation loses
    against fp32 (a file's score moved across a decision), though not how either generalises. They are spread
    over the whole table: tables are often sorted by class, and a stride cut off at the count judged ESC-10's
    first eight classes only."""
    if data.val_idx or data.soundscapes is not None:
        return "held_out", data.val_idx
    return "training_files", spread_evenly(data.train_idx, JUDGED_TRAINING_FILES)


def describe(rule: dict[str, Any]) -> str:
    values = "; ".join(
        f"{where} {rule['metric']} fp32 {v['fp32']:.4f}, int8 {v['int8']:.4f}"
        for where, v in rule.items()
        if isinstance(v, dict)
    )
    if rule["passed"]:
        return f"passes: the infer stage runs it ({values})"
    return f"fails the 0.5-point rule: inference runs fp32 ({values})"


def reserve_seconds(
    model_config: ModelConfig, data: TrainingData, config: TrainConfig, per_window: float | None = None
) -> float:
    """Time to keep back from the training budget for export_for_artifact: EXPORT_FIXED_SECONDS, plus ONNX
    Runtime passes over the calibration windows and (fp32 and int8) the validation windows at `per_window`
    seconds each (default: what torch eager takes on this host, cpu_seconds_per_window; ONNX Runtime's fp32
    measured 0.9-1.0x that, int8 0.5x: an upper bound), times 1.5."""
    if not config.export_onnx:
        return 0.0
    window = config.window_samples
    lengths = data.store.lengths[data.items[files_to_judge(data)[1]]]
    val_windows = int(np.clip(-(-lengths // window), 1, MAX_WINDOWS_PER_FILE).sum())
    if data.soundscapes is not None:  # a 5 s chunk: about 9 half-overlapping 1 s windows / 3
        val_windows += 3 * len(data.soundscapes.items)
    if per_window is None:
        per_window = cpu_seconds_per_window(model_config, window)
    return EXPORT_FIXED_SECONDS + 1.5 * per_window * (CALIBRATION_WINDOWS + 2 * val_windows)


def cpu_seconds_per_window(model_config: ModelConfig, window: int) -> float:
    """Seconds torch eager takes per window of this model on this host's CPU (a batch of 4, after a warm-up)."""
    probe = SpeakerClassifier(model_config).eval()
    wavs, lens, cpu = 0.05 * torch.randn(4, window), torch.ones(4), torch.device("cpu")
    with torch.inference_mode():
        embed_waveforms(probe, wavs, lens, cpu)
        started = time.perf_counter()
        embed_waveforms(probe, wavs, lens, cpu)
        return (time.perf_counter() - started) / 4
