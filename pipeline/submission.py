"""The infer stage: artifact + competition folder -> submission.csv (+ report), and scoring.

Which rows (`choose_rows`): when every id of the sample submission is a test item, exactly its ids in its
order. When it holds placeholders -- ids with no file, as the public copy of a code competition whose test
audio is hidden until the scoring rerun -- one row per test file, sorted by id (with a test table, a sample
id missing from it gets a fallback row instead, as the table is then the competition's own list). The report
and the notebook say which rule applied, and why.

What columns (`SampleSubmission`): the id column keeps its name; one other column gets the predicted label;
several are classes and get probabilities -- the softmax of the scaled cosine scores over the classes the
model and the header share, so each row sums to 1; a header class the model never saw gets 0, and both kinds
of mismatch are reported. A row whose audio cannot be used gets the fallback label, or the training prior.
Files are written to a temporary name and renamed: a crash never leaves a half-written submission.
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

from .artifact import Artifact, load_artifact
from .config import InferConfig
from .inference import Predictions, predict_on_devices
from .staging import staged_file, write_text_atomically
from .tables import (
    DataError,
    SampleSubmission,
    TestLayout,
    read_csv,
    read_sample_submission,
    read_test_items,
    write_csv,
)


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
    """Load the artifact, predict every test item, write the submission and its report."""
    started = time.perf_counter()
    if config.num_threads:
        torch.set_num_threads(config.num_threads)
    artifact = load_artifact(config.artifact_dir)  # an invalid artifact is the one thing that stops the run
    data_dir = Path(config.data_dir)
    layout = TestLayout.of(config)
    sample = read_sample_submission(data_dir / layout.sample_submission)
    items = read_test_items(data_dir, layout, sample.ids)
    ids, rule, row_notes = choose_rows(sample, [row.id for row in items.rows], items.source)
    notes = [*items.notes, rule, *row_notes]
    for note in notes:
        print(note)
    predictions = predict_on_devices(artifact, data_dir, items.rows, config)

    fallback = config.fallback_label or artifact.manifest["fallback_label"]  # sealed in every artifact
    if fallback not in artifact.labels:
        raise DataError(f"fallback_label={fallback!r} is not one of the model's labels {artifact.labels}")
    index_of = {row.id: i for i, row in enumerate(items.rows)}
    fallbacks = []
    where = layout.table if items.source == "table" else f"the files under {layout.test_audio_dir}"
    for item_id in ids:
        index = index_of.get(item_id)
        if index is None:
            fallbacks.append({"id": item_id, "reason": f"id of {sample.path.name} is not in {where}"})
        elif not predictions.ok[index]:
            fallbacks.append({"id": item_id, "reason": predictions.problems.get(index, "no prediction")})
    submission_path = _submission_file(Path(config.submission_path))
    if sample.probabilities:
        written, class_notes = write_probabilities(
            submission_path, sample, ids, index_of, predictions, artifact
        )
        for note in class_notes:
            print(note)
        notes += class_notes
    else:
        written = write_labels(submission_path, sample, ids, index_of, predictions, artifact.labels, fallback)
    report = {
        "rows": len(ids),
        "row_rule": rule,
        "format": "probabilities" if sample.probabilities else "label",
        "test_items": {"source": items.source, "count": len(items.rows)},
        "notes": notes,
        "fallback_label": fallback,
        "fallbacks": fallbacks,
        "repaired": [{"id": items.rows[i].id, "repairs": r} for i, r in sorted(predictions.repairs.items())],
        "files_per_device": predictions.device_counts,
        "artifact": str(artifact.path),
        "seconds": round(time.perf_counter() - started, 3),
    }
    report_path = submission_path.with_name(submission_path.stem + "_report.json")
    write_text_atomically(report_path, json.dumps(report, indent=2))
    if config.write_probabilities or config.write_embeddings:
        _write_extras(submission_path, config, artifact, items.rows, predictions)
    return InferenceResult(
        submission_path=submission_path,
        report_path=report_path,
        n_rows=len(ids),
        n_fallbacks=len(fallbacks),
        label_counts=dict(Counter(written)),
        device_counts=predictions.device_counts,
        seconds=report["seconds"],
        report=report,
    )


def choose_rows(
    sample: SampleSubmission, item_ids: list[str], source: str
) -> tuple[list[str], str, list[str]]:
    """The submission's ids, the rule that chose them (a sentence) and notes on ids left without a row."""
    have = set(item_ids)
    placeholders = [i for i in sample.ids if i not in have]
    notes = []
    if not placeholders or source == "table":
        rule = (f"rows: the {len(sample.ids)} ids of {sample.path.name}, in its order"
                + (f" ({len(placeholders)} of them not among the test items: fallback rows)" if placeholders
                   else ""))  # fmt: skip
        listed = set(sample.ids)
        unlisted = [i for i in item_ids if i not in listed]
        if unlisted:
            notes.append(f"{len(unlisted)} test item(s) not in {sample.path.name} get no row: "
                         f"{', '.join(repr(i) for i in unlisted[:5])}{' ...' if len(unlisted) > 5 else ''}")  # fmt: skip
        return list(sample.ids), rule, notes
    rule = (f"rows: one per test file ({len(item_ids)}), sorted by id, because {len(placeholders)} of the "
            f"{len(sample.ids)} ids of {sample.path.name} name no test file (placeholders, as in the public copy of "
            "a competition whose test audio appears only in the scoring rerun)")  # fmt: skip
    return sorted(item_ids), rule, notes


