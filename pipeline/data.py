"""The competition folder contract, and audio in and out of it.

    DATA/train.csv              path,label   (path relative to DATA)
    DATA/test.csv               id,path
    DATA/sample_submission.csv  id,label     (the ids a submission must carry, in this order)

Every stage reads the folder through this module and nothing else. Audio becomes 16 kHz mono float32;
training and inference cut it into the same fixed-length windows (`windows`), because the model learns the
statistics of a window (sentence mean normalisation over it), not of a whole file.
"""

from __future__ import annotations

import csv
import io
import math
import os
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import soundfile as sf
import torch
import torchaudio.functional as AF

from .config import SAMPLE_RATE
from .staging import check_output_dir, mark, marked_as, staged_directory, write_text_atomically

TRAIN_COLUMNS = ("path", "label")
TEST_COLUMNS = ("id", "path")
SUBMISSION_COLUMNS = ("id", "label")


class DataError(ValueError):
    """The competition folder breaks the contract. The message names the file, the row and what to do."""


class AudioError(ValueError):
    """One audio file cannot be used. `reason` is a short machine-readable cause, `detail` says what is wrong
    without the file's path (reports that leave the machine must not carry absolute paths)."""

    def __init__(self, reason: str, path: Path, detail: str) -> None:
        super().__init__(f"{path}: {detail}")
        self.reason, self.path, self.detail = reason, path, detail


@dataclass(frozen=True)
class TrainRow:
    line: int  # line number in train.csv (header = line 1), for error messages
    rel_path: str
    label: str


@dataclass(frozen=True)
class TestRow:
    line: int
    id: str
    rel_path: str


def read_csv(csv_path: Path, columns: tuple[str, ...]) -> list[tuple[int, dict[str, str]]]:
    """Rows of `csv_path` as (line number, row) pairs, after checking the header has `columns`."""
    if not csv_path.is_file():
        raise DataError(f"{csv_path}: file not found. A competition folder needs {csv_path.name} "
                        f"with columns {','.join(columns)}.")  # fmt: skip
    with csv_path.open(newline="", encoding="utf-8-sig") as handle:
        reader = csv.DictReader(handle)
        header = [name.strip() for name in (reader.fieldnames or [])]
        missing = [c for c in columns if c not in header]
        if missing:
            raise DataError(
                f"{csv_path}: missing column(s) {missing}; the header is {header}. "
                f"Expected columns {','.join(columns)}."
            )
        reader.fieldnames = header
        # DictReader's line_num is the physical line just read: the header is line 1.
        return [(reader.line_num, {k: (v or "").strip() for k, v in row.items() if k}) for row in reader]


def resolve_inside(data_dir: Path, rel_path: str) -> Path:
    """`data_dir / rel_path`, refusing paths that escape `data_dir` (absolute, `..`, symlinks out)."""
    root = data_dir.resolve()
    try:
        candidate = (root / rel_path).resolve()
    except (OSError, RuntimeError, ValueError) as error:  # symlink loop, name too long, NUL byte
        raise DataError(f"path {rel_path!r} cannot be resolved ({error})") from error
    if not rel_path or not candidate.is_relative_to(root):
        raise DataError(f"path {rel_path!r} resolves outside the data folder; paths in the CSVs must be "
                        "relative to it")  # fmt: skip
    return candidate


def write_csv(path: Path, header: Iterable[str], rows: Iterable[Iterable[object]]) -> None:
    """The one CSV writer (competition folders, submission.csv, probabilities.csv): csv.writer quoting, since
    ids, paths and labels may hold commas or quotes; `\n` line ends; written atomically."""
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(header)
    writer.writerows(rows)
    write_text_atomically(path, buffer.getvalue())


COMPETITION_FOLDER = "competition folder"
# What `python -m pipeline data` wrote before folders carried the marker: still recognised as ours.
_LEGACY_FOLDER_ENTRIES = {
    "train.csv",
    "test.csv",
    "sample_submission.csv",
    "solution.csv",
    "audio",
    "ATTRIBUTION.txt",
}


def written_by_data_command(folder: Path) -> bool:
    """True for a competition folder that `python -m pipeline data` wrote (it may replace it)."""
    if marked_as(folder, COMPETITION_FOLDER):
        return True
    names = {p.name for p in folder.iterdir()}
    return {"solution.csv", "audio"} <= names <= _LEGACY_FOLDER_ENTRIES


