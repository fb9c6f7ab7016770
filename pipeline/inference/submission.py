"""The infer stage: artifact + competition folder -> submission.csv (+ report).

One way through, whatever the competition (`run_inference`):

    test items (tables.py) -> a plan of rows (rows.py: each id with its file and time span, or no audio)
    -> scores of every span (predict.py, on the session's devices, within the time limit)
    -> one writer (`write_submission`): a label, or one probability per sample_submission class column

Probabilities: the softmax of the scaled cosine scores over the classes the model and the header share (each
row sums to 1) for a single-label model's file rows; independent per-class sigmoids of the same logits for a
multi-label model, and for chunk rows, where a chunk holds any number of classes. A header class the model
never saw gets 0, and both kinds of class mismatch are reported. A row with no usable audio gets the fallback
label, or the training prior (class frequencies; per class, the share of training files that have it, when
the probabilities are independent), and is listed in the report with the reason. Files are written to a
temporary name and renamed: a crash never leaves a half-written submission.
"""

from __future__ import annotations

import json
import os
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..core import objectives
from ..core.artifact import Artifact, load_artifact
from ..core.config import InferConfig
from ..core.data import audio_seconds
from ..core.progress import plural
from ..core.staging import staged_file, write_text_atomically
from ..core.tables import (
    DataError,
    SampleSubmission,
    TestItems,
    TestLayout,
    read_sample_submission,
    read_test_items,
    resolve_inside,
    write_csv,
)
from ..core.windows import FileWindows, SpanPredictions, WindowPlan, chunk_hop, run_windows, span_windows
from .predict import DeviceSettings, EngineSettings, predict_on_devices
from .rows import RowPlan, plan_chunk_rows, plan_file_rows

# Kept back from the time limit for writing the submission and its report: a fixed part, and a part per value
# written (a probability submission of 8,400 rows x 234 classes formats ~2M numbers).
WRITE_RESERVE_S = 20.0
WRITE_SECONDS_PER_VALUE = 2e-6
RATE_PROBE_SECONDS = 30.0  # audio predicted to measure the rate when the test set has less (the public copy)


@dataclass
class InferenceResult:
    submission_path: Path
    report_path: Path
    n_rows: int
    n_fallbacks: int
    label_counts: dict[str, int]
    device_counts: dict[str, int]
    seconds: float
    report: dict[str, Any]

    def summary(self) -> str:
        devices = ", ".join(f"{d}: {n} files" for d, n in self.device_counts.items())
        return (f"wrote {self.submission_path} ({self.n_rows} rows, {self.n_fallbacks} fallbacks) in "
                f"{self.seconds:.1f}s on {devices}; report {self.report_path}")  # fmt: skip


def run_inference(config: InferConfig) -> InferenceResult:
    """Load the artifact, plan the rows, predict their audio, write the submission and its report."""
    started = time.perf_counter()
    artifact = load_artifact(config.artifact_dir)  # an invalid artifact is the one thing that stops the run
    data_dir = Path(config.data_dir)
    layout = TestLayout.of(config)
    sample = read_sample_submission(data_dir / layout.sample_submission)
    items = read_test_items(data_dir, layout, sample.ids)
    plan = plan_rows(config, sample, items, data_dir, layout)
    notes = [*items.notes, plan.rule, *plan.notes]
    for note in notes:
        print(note)
    windows = window_plan(config, artifact)
    deadline = _deadline(config, len(plan.ids), len(sample.value_columns))
    predictions = predict_on_devices(artifact.model, data_dir, plan.files, plan.spans,
                                     _devices(config, artifact), windows, plan.seconds, deadline)  # fmt: skip
    if predictions.stopped:
        notes.append(predictions.stopped)
        print(predictions.stopped)
    speed = speed_report(config, artifact, windows, predictions)
    print(speed["line"])

    fallback = config.fallback_label or artifact.manifest["fallback_label"]  # sealed in every artifact
    if fallback not in artifact.labels:
        raise DataError(f"fallback_label={fallback!r} is not one of the model's labels {artifact.labels}")
    pooling = config.chunk_pooling if plan.chunked else config.clip_pooling
    scores = predictions.pooled[pooling]
    fallbacks = fallback_rows(plan, predictions)
    submission_path = _submission_file(Path(config.submission_path))
    independent = plan.chunked or artifact.model.config.objective != "aam"
    written, class_notes = write_submission(submission_path, sample, plan, scores, predictions.ok, artifact,
                                            fallback, independent)  # fmt: skip
    for note in class_notes:
        print(note)
    notes += class_notes
    report = {
        "rows": len(plan.ids),
        "row_rule": plan.rule,
        "format": "probabilities" if sample.probabilities else "label",
        "clip_pooling": None if plan.chunked else pooling,
        "probabilities": None if not sample.probabilities else "independent" if independent else "softmax",
        "test_items": {"source": items.source, "count": len(items.rows)},
        "chunks": None
        if not plan.chunked
        else {
            "segment_seconds": config.segment_seconds,
            "template": plan.template,
            "pooling": pooling,
            "window_hop_seconds": windows.hop / windows.sample_rate if windows.hop else None,
        },  # fmt: skip
        "notes": notes,
        "fallback_label": fallback,
        "fallbacks": fallbacks,
        "repaired": [{"id": items.rows[i].id, "repairs": r} for i, r in sorted(predictions.repairs.items())],
        "files_per_device": predictions.device_counts,
        "engine": engine_report(config, artifact, predictions),
        "speed": {k: v for k, v in speed.items() if k != "line"},
        "time_limit_minutes": config.time_limit_minutes,
        "stopped": predictions.stopped,
        "artifact": str(artifact.path),
        "seconds": round(time.perf_counter() - started, 3),
    }
    report_path = submission_path.with_name(submission_path.stem + "_report.json")
    write_text_atomically(report_path, json.dumps(report, indent=2))
    if config.write_probabilities or config.write_embeddings:
        _write_extras(submission_path, config, artifact, plan, scores, predictions, independent)
    return InferenceResult(
        submission_path=submission_path,
        report_path=report_path,
        n_rows=len(plan.ids),
        n_fallbacks=len(fallbacks),
        label_counts=dict(Counter(written)),
        device_counts=predictions.device_counts,
        seconds=report["seconds"],
        report=report,
    )