def write_labels(path: Path, sample: SampleSubmission, ids: list[str], index_of: dict[str, int],
                 predictions: Predictions, labels: list[str], fallback: str) -> list[str]:  # fmt: skip
    """The predicted label of every id (the fallback label where there is no prediction); returns them."""
    written = []
    for item_id in ids:
        index = index_of.get(item_id)
        ok = index is not None and predictions.ok[index]
        written.append(labels[int(np.argmax(predictions.scores[index]))] if ok else fallback)
    write_csv(path, [sample.id_column, sample.value_columns[0]], zip(ids, written, strict=True))
    return written


def write_probabilities(path: Path, sample: SampleSubmission, ids: list[str], index_of: dict[str, int],
                        predictions: Predictions, artifact: Artifact) -> tuple[list[str], list[str]]:  # fmt: skip
    """One probability per header class; returns the most probable class of each row and notes on the classes
    the model and the header do not share."""
    labels = artifact.labels
    shared = [labels.index(c) if c in labels else -1 for c in sample.value_columns]
    known = np.array([k for k in shared if k >= 0], dtype=np.int64)
    notes = []
    unseen = [c for c, k in zip(sample.value_columns, shared, strict=True) if k < 0]
    if unseen:
        notes.append(f"{len(unseen)} class column(s) of {sample.path.name} the model never saw get probability 0: "
                     f"{', '.join(repr(c) for c in unseen[:10])}{' ...' if len(unseen) > 10 else ''}")  # fmt: skip
    missing = [label for label in labels if label not in set(sample.value_columns)]
    if missing:
        notes.append(f"{len(missing)} label(s) the model knows have no column in {sample.path.name} (their share "
                     f"goes to the others): {', '.join(repr(c) for c in missing[:10])}")  # fmt: skip
    prior = _prior(artifact, known)
    scale = float(artifact.model.config.score_scale)
    rows, written = [], []
    for item_id in ids:
        index = index_of.get(item_id)
        probs = np.zeros(len(shared))
        if len(known):
            if index is not None and predictions.ok[index]:
                logits = torch.from_numpy(predictions.scores[index][known].astype(np.float64)) * scale
                probs[np.asarray(shared) >= 0] = torch.softmax(logits, dim=0).numpy()
            else:
                probs[np.asarray(shared) >= 0] = prior
        rows.append([item_id, *(f"{p:.6g}" for p in probs)])
        written.append(sample.value_columns[int(np.argmax(probs))])
    write_csv(path, [sample.id_column, *sample.value_columns], rows)
    return written, notes


def _prior(artifact: Artifact, known: np.ndarray) -> np.ndarray:
    """The training label frequencies over `known` classes (uniform if the artifact does not record them)."""
    counts = artifact.manifest.get("provenance", {}).get("label_counts") or {}
    weights = np.array([float(counts.get(artifact.labels[k], 0)) for k in known])
    if weights.sum() <= 0:
        weights = np.ones(len(known))
    return weights / weights.sum()


def _submission_file(path: Path) -> Path:
    """`submission_path` names a file, or an existing folder to write submission.csv in."""
    if path.is_dir():
        print(f"submission_path {path} is a folder: writing {path / 'submission.csv'}")
        return path / "submission.csv"
    return path


def score_submission(submission_path: str | Path, solution_path: str | Path) -> float:
    """Accuracy of a submission against a solution file (`id,label`), comparing ids and labels exactly as
    written. A probability submission (one column per class) is scored by its most probable class."""
    submission = _labels_by_id(Path(submission_path), "submission")
    solution = _labels_by_id(Path(solution_path), "solution")
    missing = solution.keys() - submission.keys()
    extra = submission.keys() - solution.keys()
    if missing or extra:
        raise DataError(f"{submission_path}: ids differ from {solution_path}: {len(missing)} missing "
                        f"(e.g. {sorted(missing)[:3]}), {len(extra)} unexpected (e.g. {sorted(extra)[:3]})")  # fmt: skip
    if not solution:
        raise DataError(f"{solution_path}: no rows to score")
    return sum(submission[i] == label for i, label in solution.items()) / len(solution)


def _labels_by_id(path: Path, what: str) -> dict[str, str]:
    sample = read_sample_submission(path)  # the same reading: first column the id
    hint = f"A {what} file has an id column, then a label column (or, for a submission, one per class)."
    rows = read_csv(path, [sample.id_column, *sample.value_columns], hint)
    labels: dict[str, str] = {}
    for line, row in rows:
        item_id = row[sample.id_column]
        if item_id in labels:
            raise DataError(f"{path} line {line}: duplicate id {item_id!r}; every id must appear once")
        if sample.probabilities:
            values = [float(row[c] or "nan") for c in sample.value_columns]
            labels[item_id] = sample.value_columns[int(np.nanargmax(values))]
        else:
            labels[item_id] = row[sample.value_columns[0]]
    return labels


def _write_extras(submission_path, config, artifact, rows, predictions) -> None:
    ids = np.array([row.id for row in rows])
    if config.write_probabilities:
        scale = float(artifact.model.config.score_scale)
        logits = torch.from_numpy(np.nan_to_num(predictions.scores, nan=0.0)) * scale
        probs = torch.softmax(logits, dim=1).numpy()
        probs[~predictions.ok] = np.nan
        write_csv(submission_path.with_name("probabilities.csv"), ["id", *artifact.labels],
                  ([sid, *(f"{p:.6f}" for p in row)] for sid, row in zip(ids, probs, strict=True)))  # fmt: skip
    if config.write_embeddings:
        with staged_file(submission_path.with_name("embeddings.npz")) as staging:
            np.savez(staging, ids=ids, embeddings=predictions.embeddings, ok=predictions.ok)