@contextmanager
def new_competition_folder(out_dir: str | os.PathLike, overwrite: bool) -> Iterator[Path]:
    """Yield a staging folder to build a competition folder in; it replaces `out_dir` when the block ends.
    `out_dir` must be new or empty, or (with `overwrite`) a folder the data commands wrote before."""
    target = check_output_dir(out_dir, name="out", is_ours=written_by_data_command,
                              what="a competition folder written by `python -m pipeline data`",
                              replace_ours=overwrite, how_to_replace="pass --overwrite (overwrite=True)")  # fmt: skip
    with staged_directory(target, written_by_data_command) as staging:
        yield staging
        mark(staging, COMPETITION_FOLDER)


def read_train_table(data_dir: str | Path, on_bad_row: str = "error") -> tuple[list[TrainRow], list[dict]]:
    """The rows of train.csv, and the rows left out for an empty label or path under `on_bad_row="skip"`
    (otherwise such a row stops the run with an error naming its line)."""
    csv_path = Path(data_dir) / "train.csv"
    rows, skipped = [], []
    for line, row in read_csv(csv_path, TRAIN_COLUMNS):
        problem = "empty label" if not row["label"] else "empty path" if not row["path"] else None
        if problem is None:
            rows.append(TrainRow(line, row["path"], row["label"]))
        else:
            skip_or_stop(on_bad_row, skipped, csv_path, line, row["path"], problem)
    if not rows and not skipped:
        raise DataError(f"{csv_path}: no rows. Training needs at least one labelled file.")
    return rows, skipped


def skip_or_stop(
    on_bad_row: str,
    skipped: list[dict],
    csv_path: Path,
    line: int,
    path: str,
    reason: str,
    cause: Exception | None = None,
) -> None:
    """The one rule for a bad training row: under on_bad_row="skip" it is recorded (by its path as written in
    the CSV, never an absolute one) and left out; otherwise the run stops with an error naming it."""
    if on_bad_row != "skip":
        raise DataError(f"{csv_path} line {line} ({path!r}): {reason}. Fix or remove the row, or set "
                        "on_bad_row='skip' to train without it (skipped rows are reported).") from cause  # fmt: skip
    skipped.append({"line": str(line), "path": path, "reason": reason})


def read_test_table(data_dir: str | Path) -> tuple[list[TestRow], list[str]]:
    """The rows of test.csv, one per id, and a note for every later row that repeats an id.

    Inference must never lose a submission row to a flaw in test.csv, so a repeated id is not an error:
    its first row is used and the repeats are reported.
    """
    csv_path = Path(data_dir) / "test.csv"
    rows: list[TestRow] = []
    first_line: dict[str, int] = {}
    repeats: list[str] = []
    for line, row in read_csv(csv_path, TEST_COLUMNS):
        if row["id"] in first_line:
            repeats.append(f"{csv_path.name} line {line} repeats id {row['id']!r} of line "
                           f"{first_line[row['id']]}; the first row is used")  # fmt: skip
            continue
        first_line[row["id"]] = line
        rows.append(TestRow(line, row["id"], row["path"]))
    return rows, repeats


def read_submission_ids(data_dir: str | Path) -> list[str]:
    """The ids of sample_submission.csv, in order: exactly the rows a submission must have."""
    csv_path = Path(data_dir) / "sample_submission.csv"
    return [row["id"] for _, row in read_csv(csv_path, SUBMISSION_COLUMNS)]


# ---------------------------------------------------------------------------------------------------------
# Audio


