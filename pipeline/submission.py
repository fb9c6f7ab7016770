"""The infer stage: artifact + competition folder -> submission.csv (+ report), and scoring.

A submission has exactly the ids of sample_submission.csv, in its order. Ids whose audio could not be used
get the fallback label and are listed in the report; ids missing from test.csv are reported the same way.
Files are written to a temporary name and renamed, so a crash never leaves a half-written submission.
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

from .artifact import load_artifact
from .config import InferConfig
from .data import DataError, read_csv, read_submission_ids, read_test_table, write_csv
from .inference import predict_on_devices
from .staging import staged_file, write_text_atomically


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
    """Load the artifact, predict every test file, write the submission and its report."""
    started = time.perf_counter()
    if config.num_threads:
        torch.set_num_threads(config.num_threads)
    artifact = load_artifact(config.artifact_dir)  # an invalid artifact is the one thing that stops the run
    data_dir = Path(config.data_dir)
    rows, repeated_ids = read_test_table(data_dir)
    submission_ids = read_submission_ids(data_dir)
    predictions = predict_on_devices(artifact, data_dir, rows, config)

    fallback = config.fallback_label or artifact.manifest["fallback_label"]  # sealed in every artifact
    if fallback not in artifact.labels:
        raise DataError(f"fallback_label={fallback!r} is not one of the model's labels {artifact.labels}")
    row_of_id = {row.id: i for i, row in enumerate(rows)}
    labels_by_id: dict[str, str] = {}
    fallbacks: list[dict[str, str]] = []
    for sid in submission_ids:
        index = row_of_id.get(sid)
        if index is None:
            fallbacks.append({"id": sid, "reason": "id of sample_submission.csv is not in test.csv"})
            labels_by_id[sid] = fallback
        elif not predictions.ok[index]:
            fallbacks.append({"id": sid, "reason": predictions.problems.get(index, "no prediction")})
            labels_by_id[sid] = fallback
        else:
            labels_by_id[sid] = artifact.labels[int(np.argmax(predictions.scores[index]))]

    submission_path = Path(config.submission_path)
    write_submission(submission_path, submission_ids, labels_by_id)
    report = {
        "rows": len(submission_ids),
        "fallback_label": fallback,
        "fallbacks": fallbacks,
        "test_csv_warnings": repeated_ids,
        "repaired": [{"id": rows[i].id, "repairs": r} for i, r in sorted(predictions.repairs.items())],
        "files_per_device": predictions.device_counts,
        "artifact": str(artifact.path),
        "seconds": round(time.perf_counter() - started, 3),
    }
    report_path = submission_path.with_name(submission_path.stem + "_report.json")
    write_text_atomically(report_path, json.dumps(report, indent=2))
    if config.write_probabilities or config.write_embeddings:
        _write_extras(submission_path, config, artifact, rows, predictions)
    return InferenceResult(
        submission_path=submission_path,
        report_path=report_path,
        n_rows=len(submission_ids),
        n_fallbacks=len(fallbacks),
        label_counts=dict(Counter(labels_by_id.values())),
        device_counts=predictions.device_counts,
        seconds=report["seconds"],
        report=report,
    )


def write_submission(path: Path, ids: list[str], labels_by_id: dict[str, str]) -> None:
    missing = [i for i in ids if i not in labels_by_id]
    if missing:  # a bug upstream, never a user error: refuse to write a submission Kaggle would reject
        raise RuntimeError(f"no label for {len(missing)} ids, e.g. {missing[:3]}")
    write_csv(path, ["id", "label"], ([sid, labels_by_id[sid]] for sid in ids))


def score_submission(submission_path: str | Path, solution_path: str | Path) -> float:
    """Accuracy of a submission against a solution file (both `id,label`); ids must match exactly."""
    submission = _labels_by_id(Path(submission_path))
    solution = _labels_by_id(Path(solution_path))
    missing = solution.keys() - submission.keys()
    extra = submission.keys() - solution.keys()
    if missing or extra:
        raise DataError(f"{submission_path}: ids differ from {solution_path}: {len(missing)} missing "
                        f"(e.g. {sorted(missing)[:3]}), {len(extra)} unexpected (e.g. {sorted(extra)[:3]})")  # fmt: skip
    if not solution:
        raise DataError(f"{solution_path}: no rows to score")
    return sum(submission[i] == label for i, label in solution.items()) / len(solution)


def _labels_by_id(path: Path) -> dict[str, str]:
    labels: dict[str, str] = {}
    for line, row in read_csv(path, ("id", "label")):
        if row["id"] in labels:
            raise DataError(f"{path} line {line}: duplicate id {row['id']!r}; every id must appear once")
        labels[row["id"]] = row["label"]
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
