"""Post-processing of chunk scores before they become probabilities: what BirdCLEF's top solutions add on top
of the model (+0.002 to +0.01 macro ROC-AUC each in their write-ups), each an InferConfig parameter whose
default is chosen by measurement (benchmarks/soundscape.py scores every variant on one prediction).

    chunk_smoothing   each class's scores over a file's neighbouring chunks, weighted by a kernel such as
                      [0.1, 0.8, 0.1]: a call runs across chunk edges, and a chunk beside a confident one more
                      often holds the class
    file_max_weight   each chunk's score moved towards the file's highest score for the class by this weight:
                      a species heard clearly once in a recording is often there, fainter, in its other chunks

Chunk rows only (a file's chunks are a time series; a row per file has no neighbours). Works on the pooled
cosine scores, per class; a chunk with no score (NaN: unusable audio) neither gives nor takes, and keeps none.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from .rows import RowPlan


def post_process(
    scores: np.ndarray, plan: RowPlan, smoothing: Sequence[float] | None, file_max_weight: float
) -> np.ndarray:
    """`scores` [n_spans, n_classes] after smoothing, then file-max boosting, of every file's chunks."""
    if not plan.chunked or (not smoothing and not file_max_weight):
        return scores
    by_file: dict[int, list[int]] = {}  # each file's spans in time order
    for index in sorted(range(len(plan.spans)), key=lambda i: plan.spans[i].start):
        by_file.setdefault(plan.spans[index].file, []).append(index)
    out = scores.copy()
    for spans in by_file.values():
        block = scores[spans]
        if smoothing:
            block = smooth(block, np.asarray(smoothing, dtype=np.float64))
        if file_max_weight:
            block = boost_towards_file_max(block, file_max_weight)
        out[spans] = block
    return out


def smooth(block: np.ndarray, kernel: np.ndarray) -> np.ndarray:
    """Each row the kernel-weighted mean of its neighbours (the kernel centred on it), over the rows that have
    scores: at a file's ends and beside an unusable chunk the weights that remain are renormalised."""
    valid = ~np.isnan(block).any(axis=1)
    values = np.where(valid[:, None], block, 0.0)
    total = np.zeros_like(values, dtype=np.float64)
    weight = np.zeros(len(block))
    for shift, k in enumerate(kernel, start=-(len(kernel) // 2)):  # the kernel centred on each row
        source = slice(max(0, shift), len(block) + min(0, shift))
        target = slice(max(0, -shift), len(block) - max(0, shift))
        total[target] += k * values[source]
        weight[target] += k * valid[source]
    smoothed = total / np.maximum(weight, 1e-12)[:, None]
    smoothed[~valid] = np.nan
    return smoothed.astype(block.dtype)


def boost_towards_file_max(block: np.ndarray, weight: float) -> np.ndarray:
    """(1 - weight) x each chunk's score + weight x the file's highest score of the class."""
    valid = ~np.isnan(block).any(axis=1)
    if not valid.any():
        return block
    return ((1.0 - weight) * block + weight * block[valid].max(axis=0)).astype(block.dtype)