def load_audio(path: Path, *, max_seconds: float | None = None) -> tuple[np.ndarray, list[str]]:
    """Decode `path` to 16 kHz mono float32, repairing what can be repaired.

    Returns the samples and the list of repairs made (e.g. "stereo mixed down", "resampled 8000->16000").
    Raises AudioError when nothing usable is left. `max_seconds` bounds decoding of very long files.
    """
    try:
        if not path.is_file():
            raise AudioError("missing", path, "file not found")
        if path.stat().st_size == 0:
            raise AudioError("empty", path, "file is empty (0 bytes)")
        info = sf.info(str(path))
        frames = -1 if max_seconds is None else int(max_seconds * info.samplerate)
        samples, rate = sf.read(str(path), dtype="float32", always_2d=True, frames=frames)
    except AudioError:
        raise
    except (sf.LibsndfileError, OSError, RuntimeError, TypeError, ValueError) as error:
        # The decoder's message repeats the absolute path; the AudioError already carries it.
        message = str(error).replace(str(path), path.name)
        raise AudioError("unreadable", path, f"not readable as audio ({message})") from error
    repairs: list[str] = []
    if samples.shape[1] > 1:
        samples = samples.mean(axis=1, keepdims=True)
        repairs.append(f"{info.channels} channels mixed down")
    mono = samples[:, 0]
    if not np.isfinite(mono).all():
        bad = int((~np.isfinite(mono)).sum())
        if bad == mono.size:
            raise AudioError("non-finite", path, "every sample is NaN or infinite")
        mono = np.nan_to_num(mono, nan=0.0, posinf=0.0, neginf=0.0)
        repairs.append(f"{bad} NaN/inf samples zeroed")
    if mono.size == 0:
        raise AudioError("empty", path, "no audio samples")
    if rate != SAMPLE_RATE:
        mono = resample(mono, rate)
        repairs.append(f"resampled {rate}->{SAMPLE_RATE}")
    return np.ascontiguousarray(mono, dtype=np.float32), repairs


def resample(samples: np.ndarray, rate: int) -> np.ndarray:
    """Resample to 16 kHz with torchaudio's windowed-sinc resampler (the one SpeechBrain uses)."""
    divisor = math.gcd(int(rate), SAMPLE_RATE)
    tensor = torch.from_numpy(np.ascontiguousarray(samples))
    out = AF.resample(tensor, orig_freq=int(rate) // divisor, new_freq=SAMPLE_RATE // divisor)
    return out.numpy()


def crop_span(
    length: int, window: int, rng: np.random.Generator, min_short_fraction: float = 1.0
) -> tuple[int, int]:
    """Where a training example is cut from a clip of `length` samples: [start, stop), at most `window` long.

    A clip at least a window long gives a random `window`-sample crop. A shorter one is taken whole (it is
    zero-padded after the cut, see `pad_crop`), except that with `min_short_fraction` < 1 half of them are
    first cut to a random part of at least that fraction of their length (augmentation: see
    TrainConfig.min_short_fraction). The draws from `rng` depend only on `length`, so a crop is a function of
    the seed whether the clip is in memory or in the audio cache.
    """
    if length >= window:
        start = int(rng.integers(0, length - window + 1))
        return start, start + window
    if min_short_fraction < 1.0 and rng.random() < 0.5:
        keep = max(1, int(length * rng.uniform(min_short_fraction, 1.0)))
        start = int(rng.integers(0, length - keep + 1))
        return start, start + keep
    return 0, length


def pad_crop(samples: np.ndarray, window: int) -> tuple[np.ndarray, float]:
    """`samples` (at most a window) left-aligned and zero-padded to `window`, and their relative length (valid
    samples / window), which the model uses to ignore padding exactly as at inference."""
    if samples.size == window:
        return np.ascontiguousarray(samples, dtype=np.float32), 1.0
    padded = np.zeros(window, dtype=np.float32)
    padded[: samples.size] = samples
    return padded, samples.size / window


def random_crop(
    samples: np.ndarray, window: int, rng: np.random.Generator, min_short_fraction: float = 1.0
) -> tuple[np.ndarray, float]:
    """A training example from a clip in memory: `crop_span`, then `pad_crop`."""
    start, stop = crop_span(samples.size, window, rng, min_short_fraction)
    return pad_crop(samples[start:stop], window)


def windows(samples: np.ndarray, window: int, max_windows: int) -> tuple[np.ndarray, np.ndarray]:
    """Cut a clip into inference windows: [n, window] samples and [n] relative lengths.

    A short clip is one left-aligned padded window (as in training). A long one is covered by
    ceil(len / window) windows, the last aligned to the end; past `max_windows`, that many evenly spaced
    windows stand for the file so minutes-long audio costs a bounded amount of compute.
    """
    if samples.size <= window:
        padded = np.zeros((1, window), dtype=np.float32)
        padded[0, : samples.size] = samples
        return padded, np.array([samples.size / window], dtype=np.float32)
    count = min(math.ceil(samples.size / window), max_windows)
    starts = np.linspace(0, samples.size - window, count).round().astype(np.int64)
    stacked = np.stack([samples[s : s + window] for s in starts])
    return stacked, np.ones(count, dtype=np.float32)


def label_list(labels: Iterable[str]) -> list[str]:
    """The class order of a model: sorted unique labels (stable across runs and machines)."""
    return sorted(set(labels))
