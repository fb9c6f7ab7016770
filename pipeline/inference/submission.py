"""The infer stage: artifact + competition folder -> submission.csv (+ report). `run_inference` is four calls:

    plan = plan_rows(sample, items, config)           which rows, and the audio span behind each (rows.py)
    runtime = resolve_runtime(config, artifact)       device, batches, threads, engine, decided once (runtime.py)
    predictions = predict(model, plan, runtime, ..)   every span's scores, within the time limit (predict.py)
    write_submission(config, artifact, ...)           chunk scores post-processed (postprocess.py), then a
                                                      label or class probabilities per row, and the report

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
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..core import objectives
from ..core.artifact import Artifact, load_artifact
from ..core.config import InferConfig
from ..core.kaggle import is_competition_rerun, process_started_at
from ..core.progress import plural
from ..core.staging import (
    check_output_file,
    file_sha256,
    read_record,
    staged_file,
    write_text_atomically,
)
from ..core.tables import (
    DataError,
    SampleSubmission,
    TestItems,
    TestLayout,
    read_sample_submission,
    read_test_items,
    write_csv,
)
from ..core.windows import TIME_LIMIT_PROBLEM, SpanPredictions
from ..teachers.blend import blend, teacher_probabilities
from .postprocess import post_process
from .predict import Predictions, predict
from .rows import RowPlan, plan_rows
from .runtime import Runtime, resolve_runtime

# Kept back from the time limit for writing the submission and its report: a fixed part, and a part per value
# written (a probability submission of 8,400 rows x 234 classes formats ~2M numbers).
WRITE_RESERVE_S = 20.0
WRITE_SECONDS_PER_VALUE = 2e-6


@dataclass(frozen=True)
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
        line = (
            f"wrote {self.submission_path} ({self.n_rows} rows, {self.n_fallbacks} fallbacks) in "
            f"{self.seconds:.1f}s on {devices}; report {self.report_path}"
        )
        alarm = self.report.get("fallback_summary", {}).get("alarm")
        return f"{line}\n{alarm}" if alarm else line


class AllFallbacksError(DataError):
    """So many rows fell back (fallback_alarm_share) that the submission would be the prior: a failure of the
    input, raised under fail_on_all_fallbacks after the report is written and before the submission is."""


def run_inference(config: InferConfig) -> InferenceResult:
    """Load the artifact, plan the rows, predict their audio, write the submission and its report."""
    started = time.perf_counter()
    artifact = load_artifact(config.artifact_dir)  # an invalid artifact is the one thing that stops the run
    outputs = OutputFiles.of(config)  # refused before anything is predicted, not after
    sample, items = read_test_set(config)
    plan = plan_rows(sample, items, config)
    runtime = resolve_runtime(config, artifact)
    for line in [*plan.notes, plan.segment_rule, plan.rule, runtime.describe()]:
        print(line)
    predictions = predict(artifact.model, plan, runtime, prediction_deadline(config, plan, sample))
    return write_submission(
        config, artifact, sample, plan, predictions, runtime, outputs=outputs, started=started
    )


def read_test_set(config: InferConfig) -> tuple[SampleSubmission, TestItems]:
    """The sample submission and the test items (a table's rows, or the files of a folder)."""
    layout = TestLayout.of(config)
    sample = read_sample_submission(Path(config.data_dir) / layout.sample_submission)
    return sample, read_test_items(config.data_dir, layout, sample.ids)


def prediction_deadline(config: InferConfig, plan: RowPlan, sample: SampleSubmission) -> float | None:
    """When prediction must stop (time.time()) for the notebook to end within time_limit_minutes, counted from
    the start of the process that runs it (the notebook's kernel): writing the submission is kept back."""
    if config.time_limit_minutes is None:
        return None
    reserve = WRITE_RESERVE_S + WRITE_SECONDS_PER_VALUE * len(plan.ids) * len(sample.value_columns)
    return process_started_at() + config.time_limit_minutes * 60 - reserve


# ------------------------------------------------------------------------------------------ writing

# Every report this project writes holds these keys: how a report beside the submission is told from a user's.
REPORT_KEYS = ("row_rule", "fallback_summary")
EXTRA_NAMES = ("probabilities.csv", "embeddings.npz")


@dataclass(frozen=True)
class OutputFiles:
    """Where the infer stage writes. The submission is the file the user named (submission_path, or
    submission.csv in the folder it names) and is replaced as asked; its report and the extras beside it are
    named by this project, so each is replaced only if this project wrote it: the report when it holds
    REPORT_KEYS, an extra when that report lists it with its sha256 (`OutputFiles.of` refuses the others)."""

    submission: Path
    report: Path
    probabilities: Path | None  # probabilities.csv, when write_probabilities
    embeddings: Path | None  # embeddings.npz, when write_embeddings
    # {name: sha256} of the extras beside it that this project wrote and nobody changed since, as the report
    # there lists them: read once, before anything is predicted (carried into the next report, so a run
    # without an extra keeps it ours).
    ours: dict[str, str]

    @classmethod
    def of(cls, config: InferConfig) -> OutputFiles:
        path = Path(config.submission_path)
        if path.is_dir():  # submission_path names a file, or an existing folder to write submission.csv in
            print(f"submission_path {path} is a folder: writing {path / 'submission.csv'}")
            path = path / "submission.csv"
        report = path.with_name(path.stem + "_report.json")
        outputs = cls(
            path,
            report,
            path.with_name(EXTRA_NAMES[0]) if config.write_probabilities else None,
            path.with_name(EXTRA_NAMES[1]) if config.write_embeddings else None,
            _extras_written(report),
        )
        instead = "choose another submission_path folder"
        check_output_file(
            outputs.report,
            is_ours=lambda p: read_record(p, REPORT_KEYS) is not None,
            what="an infer report",
            why="the submission's report",
            instead=instead,
        )
        for extra in outputs.extras:
            check_output_file(
                extra,
                is_ours=lambda p: p.name in outputs.ours,
                what=f"an extra listed with its sha256 in {outputs.report.name}",
                why=f"{'write_probabilities' if extra == outputs.probabilities else 'write_embeddings'}=True",
                instead=instead,
            )
        return outputs

    @property
    def extras(self) -> list[Path]:
        return [p for p in (self.probabilities, self.embeddings) if p is not None]


def _extras_written(report: Path) -> dict[str, str]:
    listed = (read_record(report, REPORT_KEYS) or {}).get("extras")
    if not isinstance(listed, dict):  # none (an older report), or not a report of ours
        return {}
    beside = {name: report.parent / name for name in listed if name in EXTRA_NAMES}
    return {
        name: listed[name] for name, p in beside.items() if p.is_file() and file_sha256(p) == listed[name]
    }


@dataclass(frozen=True)
class Scoring:
    """How a row's scores become what the submission holds."""

    labels: list[str]  # the model's classes
    pooling: str  # which pooled scores the rows use (chunk_pooling or clip_pooling)
    independent: bool  # per-class sigmoids (multi-label, chunks) rather than a softmax
    scale: float  # the cosine classifier's logit scale
    fallback: str  # the label of a row with no usable audio

    @classmethod
    def of(
        cls, config: InferConfig, artifact: Artifact, plan: RowPlan, independent: bool | None = None
    ) -> Scoring:
        """The submission's rule: sigmoids for chunk rows and multi-label models; `independent` overrides it."""
        fallback = config.fallback_label or artifact.manifest["fallback_label"]  # sealed in every artifact
        if fallback not in artifact.labels:
            raise DataError(f"fallback_label={fallback!r} is not one of the model's labels {artifact.labels}")
        model = artifact.model.config
        if independent is None:
            independent = plan.chunked or model.objective != "aam"
        return cls(
            artifact.labels,
            config.chunk_pooling if plan.chunked else config.clip_pooling,
            independent,
            float(model.score_scale),
            fallback,
        )


def write_submission(
    config: InferConfig,
    artifact: Artifact,
    sample: SampleSubmission,
    plan: RowPlan,
    predictions: Predictions,
    runtime: Runtime,
    *,
    outputs: OutputFiles,
    started: float,
) -> InferenceResult:
    """submission.csv with sample_submission's header (a label per row, or a probability per class column), its
    report beside it, and the extras the config asks for."""
    scoring = Scoring.of(config, artifact, plan)
    spans = predictions.spans
    scores = post_process(spans.pooled[scoring.pooling], plan, config.chunk_smoothing, config.file_max_weight)
    probs = span_probabilities(scores, scoring, predictions, runtime)
    path = outputs.submission
    if sample.probabilities:
        prior = training_prior(artifact, scoring.independent)
        header, rows, written, notes = probability_rows(sample, plan, probs, spans.ok, scoring, prior)
    else:
        header, rows, written, notes = label_rows(sample, plan, probs, spans.ok, scoring)
    fallbacks, causes = fallback_rows(plan, spans)
    summary = fallback_summary(config, causes, len(plan.ids), path)
    extras = dict(outputs.ours)
    if not summary["stops_run"]:
        write_csv(path, header, rows)
        if outputs.probabilities:
            write_all_probabilities(outputs.probabilities, plan, probs, spans.ok, scoring)
        if outputs.embeddings:
            write_embeddings(outputs.embeddings, plan, predictions)
        extras.update({p.name: file_sha256(p) for p in outputs.extras})  # the report lists them: ours
    for line in notes:
        print(line)
    speed = speed_report(config, predictions)
    print(speed.pop("line"))
    probabilities_kind = "independent" if scoring.independent else "softmax"
    chunks = {
        "segment_seconds": plan.segment,
        "template": plan.template,
        "pooling": scoring.pooling,
        "window_hop_seconds": runtime.windows.hop / runtime.windows.sample_rate,
        "smoothing": config.chunk_smoothing,
        "file_max_weight": config.file_max_weight,
    }
    report = {
        "rows": len(plan.ids),
        "row_rule": plan.rule,
        "segment_rule": plan.segment_rule,
        "format": "probabilities" if sample.probabilities else "label",
        "clip_pooling": None if plan.chunked else scoring.pooling,
        "probabilities": probabilities_kind if sample.probabilities else None,
        "test_items": {"source": plan.source, "count": len(plan.files)},
        "chunks": chunks if plan.chunked else None,
        "notes": [*plan.notes, plan.segment_rule, plan.rule, *notes],
        "fallback_label": scoring.fallback,
        "fallback_summary": summary,
        "fallbacks": fallbacks,
        "repaired": [{"id": plan.item_ids[i], "repairs": r} for i, r in sorted(spans.repairs.items())],
        "files_per_device": {predictions.device: predictions.files},
        "runtime": runtime.describe(),
        "engine": engine_report(config, artifact, predictions, runtime),
        "teacher": teacher_report(predictions, runtime),
        "speed": speed,
        "time_limit_minutes": config.time_limit_minutes,
        "stopped": spans.stopped,
        "artifact": str(artifact.path),
        "extras": extras,
        "seconds": round(time.perf_counter() - started, 3),
    }
    if spans.stopped:
        print(spans.stopped)
    report_path = outputs.report
    write_text_atomically(report_path, json.dumps(report, indent=2))
    if summary["stops_run"]:
        raise AllFallbacksError(
            f"{summary['alarm']} No submission was written (fail_on_all_fallbacks); the "
            f"report is {report_path}."
        )
    return InferenceResult(
        path,
        report_path,
        len(plan.ids),
        len(fallbacks),
        dict(Counter(written)),
        {predictions.device: predictions.files},
        report["seconds"],
        report,
    )


def span_probabilities(
    scores: np.ndarray, scoring: Scoring, predictions: Predictions, runtime: Runtime
) -> np.ndarray:
    """[spans, classes of the model]: the softmax or sigmoids of the scaled cosine scores, blended with the
    pretrained teacher's probabilities where it scored the span (teachers/blend.py). NaN scores (unusable
    audio) give rows no row reads."""
    cosines = torch.from_numpy(np.asarray(np.nan_to_num(scores, nan=0.0), dtype=np.float64))
    probs = objectives.probabilities(cosines, scoring.scale, scoring.independent).numpy()
    if predictions.teacher is not None:
        choice = runtime.teacher
        taught = teacher_probabilities(
            predictions.teacher.logits, probs, scoring.independent, choice.unknown_logit
        )
        probs = blend(probs, taught, choice.weight)
    return probs


def label_rows(
    sample: SampleSubmission, plan: RowPlan, probs: np.ndarray, ok: np.ndarray, scoring: Scoring
) -> tuple[list[str], list[list[str]], list[str], list[str]]:
    """(header, rows, each row's label, notes): the most probable class of each row, or the fallback label."""
    written = []
    for span in plan.span_of:
        usable = span is not None and ok[span]
        written.append(scoring.labels[int(np.argmax(probs[span]))] if usable else scoring.fallback)
    rows = [[row_id, label] for row_id, label in zip(plan.ids, written, strict=True)]
    return [sample.id_column, sample.value_columns[0]], rows, written, []


def probability_rows(
    sample: SampleSubmission,
    plan: RowPlan,
    probs: np.ndarray,
    ok: np.ndarray,
    scoring: Scoring,
    prior: np.ndarray,
) -> tuple[list[str], list[list[str]], list[str], list[str]]:
    """(header, rows, each row's most probable column, notes): a probability per sample_submission class
    column (a softmax's over the classes the header has: its share of the others goes to them); `prior` (over
    the model's labels) for a row with no usable audio."""
    labels = scoring.labels
    shared = np.array([labels.index(c) if c in labels else -1 for c in sample.value_columns])
    known = shared[shared >= 0]
    fallback = prior[known]  # a softmax's share of the classes the header lacks goes to the others
    if not scoring.independent:
        total = fallback.sum()
        fallback = fallback / total if total > 0 else np.full(len(known), 1.0 / max(1, len(known)))
    rows, written = [], []
    for row_id, span in zip(plan.ids, plan.span_of, strict=True):
        values = np.zeros(len(shared))
        if len(known):
            usable = span is not None and ok[span]
            row = probs[span][known] if usable else fallback
            if usable and not scoring.independent:
                row = row / row.sum()
            values[shared >= 0] = row
        rows.append([row_id, *(f"{p:.6g}" for p in values)])
        written.append(sample.value_columns[int(np.argmax(values))])
    return [sample.id_column, *sample.value_columns], rows, written, class_notes(sample, labels, shared)


def class_notes(sample: SampleSubmission, labels: list[str], shared: np.ndarray) -> list[str]:
    notes = []
    if unseen := [c for c, k in zip(sample.value_columns, shared, strict=True) if k < 0]:
        notes.append(
            f"{len(unseen)} class column(s) of {sample.path.name} the model never saw get probability 0: "
            f"{', '.join(repr(c) for c in unseen[:10])}{' ...' if len(unseen) > 10 else ''}"
        )
    if missing := [label for label in labels if label not in set(sample.value_columns)]:
        notes.append(
            f"{len(missing)} label(s) the model knows have no column in {sample.path.name} (their share "
            f"goes to the others): {', '.join(repr(c) for c in missing[:10])}"
        )
    return notes


def training_prior(artifact: Artifact, independent: bool) -> np.ndarray:
    """The fallback probabilities over the model's labels: the training label frequencies (summing to 1), or
    with `independent` probabilities each class's share of the training files. Uniform if the artifact does not
    record them."""
    provenance = artifact.manifest.get("provenance", {})
    counts = provenance.get("label_counts") or {}
    weights = np.array([float(counts.get(label, 0)) for label in artifact.labels])
    if weights.sum() <= 0:
        return np.full(len(weights), 1.0 / max(1, len(weights)))
    if independent:
        files = float(provenance.get("train_files") or weights.sum())
        return np.clip(weights / files, 0.0, 1.0)
    return weights / weights.sum()


def fallback_rows(plan: RowPlan, spans: SpanPredictions) -> tuple[list[dict[str, str]], Counter[str]]:
    """Every row with no prediction and why, and how many rows each cause took: the reason with the row's file
    written as <file>, so that 93 files refused by one rule count as one cause."""
    fallbacks, causes = [], Counter()
    for row, (row_id, span) in enumerate(zip(plan.ids, plan.span_of, strict=True)):
        if span is None:
            reason, file = plan.missing.get(row, "no audio"), None
        elif not spans.ok[span]:
            file = plan.files[plan.spans[span].file]
            reason = spans.problems.get(
                plan.spans[span].file, "no audio in this span (the file is shorter than its header says)"
            )
        else:
            continue
        fallbacks.append({"id": row_id, "reason": reason})
        causes[_without_file(reason, file)] += 1
    return fallbacks, causes


def _without_file(reason: str, file: str | None) -> str:
    if not file:
        return reason
    for name in (file, Path(file).name, Path(file).stem):  # longest first: the path, then its name, its stem
        reason = reason.replace(name, "<file>") if name else reason
    return reason


def fallback_summary(config: InferConfig, causes: Counter[str], n_rows: int, path: Path) -> dict[str, Any]:
    """How many rows fell back, for which causes (most rows first), and -- when those the input caused (not
    the time limit) are at least fallback_alarm_share of the rows -- the alarm the notebook ends with, and
    whether it stops the run."""
    fell_back = sum(causes.values())
    # Rows the time limit left are the user's choice (and said by its own line): they raise no alarm.
    share = (fell_back - causes[TIME_LIMIT_PROBLEM]) / n_rows if n_rows else 0.0
    alarm = None
    if n_rows and share >= config.fallback_alarm_share:
        what = "every row" if fell_back == n_rows else f"{fell_back} of {n_rows} rows ({share:.0%})"
        why = "; ".join(f"{rows} rows: {cause}" for cause, rows in causes.most_common(3))
        more = f" (and {len(causes) - 3} more causes)" if len(causes) > 3 else ""
        alarm = (
            f"ALARM: {what} of {path.name} fell back to the training prior, so it would score no better "
            f"than chance. This is a failure of the input, not a submission: {why}{more}."
        )
    stop = config.fail_on_all_fallbacks
    if stop is None:  # auto: the scoring rerun must always write a submission; everywhere else, stop
        stop = not is_competition_rerun()
    return {
        "rows": fell_back,
        "share": round(share, 4),
        "alarm_share": config.fallback_alarm_share,
        "causes": [{"cause": cause, "rows": rows} for cause, rows in causes.most_common()],
        "alarm": alarm,
        "stops_run": bool(alarm and stop),
    }


def write_all_probabilities(
    path: Path, plan: RowPlan, probs: np.ndarray, ok: np.ndarray, scoring: Scoring
) -> None:
    """probabilities.csv: every class of the model, for every row that has audio (NaN where it was unusable)."""
    ids, spans = _rows_with_audio(plan)
    rows = probs[spans].copy()
    rows[~ok[spans]] = np.nan
    write_csv(
        path,
        ["id", *scoring.labels],
        ([row_id, *(f"{p:.6f}" for p in row)] for row_id, row in zip(ids, rows, strict=True)),
    )


def write_embeddings(path: Path, plan: RowPlan, predictions: Predictions) -> None:
    """embeddings.npz: the mean unit window embedding of every row that has audio."""
    ids, spans = _rows_with_audio(plan)
    predicted = predictions.spans
    with staged_file(path) as staging:
        np.savez(staging, ids=ids, embeddings=predicted.embeddings[spans], ok=predicted.ok[spans])


def _rows_with_audio(plan: RowPlan) -> tuple[np.ndarray, np.ndarray]:
    rows = [(row_id, span) for row_id, span in zip(plan.ids, plan.span_of, strict=True) if span is not None]
    return np.array([r for r, _ in rows]), np.array([s for _, s in rows], dtype=np.int64)


# ---------------------------------------------------------------------------------------- the report


def speed_report(config: InferConfig, predictions: Predictions) -> dict[str, Any]:
    """The rate (seconds of audio per second) and, for `expected_test_files` x `expected_file_seconds`, the
    projected prediction time; "line" is what the notebook prints."""
    rate, threads = predictions.rate, predictions.threads or torch.get_num_threads()
    speed: dict[str, Any] = {
        "audio_seconds": round(rate.audio_seconds, 1),
        "seconds": round(rate.seconds, 2),
        "audio_seconds_per_second": round(rate.per_second, 1),
        "measured_on": rate.measured_on,
        "threads": threads,
        "engine": predictions.engine,
    }
    line = (
        f"rate: {rate.per_second:.1f} s of audio per second ({rate.measured_on}, {predictions.engine}, "
        f"{plural(threads, 'thread')})"
    )
    taught = predictions.teacher
    if taught is not None:
        speed["teacher_audio_seconds_per_second"] = round(taught.rate.per_second, 1)
        line += f"; teacher {taught.rate.per_second:.1f} s of audio per second ({taught.rate.measured_on})"
    if config.expected_test_files and config.expected_file_seconds:
        hidden = config.expected_test_files * config.expected_file_seconds
        seconds = hidden / rate.per_second + (hidden / taught.rate.per_second if taught is not None else 0.0)
        speed["projected_seconds"] = round(seconds, 1)
        line += (
            f"; projected for {config.expected_test_files} files x {config.expected_file_seconds:g} s: "
            f"{seconds / 60:.1f} min of prediction" + (", the teacher's included" if taught else "")
        )
        if config.time_limit_minutes:
            line += f" (time limit {config.time_limit_minutes:g} min)"
    speed["line"] = line
    return speed


def teacher_report(predictions: Predictions, runtime: Runtime) -> dict[str, Any]:
    """Whether the artifact's pretrained teacher was blended in, at what weight, over how many files."""
    choice, taught = runtime.teacher, predictions.teacher
    report: dict[str, Any] = {"blended": taught is not None, "why": choice.why}
    if choice.teacher is not None and taught is not None:
        report.update(
            name=choice.teacher.name,
            weight=choice.weight,
            unknown_logit=choice.unknown_logit,
            classes_known=int(sum(o >= 0 for o in choice.outputs)),
            files=taught.files,
            audio_seconds_per_second=round(taught.rate.per_second, 1),
            stopped=taught.stopped,
        )
    return report


def engine_report(
    config: InferConfig, artifact: Artifact, predictions: Predictions, runtime: Runtime
) -> dict[str, Any]:
    """Which engine and precision computed the batches, and why (the printed lines)."""
    ran = predictions.engine
    return {
        "asked": {"engine": config.engine, "onnx_precision": config.onnx_precision},
        "chosen": {key: getattr(runtime.engine, key) for key in ("mode", "precision", "why")},
        "ran": ran,
        "precision": "int8" if "int8" in ran.split(",")[0] else "fp16" if "fp16" in ran else "fp32",
        "threads": predictions.threads,
        "length_buckets": config.length_buckets,
        "artifact_onnx": artifact.manifest.get("provenance", {}).get("onnx"),
        "lines": list(predictions.engine_notes),
    }
