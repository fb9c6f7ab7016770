"""Self-training on the competition's unlabelled soundscapes, in rounds ("noisy student": BirdCLEF 2025's 1st and
2026's 2nd place took their largest gains from it).

    round 0   the focal recordings alone (today's recipe), or a teacher you bring: an artifact, or a scores file
              computed elsewhere (a pretrained bird model's predictions, in the targets format below)
    round k   the last round's model scores every window of the unlabelled soundscapes (`score_soundscapes`);
              the next model trains on the focal recordings with those soft targets mixed in
              (TrainConfig.soundscape_targets and its controls, pipeline/training/augment.py); with
              `distill_focal` it also scores the training recordings themselves (`score_recordings`), and each
              crop's target becomes part label, part teacher (TrainConfig.focal_targets)

Distillation is the same loop with a bigger teacher: an ensemble (`ensemble_members`) or a 'voxceleb' model
trained on a TPU, as `teacher`, and the CPU-fast default as the student (`model_size`), with `distill_focal`.

The targets file: `filename,start,end,<class>,...` -- a stretch of a soundscape (filename relative to the
noise_dir folder, seconds) and one probability per class. Written beside it, `<name>.json` says where the
targets came from; training copies it into the artifact's provenance, so each round's artifact names its
teacher, and that teacher's its own.

Each round is an ordinary training run (time budget, checkpoints, resume, any device topology); the last
round's artifact is the submission's (`train_rounds`).
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..core.artifact import check_training_outputs
from ..core.config import ConfigError, InferConfig, TrainConfig
from ..core.tables import check_targets_file
from ..inference.targets import write_window_targets
from ..training.plan import Session, auto_could_choose, open_session
from ..training.provenance import PATH_FIELDS
from ..training.train import TrainResult, train
from . import pretrained

# How a round's teacher scores: the infer stage's defaults on torch fp32, not the int8 race, whose winner may
# change from run to run: a lost session that scores again must write the same targets, or the next round's
# checkpoint (its fingerprint holds the targets' hash) would not resume.
TEACHER_SCORING = InferConfig(engine="torch", progress=False)


def score_soundscapes(
    artifact_dir: str | Path, session: Session, out: str | Path, log: Callable[[str], Any] = print
) -> Path:
    """The teacher's probabilities for every window of the session's soundscapes (noise_dir's files: the
    background training reads too), windows of the model's length half a window apart, as a targets file at
    `out` (+ its .json); filenames relative to noise_dir (TrainConfig.soundscape_targets)."""
    files, names = session.sources.noise_names()
    # Independent sigmoids even from a one-label teacher: a stretch of soundscape holds any number of calls, or
    # none, where a softmax would share out a probability of 1.
    return write_window_targets(
        artifact_dir,
        session.config.data_dir,
        files,
        names,
        out,
        independent=True,
        config=TEACHER_SCORING,
        what="soundscapes",
        log=log,
    )


def score_recordings(
    artifact_dir: str | Path, session: Session, out: str | Path, log: Callable[[str], Any] = print
) -> Path:
    """The teacher's probabilities for every window of the training table's recordings, filenames relative to
    data_dir (TrainConfig.focal_targets): what a distilled student learns beside the labels."""
    files = sorted({row.rel_path for row in session.sources.rows})
    return write_window_targets(
        artifact_dir,
        session.config.data_dir,
        files,
        files,
        out,
        config=TEACHER_SCORING,
        what="training recordings",
        log=log,
    )


@dataclass(frozen=True)
class Round:
    """One training run of the rounds: its number (0: the focal recordings alone), its artifact folder, and the
    targets files the teacher's pass writes for it (None: none; a teacher's .csv is read as it is)."""

    number: int
    artifact: Path
    soundscape_targets: Path | None
    focal_targets: Path | None


def plan_rounds(config: TrainConfig) -> list[Round]:
    """Every round `config` trains, in order: round 0 unless a `teacher` is given, then rounds 1..N, each scored
    by the one before (the first by `teacher`); the last round's artifact is `artifact_dir` itself."""
    base = Path(config.artifact_dir)
    if config.self_training_rounds == 0:
        return [Round(0, base, None, None)]
    given_scores = bool(config.teacher) and config.teacher.endswith(".csv")
    numbers = ([] if config.teacher else [0]) + list(range(1, config.self_training_rounds + 1))
    plan = []
    for position, k in enumerate(numbers):
        scored = k > 0 and not (position == 0 and given_scores)
        plan.append(
            Round(
                k,
                base if position == len(numbers) - 1 else base.with_name(f"{base.name}.round_{k}"),
                base.with_name(f"{base.name}.targets_{k}.csv") if scored and config.noise_dir else None,
                base.with_name(f"{base.name}.focal_targets_{k}.csv")
                if scored and config.distill_focal
                else None,
            )
        )
    return plan


def check_round_outputs(config: TrainConfig, extra_files: Sequence[Path] = ()) -> None:
    """Every folder and file the rounds write, checked before anything slow (never train a round for an hour,
    then refuse the next one's folder or replace a user's file): each round's artifact and checkpoint folder
    as training checks its own, and each targets file, the rounds' and `extra_files` (the teacher's pass)."""
    for this in plan_rounds(config):
        check_training_outputs(dataclasses.replace(config, artifact_dir=str(this.artifact)))
        for path in (this.soundscape_targets, this.focal_targets):
            if path is not None:
                check_targets_file(path, why=f"the teacher's scores for self-training round {this.number}")
    for path in extra_files:
        check_targets_file(path, why="the pretrained teacher's scores")


