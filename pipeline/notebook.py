"""Notebook defaults: parameters left as None are resolved here, the same way for every notebook.

On Kaggle the inputs are searched for under /kaggle/input and outputs go to /kaggle/working; elsewhere the
defaults are the local `artifacts/` folder the Makefile's demo uses.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from . import kaggle
from .config import ConfigError, InferConfig, TrainConfig

LOCAL_DATA = Path("artifacts/demo_data")
LOCAL_ARTIFACT = Path("artifacts/model")
LOCAL_SUBMISSION = Path("artifacts/submission.csv")


def resolve_train_paths(config: TrainConfig) -> TrainConfig:
    data_dir = config.data_dir or _found(kaggle.find_competition_dir, LOCAL_DATA, "data_dir",
                                         "a folder with train.csv, test.csv and sample_submission.csv")  # fmt: skip
    artifact_dir = config.artifact_dir or str(
        kaggle.working_dir() / "model" if kaggle.on_kaggle() else LOCAL_ARTIFACT
    )
    return dataclasses.replace(config, data_dir=str(data_dir), artifact_dir=str(artifact_dir))


def resolve_infer_paths(config: InferConfig) -> InferConfig:
    data_dir = config.data_dir or _found(kaggle.find_test_dir, LOCAL_DATA, "data_dir",
                                         "a folder with test.csv and sample_submission.csv")  # fmt: skip
    artifact_dir = config.artifact_dir or _found(kaggle.find_artifact_dir, LOCAL_ARTIFACT, "artifact_dir",
                                                 "a folder with manifest.json (train.ipynb's output)")  # fmt: skip
    submission_path = config.submission_path or str(
        kaggle.working_dir() / "submission.csv" if kaggle.on_kaggle() else LOCAL_SUBMISSION
    )
    return dataclasses.replace(
        config, data_dir=str(data_dir), artifact_dir=str(artifact_dir), submission_path=str(submission_path)
    )


def _found(search, local_default: Path, name: str, what: str) -> str:
    if kaggle.on_kaggle():
        found = search()
        if found is None:
            raise ConfigError(f"parameter {name} is None and no {what} was found under {kaggle.input_dir()}; "
                              f"attach the input or pass -p {name} PATH")  # fmt: skip
        print(f"{name}: found {found}")
        return str(found)
    if not local_default.exists():
        raise ConfigError(f"parameter {name} is None and the local default {local_default} does not exist; "
                          f"pass -p {name} PATH ({what})")  # fmt: skip
    return str(local_default)
