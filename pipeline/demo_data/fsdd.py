"""Free Spoken Digit Dataset (FSDD) -> a competition folder, for real-speech tests and benchmarks.

FSDD recordings are named `{digit}_{speaker}_{index}.wav` (8 kHz mono). Two tasks come from them:
`speaker` (label = speaker name) and `digit` (label = the spoken digit). The split is deterministic in the
seed and stratified by (digit, speaker) cell, so every label keeps the same fraction in test and, within a
label, the other factor is spread evenly (a speaker test set holds every digit of every speaker).

Test files are renamed to their opaque id: the original name carries both labels. Audio is hard-linked into
the folder when source and output share a filesystem, else copied; never symlinked, because the data module
resolves symlinks and refuses paths that end up outside the competition folder.

FSDD: Zohar Jackson et al., https://github.com/Jakobovski/free-spoken-digit-dataset,
DOI 10.5281/zenodo.1342401, licensed CC BY-SA 4.0. The folder written here carries that attribution.
"""

from __future__ import annotations

import hashlib
import itertools
import os
import re
import shutil
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..core.tables import new_competition_folder, write_csv

TASKS = ("speaker", "digit")
NAME_PATTERN = re.compile(r"(?i)^(?P<digit>[0-9])_(?P<speaker>[a-z][a-z0-9-]*)_(?P<index>[0-9]+)\.wav$")
ATTRIBUTION = """\
Audio: Free Spoken Digit Dataset (FSDD), Zohar Jackson et al.
https://github.com/Jakobovski/free-spoken-digit-dataset  DOI 10.5281/zenodo.1342401
License: Creative Commons Attribution-ShareAlike 4.0 International (CC BY-SA 4.0).
This folder is a derivative (train/test split, test files renamed to opaque ids) and is shared under the same
license. Written by `python -m pipeline data fsdd`.
"""


class FSDDError(ValueError):
    """The source folder is not usable FSDD: no recordings, or a recording whose name cannot be parsed."""


@dataclass(frozen=True)
class Recording:
    path: Path
    digit: str
    speaker: str
    index: int

    def label(self, task: str) -> str:
        return self.speaker if task == "speaker" else self.digit


def parse_name(path: Path) -> Recording:
    """The (digit, speaker, index) of an FSDD file name; FSDDError naming the file if it does not parse."""
    match = NAME_PATTERN.match(path.name)
    if match is None:
        raise FSDDError(
            f"{path}: not an FSDD recording name; expected {{digit}}_{{speaker}}_{{index}}.wav "
            "(e.g. 3_jackson_12.wav). Move other .wav files out of the source folder."
        )
    return Recording(path, match["digit"], match["speaker"], int(match["index"]))


def scan_recordings(source: str | os.PathLike) -> list[Recording]:
    """Every `*.wav` under `source` (recursively, sorted by name so listing order never matters)."""
    root = Path(source)
    if not root.is_dir():
        raise FSDDError(f"{root}: not a directory. Pass --source the FSDD 'recordings' folder.")
    files = sorted(
        (p for p in root.rglob("*") if p.suffix.lower() == ".wav" and p.is_file()),
        key=lambda p: (p.name, str(p)),
    )
    if not files:
        raise FSDDError(
            f"{root}: no .wav files found. Pass --source the FSDD 'recordings' folder "
            "(files named {digit}_{speaker}_{index}.wav)."
        )
    recordings = [parse_name(p) for p in files]
    # The name is a recording's identity: copies would leak across the split. Sorted, a copy follows its original.
    for first, second in itertools.pairwise(files):
        if first.name == second.name:
            raise FSDDError(f"{second}: duplicate recording name (also {first})")
    return recordings


def split_recordings(
    recordings: list[Recording], test_fraction: float, seed: int
) -> tuple[list[Recording], list[Recording]]:
    """(train, test): `test_fraction` of every (digit, speaker) cell, shuffled by `seed`. Every cell keeps at
    least one file in train (every label of either task is trainable) and gives one to test if it has two."""
    ordered = sorted(recordings, key=lambda r: (r.digit, r.speaker, r.index))
    train, test = [], []
    for key, cell in itertools.groupby(ordered, key=lambda r: (r.digit, r.speaker)):
        members = list(cell)
        # One generator per cell, keyed by the cell itself: adding a speaker never reshuffles the others.
        cell_seed = int.from_bytes(hashlib.sha256(f"{key[0]}|{key[1]}".encode()).digest()[:4], "little")
        order = np.random.default_rng([seed, cell_seed]).permutation(len(members))
        # At least one test file per cell when there are two (small folders still test every cell).
        n_test = min(max(1, int(round(len(members) * test_fraction))), len(members) - 1)
        test += [members[i] for i in order[:n_test]]
        train += [members[i] for i in order[n_test:]]
    return train, test


