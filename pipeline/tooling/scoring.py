"""`python -m pipeline score`: a submission's metric against a solution file with the same ids.

A solution is `id,label` (one true class per row) or `id` + one 0/1 column per class (several per row, as
BirdCLEF's). The metric (pipeline/core/metrics.py) defaults to accuracy for the first and macro_roc_auc for the
second. Ids and labels are compared exactly as written; a missing or unexpected id, a repeated id or a value
that is not a number is an error naming the file, the id and the column.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ..core import metrics
from ..core.tables import DataError, SampleSubmission, read_csv, read_sample_submission


def score_submission(
    submission_path: str | Path, solution_path: str | Path, metric: str = "auto"
) -> tuple[str, float]:
    """(metric, value) of a submission against a solution (the module docstring; `metric` auto picks as it says).
    A label submission is scored as one-hot rows; a probability submission by its columns (accuracy: its most
    probable class)."""
    solution_sample = read_sample_submission(Path(solution_path))
    classes = solution_sample.value_columns if solution_sample.probabilities else None
    if metric == "auto":
        metric = "macro_roc_auc" if classes else "accuracy"
    if metric not in metrics.METRICS:
        raise DataError(f"metric {metric!r} is not one of {list(metrics.METRICS)}")
    _, truth_rows = _rows_by_id(Path(solution_path), "solution")
    submission_sample, submitted = _rows_by_id(Path(submission_path), "submission")
    missing = truth_rows.keys() - submitted.keys()
    extra = submitted.keys() - truth_rows.keys()
    if missing or extra:
        raise DataError(
            f"{submission_path}: ids differ from {solution_path}: {len(missing)} missing "
            f"(e.g. {sorted(missing)[:3]}), {len(extra)} unexpected (e.g. {sorted(extra)[:3]})"
        )
    if not truth_rows:
        raise DataError(f"{solution_path}: no rows to score")
    ids = list(truth_rows)
    if classes is None:  # id,label
        classes = sorted({truth_rows[i][solution_sample.value_columns[0]] for i in ids})
    if _labels_only(submission_sample, classes):  # a submitted label the solution lacks: a class of its own
        column = submission_sample.value_columns[0]
        classes = classes + sorted({submitted[i][column] for i in ids} - set(classes))
    truth = _matrix(truth_rows, ids, classes, solution_sample, solution_path, absent_ok=True)
    scores = _matrix(submitted, ids, classes, submission_sample, submission_path)
    try:
        return metric, metrics.score(metric, truth, scores)
    except metrics.MetricError as error:
        raise DataError(f"{solution_path}: {error}") from error


def _rows_by_id(path: Path, what: str) -> tuple[SampleSubmission, dict[str, dict[str, str]]]:
    """The file's header (as a sample submission's: first column the id) and its rows by id."""
    sample = read_sample_submission(path)
    hint = f"A {what} file has an id column, then a label column or one column per class."
    rows: dict[str, dict[str, str]] = {}
    for line, row in read_csv(path, [sample.id_column, *sample.value_columns], hint):
        item_id = row[sample.id_column]
        if item_id in rows:
            raise DataError(f"{path} line {line}: duplicate id {item_id!r}; every id must appear once")
        rows[item_id] = row
    return sample, rows


def _labels_only(sample: SampleSubmission, classes: list[str]) -> bool:
    """A file of one label per row, rather than a column per class (one column named after a class is a
    one-class file of columns)."""
    return len(sample.value_columns) == 1 and sample.value_columns[0] not in classes


def _matrix(
    rows: dict[str, dict[str, str]],
    ids: list[str],
    classes: list[str],
    sample: SampleSubmission,
    path,
    absent_ok: bool = False,
) -> np.ndarray:
    """[ids, classes] values of a label file (one-hot) or a class-column file (its numbers; a class it has no
    column for is an error, or with `absent_ok` a column of zeros)."""
    if _labels_only(sample, classes):
        labels = np.array([rows[item_id][sample.value_columns[0]] for item_id in ids], dtype=object)
        return (labels[:, None] == np.array(classes, dtype=object)).astype(float)
    matrix = np.zeros((len(ids), len(classes)))
    absent = [c for c in classes if c not in set(sample.value_columns)]
    if absent and not absent_ok:
        raise DataError(
            f"{path}: no column for class(es) {absent[:5]} of the solution; a submission has "
            "sample_submission's header"
        )
    for r, item_id in enumerate(ids):
        for k, name in enumerate(classes):
            if name in absent:
                continue
            text = rows[item_id][name]
            try:
                matrix[r, k] = float(text)
            except ValueError:
                raise DataError(
                    f"{path}: id {item_id!r}, column {name!r}: {text!r} is not a number"
                ) from None
    return matrix
