"""The training set: the table's rows, their audio in the cache, the classes and the train/validation split.

`load_training_data` runs once per machine, before any training process starts: it reads the table, has the
audio decoded into the cache (pipeline.store) and decides which rows train and which validate. What it
returns is small (row metadata and index arrays; the audio stays on disk) and is handed to every rank.
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from . import kaggle
from .config import TrainConfig
from .progress import plural
from .store import AudioStore, CacheBuildStopped, open_or_build, source_files
from .tables import DataError, TrainRow, TrainTable, label_list, read_train_table, skip_or_stop


@dataclass
class TrainingData:
    """What every training process needs to know about the data (pickled to DDP ranks: no audio in it)."""

    store: AudioStore
    rows: list[TrainRow]  # the usable rows of the table
    items: np.ndarray  # the cache index of each row
    labels: list[str]  # the classes, in the model's order
    targets: np.ndarray  # the class of each row
    train_idx: list[int]
    val_idx: list[int]
    skipped: list[dict[str, str]] = field(default_factory=list)  # rows left out, with line, path and reason
    notes: list[str] = field(default_factory=list)  # what was changed or noticed on the way, for the report

    def describe(self) -> str:
        return (f"data: {len(self.rows)} files ({self.store.hours:.1f} h), {len(self.labels)} "
                f"{'class' if len(self.labels) == 1 else 'classes'}, {len(self.train_idx)} train / "
                f"{len(self.val_idx)} validation")  # fmt: skip


def default_cache_dir() -> Path:
    """Where decoded audio is cached when cache_dir is not given. On Kaggle: /kaggle/tmp (not saved with the
    notebook's output, and not counted against /kaggle/working's 20 GB: 100 hours of audio are 11.5 GB), else
    /tmp. Elsewhere: the user's cache folder ($XDG_CACHE_HOME, ~/.cache), shared by every run on the machine."""
    if kaggle.on_kaggle():
        tmp = kaggle.kaggle_root() / "tmp"
        return (tmp if tmp.is_dir() else Path("/tmp")) / "ecapa-audio-cache"
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "kaggle-ecapa-pipeline" / "audio"


def load_training_data(config: TrainConfig, log: Callable[[str], object] = print) -> TrainingData:
    """Read the training table, cache its audio and split it. A row with no label or unusable audio stops the
    run with an error naming its line (or, under on_bad_row="skip", is left out and reported)."""
    data_dir = Path(config.data_dir)
    csv_path = data_dir / config.train_table
    rows, skipped = read_train_table(data_dir, config.on_bad_row, TrainTable.of(config))
    rows, notes = drop_repeated_rows(rows, csv_path)
    for note in notes:
        log(note)
    files = source_files(data_dir, [row.rel_path for row in rows])
    try:
        store = open_or_build(
            files,
            config.cache_dir or default_cache_dir(),
            search=[p for p in kaggle.find_dirs_with(("cache.json", "index.npz"))]
            if kaggle.on_kaggle()
            else [],
            stop_at_first_failure=config.on_bad_row != "skip",
            log=log,
            progress=config.progress,
            keep_apart={"data_dir": config.data_dir},
        )
    except CacheBuildStopped as stop:
        row = rows[stop.index]
        skip_or_stop("error", [], csv_path, row.line, row.written or row.rel_path, stop.reason)
        raise  # not reached: skip_or_stop raised
    kept = []
    for index, row in enumerate(rows):
        if index in store.failures:
            skip_or_stop(config.on_bad_row, skipped, csv_path, row.line, row.written or row.rel_path,
                         store.failures[index])  # fmt: skip
        else:
            kept.append(index)
    if not kept:
        raise DataError(f"{csv_path}: no usable training audio (all {len(skipped)} rows were skipped)")
    rows = [rows[i] for i in kept]
    labels = label_list(row.label for row in rows)
    class_of = {label: k for k, label in enumerate(labels)}
    targets = np.array([class_of[row.label] for row in rows], dtype=np.int64)
    train_idx, val_idx, split_note = split_files(rows, config.val_fraction, config.seed)
    if split_note:
        log(split_note)
        notes.append(split_note)
    return TrainingData(store, rows, np.asarray(kept, dtype=np.int64), labels, targets, train_idx, val_idx,
                        skipped, notes)  # fmt: skip


