"""The competition folder: its tables, where its audio is, and what a submission must look like.

This project's own layout is the default, and any competition's can be described with parameters:

    training  TrainTable: `train_table` (train.csv), `path_column` (path), `label_column` (label), paths relative
              to `audio_dir` (the data folder); e.g. train_curated.csv with fname,labels and train_curated/;
              `secondary_labels_column`: labels also present in a file (BirdCLEF: "['a', 'b']")
    test      TestLayout: a table (`test_table` test.csv with `id_column` id and `path_column` path), or, when
              the test set is hidden until Kaggle's scoring rerun, every audio file under `test_audio_dir`,
              named by file name or stem (`test_id`: auto | name | stem)
    submission sample_submission.csv: its first column is the id; one other column is a label to predict,
              several are the classes whose probabilities to write (SampleSubmission)

Values are kept byte-exact as the CSV has them (only CSV quoting is undone): a label ' spaced ' stays itself, in
the model and in submission.csv. Paths may leave out the audio extension, and may lie in nested folders.
Every error names the file, the line and the column, and says what to do.
"""

from __future__ import annotations

import ast
import csv
import hashlib
import io
import json
import os
from array import array
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from .staging import (
    changes_since_marked,
    check_output_dir,
    check_output_file,
    file_sha256,
    mark,
    read_record,
    staged_directory,
    staged_file,
    write_text_atomically,
)

AUDIO_SUFFIXES = (".wav", ".flac", ".ogg", ".mp3", ".opus", ".aiff", ".aif", ".aifc", ".au", ".caf", ".w64")


class DataError(ValueError):
    """The competition folder breaks the contract. The message names the file, the row and what to do."""


@dataclass(frozen=True)
class TrainRow:
    line: int  # line number in the training table (header = line 1), for error messages
    rel_path: str  # the audio file, relative to the data folder (audio_dir and extension resolved)
    label: str
    written: str = ""  # the path as the table writes it, for messages
    secondary: tuple[str, ...] = ()  # labels also present in the file, less prominently (BirdCLEF's)


@dataclass(frozen=True)
class TestRow:
    __test__ = False  # not a pytest test class, whatever its name
    line: int  # line in the test table; 0 for a file found in test_audio_dir
    id: str
    rel_path: str  # relative to the data folder


@dataclass(frozen=True)
class TrainTable:
    """Where the training rows and their audio are (TrainConfig's table parameters)."""

    table: str = "train.csv"
    path_column: str = "path"
    label_column: str = "label"
    audio_dir: str | None = None  # inside the data folder; None: the data folder itself
    label_separator: str | None = None  # "a,b" is two labels of one file (multi-label tables)
    secondary_column: str | None = None  # "['a', 'b']", "[]", or labels split by label_separator

    @classmethod
    def of(cls, config: Any) -> TrainTable:
        return cls(
            config.train_table,
            config.path_column,
            config.label_column,
            config.audio_dir,
            config.label_separator,
            config.secondary_labels_column,
        )


@dataclass(frozen=True)
class TestLayout:
    """Where the test items and the sample submission are (InferConfig's table parameters)."""

    __test__ = False  # not a pytest test class, whatever its name
    table: str = "test.csv"
    id_column: str = "id"
    path_column: str = "path"
    audio_dir: str | None = None  # the test table's paths are relative to it; None: the data folder
    test_audio_dir: str | None = None  # no table: every audio file under this folder is a test item
    test_id: str = "auto"  # auto | name | stem: how a discovered file is named in the submission
    sample_submission: str = "sample_submission.csv"

    @classmethod
    def of(cls, config: Any) -> TestLayout:
        return cls(
            config.test_table,
            config.id_column,
            config.path_column,
            config.audio_dir,
            config.test_audio_dir,
            config.test_id,
            config.sample_submission,
        )


# --------------------------------------------------------------------------------------------- CSV


