"""A pretrained model as the teacher of a training run (TrainConfig.pretrained_teacher: "birdnet" or a folder).

    teach(session)         the teacher scores every training recording, and the unlabelled soundscapes of
                           noise_dir, into targets files beside the artifact (`<artifact>.teacher_recordings.csv`,
                           `<artifact>.teacher_soundscapes.csv`; a rerun with the same teacher and files keeps
                           them); the competition's classes are matched to its outputs by scientific name; on
                           one-label tables whose classes it does not all know, the logit that tells "none of
                           mine" is fitted on the recordings' labels (teachers/blend.py)
    seal(artifact, taught) its model file, labels and a teacher.json (class map, that logit, the blend weight)
                           copied into the artifact, every file hashed by the manifest: the infer stage blends
                           its probabilities with the model's (inference/runtime.py), offline, from the
                           artifact alone

What the scores teach is the caller's choice (rounds/self_training.py): with distill_focal each training crop's
target takes part of the teacher's window nearest it, with self_training_rounds the soundscapes' scores teach
the first round, and with teacher_blend > 0 the teacher is sealed for the infer stage.
"""

from __future__ import annotations

import json
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..core.artifact import TEACHER_RECORD, add_to_artifact
from ..core.config import TrainConfig
from ..core.tables import label_list, read_chunk_targets, targets_lineage
from ..teachers.blend import fit_unknown_logit
from ..teachers.model import Teacher, TeacherRuntime, find_teacher, logit
from ..teachers.scoring import write_targets
from ..teachers.species import ClassMap, match_classes
from ..training.plan import Session


@dataclass(frozen=True)
class Taught:
    """What the teacher's pass left: its scores as targets files, its class map and the fitted logit."""

    teacher: Teacher
    class_map: ClassMap
    recordings: Path  # targets of every training recording (filenames relative to data_dir)
    soundscapes: Path | None  # targets of noise_dir's soundscapes (filenames relative to noise_dir)
    unknown_logit: float | None
    rate: float  # seconds of audio the teacher scored per second, on the recordings

    def record(self, weight: float) -> dict[str, Any]:
        """What the artifact keeps of it (teacher.json beside its files; provenance too)."""
        teacher = self.teacher
        return {
            "name": teacher.name,
            "sample_rate": teacher.sample_rate,
            "window_seconds": teacher.window_seconds,
            "output": teacher.output,
            "licence": teacher.licence,
            "sha256": teacher.sha256(),
            **self.class_map.as_record(),
            "unknown_logit": self.unknown_logit,
            "blend_weight": weight,
            "unknown_logit_fitted_on": "the training recordings' labels"
            if self.unknown_logit is not None
            else None,
        }


def targets_files(config: TrainConfig) -> tuple[Path, Path | None]:
    """Where the teacher's pass writes its scores, beside the artifact: the training recordings', and the
    soundscapes' (None without noise_dir)."""
    base = Path(config.artifact_dir)
    soundscapes = base.with_name(f"{base.name}.teacher_soundscapes.csv") if config.noise_dir else None
    return base.with_name(f"{base.name}.teacher_recordings.csv"), soundscapes


def teach(session: Session, log: Callable[[str], Any] = print) -> Taught:
    """The teacher's pass over the training recordings and soundscapes (module docstring)."""
    config, rows = session.config, list(session.sources.rows)
    teacher = find_teacher(config.pretrained_teacher)
    classes = label_list(row.label for row in rows)
    class_map = match_classes(classes, teacher.labels, session.taxonomy, config.teacher_exclude or ())
    log(f"pretrained teacher: {teacher.describe()}; {class_map.describe()}")
    runtime = teacher.runtime(config.num_threads)
    files = sorted({row.rel_path for row in rows})
    recordings, soundscapes = targets_files(config)
    rate = _targets(runtime, class_map, config, files, files, recordings, "training recordings", log)
    if soundscapes is not None:
        found, names = session.sources.noise_names()
        _targets(runtime, class_map, config, found, names, soundscapes, "soundscapes", log)
    unknown = fit_unknown(recordings, rows, classes, class_map)
    if unknown is not None:
        log(
            f"pretrained teacher: 'none of mine' above logit {unknown:g} (fitted on the training recordings of the "
            f"{len(class_map.lacking)} classes it lacks and the others)"
        )
    return Taught(teacher, class_map, recordings, soundscapes, unknown, rate)


