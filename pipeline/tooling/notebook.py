"""Notebook defaults: parameters left as None are resolved here, the same way for every notebook.

On Kaggle the inputs are searched for under /kaggle/input, outputs and checkpoints go to /kaggle/working,
and training gets a time budget that ends before the session limit. Elsewhere the defaults are the local
`artifacts/` folder the Makefile's demo uses, and no budget.
"""

from __future__ import annotations

import dataclasses
import re
import shutil
from collections.abc import Callable
from pathlib import Path

from ..core import kaggle
from ..core.config import ConfigError, InferConfig, TrainConfig

LOCAL_DATA = Path("artifacts/demo_data")
LOCAL_ARTIFACT = Path("artifacts/model")
LOCAL_SUBMISSION = Path("artifacts/submission.csv")


def resolve_train_defaults(config: TrainConfig) -> TrainConfig:
    """Fill data_dir, artifact_dir, checkpoint_dir and (on Kaggle) time_budget_minutes."""
    data_dir = config.data_dir or _found(lambda: kaggle.find_competition_dir(config.train_table), LOCAL_DATA,
                                         "data_dir", f"a folder with {config.train_table} and sample_submission.csv")  # fmt: skip
    if not kaggle.on_kaggle():
        artifact_dir = config.artifact_dir or str(LOCAL_ARTIFACT)
        return dataclasses.replace(config, data_dir=str(data_dir), artifact_dir=artifact_dir)

    artifact_dir = config.artifact_dir or str(kaggle.working_dir() / "model")
    # Checkpoints live in /kaggle/working whatever artifact_dir is: it is the only place that is kept
    # (as the version's output, or across interactive sessions with "Files" persistence).
    checkpoint_dir = Path(config.checkpoint_dir or kaggle.working_dir() / "checkpoints")
    seed_checkpoint(checkpoint_dir)
    budget = config.time_budget_minutes
    if budget is None:
        budget = kaggle.default_time_budget_minutes()
        print(f"time_budget_minutes: {budget:.0f} (Kaggle's {kaggle.session_limit_hours():g} h session limit "
              f"minus {kaggle.SESSION_MARGIN_MINUTES:g} min margin and the time already used)")  # fmt: skip
    return dataclasses.replace(config, data_dir=str(data_dir), artifact_dir=str(artifact_dir),
                               checkpoint_dir=str(checkpoint_dir), time_budget_minutes=budget)  # fmt: skip


def seed_checkpoint(checkpoint_dir: Path) -> list[Path]:
    """Copy the checkpoints found among the inputs into `checkpoint_dir`, each into its run's folder
    (`<fingerprint>/latest.pt`) unless that folder already holds one; returns the copies made.

    A Save Version run starts with an empty /kaggle/working: the checkpoint of an earlier version (attached
    as an input) is how it continues instead of starting over. Whether one belongs to this run is decided
    at resume time by its fingerprint; the others are kept as they are.
    """
    copied = []
    for found in kaggle.find_input_checkpoints():
        if not re.fullmatch(r"[0-9a-f]{16}", found.name):  # `checkpoints/latest.pt`, before a folder per run
            print(f"checkpoint: {found / kaggle.CHECKPOINT_FILE} is from an older version of this project "
                  "and cannot be resumed by this one; training starts over")  # fmt: skip
            continue
        target = checkpoint_dir / found.name / kaggle.CHECKPOINT_FILE
        if target.exists():
            continue
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(found / kaggle.CHECKPOINT_FILE, target)  # inputs are read-only: resume writes here
        print(f"checkpoint: copied {found / kaggle.CHECKPOINT_FILE} from the inputs to {target}")
        copied.append(target)
    return copied


def resolve_infer_paths(config: InferConfig) -> InferConfig:
    test_files = f"folder {config.test_audio_dir}" if config.test_audio_dir else config.test_table
    data_dir = config.data_dir or _found(
        lambda: kaggle.find_test_dir(config.sample_submission, config.test_table, config.test_audio_dir),
        LOCAL_DATA, "data_dir", f"a folder with {config.sample_submission} and the test {test_files}",
    )  # fmt: skip
    artifact_dir = config.artifact_dir or _found(kaggle.find_artifact_dir, LOCAL_ARTIFACT, "artifact_dir",
                                                 "a folder with manifest.json (train.ipynb's output)")  # fmt: skip
    submission_path = config.submission_path or str(
        kaggle.working_dir() / "submission.csv" if kaggle.on_kaggle() else LOCAL_SUBMISSION
    )
    return dataclasses.replace(
        config, data_dir=str(data_dir), artifact_dir=str(artifact_dir), submission_path=str(submission_path)
    )


def _found(search: Callable[[], Path | None], local_default: Path, name: str, what: str) -> str:
    if kaggle.on_kaggle():
        found = search()
        if found is None:
            raise ConfigError(f"parameter {name} is None and {what} was not found under {kaggle.input_dir()}; "
                              f"attach the input or pass -p {name} PATH")  # fmt: skip
        print(f"{name}: found {found}")
        return str(found)
    if not local_default.exists():
        raise ConfigError(f"parameter {name} is None and the local default {local_default} does not exist; "
                          f"pass -p {name} PATH ({what})")  # fmt: skip
    return str(local_default)
