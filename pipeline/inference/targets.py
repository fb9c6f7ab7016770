"""A model's probabilities over every window of some files, as a targets file: what self-training and
distillation learn from (pipeline/rounds/self_training.py).

The infer stage's own calls do it: `plan_window_rows` (a row per window of every file, rows.py),
`resolve_runtime`, `predict`, and the submission's probabilities (`span_probabilities`: a sealed pretrained
teacher blended in, as the submission would have it). The targets file is `filename,start,end,<class>...`
(TrainConfig.soundscape_targets, focal_targets), with a lineage record beside it (`<name>.json`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ..core.artifact import load_artifact
from ..core.config import InferConfig
from ..core.tables import write_targets_file
from .predict import predict
from .rows import plan_window_rows
from .runtime import resolve_runtime
from .submission import Scoring, span_probabilities


def write_window_targets(
    artifact_dir: str | Path,
    data_dir: str | Path,
    files: Sequence[str],
    names: Sequence[str],
    out: str | Path,
    *,
    hop_seconds: float | None = None,
    independent: bool | None = None,
    config: InferConfig | None = None,
    what: str = "files",
    log: Callable[[str], Any] = print,
) -> Path:
    """The artifact's probabilities for every window of `files` (relative to `data_dir`; windows of the model's
    length, `hop_seconds` apart, default half a window), written as `names` in a targets file at `out`.
    `independent`: sigmoids per class (a stretch of soundscape holds any number of calls, or none), or a
    softmax; None: as the model was trained. `config`: the infer stage's parameters (default: its defaults)."""
    started = time.perf_counter()
    artifact = load_artifact(artifact_dir)
    model = artifact.model.config
    window = model.window_samples / model.sample_rate
    hop = hop_seconds or window / 2
    plan = plan_window_rows(Path(data_dir), files, window, hop)
    runtime = resolve_runtime(config or InferConfig(progress=False), artifact)
    predictions = predict(artifact.model, plan, runtime, log=lambda _: None)
    if independent is None:
        independent = model.objective != "aam"
    scoring = Scoring.of(config or InferConfig(), artifact, plan, independent=independent)
    probs = span_probabilities(predictions.spans.pooled[scoring.pooling], scoring, predictions, runtime)
    ok = predictions.spans.ok
    rows = (
        [names[span.file], f"{span.start:g}", f"{span.end:g}", *(f"{p:.4f}" for p in row)]
        for span, row, usable in zip(plan.spans, probs, ok, strict=True)
        if usable
    )
    # What the teacher learned from: its own targets' lineage (None for a focal-only model).
    taught = (artifact.manifest.get("provenance") or {}).get("soundscape_targets")
    lineage = {
        "teacher": Path(artifact_dir).name,
        "teacher_provenance": taught,
        "windows": int(np.sum(ok)),
        "files": len(files),
        "hop_seconds": hop,
    }
    header = ["filename", "start", "end", *artifact.labels]
    write_targets_file(out, header, rows, lambda: lineage, why=f"the teacher's scores of the {what}")
    log(
        f"teacher {artifact_dir}: {len(plan.spans)} windows of {len(files)} {what} scored in "
        f"{time.perf_counter() - started:.0f} s -> {out}"
    )
    return Path(out)


__all__ = ["write_window_targets"]