def read_csv(csv_path: Path, columns: Sequence[str], hint: str) -> list[tuple[int, dict[str, str]]]:
    """Rows of `csv_path` as (line number, row) pairs, after checking the header has `columns`. Values are
    exactly what the CSV holds; header names are matched without surrounding spaces."""
    if not csv_path.is_file():
        raise DataError(f"{csv_path}: file not found. {hint}")
    with csv_path.open(newline="", encoding="utf-8-sig") as handle:
        reader = csv.DictReader(handle)
        header = [name.strip() for name in (reader.fieldnames or [])]
        if missing := [c for c in columns if c not in header]:
            raise DataError(f"{csv_path}: missing column(s) {missing}; the header is {header}. {hint}")
        reader.fieldnames = header
        # DictReader's line_num is the physical line just read: the header is line 1.
        return [(reader.line_num, {k: v or "" for k, v in row.items() if k}) for row in reader]


def write_csv(path: Path, header: Iterable[str], rows: Iterable[Iterable[object]]) -> None:
    """The one CSV writer (competition folders, submission.csv, probabilities.csv): csv.writer quoting, since
    ids, paths and labels may hold commas or quotes; `\n` line ends; written atomically, row by row (a
    teacher's scores of every window run to millions of rows: they never stand in memory as one text)."""
    with staged_file(path) as staging:
        _write_rows(staging, header, rows)


def _write_rows(path: Path, header: Iterable[str], rows: Iterable[Iterable[object]]) -> None:
    with path.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle, lineterminator="\n")
        writer.writerow(header)
        writer.writerows(rows)


def resolve_inside(data_dir: Path, rel_path: str) -> Path:
    """`data_dir / rel_path`, judged as written: an absolute path, or one whose `..` climbs out of `data_dir`, is
    refused, so a table cannot make the notebooks read `../../etc/passwd`. Links are followed: Kagglers compose
    data folders out of links to /kaggle/input (read-only), and a link inside the folder was put there by
    whoever owns it, as the audio was. The path returned is the one judged (`a/../b` is `b`), never resolved."""
    if not rel_path:
        raise DataError("empty path: the row names no file")
    if "\x00" in rel_path:
        raise DataError(f"path {rel_path!r} holds a NUL byte: no file can have that name")
    inside = os.path.normpath(rel_path)
    if os.path.isabs(rel_path) or inside == os.pardir or inside.startswith(os.pardir + os.sep):
        why = "an absolute path" if os.path.isabs(rel_path) else "its '..' climbs out"
        raise DataError(
            f"path {rel_path!r} points outside the data folder ({why}); paths in the tables must be "
            "relative to it (a link inside the folder is followed)"
        )
    return Path(os.path.abspath(data_dir)) / inside


def audio_root(data_dir: Path, folder: str | None, parameter: str) -> tuple[Path, str]:
    """The folder `parameter` names inside the data folder, and its path relative to it ("" for the folder)."""
    if not folder:
        return data_dir, ""
    try:
        root = resolve_inside(data_dir, folder)
    except DataError as error:
        raise DataError(f"parameter {parameter}={folder!r}: {error}") from error
    if not root.is_dir():
        raise DataError(
            f"parameter {parameter}={folder!r}: no such folder in {data_dir}; folders there: "
            f"{sorted(p.name for p in data_dir.iterdir() if p.is_dir())[:10]}"
        )
    prefix = os.path.normpath(folder)
    return root, "" if prefix == os.curdir else Path(prefix).as_posix()


def audio_files_under(root: Path) -> list[Path]:
    """Every audio file under `root`, nested folders and linked folders included, hidden ones skipped, in name
    order. A link back to a folder already walked (a loop) is walked once."""
    found: list[Path] = []
    walked: set[tuple[int, int]] = set()
    for current, subdirs, files in os.walk(root, followlinks=True):
        try:
            stat = os.stat(current)
        except OSError:
            subdirs[:] = []
            continue
        if (stat.st_dev, stat.st_ino) in walked:
            subdirs[:] = []
            continue
        walked.add((stat.st_dev, stat.st_ino))
        subdirs[:] = sorted(d for d in subdirs if not d.startswith("."))
        found += [
            Path(current, f)
            for f in sorted(files)
            if not f.startswith(".") and Path(f).suffix.lower() in AUDIO_SUFFIXES
        ]
    return found