def plan_rows(
    config: InferConfig, sample: SampleSubmission, items: TestItems, data_dir: Path, layout: TestLayout
) -> RowPlan:
    """File rows, or chunk rows when `segment_seconds` is set; the files' header durations either way (they
    order the work and count the chunks)."""
    where = layout.table if items.source == "table" else f"the files under {layout.test_audio_dir}"
    seconds = [_header_seconds(data_dir, row.rel_path) for row in items.rows]
    if config.segment_seconds is None:
        plan = plan_file_rows(sample, items, where)
        plan.seconds = seconds
        return plan
    return plan_chunk_rows(sample, items, seconds, config.segment_seconds, config.row_id_template, where,
                           usual_seconds=config.expected_file_seconds)  # fmt: skip


def _header_seconds(data_dir: Path, rel_path: str) -> float | None:
    try:
        return audio_seconds(resolve_inside(data_dir, rel_path))
    except DataError:
        return None


def window_plan(config: InferConfig, artifact: Artifact) -> WindowPlan:
    """The artifact's windows; a chunk's windows `window_hop_seconds` apart (default: half a window)."""
    model = artifact.model.config
    hop = chunk_hop(model.window_samples, config.window_hop_seconds, model.sample_rate)
    file_hop = (None if config.clip_pooling == "mean" else
                chunk_hop(model.window_samples, config.clip_hop_seconds, model.sample_rate))  # fmt: skip
    return WindowPlan(model.window_samples, model.sample_rate, config.batch_windows or 0,
                      config.max_windows_per_file, hop, config.length_buckets, file_hop)  # fmt: skip


def _devices(config: InferConfig, artifact: Artifact) -> DeviceSettings:
    return DeviceSettings(config.device, config.devices, config.batch_windows, config.num_workers, config.progress,
                          config.num_threads, engine_settings(config, artifact))  # fmt: skip


def engine_settings(config: InferConfig, artifact: Artifact) -> EngineSettings:
    """The engine parameters with the artifact's ONNX files (written and gated at training, verified at load)."""
    from ..core.onnx import ONNX_FP32, ONNX_INT8

    record = artifact.manifest.get("provenance", {}).get("onnx") or {}
    fp32, int8 = artifact.listed_file(ONNX_FP32), artifact.listed_file(ONNX_INT8)
    return EngineSettings(config.engine, config.onnx_precision, str(fp32) if fp32 else None,
                          str(int8) if int8 else None, bool((record.get("int8") or {}).get("passed")))  # fmt: skip


def engine_report(config: InferConfig, artifact: Artifact, predictions: SpanPredictions) -> dict[str, Any]:
    """Which engine and precision computed the batches, per device process, and why (the printed lines)."""
    engines = predictions.engines
    names = sorted(set(engines.values()))
    return {
        "asked": {"engine": config.engine, "onnx_precision": config.onnx_precision},
        "ran": names[0] if len(names) == 1 else names,
        "precision": sorted({engine_precision(name) for name in names}),
        "per_device": engines,
        "threads": predictions.threads,
        "length_buckets": config.length_buckets,
        "artifact_onnx": artifact.manifest.get("provenance", {}).get("onnx"),
        "lines": predictions.engine_notes,
    }


