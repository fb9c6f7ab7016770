"""What a Kaggler sees: training curves and the confusion matrix (saved in the artifact), shown inline.

(Plots: being implemented under the real-speech issue; for now nothing is drawn.)
"""

from __future__ import annotations

from pathlib import Path

import numpy as np


def save_training_figures(
    history: list[dict[str, float]],
    val_truth: np.ndarray,
    val_pred: np.ndarray,
    labels: list[str],
    out_dir: Path,
) -> dict[str, Path]:
    """Write figures into `out_dir`; returns {artifact file name: path} for save_artifact's extra_files."""
    return {}
