"""Post-processing of chunk scores: smoothing over neighbouring chunks, boosting towards the file's maximum."""

from pathlib import Path

import numpy as np
import pytest

from pipeline.core.config import ConfigError, InferConfig, from_params
from pipeline.core.windows import Span
from pipeline.inference.postprocess import post_process
from pipeline.inference.rows import RowPlan


def chunk_plan(chunks_per_file: list[int], shuffled: bool = False) -> RowPlan:
    spans = [Span(f, 5.0 * c, 5.0 * (c + 1)) for f, n in enumerate(chunks_per_file) for c in range(n)]
    if shuffled:  # the plan's span order need not be time order
        spans = spans[::-1]
    ids = [f"{s.file}_{s.end:g}" for s in spans]
    return RowPlan(Path("."), ids, list(range(len(spans))), spans, [f"{f}.ogg" for f in range(len(chunks_per_file))],
                   [None] * len(chunks_per_file), "test", segment=5.0)  # fmt: skip


def test_smoothing_weighs_each_chunks_neighbours_within_its_file_only():
    plan = chunk_plan([4, 2])
    scores = np.array([[1.0, 0.0], [0.0, 0.0], [0.0, 0.0], [0.0, 1.0], [0.5, 0.5], [0.0, 0.0]], np.float32)
    out = post_process(scores, plan, [0.1, 0.8, 0.1], 0.0)
    np.testing.assert_allclose(out[:, 0], [0.8 / 0.9, 0.1, 0.0, 0.0, 0.4 / 0.9, 0.05 / 0.9], rtol=1e-6)
    np.testing.assert_allclose(out[:4, 1], [0.0, 0.0, 0.1, 0.8 / 0.9], rtol=1e-6)  # file 1 does not leak in
    assert out.dtype == scores.dtype and scores[0, 0] == 1.0  # the input is left as it was


def test_time_order_comes_from_the_spans_not_their_order_in_the_plan():
    ordered, shuffled = chunk_plan([3]), chunk_plan([3], shuffled=True)
    scores = np.array([[1.0], [0.0], [0.0]], np.float32)
    np.testing.assert_allclose(post_process(scores[::-1], shuffled, [0.25, 0.5, 0.25], 0.0)[::-1],
                               post_process(scores, ordered, [0.25, 0.5, 0.25], 0.0))  # fmt: skip


def test_an_unusable_chunk_neither_gives_nor_takes():
    scores = np.array([[1.0], [np.nan], [0.0]], np.float32)
    out = post_process(scores, chunk_plan([3]), [1.0, 1.0, 1.0], 0.5)
    assert np.isnan(out[1, 0])
    np.testing.assert_allclose(out[[0, 2], 0], [1.0, 0.5])  # smoothing: 1 and 0 alone; file max 1 pulls 0 up


def test_the_file_max_boost_moves_each_chunk_towards_its_files_peak():
    scores = np.array([[0.2, 0.9], [0.6, 0.1], [0.0, 0.3]], np.float32)
    out = post_process(scores, chunk_plan([2, 1]), None, 0.5)
    np.testing.assert_allclose(out, [[0.4, 0.9], [0.6, 0.5], [0.0, 0.3]], rtol=1e-6)


def test_file_rows_and_the_defaults_change_nothing():
    scores = np.random.default_rng(0).random((3, 2)).astype(np.float32)
    plan = chunk_plan([3])
    assert post_process(scores, plan, None, 0.0) is scores
    file_rows = RowPlan(Path("."), ["a"], [0], [Span(0)], ["a.ogg"], [None], "test")
    assert post_process(scores[:1], file_rows, [0.1, 0.8, 0.1], 0.5) is not None
    np.testing.assert_array_equal(post_process(scores[:1], file_rows, [0.1, 0.8, 0.1], 0.5), scores[:1])


def test_the_parameters_are_checked_and_papermill_text_is_read():
    assert InferConfig(chunk_smoothing="0.1,0.8,0.1").chunk_smoothing == [0.1, 0.8, 0.1]
    assert InferConfig(chunk_smoothing="[0.25, 0.5, 0.25]").chunk_smoothing == [0.25, 0.5, 0.25]
    # through the notebook's parameters: papermill's -p gives the text, -y a list
    for given in ("0.1,0.8,0.1", [0.1, 0.8, 0.1]):
        assert from_params(InferConfig, {"chunk_smoothing": given}).chunk_smoothing == [0.1, 0.8, 0.1]
    for bad in ([0.5, 0.5], [-0.1, 1.0, 0.1], "a,b,c", [0.0]):
        with pytest.raises(ConfigError, match="chunk_smoothing"):
            InferConfig(chunk_smoothing=bad)
    with pytest.raises(ConfigError, match="file_max_weight"):
        InferConfig(file_max_weight=1.5)