def _targets(
    runtime: TeacherRuntime,
    class_map: ClassMap,
    config: TrainConfig,
    files: list[str],
    names: list[str],
    out: Path,
    what: str,
    log: Callable[[str], Any],
) -> float:
    """Write (or keep, when the same teacher already scored the same files into it) a targets file; returns
    the teacher's rate in seconds of audio per second."""
    lineage_path = targets_lineage(out)
    if out.is_file() and lineage_path.is_file():
        kept = json.loads(lineage_path.read_text())
        same = (
            kept.get("teacher_sha256") == runtime.teacher.sha256()
            and kept.get("files") == len(files)
            and kept.get("classes") == class_map.as_record()["classes"]
        )
        if same:
            log(
                f"pretrained teacher: {out.name} is there, scored by the same teacher from the same files: kept"
            )
            return float(kept.get("audio_seconds_per_second") or 0.0)
    lineage = write_targets(runtime, class_map, config.data_dir, files, names, out, what=what, log=log)
    return float(lineage["audio_seconds_per_second"])


def fit_unknown(recordings: Path, rows: list, classes: list[str], class_map: ClassMap) -> float | None:
    """The unknown logit, from each recording's highest window probability per known class and its label:
    None on multi-label tables (their rows are independent: the teacher's sigmoid is each class's own) and
    when the teacher knows every class."""
    labels_of: dict[str, set[str]] = {}
    for row in rows:
        labels_of.setdefault(row.rel_path, set()).add(row.label)
    if not class_map.lacking or any(len(labels) > 1 for labels in labels_of.values()):
        return None
    found = read_chunk_targets(recordings, classes)
    order = np.argsort(np.asarray(found.files, dtype=object), kind="stable")
    names = np.asarray(found.files, dtype=object)[order]
    starts = np.flatnonzero(np.r_[True, names[1:] != names[:-1]])
    best = np.maximum.reduceat(found.probs[order], starts, axis=0)
    logits = np.vectorize(lambda p: logit(min(max(float(p), 1e-4), 1 - 1e-4)))(best)
    truth = np.array([classes.index(next(iter(labels_of[name]))) for name in names[starts]])
    known = np.array([output >= 0 for output in class_map.outputs])
    return fit_unknown_logit(logits, truth, known)


def seal(artifact_dir: str | Path, taught: Taught, weight: float, log: Callable[[str], Any] = print) -> Path:
    """The teacher's files and teacher.json added to the artifact (the infer stage blends at `weight`)."""
    teacher = taught.teacher
    record = taught.record(weight)
    model_name = f"teacher_model{teacher.model_path.suffix.lower()}"
    with tempfile.TemporaryDirectory() as scratch:
        description = Path(scratch) / TEACHER_RECORD
        description.write_text(
            json.dumps({**record, "model": model_name, "labels": "teacher_labels.txt"}, indent=2)
        )
        labels = Path(scratch) / "teacher_labels.txt"
        labels.write_text("\n".join(teacher.labels) + "\n", encoding="utf-8")
        files = {model_name: teacher.model_path, "teacher_labels.txt": labels, TEACHER_RECORD: description}
        provenance = {"pretrained_teacher": {k: v for k, v in record.items() if k != "classes"}}
        path = add_to_artifact(artifact_dir, files, provenance)
    log(
        f"pretrained teacher: {teacher.name} sealed in {path} ({teacher.model_path.stat().st_size / 1e6:.0f} MB), "
        f"blended at inference with weight {weight:g} ({teacher.licence or 'see its licence'})"
    )
    return path


__all__ = ["Taught", "fit_unknown", "seal", "targets_files", "teach"]
