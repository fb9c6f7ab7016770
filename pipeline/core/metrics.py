"""Competition metrics over per-row class scores, computed with scikit-learn (both Kaggle images ship it).

    accuracy       the most probable class equals the row's main true class (its largest target: a file's own
                   label over its secondary labels' 0.5; the first of equal ones): speaker and single-label tasks
    macro_roc_auc  BirdCLEF 2024-2026: ROC-AUC of each class over the rows, averaged over the classes with a
                   positive row (Kaggle's metric drops the others; a class positive in every row has no
                   AUC either and is dropped too, where Kaggle's code would fail)
    lwlrap         label-weighted label-ranking average precision (Freesound Audio Tagging 2019, Rainforest
                   Connection): scikit-learn's LRAP with each row weighted by its number of positive labels,
                   which is exactly the label-weighted form (rows without a positive weigh nothing); computed
                   here for all rows at once, equal to scikit-learn's (tests/core/test_metrics.py)
    padded_cmap    BirdCLEF 2023: 5 rows positive for every class are appended to both the truth and the
                   scores, then scikit-learn's macro average precision (the competition's own variant)

`truth` is a [rows, classes] 0/1 matrix (training's targets: 1 for a file's own labels, less for secondary
ones), `scores` a [rows, classes] matrix of any monotone scores (cosines,
probabilities): every metric here depends only on how scores rank, except accuracy (the argmax).
"""

from __future__ import annotations

import numpy as np

METRICS = ("accuracy", "macro_roc_auc", "lwlrap", "padded_cmap")
PADDING_ROWS = 5  # BirdCLEF 2023's padding_factor
JACKKNIFE_GROUPS = 10  # standard_error
JACKKNIFE_SEED = 20241


class MetricError(ValueError):
    """The metric cannot be computed on these rows (no row, no class with a positive row). Says why."""


def score(metric: str, truth: np.ndarray, scores: np.ndarray) -> float:
    """`metric` of `scores` against `truth` (see the module docstring)."""
    truth = np.asarray(truth, dtype=np.float64)
    scores = np.asarray(scores, dtype=np.float64)
    if truth.shape != scores.shape or truth.ndim != 2:
        raise MetricError(f"truth {truth.shape} and scores {scores.shape} must both be [rows, classes]")
    if len(truth) == 0:
        raise MetricError("no rows to score")
    if not np.isfinite(scores).all():
        raise MetricError("scores hold NaN or infinite values")
    positive = truth > 0
    if metric == "accuracy":
        has_label = positive.any(axis=1)
        if not has_label.any():
            raise MetricError("accuracy needs rows with a true class; no row has one")
        # Not the first positive: a secondary label may come before the file's own.
        return float((scores.argmax(axis=1) == truth.argmax(axis=1))[has_label].mean())
    if metric == "macro_roc_auc":
        from sklearn.metrics import roc_auc_score

        scored = positive.any(axis=0) & ~positive.all(axis=0)
        if not scored.any():
            raise MetricError(
                "macro_roc_auc needs a class with both positive and negative rows; there is none"
            )
        return float(roc_auc_score(positive[:, scored], scores[:, scored], average="macro"))
    if metric == "lwlrap":
        if not positive.any():
            raise MetricError("lwlrap needs rows with a positive label; there is none")
        return lwlrap(positive, scores)
    if metric == "padded_cmap":
        from sklearn.metrics import average_precision_score

        pad = np.ones((PADDING_ROWS, truth.shape[1]))
        padded = np.vstack([positive, pad]), np.vstack([scores, pad])
        return float(average_precision_score(*padded, average="macro"))
    raise MetricError(f"unknown metric {metric!r}; use one of {list(METRICS)}")


def lwlrap(positive: np.ndarray, scores: np.ndarray) -> float:
    """scikit-learn's label_ranking_average_precision_score(positive, scores, sample_weight=positives per row),
    ties and all, computed for every row at once: scikit-learn ranks row by row in Python, 6.5 s for 20,000 rows x
    80 classes against 0.2 s here (benchmarks/metric_speed.py), and standard_error asks 10 times more. Each positive
    label scores (positive labels ranked at or above it) / (labels ranked at or above it); weighting a row by its
    positives makes the metric the mean of those over every positive label of every row."""
    from scipy.stats import rankdata

    at_or_above = rankdata(-scores, method="max", axis=1)
    positives_at_or_above = rankdata(np.where(positive, -scores, np.inf), method="max", axis=1)
    return float((positives_at_or_above / at_or_above)[positive].mean())


def standard_error(
    metric: str, truth: np.ndarray, scores: np.ndarray, groups: int = JACKKNIFE_GROUPS
) -> float:
    """How much `metric` of these rows would move with other rows from the same source: the delete-a-group
    jackknife over `groups` random groups of rows, sqrt((g - 1) / g * sum((m_i - mean)^2)) where m_i is the
    metric without group i (groups it cannot be computed without are skipped; 0.0 if fewer than 2 remain).
    It costs `groups` evaluations of the metric: ~4 s for 2,000 rows x 200 classes of macro ROC-AUC, where a
    200-round bootstrap took 80 s; on the rows measured here the two agree within ~30 %. Seeded, so every
    process computes the same value from the same rows."""
    truth = np.asarray(truth, dtype=np.float64)
    scores = np.asarray(scores, dtype=np.float64)
    groups = min(groups, len(truth))
    if groups < 2:
        return 0.0
    group_of_row = np.random.default_rng(JACKKNIFE_SEED).permutation(len(truth)) % groups
    values = []
    for group in range(groups):
        kept = group_of_row != group
        try:
            values.append(score(metric, truth[kept], scores[kept]))
        except MetricError:  # e.g. the group held the only positive rows of every scored class
            continue
    if len(values) < 2:
        return 0.0
    spread = np.asarray(values) - np.mean(values)
    return float(np.sqrt((len(values) - 1) / len(values) * np.sum(spread**2)))


__all__ = ["METRICS", "MetricError", "lwlrap", "score", "standard_error"]