def make_fsdd_competition(
    source: str | os.PathLike,
    out_dir: str | os.PathLike,
    task: str = "speaker",
    seed: int = 0,
    test_fraction: float = 0.2,
    max_per_cell: int | None = None,
    overwrite: bool = False,
) -> Path:
    """Write a competition folder (train.csv, test.csv, sample_submission.csv, solution.csv, audio/) from FSDD.

    Deterministic in (`seed`, `test_fraction`, `max_per_cell`). `max_per_cell` keeps only the lowest-index
    recordings of each (digit, speaker) cell: a small folder for smoke tests. Refuses a non-empty `out_dir`
    unless `overwrite`.
    """
    if seed < 0:
        raise ValueError(f"seed={seed!r}: use a non-negative integer")
    if task not in TASKS:
        raise ValueError(f"task={task!r}: use one of {list(TASKS)}")
    if not 0.0 < test_fraction < 1.0:
        raise ValueError(f"test_fraction={test_fraction!r}: use a fraction in (0, 1)")
    if max_per_cell is not None and max_per_cell < 2:
        raise ValueError(f"max_per_cell={max_per_cell!r}: need at least 2 (one train, one test file)")
    recordings = scan_recordings(source)
    if max_per_cell is not None:
        ordered = sorted(recordings, key=lambda r: (r.digit, r.speaker, r.index))
        cells = itertools.groupby(ordered, key=lambda r: (r.digit, r.speaker))
        recordings = [rec for _, cell in cells for rec in itertools.islice(cell, max_per_cell)]
    train, test = split_recordings(recordings, test_fraction, seed)
    if not test:
        raise FSDDError(
            f"{source}: too few recordings per (digit, speaker) for a test split "
            f"of {test_fraction:g}; {len(recordings)} files in total"
        )

    out = Path(out_dir)
    with new_competition_folder(out, overwrite) as staging:
        _build(staging, train, test, task, seed)
    return out


def _build(root: Path, train: list[Recording], test: list[Recording], task: str, seed: int) -> None:
    train_rows = []
    for rec in train:
        rel = f"audio/train/{rec.path.name}"
        link_or_copy(rec.path, root / rel)
        train_rows.append([rel, rec.label(task)])

    # Opaque ids: seeded random tokens, not hashes of the name (a hash of "3_jackson_12.wav" can be
    # recomputed). Rows are sorted by id, so neither the id nor the order says anything about the label.
    rng = np.random.default_rng([seed, 0x7E57])
    ids: set[str] = set()
    while len(ids) < len(test):
        ids.add("".join(f"{b:02x}" for b in rng.integers(0, 256, size=5)))
    shuffled = [test[i] for i in rng.permutation(len(test))]
    test_rows, solution_rows = [], []
    for test_id, rec in sorted(zip(sorted(ids), shuffled, strict=True)):
        rel = f"audio/test/{test_id}.wav"
        link_or_copy(rec.path, root / rel)
        test_rows.append([test_id, rel])
        solution_rows.append([test_id, rec.label(task)])

    counts = Counter(row[1] for row in train_rows)
    default_label = max(sorted(counts), key=lambda label: counts[label])
    write_csv(root / "train.csv", ["path", "label"], train_rows)
    write_csv(root / "test.csv", ["id", "path"], test_rows)
    write_csv(root / "sample_submission.csv", ["id", "label"], [[r[0], default_label] for r in test_rows])
    write_csv(root / "solution.csv", ["id", "label"], solution_rows)
    (root / "ATTRIBUTION.txt").write_text(ATTRIBUTION, encoding="utf-8")


def link_or_copy(source: Path, target: Path) -> None:
    """Hard-link (no extra disk on the same filesystem) or copy; never symlink (see the module docstring)."""
    target.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.link(source, target)
    except OSError:  # another filesystem, or links not allowed: copy the bytes
        shutil.copyfile(source, target)


__all__ = [
    "TASKS",
    "FSDDError",
    "Recording",
    "link_or_copy",
    "make_fsdd_competition",
    "parse_name",
    "scan_recordings",
    "split_recordings",
]
