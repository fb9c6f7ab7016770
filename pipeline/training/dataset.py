"""The training set: the table's rows, their audio in the cache, the classes and the train/validation split.

`load_training_data` runs once per machine, before any training process starts: from the `Sources` the session
read (the table's rows, the labelled soundscape chunks, the noise folder's files: plan.open_session), it has the
audio decoded into the cache (pipeline.training.store) and decides which rows train and which validate. What it
returns is small (row metadata and index arrays; the audio stays on disk) and is handed to every rank.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..core import tables
from ..core.config import TrainConfig
from ..core.objectives import is_multi_label
from ..core.progress import plural
from ..core.tables import DataError, LabelledChunk, TrainRow, skip_or_stop
from .augment import FocalTargets, SoundscapeTargets
from .store import AudioStore, CacheBuildStopped, open_or_build, source_files

MAX_CROPS_PER_FILE = 8  # crops per file and epoch, for files of many windows (TrainingData.epoch_rows)


@dataclass(frozen=True)
class Sources:
    """What the training data is made from, read once before anything is decided (plan.open_session): the
    table's usable rows and those skipped under on_bad_row="skip", val_soundscapes_table's labelled chunks, the
    audio files under noise_dir and the audio caches attached as Kaggle inputs. Self-training's rounds train on
    the same sources; what changes between rounds is the targets files, named by the config."""

    rows: tuple[TrainRow, ...]
    skipped: tuple[dict[str, str], ...] = ()
    chunks: tuple[LabelledChunk, ...] = ()
    noise: tuple[str, ...] = ()  # relative to data_dir
    noise_prefix: str = ""  # noise_dir relative to data_dir: where the soundscapes of a targets file are
    caches: tuple[Path, ...] = ()  # searched before the audio is decoded again (store.open_or_build)

    def noise_names(self) -> tuple[list[str], list[str]]:
        """noise_dir's files relative to data_dir, and the same relative to noise_dir: how a targets file of
        soundscape windows names them (TrainConfig.soundscape_targets)."""
        prefix = f"{self.noise_prefix}/" if self.noise_prefix else ""
        return list(self.noise), [name.removeprefix(prefix) for name in self.noise]


@dataclass
class LabelledSoundscapes:
    """Chunks of labelled soundscapes to validate on (val_soundscapes_table), their audio in a cache."""

    store: AudioStore
    items: np.ndarray  # the cache index of each chunk's file
    starts: np.ndarray  # seconds
    ends: np.ndarray
    truth: np.ndarray  # [chunks, classes] 0/1
    files: list[str]  # the soundscapes, relative to the data folder


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
    objective: str = "aam"  # pipeline/core/objectives.py
    noise: AudioStore | None = None  # background recordings for augmentation (noise_dir), cached
    # Multi-label objectives: one row per file, its target of every class (1 for its labels, the secondary
    # label weight for its secondary labels); None for aam, whose rows are (file, label) pairs.
    multi_hot: np.ndarray | None = None
    soundscapes: LabelledSoundscapes | None = None  # validation chunks in the test's domain
    soundscape_targets: SoundscapeTargets | None = None  # self-training's soft targets (augment.py)
    targets_record: dict | None = None  # where they came from, for the artifact's provenance
    focal_targets: FocalTargets | None = None  # a teacher's probabilities over the recordings (distillation)
    focal_record: dict | None = None  # where they came from, for the artifact's provenance

    def truth(self, rows: list[int] | np.ndarray) -> np.ndarray:
        """[len(rows), classes] targets of `rows` (one-hot for aam): what validation metrics compare with."""
        rows = np.asarray(rows, dtype=np.int64)
        if self.multi_hot is not None:
            return self.multi_hot[rows]
        truth = np.zeros((len(rows), len(self.labels)), dtype=np.float32)
        truth[np.arange(len(rows)), self.targets[rows]] = 1.0
        return truth

    def epoch_rows(self, window: int, crops_per_file: int | None = None) -> list[int]:
        """The training rows one epoch crops from: each file once per `window` samples of its audio, up to
        MAX_CROPS_PER_FILE (or `crops_per_file` times each). A clip shorter than a window is seen once an epoch;
        a 40 s focal recording with several calls is not reduced to one crop an epoch."""
        lengths = self.store.lengths[self.items[self.train_idx]]
        counts = crops_per_file or np.clip(np.round(lengths / window), 1, MAX_CROPS_PER_FILE).astype(np.int64)
        return np.repeat(np.asarray(self.train_idx, dtype=np.int64), counts).tolist()

    def label_counts(self) -> dict[str, int]:
        """Training rows per class (files that have it, for multi-label objectives): the prior at inference."""
        counts = (
            (self.multi_hot > 0).sum(axis=0)
            if self.multi_hot is not None
            else np.bincount(self.targets, minlength=len(self.labels))
        )
        return {label: int(n) for label, n in zip(self.labels, counts, strict=True)}

    def describe(self) -> str:
        return (
            f"data: {len(self.rows)} files ({self.store.hours:.1f} h), {plural(len(self.labels), 'class')}, "
            f"{len(self.train_idx)} train / {len(self.val_idx)} validation"
        )


def load_training_data(
    config: TrainConfig, log: Callable[[str], object], sources: Sources, *, objective: str
) -> TrainingData:
    """Cache the training table's audio and split it, for `objective` (the plan decides it: plan.py). A row with
    no label or unusable audio stops the run with an error naming its line (or, under on_bad_row="skip", is
    left out and reported). `sources`: what the session read for `config`, whose session and sample rate are
    resolved."""
    data_dir = Path(config.data_dir)
    csv_path = data_dir / config.train_table
    rows, skipped = list(sources.rows), list(sources.skipped)  # rows left out below join the table's own
    notes: list[str] = []

    def note(*found: str | None) -> None:  # said now, and kept for the report
        for text in filter(None, found):
            log(text)
            notes.append(text)

    rows, repeat_notes = drop_repeated_rows(rows, csv_path)
    note(*repeat_notes)
    try:
        store = _cached(
            config,
            [row.rel_path for row in rows],
            log,
            search=sources.caches,
            stop_at_first_failure=config.on_bad_row != "skip",
        )
    except CacheBuildStopped as stop:
        row = rows[stop.index]
        skip_or_stop("error", [], csv_path, row.line, row.written or row.rel_path, stop.reason)
        raise  # not reached: skip_or_stop raised
    for index, why in sorted(store.failures.items()):
        row = rows[index]
        skip_or_stop(config.on_bad_row, skipped, csv_path, row.line, row.written or row.rel_path, why)
    kept = [index for index in range(len(rows)) if index not in store.failures]
    if not kept:
        raise DataError(f"{csv_path}: no usable training audio (all {len(skipped)} rows were skipped)")
    rows = [rows[i] for i in kept]
    items = np.asarray(kept, dtype=np.int64)
    labels = tables.label_list(row.label for row in rows)
    multi_hot = None
    if is_multi_label(objective):
        first, multi_hot, target_notes = per_file_targets(rows, labels, config.secondary_label_weight)
        rows, items = [rows[i] for i in first], items[first]
        note(*target_notes)
    elif secondary := sum(len(row.secondary) for row in rows):
        note(f"{plural(secondary, 'secondary label')} left out: the aam objective learns one class per clip")
    class_of = {label: k for k, label in enumerate(labels)}
    targets = np.array([class_of[row.label] for row in rows], dtype=np.int64)
    train_idx, val_idx, split_note = split_files(rows, config.split_fraction, config.seed)
    note(split_note)
    soundscapes = load_labelled_soundscapes(config, sources.chunks, labels, log) if sources.chunks else None
    held_out = set(soundscapes.files) if soundscapes else set()
    noise = load_noise(config, sources.noise, log, exclude=held_out) if config.noise_dir else None
    stretches = record = focal = focal_record = None
    if config.soundscape_targets:
        stretches, record = load_soundscape_targets(config, labels, sources.noise_prefix, held_out, log)
    if config.focal_targets:
        focal, focal_record = load_focal_targets(config, rows, labels, log, objective)
    return TrainingData(
        store,
        rows,
        items,
        labels,
        targets,
        train_idx,
        val_idx,
        skipped,
        notes,
        objective=objective,
        noise=noise,
        multi_hot=multi_hot,
        soundscapes=soundscapes,
        soundscape_targets=stretches,
        targets_record=record,
        focal_targets=focal,
        focal_record=focal_record,
    )


def _cached(
    config: TrainConfig,
    files: list[str],
    log: Callable[[str], object],
    what: str | None = None,
    **options: object,
) -> AudioStore:
    """The cache of `files` (relative to data_dir) at the run's sample rate, found or built in cache_dir. With
    `what` (the table that named these soundscapes), one that cannot be used stops the run, named."""
    store = open_or_build(
        source_files(Path(config.data_dir), files),
        config.cache_dir,
        sample_rate=config.sample_rate,
        log=log,
        progress=config.progress,
        keep_apart={"data_dir": config.data_dir},
        **options,
    )
    if what is not None and store.failures:
        index, why = next(iter(store.failures.items()))
        raise DataError(
            f"{what}: soundscape {files[index]!r} cannot be used ({why}); fix it or remove its rows"
        )
    return store


def _read_targets(config: TrainConfig, name: str, labels: list[str], log: Callable[[str], object]):
    """The targets file parameter `name` (absolute, or relative to data_dir) and what it holds (its notes said)."""
    path = Path(config.data_dir) / name  # an absolute `name` replaces data_dir
    found = tables.read_chunk_targets(path, labels)
    for line in found.notes:
        log(line)
    return path, found


def _targets_record(path: Path, found: tables.ChunkTargets, **fields: object) -> dict:
    """What the provenance keeps of a targets file: its name and the hash of what was read (`found`), `fields`,
    and the lineage its teacher wrote beside it (`<name>.json`, pipeline/rounds/self_training.py)."""
    lineage = tables.targets_lineage(path)
    return {
        "file": path.name,
        "sha256": found.sha256,
        **fields,
        "lineage": json.loads(lineage.read_text()) if lineage.is_file() else None,
    }


def load_focal_targets(
    config: TrainConfig,
    rows: list[TrainRow],
    labels: list[str],
    log: Callable[[str], object] = print,
    objective: str = "aam",
) -> tuple[FocalTargets, dict]:
    """The teacher's windows of each training row's recording (`focal_targets`, filenames relative to data_dir)
    and a record for the provenance. Rows whose recording has no window keep their labels (said); a file of
    windows of no training recording stops with what to do."""
    path, found = _read_targets(config, config.focal_targets, labels, log)
    by_file: dict[str, list[int]] = {}
    for k, name in enumerate(found.files):
        by_file.setdefault(name, []).append(k)
    rate, first, order = config.sample_rate, [0], []
    for row in rows:
        order += sorted(by_file.get(row.rel_path, []), key=lambda k: found.starts[k])
        first.append(len(order))
    covered = sum(1 for row in rows if row.rel_path in by_file)
    if not covered:
        raise DataError(
            f"{path}: none of its {len(by_file)} files is a recording of the training table (filenames "
            f"are relative to data_dir, e.g. {rows[0].rel_path!r}); score the training recordings"
        )
    focal = FocalTargets(
        np.asarray(first, dtype=np.int64),
        ((found.starts[order] + found.ends[order]) / 2 * rate).astype(np.int64),
        found.probs[order],
        float(config.focal_target_weight),
        None if found.known is None or found.known.all() else found.known,
        one_label=not is_multi_label(objective),
    )
    record = _targets_record(
        path,
        found,
        windows=len(order),
        rows_covered=covered,
        rows=len(rows),
        weight=config.focal_target_weight,
    )
    log(
        f"focal targets: {plural(len(order), 'teacher window')} over {covered} of {plural(len(rows), 'training row')} "
        f"from {path.name}, weight {config.focal_target_weight:g}"
        + (f" ({len(rows) - covered} rows keep their labels alone)" if covered < len(rows) else "")
    )
    return focal, record


def load_soundscape_targets(
    config: TrainConfig,
    labels: list[str],
    prefix: str,
    held_out: set[str],
    log: Callable[[str], object] = print,
) -> tuple[SoundscapeTargets, dict]:
    """The stretches of `soundscape_targets` after its controls (power, floor, threshold), their soundscapes
    (files in the folder `prefix`, relative to data_dir) cached; and a record for the provenance: the file's
    hash, what was kept, and the lineage written beside it (`<name>.json`, pipeline/rounds/self_training.py).
    Stretches of validation soundscapes are left out."""
    path, found = _read_targets(config, config.soundscape_targets, labels, log)
    # Per soundscape, not per row: a targets file holds millions of rows naming a few thousand soundscapes.
    rel = {name: f"{prefix}/{name}" if prefix else name for name in set(found.files)}
    probs = found.probs**config.target_power
    probs[probs < config.target_floor] = 0.0
    usable = np.fromiter((rel[name] not in held_out for name in found.files), bool, len(found.files))
    keep = np.flatnonzero((probs.max(axis=1) >= config.target_threshold) & usable)
    if not len(keep):
        raise DataError(
            f"{path}: no stretch has a probability >= target_threshold={config.target_threshold:g}; lower it"
        )
    files = sorted({rel[found.files[k]] for k in keep})
    store = _cached(config, files, log, what=str(path))
    position = {name: k for k, name in enumerate(files)}
    rate = config.sample_rate
    stretches = SoundscapeTargets(
        store,
        np.array([position[rel[found.files[k]]] for k in keep], dtype=np.int64),
        (found.starts[keep] * rate).astype(np.int64),
        (found.ends[keep] * rate).astype(np.int64),
        probs[keep],
    )
    record = _targets_record(
        path,
        found,
        stretches=len(keep),
        of=len(found.files),
        soundscapes=len(files),
        mean_target_mass=round(float(probs[keep].sum(1).mean()), 4),
        power=config.target_power,
        floor=config.target_floor,
        threshold=config.target_threshold,
        probability=config.target_probability,
    )
    log(
        f"soundscape targets: {plural(len(keep), 'stretch', 'stretches')} of {plural(len(files), 'soundscape')} from {path.name} "
        f"(mean target mass {record['mean_target_mass']:.2f} per stretch)"
    )
    return stretches, record


def load_labelled_soundscapes(
    config: TrainConfig,
    chunks: Sequence[LabelledChunk],
    labels: list[str],
    log: Callable[[str], object] = print,
) -> LabelledSoundscapes:
    """The labelled chunks of val_soundscapes_table, their soundscapes cached. Labels that are no class of the
    training table are left out (and said); a soundscape that cannot be read stops with its name."""
    files = sorted({chunk.rel_path for chunk in chunks})
    store = _cached(config, files, log, what=config.val_soundscapes_table)
    class_of = {label: k for k, label in enumerate(labels)}
    truth = np.zeros((len(chunks), len(labels)), dtype=np.float32)
    for row, chunk in enumerate(chunks):
        truth[row, [class_of[label] for label in chunk.labels if label in class_of]] = 1.0
    unknown = {label for chunk in chunks for label in chunk.labels} - class_of.keys()
    position = {path: k for k, path in enumerate(files)}
    log(
        f"validation soundscapes: {plural(len(chunks), 'labelled chunk')} of {plural(len(files), 'soundscape')}"
        + (
            f"; {plural(len(unknown), 'label')} no class of the training table is left out: "
            f"{', '.join(repr(u) for u in sorted(unknown)[:10])}"
            if unknown
            else ""
        )
    )
    return LabelledSoundscapes(
        store,
        np.array([position[c.rel_path] for c in chunks], dtype=np.int64),
        np.array([c.start for c in chunks]),
        np.array([c.end for c in chunks]),
        truth,
        files,
    )


def load_noise(
    config: TrainConfig,
    found: Sequence[str],
    log: Callable[[str], object] = print,
    exclude: set[str] = frozenset(),
) -> AudioStore:
    """The background recordings under `noise_dir` (`found`: every audio file, nested folders included, relative
    to data_dir), but those in `exclude` (validation soundscapes), cached like the training audio. Unreadable
    ones are left out and said; none usable is an error naming the folder."""
    found = list(found)
    if left_out := exclude & set(found):
        log(f"noise_dir: {plural(len(left_out), 'validation soundscape')} left out of the background")
        found = [f for f in found if f not in exclude]
    store = _cached(config, found, log)
    if len(store.failures) == len(store):
        raise DataError(
            f"parameter noise_dir={config.noise_dir!r}: no usable audio file under {Path(config.data_dir, config.noise_dir)} "
            f"({len(found)} found); point it at a folder of background recordings or leave it unset"
        )
    if store.failures:
        log(f"noise_dir: {plural(len(store.failures), 'file')} unusable and left out of the background noise")
    return store


def per_file_targets(
    rows: list[TrainRow], labels: list[str], secondary_weight: float
) -> tuple[list[int], np.ndarray, list[str]]:
    """One row per file (its first) and its targets: 1 for every label its rows give it, `secondary_weight`
    for its secondary labels. Secondary labels that are no class are left out, and said."""
    class_of = {label: k for k, label in enumerate(labels)}
    first: dict[str, int] = {}
    for index, row in enumerate(rows):
        first.setdefault(row.rel_path, index)
    order = list(first.values())
    position = {path: k for k, path in enumerate(first)}
    targets = np.zeros((len(order), len(labels)), dtype=np.float32)
    for row in rows:  # secondary labels first: a primary label's 1, set below, wins
        secondary = [class_of[label] for label in row.secondary if label in class_of]
        targets[position[row.rel_path], secondary] = secondary_weight
    targets[[position[row.rel_path] for row in rows], [class_of[row.label] for row in rows]] = 1.0
    unknown = {label for row in rows for label in row.secondary} - class_of.keys()
    notes = (
        [
            f"{plural(len(unknown), 'secondary label')} name no class of the table (no file has it as its label) "
            f"and are left out: {', '.join(repr(u) for u in sorted(unknown)[:10])}"
        ]
        if unknown
        else []
    )
    return order, targets, notes


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
        extra = (
            f"validation: {plural(returned, 'file')} with several labels went back to training, where "
            "one of their labels had no other file"
        )
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
        notes.append(
            f"{csv_path.name}: {len(repeats)} repeated row(s) dropped (same path and label as an "
            f"earlier row): {', '.join(repeats[:5])}{' ...' if len(repeats) > 5 else ''}"
        )
    if conflicts := sorted(path for path, labels in labels_of.items() if len(labels) > 1):
        notes.append(
            f"{csv_path.name}: {len(conflicts)} file(s) carry more than one label; each label is "
            f"trained on: {', '.join(repr(p) for p in conflicts[:5])}{' ...' if len(conflicts) > 5 else ''}"
        )
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
    for label in sorted(by_label):
        rng.shuffle(by_label[label])
    held = {label: min(int(round(len(m) * fraction)), len(m) - 1) for label, m in by_label.items()}
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
    val_idx = sorted(i for label, members in by_label.items() for i in members[: held[label]])
    train_idx = sorted(set(range(len(labels))) - set(val_idx))
    note = None
    if not val_idx:
        why = "val_fraction=0" if fraction <= 0 else "every class has a single clip, which training needs"
        note = (
            f"no validation split ({why}): model selection is off, the last epoch's weights are saved "
            "and no validation accuracy is reported"
        )
    elif topped_up:
        counts = Counter(labels)
        note = (
            f"validation: {len(val_idx)} files; val_fraction={fraction:g} of each class gives "
            f"{len(val_idx) - topped_up} with {len(counts)} classes of {min(counts.values())}-"
            f"{max(counts.values())} clips, so {topped_up} more came from classes that could spare a clip"
        )
    return train_idx, val_idx, note