def split_files(rows: list[TrainRow], fraction: float, seed: int) -> tuple[list[int], list[int], str | None]:
    """stratified_split over files, not rows: a file with several labels (one row each, from label_separator)
    goes wholly to training or wholly to validation, stratified by its first label, so validation never
    scores audio training saw. A label whose files all went to validation brings one back (every class is
    trained). With one row per file this is stratified_split itself. Returns row indices and a note."""
    first_row: dict[str, int] = {}
    for index, row in enumerate(rows):
        first_row.setdefault(row.rel_path, index)
    files = list(first_row)
    train_files, val_files, note = stratified_split([rows[first_row[f]].label for f in files], fraction, seed)
    held = {files[k] for k in val_files}
    trained = {row.label for row in rows if row.rel_path not in held}
    returned = 0
    for row in rows:
        if row.label not in trained and row.rel_path in held:
            held.discard(row.rel_path)
            trained |= {other.label for other in rows if other.rel_path == row.rel_path}
            returned += 1
    if returned:
        extra = (f"validation: {plural(returned, 'file')} with several labels went back to training, where "
                 "one of their labels had no other file")  # fmt: skip
        note = f"{note}; {extra}" if note else extra
    train_idx = [i for i, row in enumerate(rows) if row.rel_path not in held]
    val_idx = [i for i, row in enumerate(rows) if row.rel_path in held]
    return train_idx, val_idx, note


def drop_repeated_rows(rows: list[TrainRow], csv_path: Path) -> tuple[list[TrainRow], list[str]]:
    """Rows with the same path and label as an earlier row are dropped (the same clip twice would weigh double,
    and could land in both training and validation). A path with two labels is kept, and said."""
    seen: dict[tuple[str, str], int] = {}
    labels_of: dict[str, set[str]] = {}
    kept, repeats = [], []
    for row in rows:
        key = (row.rel_path, row.label)
        if key in seen:
            repeats.append(f"line {row.line} (= line {seen[key]})")
            continue
        seen[key] = row.line
        labels_of.setdefault(row.rel_path, set()).add(row.label)
        kept.append(row)
    notes = []
    if repeats:
        notes.append(f"{csv_path.name}: {len(repeats)} repeated row(s) dropped (same path and label as an "
                     f"earlier row): {', '.join(repeats[:5])}{' ...' if len(repeats) > 5 else ''}")  # fmt: skip
    conflicts = sorted(path for path, labels in labels_of.items() if len(labels) > 1)
    if conflicts:
        notes.append(f"{csv_path.name}: {len(conflicts)} file(s) carry more than one label; each label is "
                     f"trained on: {', '.join(repr(p) for p in conflicts[:5])}{' ...' if len(conflicts) > 5 else ''}")  # fmt: skip
    return kept, notes


def stratified_split(
    labels: list[str], fraction: float, seed: int
) -> tuple[list[int], list[int], str | None]:
    """Indices (train, validation), and a note when the split is not what `fraction` asks or is empty.

    `fraction` of each label is held out (at least one clip of every label stays in training). When that
    rounds to fewer than round(fraction x files) (at least one) -- many classes with few clips, e.g. 120
    classes x 2 clips gave none -- classes that can spare a clip give one each (in a seeded order) until it
    does: model selection needs something to select on.
    """
    rng = np.random.default_rng(seed)
    by_label: dict[str, list[int]] = {}
    for index, label in enumerate(labels):
        by_label.setdefault(label, []).append(index)
    held: dict[str, int] = {}
    for label in sorted(by_label):
        members = by_label[label]
        rng.shuffle(members)
        held[label] = min(int(round(len(members) * fraction)), len(members) - 1)
    spare_clips = sum(len(m) - 1 for m in by_label.values())
    wanted = 0 if fraction <= 0 else min(max(1, round(fraction * len(labels))), spare_clips)
    topped_up = 0
    spare = np.random.default_rng([seed, 31337])
    while sum(held.values()) < wanted:
        can_spare = [label for label in sorted(by_label) if len(by_label[label]) - held[label] > 1]
        for k in spare.permutation(len(can_spare)):
            if sum(held.values()) >= wanted:
                break
            held[can_spare[k]] += 1
            topped_up += 1
    train_idx, val_idx = [], []
    for label in sorted(by_label):
        val_idx += by_label[label][: held[label]]
        train_idx += by_label[label][held[label] :]
    note = None
    if not val_idx:
        why = "val_fraction=0" if fraction <= 0 else "every class has a single clip, which training needs"
        note = (f"no validation split ({why}): model selection is off, the last epoch's weights are saved "
                "and no validation accuracy is reported")  # fmt: skip
    elif topped_up:
        counts = Counter(labels)
        note = (f"validation: {len(val_idx)} files; val_fraction={fraction:g} of each class gives "
                f"{len(val_idx) - topped_up} with {len(counts)} classes of {min(counts.values())}-"
                f"{max(counts.values())} clips, so {topped_up} more came from classes that could spare a clip")  # fmt: skip
    return sorted(train_idx), sorted(val_idx), note
