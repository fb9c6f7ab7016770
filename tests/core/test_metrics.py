"""The competition metrics against independent computations from their definitions."""

import numpy as np
import pytest

from pipeline.core.metrics import MetricError, score, standard_error


def lwlrap_by_definition(truth, scores):
    """Label-weighted LRAP as Freesound 2019 defines it: for every (row, positive label) pair, the precision of
    the row's ranking at that label; averaged over all pairs."""
    precisions = []
    for row_truth, row_scores in zip(truth, scores, strict=True):
        order = np.argsort(-row_scores, kind="stable")
        hits = row_truth[order] > 0
        for rank in np.flatnonzero(hits):
            precisions.append(hits[: rank + 1].sum() / (rank + 1))
    return float(np.mean(precisions))


def average_precision_by_definition(truth, scores):
    """Mean over the positives of the precision among rows scored at least as high (ties count against)."""
    result = []
    for k in range(truth.shape[1]):
        positive = truth[:, k] > 0
        result.append(np.mean([((scores[:, k] >= s) & positive).sum() / (scores[:, k] >= s).sum()
                               for s in scores[positive, k]]))  # fmt: skip
    return float(np.mean(result))


def auc_by_definition(positive, scores):
    """P(score of a positive > score of a negative), ties counting half."""
    pos, neg = scores[positive], scores[~positive]
    return float(np.mean([(p > n) + 0.5 * (p == n) for p in pos for n in neg]))


@pytest.fixture
def rows():
    rng = np.random.default_rng(0)
    truth = (rng.random((40, 5)) < 0.3).astype(float)
    truth[:, 4] = 0  # a class with no positive row: macro ROC-AUC skips it, as BirdCLEF's metric does
    scores = truth * 0.5 + rng.random((40, 5))
    return truth, scores


def test_macro_roc_auc_averages_the_classes_with_a_positive_row(rows):
    truth, scores = rows
    expected = np.mean([auc_by_definition(truth[:, k] > 0, scores[:, k]) for k in range(4)])
    assert score("macro_roc_auc", truth, scores) == pytest.approx(expected)


def test_lwlrap_is_the_label_weighted_lrap(rows):
    truth, scores = rows
    assert score("lwlrap", truth, scores) == pytest.approx(lwlrap_by_definition(truth, scores))
    # Label weighting differs from plain LRAP when rows have different numbers of labels.
    from sklearn.metrics import label_ranking_average_precision_score

    has = truth.sum(1) > 0
    assert score("lwlrap", truth, scores) != pytest.approx(
        label_ranking_average_precision_score(truth[has], scores[has])
    )


@pytest.mark.parametrize("ties", [False, True])
def test_lwlrap_equals_scikit_learns_label_weighted_lrap_ties_and_all(ties):
    from sklearn.metrics import label_ranking_average_precision_score

    rng = np.random.default_rng(1)
    truth = rng.random((300, 12)) < 0.2
    truth[:5] = False  # rows without a positive weigh nothing
    truth[5:8] = True  # rows all positive score 1
    scores = truth * 0.4 + rng.random((300, 12))
    if ties:
        scores = np.round(scores, 1)  # many equal scores within a row: scikit-learn ranks them at the lowest
    expected = label_ranking_average_precision_score(truth, scores, sample_weight=truth.sum(axis=1))
    assert score("lwlrap", truth.astype(float), scores) == pytest.approx(expected, abs=1e-12)


def test_padded_cmap_appends_five_all_positive_rows(rows):
    truth, scores = rows
    padded_truth = np.vstack([truth, np.ones((5, 5))])
    padded_scores = np.vstack([scores, np.ones((5, 5))])
    assert score("padded_cmap", truth, scores) == pytest.approx(
        average_precision_by_definition(padded_truth, padded_scores)
    )


def test_accuracy_compares_the_most_probable_class_with_the_first_true_one():
    truth = np.array([[1, 0, 0], [0, 1, 1], [0, 0, 1], [0, 0, 0]], dtype=float)
    scores = np.array([[0.9, 0.1, 0], [0.2, 0.7, 0.1], [0.5, 0.4, 0.1], [0.3, 0.3, 0.4]])
    assert score("accuracy", truth, scores) == pytest.approx(2 / 3)  # the unlabelled row is not counted


def test_accuracy_compares_with_the_files_own_label_not_an_earlier_secondary_one():
    # Training's targets: 1 for the file's own label, 0.5 for a secondary label that may sort before it.
    truth = np.array([[0.5, 1.0, 0.0], [0.0, 1.0, 0.5], [1.0, 0.0, 0.5]])
    scores = np.array([[0.1, 0.8, 0.1], [0.1, 0.8, 0.1], [0.2, 0.1, 0.7]])
    assert score("accuracy", truth, scores) == pytest.approx(2 / 3)


def test_metrics_that_cannot_be_computed_say_why():
    with pytest.raises(MetricError, match="no rows"):
        score("accuracy", np.zeros((0, 2)), np.zeros((0, 2)))
    with pytest.raises(MetricError, match="both positive and negative"):
        score("macro_roc_auc", np.ones((3, 2)), np.random.default_rng(0).random((3, 2)))
    with pytest.raises(MetricError, match="NaN"):
        score("lwlrap", np.eye(2), np.array([[np.nan, 0], [0, 1]]))
    with pytest.raises(MetricError, match="unknown metric"):
        score("f1", np.eye(2), np.eye(2))


def _noisy_rows(n, seed):
    rng = np.random.default_rng(seed)
    truth = np.zeros((n, 4))
    truth[np.arange(n), rng.integers(0, 4, n)] = 1
    return truth, truth * 0.6 + rng.random((n, 4))


@pytest.mark.parametrize("metric", ["accuracy", "macro_roc_auc", "lwlrap", "padded_cmap"])
def test_standard_error_follows_the_spread_of_the_metric_over_other_rows_from_the_same_source(metric):
    # The reference: the metric's actual spread over 200 independent draws of 60 rows.
    spread = np.std([score(metric, *_noisy_rows(60, seed)) for seed in range(200)])
    estimates = [standard_error(metric, *_noisy_rows(60, seed)) for seed in range(1000, 1020)]
    assert 0.6 * spread < np.mean(estimates) < 1.6 * spread
    # A hundred times the rows: about a tenth of the error (padded_cmap's padding weighs less there: 0.22).
    assert standard_error(metric, *_noisy_rows(6000, 7)) < 0.3 * np.mean(estimates)
    # Seeded: the same rows give the same value (every process decides alike).
    assert standard_error(metric, *_noisy_rows(60, 3)) == standard_error(metric, *_noisy_rows(60, 3))


def test_standard_error_of_too_few_rows_is_zero_not_an_error():
    truth, scores = _noisy_rows(1, 0)
    assert standard_error("accuracy", truth, scores) == 0.0
