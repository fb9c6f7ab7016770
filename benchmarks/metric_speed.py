"""The validation metrics' cost at two sizes: pipeline.core.metrics against scikit-learn's own call.

    python -m benchmarks.metric_speed --out benchmarks/raw/metric_speed.json

Every validation of a multi-label run computes the competition metric once and its standard error (10 more
evaluations, metrics.standard_error). Rows of 80 classes (Freesound 2019's), scores rounded to 2 decimals so
that rows hold ties, at 2,000 and 20,000 rows: seconds of one evaluation (best of 3), the ratio between the two
sizes, and the largest difference from scikit-learn's value.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks import print_result

CLASSES = 80
SIZES = (2_000, 20_000)


def rows(n: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    truth = rng.random((n, CLASSES)) < 0.03
    truth[np.arange(n), rng.integers(0, CLASSES, n)] = True
    return truth, np.round(rng.random((n, CLASSES)) + 0.5 * truth, 2)


def best_of(repeats: int, call) -> tuple[float, Any]:
    times, value = [], None
    for _ in range(repeats):
        started = time.perf_counter()
        value = call()
        times.append(time.perf_counter() - started)
    return min(times), value


def one_size(n: int) -> dict[str, Any]:
    from sklearn.metrics import label_ranking_average_precision_score

    from pipeline.core import metrics

    truth, scores = rows(n)
    ours_s, ours = best_of(3, lambda: metrics.score("lwlrap", truth.astype(float), scores))
    sk_s, sk = best_of(
        3, lambda: label_ranking_average_precision_score(truth, scores, sample_weight=truth.sum(1))
    )
    se_s, _ = best_of(1, lambda: metrics.standard_error("lwlrap", truth.astype(float), scores))
    return {"lwlrap_s": round(ours_s, 4), "scikit_learn_s": round(sk_s, 4), "speedup": round(sk_s / ours_s, 1),
            "standard_error_s": round(se_s, 3), "abs_diff": float(abs(ours - sk))}  # fmt: skip


def run() -> dict[str, Any]:
    found = {str(n): one_size(n) for n in SIZES}
    small, large = (found[str(n)] for n in SIZES)
    ratio = large["lwlrap_s"] / small["lwlrap_s"]
    headline = (
        f"lwlrap, {CLASSES} classes: {small['lwlrap_s']:.3f} s at {SIZES[0]:,} rows, {large['lwlrap_s']:.3f} s at "
        f"{SIZES[1]:,} (x{ratio:.1f} for x{SIZES[1] // SIZES[0]} the rows); scikit-learn's call "
        f"{small['scikit_learn_s']:.2f} / {large['scikit_learn_s']:.2f} s; the same value to "
        f"{max(small['abs_diff'], large['abs_diff']):.0e}"
    )
    return {"headline": headline, "classes": CLASSES, "sizes": found, "ratio_large_to_small": round(ratio, 2)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.metric_speed", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--out", type=Path, help="raw file to write (stamped with the commit and machine)")
    print_result(run(), parser.parse_args(argv).out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
