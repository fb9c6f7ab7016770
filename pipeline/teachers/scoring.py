"""Audio -> a teacher's windows -> its logits: targets files for training, pooled span scores for inference.

A file is decoded at the teacher's rate and cut into windows of its length, `hop` apart (default: one window,
as BirdNET's own code reads a file); a last part of at least half a window is a window of its own,
zero-padded, and a file shorter than that is one padded window. The next file is decoded while the model runs
on the current one (a thread: the runtimes release the GIL).

    score_files(runtime, paths)         (file, window starts, logits [windows, outputs]) for every readable file
    write_targets(...)                  the targets file self-training and distillation read: filename, start,
                                        end and one probability (a sigmoid of the logit) per class the teacher
                                        knows -- classes it lacks get no column, so training knows it has no
                                        opinion of them -- and a lineage record beside it (`<name>.json`)
    span_logits(runtime, path, spans)   the infer stage's spans (a whole file, or chunks): the highest logit of
                                        the windows inside each span, per output
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

from ..core.data import AudioError, load_audio
from ..core.tables import write_targets_file
from .model import TeacherRuntime, sigmoid
from .species import ClassMap

BATCH_WINDOWS = 32


def teacher_windows(samples: np.ndarray, window: int, hop: int) -> tuple[np.ndarray, np.ndarray]:
    """([n, window] float32 windows, [n] start samples) of `samples`, `hop` apart (module docstring)."""
    starts = list(range(0, max(len(samples) - window, 0) + 1, hop))
    if starts[-1] + window < len(samples) and len(samples) - (starts[-1] + hop) >= window // 2:
        starts.append(starts[-1] + hop)  # the last part, at least half a window: zero-padded
    out = np.zeros((len(starts), window), dtype=np.float32)
    for k, start in enumerate(starts):
        part = samples[start : start + window]
        out[k, : len(part)] = part
    return out, np.asarray(starts, dtype=np.int64)


def window_logits(runtime: TeacherRuntime, windows: np.ndarray) -> np.ndarray:
    """[n, outputs] logits of `windows`, BATCH_WINDOWS at a time."""
    outs = [runtime.logits(windows[k : k + BATCH_WINDOWS]) for k in range(0, len(windows), BATCH_WINDOWS)]
    return np.concatenate(outs) if outs else np.zeros((0, len(runtime.teacher.labels)), dtype=np.float32)


def decoded(
    paths: Sequence[Path], rate: int, max_seconds: float | None = None
) -> Iterator[tuple[Path, np.ndarray | None, str | None]]:
    """(path, samples or None, problem) for each path in order, the next decoded while the caller works; a
    file that cannot be decoded gives its problem, never an exception."""

    def decode(path: Path) -> tuple[Path, np.ndarray | None, str | None]:
        try:
            return path, load_audio(path, sample_rate=rate, max_seconds=max_seconds)[0], None
        except AudioError as error:
            return path, None, error.detail
        except Exception as error:  # noqa: BLE001 - a bad file costs its scores, never the run
            return path, None, f"{type(error).__name__}: {error}"

    with ThreadPoolExecutor(max_workers=1) as pool:
        pending = [pool.submit(decode, p) for p in paths[:2]]
        for k in range(len(paths)):
            done = pending.pop(0).result()
            if k + 2 < len(paths):
                pending.append(pool.submit(decode, paths[k + 2]))
            yield done


def score_files(
    runtime: TeacherRuntime, paths: Sequence[Path]
) -> Iterator[tuple[int, np.ndarray, np.ndarray, str | None]]:
    """(index into paths, window starts in seconds, logits [windows, outputs], problem) for every file, its
    windows one window apart; an unreadable file yields no windows and its problem."""
    teacher = runtime.teacher
    window = teacher.window_samples
    for k, (_, samples, problem) in enumerate(decoded(list(paths), teacher.sample_rate)):
        if samples is None:
            yield k, np.zeros(0), np.zeros((0, len(teacher.labels)), dtype=np.float32), problem
            continue
        windows, starts = teacher_windows(samples, window, window)
        yield k, starts / teacher.sample_rate, window_logits(runtime, windows), None


def write_targets(
    runtime: TeacherRuntime,
    class_map: ClassMap,
    data_dir: str | Path,
    files: Sequence[str],
    names: Sequence[str],
    out: str | Path,
    *,
    what: str = "files",
    log: Callable[[str], Any] = print,
) -> dict[str, Any]:
    """The teacher's probabilities of the classes it knows for every window of `files` (relative to
    `data_dir`), written as `names` in a targets file at `out`, with its lineage beside it; returns the
    lineage (windows, files, seconds, the rate in seconds of audio per second)."""
    started = time.perf_counter()
    teacher = runtime.teacher
    known = class_map.known
    columns = np.asarray([class_map.outputs[k] for k in known], dtype=np.int64)
    window = teacher.window_seconds
    problems: dict[str, str] = {}
    audio = 0.0
    n_windows = 0

    def rows() -> Iterator[list[str]]:
        nonlocal audio, n_windows
        paths = [Path(data_dir) / rel for rel in files]
        for k, starts, logits, problem in score_files(runtime, paths):
            if problem:
                problems[files[k]] = problem
                continue
            probs = sigmoid(logits[:, columns])
            audio += float(starts[-1] + window) if len(starts) else 0.0
            n_windows += len(starts)
            for start, row in zip(starts, probs, strict=True):
                yield [names[k], f"{start:g}", f"{start + window:g}", *(f"{p:.4f}" for p in row)]

    def lineage() -> dict[str, Any]:  # once the rows are scored
        seconds = time.perf_counter() - started
        return {
            "teacher": teacher.name,
            "teacher_sha256": teacher.sha256(),
            "windows": n_windows,
            "files": len(files),
            "unreadable": problems,
            "hop_seconds": window,
            "window_seconds": window,
            "threads": runtime.threads,
            "seconds": round(seconds, 1),
            "audio_seconds_per_second": round(audio / max(seconds, 1e-9), 1),
            **class_map.as_record(),
        }

    header = ["filename", "start", "end", *(class_map.classes[k] for k in known)]
    record = write_targets_file(out, header, rows(), lineage, why=f"the teacher's scores of the {what}")
    seconds = record["seconds"]
    log(
        f"teacher {teacher.name}: {n_windows} windows of {len(files) - len(problems)} {what} "
        f"({audio / 3600:.2f} h) in {seconds:.0f} s, {record['audio_seconds_per_second']:g} s of audio per second "
        f"on {runtime.threads} thread(s) -> {out}" + (f"; {len(problems)} unreadable" if problems else "")
    )
    return record


def span_logits(
    runtime: TeacherRuntime, samples: np.ndarray, spans: Sequence[tuple[float, float | None]]
) -> np.ndarray:
    """[spans, outputs]: per span (start, end seconds; end None: to the file's end) the highest logit of the
    teacher's windows that start inside it. `samples` at the teacher's rate."""
    teacher = runtime.teacher
    windows, starts = teacher_windows(samples, teacher.window_samples, teacher.window_samples)
    logits = window_logits(runtime, windows)
    seconds = starts / teacher.sample_rate
    out = np.full((len(spans), logits.shape[1]), -np.inf, dtype=np.float32)
    for k, (start, end) in enumerate(spans):
        inside = (seconds >= start - 1e-6) & (seconds < (np.inf if end is None else end) - 1e-6)
        if not inside.any():  # a span shorter than the teacher's window: the window that overlaps it most
            inside = np.zeros(len(seconds), dtype=bool)
            inside[
                int(np.argmin(np.abs(seconds + teacher.window_seconds / 2 - (start + (end or start)) / 2)))
            ] = True
        out[k] = logits[inside].max(axis=0)
    return out


__all__ = ["decoded", "score_files", "span_logits", "teacher_windows", "write_targets"]