def audio_in_folder(data_dir: Path, folder: str, parameter: str) -> tuple[list[str], str]:
    """The audio files under the folder `parameter` names (audio_files_under), relative to the data folder,
    sorted; and that folder relative to the data folder ("" for the data folder itself)."""
    root, prefix = audio_root(data_dir, folder, parameter)
    found = (p.relative_to(root).as_posix() for p in audio_files_under(root) if p.is_file())
    return sorted(f"{prefix}/{rel}" if prefix else rel for rel in found), prefix


class AudioLocator:
    """Finds the file a table row means when the row leaves out its extension ("abc" -> "abc.wav"), listing
    each folder once."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self._stems: dict[Path, dict[str, str]] = {}

    def locate(self, rel: str) -> str:
        """`rel`, or `rel` with the audio extension of the one file it names; unchanged if there is none."""
        if not rel or Path(rel).suffix.lower() in AUDIO_SUFFIXES:
            return rel
        try:
            if (self.root / rel).is_file():
                return rel
            folder = (self.root / rel).parent
        except (OSError, ValueError):
            return rel
        if folder not in self._stems:
            try:
                names = [name for name in os.listdir(folder) if Path(name).suffix.lower() in AUDIO_SUFFIXES]
            except OSError:
                names = []
            # A stem several files share: the first suffix of AUDIO_SUFFIXES wins (written last below).
            ordered = sorted(names, key=lambda n: AUDIO_SUFFIXES.index(Path(n).suffix.lower()))
            self._stems[folder] = {Path(name).stem: name for name in reversed(ordered)}
        found = self._stems[folder].get(Path(rel).name)
        return rel if found is None else str(Path(rel).with_name(found))


# ---------------------------------------------------------------------------------------- training


def read_train_table(
    data_dir: str | Path, on_bad_row: str = "error", layout: TrainTable | None = None
) -> tuple[list[TrainRow], list[dict]]:
    """The rows of the training table, and the rows left out for an empty label or path under
    `on_bad_row="skip"` (otherwise such a row stops the run with an error naming its line)."""
    layout = layout or TrainTable()
    data_dir = Path(data_dir)
    csv_path = data_dir / layout.table
    root, prefix = audio_root(data_dir, layout.audio_dir, "audio_dir")
    hint = (
        f"Training needs a table with a {layout.path_column!r} and a {layout.label_column!r} column: set "
        "train_table, path_column and label_column to the competition's own names."
    )
    locator = AudioLocator(root)
    rows, skipped = [], []
    extra = [layout.secondary_column] if layout.secondary_column else []
    for line, row in read_csv(csv_path, [layout.path_column, layout.label_column, *extra], hint):
        path, label = row[layout.path_column], row[layout.label_column]
        if not (label and path):
            empty = layout.path_column if label else layout.label_column
            skip_or_stop(on_bad_row, skipped, csv_path, line, path, f"empty {empty!r}")
            continue
        rel = locator.locate(path)
        rel = f"{prefix}/{rel}" if prefix else rel
        labels = label.split(layout.label_separator) if layout.label_separator else [label]
        secondary = (
            parse_label_list(
                row[layout.secondary_column], layout.label_separator, csv_path, line, layout.secondary_column
            )
            if layout.secondary_column
            else ()
        )
        rows += [TrainRow(line, rel, one, path, secondary) for one in labels if one]
    if not rows and not skipped:
        raise DataError(f"{csv_path}: no rows. Training needs at least one labelled file.")
    return rows, skipped


def parse_label_list(
    text: str, separator: str | None, csv_path: Path, line: int, column: str
) -> tuple[str, ...]:
    """Labels of a cell that lists several: a Python list literal ("['a', 'b']", "[]", BirdCLEF's form), else
    split by `separator`, else the one label the cell names. Never evaluates anything but a literal."""
    text = text.strip()
    if text.startswith("["):
        try:
            value = ast.literal_eval(text)
        except (ValueError, SyntaxError):
            value = None
        if not isinstance(value, (list, tuple)) or not all(isinstance(v, str) for v in value):
            raise DataError(
                f"{csv_path} line {line}, column {column!r}: {text[:80]!r} is not a list of labels "
                "such as ['a', 'b'] or []; fix the cell, or leave secondary_labels_column unset"
            )
        return tuple(v for v in value if v)
    return tuple(v for v in (text.split(separator) if separator else [text]) if v)


def skip_or_stop(
    on_bad_row: str, skipped: list[dict], csv_path: Path, line: int, path: str, reason: str
) -> None:
    """The one rule for a bad training row: under on_bad_row="skip" it is recorded (by its path as written in
    the table, never an absolute one) and left out; otherwise the run stops with an error naming it."""
    if on_bad_row != "skip":
        raise DataError(
            f"{csv_path} line {line} ({path!r}): {reason}. Fix or remove the row, or set "
            "on_bad_row='skip' to train without it (skipped rows are reported)."
        ) from None
    skipped.append({"line": str(line), "path": path, "reason": reason})


@dataclass(frozen=True)
class LabelledChunk:
    """A row of a labelled-soundscapes table: seconds [start, end) of a file and the labels heard in it."""

    line: int
    rel_path: str  # relative to the data folder
    start: float
    end: float
    labels: tuple[str, ...]


TAXONOMY = "taxonomy.csv"


def read_taxonomy(data_dir: str | Path, table: str = TAXONOMY) -> dict[str, str]:
    """label -> scientific name from the competition's taxonomy table (BirdCLEF: primary_label,
    scientific_name); empty when there is none."""
    path = Path(data_dir) / table
    if not path.is_file():
        return {}
    with path.open(newline="", encoding="utf-8-sig") as handle:
        rows = list(csv.DictReader(handle))
    if not rows or not {"primary_label", "scientific_name"} <= set(rows[0]):
        return {}
    return {row["primary_label"]: row["scientific_name"] for row in rows if row["primary_label"]}


# The columns of BirdCLEF 2026's train_soundscapes_labels.csv.
SOUNDSCAPE_COLUMNS = ("filename", "start", "end", "primary_label")


def read_labelled_chunks(data_dir: str | Path, table: str, folder: str | None) -> list[LabelledChunk]:
    """The rows of a labelled-soundscapes table (filename relative to `folder`, start and end in seconds or as
    H:MM:SS, labels separated by ";"); an unusable row stops with its line and what to fix."""
    data_dir = Path(data_dir)
    csv_path = data_dir / table
    root, prefix = audio_root(data_dir, folder, "val_soundscapes_dir")
    locator = AudioLocator(root)
    hint = f"A labelled-soundscapes table has the columns {', '.join(SOUNDSCAPE_COLUMNS)} (BirdCLEF 2026's form)."
    chunks = []
    for line, row in read_csv(csv_path, SOUNDSCAPE_COLUMNS, hint):
        try:
            start, end = _seconds(row["start"]), _seconds(row["end"])
        except ValueError:
            raise DataError(
                f"{csv_path} line {line}: start {row['start']!r} / end {row['end']!r} are not seconds "
                "(5, 5.0 or 0:00:05)"
            ) from None
        if not row["filename"] or end <= start:
            raise DataError(
                f"{csv_path} line {line}: needs a filename and an end after its start; fix or remove it"
            )
        rel = locator.locate(row["filename"])
        labels = tuple(label.strip() for label in row["primary_label"].split(";") if label.strip())
        chunks.append(LabelledChunk(line, f"{prefix}/{rel}" if prefix else rel, start, end, labels))
    if not chunks:
        raise DataError(f"{csv_path}: no rows. {hint}")
    return chunks


@dataclass(frozen=True)
class ChunkTargets:
    """Soft targets for stretches of soundscapes (self-training's teacher scores, pipeline/rounds/self_training.py):
    `files[k]` (relative to the soundscape folder) from `starts[k]` to `ends[k]` seconds has probability
    `probs[k, c]` of the model's class c."""

    files: list[str]
    starts: np.ndarray  # [rows] float64 seconds
    ends: np.ndarray
    probs: np.ndarray  # [rows, classes] float32, in the order of the `labels` read_chunk_targets was given
    notes: list[str]
    known: np.ndarray | None  # [classes] bool: the file has a column for the class (its teacher knows it)
    sha256: str  # of the bytes read: what the student's provenance and checkpoint fingerprint record


# What every lineage record beside a targets file holds (`<name>.json`): how this project tells its own.
LINEAGE_KEYS = ("teacher", "windows", "files", "sha256")


def targets_lineage(csv_path: Path) -> Path:
    return csv_path.with_suffix(".json")


def _lineage_of_ours(path: Path) -> bool:
    return read_record(path, LINEAGE_KEYS) is not None


def check_targets_file(csv_path: str | Path, why: str) -> Path:
    """Refuse (OutputRefused) a targets file, or its lineage record, that this project did not write: a
    targets file is ours when the lineage beside it is (`why`: which step writes it)."""
    csv_path = Path(csv_path)
    lineage = targets_lineage(csv_path)
    check_output_file(lineage, is_ours=_lineage_of_ours, what="a targets file's lineage record", why=why)
    check_output_file(
        csv_path,
        is_ours=lambda _: _lineage_of_ours(lineage),
        what=f"a targets file (no lineage record {lineage.name} of this project beside it)",
        why=why,
    )
    return csv_path


def write_targets_file(
    csv_path: str | Path,
    header: Sequence[str],
    rows: Iterable[Iterable[object]],
    lineage: Callable[[], dict[str, Any]],
    why: str,
) -> dict[str, Any]:
    """A targets file and its lineage record (`lineage()` once the rows are consumed, with the file's sha256
    added), each written atomically, the record first: a session killed between the two leaves a record of
    this project beside the older file, so a rerun may replace it. A file of someone else's is refused
    (`check_targets_file`). Returns the record."""
    csv_path = check_targets_file(csv_path, why)
    with staged_file(csv_path) as staging:  # replaces csv_path when the block ends
        _write_rows(staging, header, rows)
        record = {**lineage(), "sha256": file_sha256(staging)}
        write_text_atomically(targets_lineage(csv_path), json.dumps(record, indent=2))
    return record


def read_chunk_targets(csv_path: Path, labels: Sequence[str]) -> ChunkTargets:
    """A targets file: `filename,start,end` and one probability column per class. Columns of classes the model
    does not have are left out, classes it has but the file lacks get 0 (both said in `notes`); a row with an
    unreadable time or a probability outside 0..1 stops with its line and what to fix.

    A teacher's scores of every window of a BirdCLEF training set run to millions of rows, so the file is read
    row by row straight into flat float arrays (4 bytes a probability; a row of Python floats costs ~10x), and
    hashed as it is read (one pass over hundreds of MB, and the hash is of the very bytes parsed)."""
    hint = "A targets file has the columns filename, start, end and one probability (0..1) per class."
    if not csv_path.is_file():
        raise DataError(f"{csv_path}: file not found. {hint}")
    digest = hashlib.sha256()
    with (
        _HashingReader(csv_path, digest) as raw,
        io.TextIOWrapper(raw, encoding="utf-8-sig", newline="") as handle,
    ):
        reader = csv.reader(handle)
        header = [name.strip() for name in next(reader, [])]
        if missing := [c for c in ("filename", "start", "end") if c not in header]:
            raise DataError(f"{csv_path}: missing column(s) {missing}; the header is {header}. {hint}")
        classes = [c for c in header if c and c not in ("filename", "start", "end")]
        known = [c for c in classes if c in labels]
        notes = []
        if len(known) < len(classes):
            notes.append(
                f"{csv_path.name}: {len(classes) - len(known)} class column(s) the model does not have are "
                f"left out: {sorted(set(classes) - set(known))[:10]}"
            )
        if len(known) < len(labels):
            notes.append(
                f"{csv_path.name}: no column for {len(labels) - len(known)} of the model's classes (target 0): "
                f"{sorted(set(labels) - set(known))[:10]}"
            )
        name_at, start_at, end_at = (header.index(c) for c in ("filename", "start", "end"))
        value_at = [header.index(c) for c in known]
        files: list[str] = []
        same_name: dict[str, str] = {}  # one string per soundscape, however many rows name it
        times, values, lines = array("d"), array("f"), array("l")
        for row in reader:
            if not any(row):
                continue  # a blank line, as csv.DictReader skips it
            try:
                times.extend((_seconds(row[start_at]), _seconds(row[end_at])))
                values.extend([float(row[k]) for k in value_at])
            except (ValueError, IndexError):
                raise DataError(
                    f"{csv_path} line {reader.line_num}: start, end and the class columns must be "
                    f"numbers. {hint}"
                ) from None
            files.append(same_name.setdefault(row[name_at], row[name_at]))
            lines.append(reader.line_num)
    if not files:
        raise DataError(f"{csv_path}: no rows. {hint}")
    spans = np.frombuffer(times, dtype=np.float64).reshape(len(files), 2)
    found = np.frombuffer(values, dtype=np.float32).reshape(len(files), len(known))
    bad = ~(spans[:, 1] > spans[:, 0]) | ~((found >= 0.0) & (found <= 1.0)).all(axis=1)
    if bad.any():
        line = lines[int(np.argmax(bad))]
        raise DataError(f"{csv_path} line {line}: needs end > start and probabilities in 0..1. {hint}")
    probs = np.zeros((len(files), len(labels)), dtype=np.float32)
    columns = [labels.index(name) for name in known]
    probs[:, columns] = found
    has_column = np.zeros(len(labels), dtype=bool)
    has_column[columns] = True
    return ChunkTargets(
        files, spans[:, 0].copy(), spans[:, 1].copy(), probs, notes, has_column, digest.hexdigest()
    )


class _HashingReader(io.BufferedReader):
    """A file read in binary whose bytes also go into `digest`, as they are read."""

    def __init__(self, path: Path, digest: Any) -> None:
        super().__init__(io.FileIO(path, "rb"), buffer_size=1 << 20)
        self.digest = digest

    def read1(self, size: int = -1) -> bytes:  # what TextIOWrapper reads with
        data = super().read1(size)
        self.digest.update(data)
        return data

    def read(self, size: int | None = -1) -> bytes:
        data = super().read(size)
        self.digest.update(data)
        return data


def _seconds(text: str) -> float:
    parts = [float(part) for part in text.strip().split(":")]
    return sum(value * 60**power for power, value in enumerate(reversed(parts)))


def label_list(labels: Iterable[str]) -> list[str]:
    """The class order of a model: sorted unique labels (stable across runs and machines)."""
    return sorted(set(labels))


# -------------------------------------------------------------------------------------------- test


@dataclass
class TestItems:
    __test__ = False  # not a pytest test class, whatever its name
    rows: list[TestRow]
    source: str  # "table" or "folder"
    notes: list[str] = field(default_factory=list)


def read_test_items(data_dir: str | Path, layout: TestLayout, sample_ids: Sequence[str] = ()) -> TestItems:
    """The test items: the rows of the test table, or the audio files under `test_audio_dir`. Never raises
    for a flaw of a single row: a repeated id keeps its first row and is reported."""
    data_dir = Path(data_dir)
    if layout.test_audio_dir:
        return discover_test_files(data_dir, layout.test_audio_dir, layout.test_id, sample_ids)
    csv_path = data_dir / layout.table
    if not csv_path.is_file():
        folders = sorted(p.name for p in data_dir.iterdir() if p.is_dir() and not p.name.startswith("."))
        raise DataError(
            f"{csv_path}: file not found. A competition without a test table keeps its test audio "
            f"in a folder: set test_audio_dir to it (folders in {data_dir}: {folders[:10]})"
        )
    root, prefix = audio_root(data_dir, layout.audio_dir, "audio_dir")
    locator = AudioLocator(root)
    hint = "Set test_table, id_column and path_column to the competition's own names, or use test_audio_dir."
    by_id: dict[str, TestRow] = {}
    notes: list[str] = []
    for line, row in read_csv(csv_path, (layout.id_column, layout.path_column), hint):
        item_id = row[layout.id_column]
        if item_id in by_id:
            notes.append(
                f"{csv_path.name} line {line} repeats id {item_id!r} of line {by_id[item_id].line}; "
                "the first row is used"
            )
            continue
        rel = locator.locate(row[layout.path_column])
        by_id[item_id] = TestRow(line, item_id, f"{prefix}/{rel}" if prefix and rel else rel)
    return TestItems(list(by_id.values()), "table", notes)


def discover_test_files(data_dir: Path, folder: str, test_id: str, sample_ids: Sequence[str]) -> TestItems:
    """Every audio file under `folder` (nested folders included, hidden ones skipped), in name order, named by
    its file name or its stem: `test_id`, or for "auto" whichever form the sample submission's ids use."""
    root, prefix = audio_root(data_dir, folder, "test_audio_dir")
    found = audio_files_under(root)
    notes = []
    if test_id == "auto":
        test_id, why = _id_form(found, sample_ids)
        notes.append(f"test ids: each file's {test_id} ({why})")
    seen: dict[str, str] = {}  # id -> the first file with it
    for path in found:
        rel = path.relative_to(root).as_posix()
        item_id = path.name if test_id == "name" else path.stem
        if item_id in seen:
            notes.append(
                f"{folder}/{rel} has the id {item_id!r} of {folder}/{seen[item_id]}; the first is used"
            )
            continue
        seen[item_id] = rel
    rows = [TestRow(0, item_id, f"{prefix}/{rel}" if prefix else rel) for item_id, rel in seen.items()]
    notes.insert(0, f"test items: {len(rows)} audio file(s) under {folder}")
    return TestItems(rows, "folder", notes)


def _id_form(files: Sequence[Path], sample_ids: Sequence[str]) -> tuple[str, str]:
    names, stems = {p.name for p in files}, {p.stem for p in files}
    by_name, by_stem = sum(i in names for i in sample_ids), sum(i in stems for i in sample_ids)
    if by_name != by_stem:
        form = "name" if by_name > by_stem else "stem"
        return form, f"{max(by_name, by_stem)} of sample_submission's {len(sample_ids)} ids are file {form}s"
    with_suffix = sum(Path(i).suffix.lower() in AUDIO_SUFFIXES for i in sample_ids)
    form = "name" if sample_ids and with_suffix > len(sample_ids) / 2 else "stem"
    return form, (
        f"no sample_submission id names a file here; its ids {'end' if form == 'name' else 'do not end'} "
        "in an audio extension"
    )


# -------------------------------------------------------------------------------------- submission


@dataclass(frozen=True)
class SampleSubmission:
    """What a submission must look like: sample_submission.csv's header and ids."""

    path: Path
    id_column: str
    value_columns: list[str]  # one: the label to predict; several: one probability per class
    ids: list[str]

    @property
    def probabilities(self) -> bool:
        return len(self.value_columns) > 1


def read_sample_submission(path: Path) -> SampleSubmission:
    """The header (first column: the id) and the ids, in order, of a sample submission."""
    hint = "A sample submission has an id column first, then a label column or one column per class."
    if not path.is_file():
        raise DataError(f"{path}: file not found. {hint} Set sample_submission to the competition's file.")
    with path.open(newline="", encoding="utf-8-sig") as handle:
        reader = csv.reader(handle)
        header = [name.strip() for name in next(reader, [])]
        if len(header) < 2:
            raise DataError(f"{path}: the header {header} has fewer than two columns. {hint}")
        ids = [row[0] for row in reader if row]
    return SampleSubmission(path, header[0], header[1:], ids)


# ---------------------------------------------------------------------------------- writing folders

COMPETITION_FOLDER = "competition folder"


def written_by_data_command(folder: Path) -> bool:
    """True for a competition folder that `python -m pipeline data` wrote and nobody changed since: a rerun
    with --overwrite may replace it (core/staging.changes_since_marked)."""
    return not changes_since_marked(folder, COMPETITION_FOLDER)


@contextmanager
def new_competition_folder(out_dir: str | os.PathLike, overwrite: bool) -> Iterator[Path]:
    """Yield a staging folder to build a competition folder in; it replaces `out_dir` when the block ends.
    `out_dir` must be new or empty, or (with `overwrite`) a folder the data commands wrote before."""
    target = check_output_dir(
        out_dir,
        name="out",
        what="a competition folder written by `python -m pipeline data` and left as it was",
        not_ours=lambda folder: changes_since_marked(folder, COMPETITION_FOLDER),
        replace_ours=overwrite,
        how_to_replace="pass --overwrite (overwrite=True)",
    )
    with staged_directory(target, written_by_data_command) as staging:
        yield staging
        mark(staging, COMPETITION_FOLDER)
