"""A model's probabilities over every window of some files, as a targets file: what self-training and
distillation learn from (pipeline/rounds/self_training.py).

The infer stage's own calls do it: `plan_window_rows` (a row per window of every file, rows.py),
`resolve_runtime`, `predict`, and the submission's probabilities (`span_probabilities`: a sealed pretrained
teacher blended in, as the submission would have it). The targets file is `filename,start,end,<class>...`
(TrainConfig.soundscape_targets, focal_targets), with a lineage record beside it (`<name>.json`). The files are
scored FILES_PER_PASS at a time, each pass's rows written before the next: a teacher's pass over every soundscape
of a BirdCLEF set keeps the memory of one pass.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from ..core.artifact import load_artifact
from ..core.config import InferConfig
from ..core.tables import write_targets_file
from .predict import predict
from .rows import plan_window_rows
from .runtime import resolve_runtime
from .submission import Scoring, span_probabilities

# Files scored per pass of the infer stage's calls. A pass holds about ten floats per window and class (the
# pooling's sums, maxima and results), 1.5 GB for 190,000 windows of 200 classes: its rows are written out
# before the next pass starts, so memory is bounded by a pass, not by the set (benchmarks/teacher_pass_scale.py).
FILES_PER_PASS = 128


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
    config = config or InferConfig(progress=False)
    runtime = resolve_runtime(config, artifact)
    if independent is None:
        independent = model.objective != "aam"
    counts = {"spans": 0, "windows": 0}

    def rows() -> Iterator[list[str]]:
        for first in range(0, len(files), FILES_PER_PASS):
            plan = plan_window_rows(Path(data_dir), files[first : first + FILES_PER_PASS], window, hop)
            predictions = predict(artifact.model, plan, runtime, log=lambda _: None)
            scoring = Scoring.of(config, artifact, plan, independent=independent)
            probs = span_probabilities(
                predictions.spans.pooled[scoring.pooling], scoring, predictions, runtime
            )
            counts["spans"] += len(plan.spans)
            # Rows by index: a loop variable bound to a row of `probs` would keep the whole array alive
            # into the next pass.
            for k, (span, usable) in enumerate(zip(plan.spans, predictions.spans.ok, strict=True)):
                if usable:
                    counts["windows"] += 1
                    yield [
                        names[first + span.file],
                        f"{span.start:g}",
                        f"{span.end:g}",
                        *(f"{p:.4f}" for p in probs[k]),
                    ]
            del plan, predictions, probs  # before the next pass: the memory of one pass, not two

    # What the teacher learned from: its own targets' lineage (None for a focal-only model).
    taught = (artifact.manifest.get("provenance") or {}).get("soundscape_targets")

    def lineage() -> dict[str, Any]:  # once the rows are written
        return {
            "teacher": Path(artifact_dir).name,
            "teacher_provenance": taught,
            "windows": counts["windows"],
            "files": len(files),
            "hop_seconds": hop,
        }

    header = ["filename", "start", "end", *artifact.labels]
    write_targets_file(out, header, rows(), lineage, why=f"the teacher's scores of the {what}")
    log(
        f"teacher {artifact_dir}: {counts['spans']} windows of {len(files)} {what} scored in "
        f"{time.perf_counter() - started:.0f} s -> {out}"
    )
    return Path(out)


__all__ = ["write_window_targets"]