def engine_precision(engine: str) -> str:
    """The arithmetic an engine label stands for: int8, fp16 (CUDA autocast) or fp32 (an fp32 race the run ended
    during, engines.RacingEmbedder, is fp32 on both engines; an int8 race is decided on the first batch)."""
    return "int8" if "int8" in engine.split(",")[0] else "fp16" if "fp16" in engine else "fp32"


def _deadline(config: InferConfig, rows: int, columns: int) -> float | None:
    """When prediction must stop (time.time()) for the notebook to end within time_limit_minutes, counted from
    the start of the process that runs it (the notebook's kernel): writing the submission is kept back."""
    if config.time_limit_minutes is None:
        return None
    reserve = WRITE_RESERVE_S + WRITE_SECONDS_PER_VALUE * rows * columns
    return process_started_at() + config.time_limit_minutes * 60 - reserve


def process_started_at() -> float:
    """When this process started (time.time() scale): Linux's /proc, else now."""
    try:
        ticks = int(Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[19])
        boot = next(int(line.split()[1]) for line in Path("/proc/stat").read_text().splitlines()
                    if line.startswith("btime"))  # fmt: skip
        return boot + ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, StopIteration):
        return time.time()


# ------------------------------------------------------------------------------------------- speed


def speed_report(
    config: InferConfig, artifact: Artifact, windows: WindowPlan, predictions: SpanPredictions
) -> dict[str, Any]:
    """The rate (seconds of audio per second) and, for `expected_test_files` x `expected_file_seconds`, the
    projected prediction time. A test set shorter than RATE_PROBE_SECONDS (the public copy's few files, or
    none) gives no rate worth the name: it is measured on that much generated audio instead."""
    measured_on = "the test files"
    audio, seconds = predictions.audio_seconds, predictions.seconds
    if audio < RATE_PROBE_SECONDS:
        audio, seconds = probe_rate(artifact, windows, config.segment_seconds, predictions.embedder)
        measured_on = f"{audio:.0f} s of generated audio (the test set has less)"
    rate = audio / seconds if seconds > 0 else float("nan")
    engines = ", ".join(sorted(set(predictions.engines.values()))) or "torch"
    speed: dict[str, Any] = {"audio_seconds": round(audio, 1), "seconds": round(seconds, 2),
                             "audio_seconds_per_second": round(rate, 1), "measured_on": measured_on,
                             "threads": torch.get_num_threads(), "engine": engines}  # fmt: skip
    line = (f"rate: {rate:.1f} s of audio per second ({measured_on}, {engines}, "
            f"{plural(torch.get_num_threads(), 'thread')})")  # fmt: skip
    if config.expected_test_files and config.expected_file_seconds:
        hidden = config.expected_test_files * config.expected_file_seconds
        speed["projected_seconds"] = round(hidden / rate, 1)
        line += (f"; projected for {config.expected_test_files} files x {config.expected_file_seconds:g} s: "
                 f"{hidden / rate / 60:.1f} min of prediction")  # fmt: skip
        if config.time_limit_minutes:
            line += f" (time limit {config.time_limit_minutes:g} min)"
    speed["line"] = line
    return speed


