"""The infer notebook's paths: data_dir, artifact_dir and submission_path left as None are resolved here.

On Kaggle the inputs are searched for under /kaggle/input and the submission goes to /kaggle/working.
Elsewhere the defaults are the local `artifacts/` folder the Makefile's demo uses. (The train notebook's
session is resolved with the rest of its plan: pipeline/training/plan.py.)
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from ..core import kaggle
from ..core.config import InferConfig

LOCAL_SUBMISSION = Path("artifacts/submission.csv")


def resolve_infer_paths(config: InferConfig) -> InferConfig:
    test_files = f"folder {config.test_audio_dir}" if config.test_audio_dir else config.test_table
    data_dir = config.data_dir or kaggle.input_or_local(
        lambda: kaggle.find_test_dir(config.sample_submission, config.test_table, config.test_audio_dir),
        kaggle.LOCAL_DATA,
        "data_dir",
        f"a folder with {config.sample_submission} and the test {test_files}",
    )
    artifact_dir = config.artifact_dir or kaggle.input_or_local(
        kaggle.find_artifact_dir,
        kaggle.LOCAL_ARTIFACT,
        "artifact_dir",
        "a folder with manifest.json (train.ipynb's output)",
    )
    submission_path = config.submission_path or str(
        kaggle.working_dir() / "submission.csv" if kaggle.on_kaggle() else LOCAL_SUBMISSION
    )
    return dataclasses.replace(
        config, data_dir=str(data_dir), artifact_dir=str(artifact_dir), submission_path=str(submission_path)
    )
