"""Kaggle awareness: is this a Kaggle session, and where are its inputs and working directory?

Inputs are mounted read-only under /kaggle/input in two layouts seen in 2026: the old flat
`/kaggle/input/<slug>/` and the newer `/kaggle/input/{competitions,datasets/<owner>,notebooks/<owner>,
models/...}/<slug>/`. Rather than hard-coding either, stages search for what they need (a competition
folder, an artifact's manifest). `KAGGLE_ROOT` moves the whole tree (tests build a fake one).
"""

from __future__ import annotations

import os
from pathlib import Path

RUN_TYPE_VARIABLE = "KAGGLE_KERNEL_RUN_TYPE"  # "Interactive" in the editor, "Batch" for Save Version
SEARCH_DEPTH = 5  # input/<kind>/<owner>/<slug>/<subdir>: deep enough for both layouts


def kaggle_root() -> Path:
    return Path(os.environ.get("KAGGLE_ROOT", "/kaggle"))


def on_kaggle() -> bool:
    return RUN_TYPE_VARIABLE in os.environ


def run_type() -> str | None:
    """'Interactive', 'Batch' (Save Version / Save & Run All), or None off Kaggle."""
    return os.environ.get(RUN_TYPE_VARIABLE)


def is_competition_rerun() -> bool:
    """True only in the hidden-test scoring rerun of a code competition."""
    return bool(os.environ.get("KAGGLE_IS_COMPETITION_RERUN"))


def working_dir() -> Path:
    return kaggle_root() / "working"


def input_dir() -> Path:
    return kaggle_root() / "input"


def find_dirs_with(marker_files: tuple[str, ...], roots: list[Path] | None = None) -> list[Path]:
    """Directories under the input (and working) roots that contain all `marker_files`, shallowest first."""
    found = []
    for root in roots or [input_dir()]:
        if not root.is_dir():
            continue
        base_depth = len(root.parts)
        for current, subdirs, files in os.walk(root, followlinks=True):
            depth = len(Path(current).parts) - base_depth
            if all(name in files for name in marker_files):
                found.append(Path(current))
            if depth >= SEARCH_DEPTH:
                subdirs.clear()
            subdirs.sort()
    return sorted(found, key=lambda p: (len(p.parts), str(p)))


def find_competition_dir() -> Path | None:
    matches = find_dirs_with(("train.csv", "test.csv", "sample_submission.csv"))
    return matches[0] if matches else None


def find_test_dir() -> Path | None:
    """The submission notebook needs only test.csv and sample_submission.csv."""
    matches = find_dirs_with(("test.csv", "sample_submission.csv"))
    return matches[0] if matches else None


def find_artifact_dir() -> Path | None:
    """An artifact among the inputs (a train notebook's output, a dataset or a model), else in working."""
    matches = find_dirs_with(("manifest.json", "model.safetensors"), [input_dir(), working_dir()])
    return matches[0] if matches else None