def probe_rate(
    artifact: Artifact, windows: WindowPlan, segment: float | None, embed: Callable | None = None
) -> tuple[float, float]:
    """(audio seconds, seconds) of predicting RATE_PROBE_SECONDS of noise in this run's windows and chunks, with
    this run's `embed` (the engine that predicted; None: torch)."""
    from .inference_devices import batching_for

    model = artifact.model
    device = next(model.parameters()).device
    batch, _ = batching_for(windows.batch_windows or None, 0, model.config, device)
    noise = np.random.default_rng(0).standard_normal(int(RATE_PROBE_SECONDS * windows.sample_rate))
    noise = (0.05 * noise).astype(np.float32)
    if segment:
        count = int(RATE_PROBE_SECONDS // segment)
        spans = [(k, k * segment, (k + 1) * segment) for k in range(count)]
    else:
        spans, count = [(0, 0.0, None)], 1
    started = time.perf_counter()
    item = FileWindows(0, *span_windows(noise, spans, windows))
    run_windows(model, iter([item]), count, batch, device, embed=embed, buckets=windows.buckets())
    return RATE_PROBE_SECONDS, time.perf_counter() - started


# ------------------------------------------------------------------------------------------ writing


def fallback_rows(plan: RowPlan, predictions: SpanPredictions) -> list[dict[str, str]]:
    """Every row with no prediction, and why."""
    fallbacks = []
    for row, (row_id, span) in enumerate(zip(plan.ids, plan.span_of, strict=True)):
        if span is None:
            fallbacks.append({"id": row_id, "reason": plan.missing.get(row, "no audio")})
        elif not predictions.ok[span]:
            file = plan.spans[span].file
            reason = predictions.problems.get(
                file, "no audio in this span (the file is shorter than its header says)"
            )
            fallbacks.append({"id": row_id, "reason": reason})
    return fallbacks


def write_submission(
    path: Path,
    sample: SampleSubmission,
    plan: RowPlan,
    scores: np.ndarray,
    ok: np.ndarray,
    artifact: Artifact,
    fallback: str,
    independent: bool,
) -> tuple[list[str], list[str]]:
    """submission.csv with sample_submission's header: a label per row, or a probability per class column.
    Returns the most probable class of every row, and notes on classes the model and the header do not share."""
    labels = artifact.labels
    if not sample.probabilities:
        written = []
        for span in plan.span_of:
            usable = span is not None and ok[span]
            written.append(labels[int(np.argmax(scores[span]))] if usable else fallback)
        write_csv(path, [sample.id_column, sample.value_columns[0]], zip(plan.ids, written, strict=True))
        return written, []
    shared = np.array([labels.index(c) if c in labels else -1 for c in sample.value_columns])
    known = shared[shared >= 0]
    notes = class_notes(sample, labels, shared)
    prior = training_prior(artifact, known, independent)
    scale = float(artifact.model.config.score_scale)
    rows, written = [], []
    for row_id, span in zip(plan.ids, plan.span_of, strict=True):
        probs = np.zeros(len(shared))
        if len(known):
            usable = span is not None and ok[span]
            probs[shared >= 0] = probabilities(scores[span][known], scale, independent) if usable else prior
        rows.append([row_id, *(f"{p:.6g}" for p in probs)])
        written.append(sample.value_columns[int(np.argmax(probs))])
    write_csv(path, [sample.id_column, *sample.value_columns], rows)
    return written, notes


def probabilities(cosines: np.ndarray, scale: float, independent: bool) -> np.ndarray:
    """Class probabilities from cosine scores (objectives.probabilities, in float64 on numpy arrays)."""
    return objectives.probabilities(
        torch.from_numpy(np.asarray(cosines, dtype=np.float64)), scale, independent
    ).numpy()


def class_notes(sample: SampleSubmission, labels: list[str], shared: np.ndarray) -> list[str]:
    notes = []
    unseen = [c for c, k in zip(sample.value_columns, shared, strict=True) if k < 0]
    if unseen:
        notes.append(f"{len(unseen)} class column(s) of {sample.path.name} the model never saw get probability 0: "
                     f"{', '.join(repr(c) for c in unseen[:10])}{' ...' if len(unseen) > 10 else ''}")  # fmt: skip
    missing = [label for label in labels if label not in set(sample.value_columns)]
    if missing:
        notes.append(f"{len(missing)} label(s) the model knows have no column in {sample.path.name} (their share "
                     f"goes to the others): {', '.join(repr(c) for c in missing[:10])}")  # fmt: skip
    return notes


def training_prior(artifact: Artifact, known: np.ndarray, independent: bool) -> np.ndarray:
    """The fallback probabilities over `known` classes: the training label frequencies (summing to 1), or with
    `independent` probabilities each class's share of the training files. Uniform if the artifact does not
    record them."""
    provenance = artifact.manifest.get("provenance", {})
    counts = provenance.get("label_counts") or {}
    weights = np.array([float(counts.get(artifact.labels[k], 0)) for k in known])
    if weights.sum() <= 0:
        return np.full(len(known), 1.0 / max(1, len(known)))
    if independent:
        files = float(provenance.get("train_files") or weights.sum())
        return np.clip(weights / files, 0.0, 1.0)
    return weights / weights.sum()


def _submission_file(path: Path) -> Path:
    """`submission_path` names a file, or an existing folder to write submission.csv in."""
    if path.is_dir():
        print(f"submission_path {path} is a folder: writing {path / 'submission.csv'}")
        return path / "submission.csv"
    return path


def _write_extras(submission_path, config, artifact, plan, scores, predictions, independent) -> None:
    """probabilities.csv (every class of the model) and embeddings.npz, for every row that has audio."""
    rows = [(row_id, span) for row_id, span in zip(plan.ids, plan.span_of, strict=True) if span is not None]
    ids = np.array([row_id for row_id, _ in rows])
    spans = np.array([span for _, span in rows], dtype=np.int64)
    if config.write_probabilities:
        scale = float(artifact.model.config.score_scale)
        probs = probabilities(np.nan_to_num(scores[spans], nan=0.0), scale, independent)
        probs[~predictions.ok[spans]] = np.nan
        write_csv(submission_path.with_name("probabilities.csv"), ["id", *artifact.labels],
                  ([sid, *(f"{p:.6f}" for p in row)] for sid, row in zip(ids, probs, strict=True)))  # fmt: skip
    if config.write_embeddings:
        with staged_file(submission_path.with_name("embeddings.npz")) as staging:
            np.savez(staging, ids=ids, embeddings=predictions.embeddings[spans], ok=predictions.ok[spans])