def train_rounds(config: TrainConfig, log: Callable[[str], Any] = print) -> TrainResult:
    """What the train notebook runs: `train(config)`, or with `self_training_rounds` N that many student rounds,
    each taught by the one before -- the first by `teacher` (an artifact folder or a targets .csv), or without
    one by a round 0 on the focal recordings alone. A `pretrained_teacher` first scores the recordings and
    soundscapes (rounds/pretrained.py): its soundscape scores teach the first round, with distill_focal its
    recording scores teach every crop, and with teacher_blend > 0 it is sealed in the last artifact. Round k's
    artifact is `<artifact_dir>.round_<k>`, the last round's is `artifact_dir` (the one the infer notebook
    loads); its targets `<artifact_dir>.targets_<k>.csv` (`plan_rounds`). Every folder and file of them is
    checked before the first starts (`check_round_outputs`).

    Each round gets an equal share of what is left of `time_budget_minutes`; a round whose artifact is already
    there from an earlier session, trained with the same parameters, is kept rather than trained again, so a
    lost session resumes at the round it was in (and that round at its last checkpoint)."""
    # Opened once (plan.open_session): the rounds' artifacts and targets are named after artifact_dir, and
    # every round and the teacher's pass read the same table.
    session = open_session(config)
    config = session.config
    rounds_session, teacher_files = session, ()
    if config.pretrained_teacher:  # its scores teach this run (rounds/pretrained.py); it is sealed at the end
        recordings, soundscapes = teacher_files = pretrained.targets_files(config)
        rounds = config.self_training_rounds
        # Its recording scores teach every crop (distill_focal); its soundscape scores teach the first round.
        rounds_session = session.but(
            pretrained_teacher=None,
            focal_targets=str(recordings) if config.distill_focal else config.focal_targets,
            distill_focal=config.distill_focal and bool(rounds),
            teacher=str(soundscapes) if rounds and soundscapes else None,
        )
    check_round_outputs(rounds_session.config, [path for path in teacher_files if path is not None])
    taught = pretrained.teach(session, log) if config.pretrained_teacher else None
    result = _rounds(rounds_session, log)
    if taught is not None and config.teacher_blend > 0:
        pretrained.seal(result.artifact_dir, taught, config.teacher_blend, log)
    return result


def _rounds(session: Session, log: Callable[[str], Any]) -> TrainResult:
    config = session.config
    rounds = config.self_training_rounds
    if rounds == 0:
        return train(session)
    if not config.noise_dir and not config.distill_focal:
        raise ConfigError(
            "self_training_rounds needs noise_dir (the unlabelled soundscapes the teacher scores) "
            "or distill_focal (the teacher scores the training recordings)"
        )
    started = time.monotonic()
    plan = plan_rounds(config)
    teacher = config.teacher
    result = None
    for position, this in enumerate(plan):
        last = position == len(plan) - 1
        targets = teacher if this.number and teacher.endswith(".csv") else None  # scores computed elsewhere
        focal = config.focal_targets
        if this.soundscape_targets:
            targets = str(score_soundscapes(teacher, session, this.soundscape_targets, log=log))
        if this.focal_targets:
            focal = str(score_recordings(teacher, session, this.focal_targets, log=log))
        budget = None
        if config.time_budget_minutes is not None:
            left = config.time_budget_minutes - (time.monotonic() - started) / 60
            budget = max(1.0, left / (len(plan) - position))
        round_session = session.but(
            artifact_dir=str(this.artifact),
            soundscape_targets=targets,
            focal_targets=focal,
            time_budget_minutes=budget,
            self_training_rounds=0,
            teacher=None,
            distill_focal=False,
        )
        taught = [Path(t).name for t in (targets, focal) if t]
        log(
            f"self-training round {this.number} of {rounds}: "
            + (f"targets {' and '.join(taught)}" if taught else "focal recordings only")
            + (f", {budget:.0f} min" if budget else "")
            + f" -> {this.artifact}"
        )
        if not last and _trained_with(this.artifact, round_session.config):
            log(f"round {this.number}: {this.artifact} is there, trained with these parameters: kept")
        else:
            result = train(round_session)
        teacher = str(this.artifact)
    return result


def _trained_with(artifact: Path, config: TrainConfig) -> bool:
    """Whether `artifact` holds a finished model trained with `config` (compared as its provenance keeps it)."""
    manifest = artifact / "manifest.json"
    if not manifest.is_file():
        return False
    kept = (json.loads(manifest.read_text()).get("provenance") or {}).get("config") or {}
    wanted = {k: Path(v).name if k in PATH_FIELDS and v else v for k, v in dataclasses.asdict(config).items()}
    # The provenance keeps what training ran with: a parameter left to auto (None) is kept as what the data
    # decided, which the same data decides again.
    return all(
        kept.get(k) == v or (v is None and auto_could_choose(k, kept.get(k)))
        for k, v in wanted.items()
        if k not in ("time_budget_minutes", "progress")
    )


__all__ = [
    "TEACHER_SCORING",
    "Round",
    "check_round_outputs",
    "plan_rounds",
    "score_recordings",
    "score_soundscapes",
    "train_rounds",
]
