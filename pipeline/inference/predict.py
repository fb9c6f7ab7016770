"""Prediction: the scores of every span of a row plan, on the runtime's device (`predict`).

This module knows files and spans, nothing of tables or submissions (rows.py plans which span every row
needs; submission.py writes them). How a span becomes scores: decode its file (DataLoader workers,
overlapped with compute) -> mono at the model's rate -> fixed-length windows exactly like the training crops
-> batches of windows from any files -> window embeddings (engines.py) -> pooled per span (mean, max or
mean_max). The windows, batches and pooling are pipeline/core/windows.py's, which training's validation shares.

Feeding whole variable-length files instead of windows cost a measured 40 accuracy points on FSDD digits
(../shared/NOTES.md): the model only knows windows. A file that cannot be read leaves its spans without scores
(`ok` False) and says why. With a deadline, prediction stops before the measured rate says the next file
would overrun it. This module never imports torch_xla.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from operator import itemgetter
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

from ..core.data import AudioError, load_audio
from ..core.model import SpeakerClassifier
from ..core.tables import DataError, resolve_inside
from ..core.windows import (
    TIME_LIMIT_PROBLEM,
    FileWindows,
    SpanPredictions,
    WindowPlan,
    run_windows,
    span_windows,
)
from ..teachers.scoring import decoded, span_logits
from .engines import Embed, make_embedder
from .rows import RowPlan
from .runtime import Runtime

# A whole file (a span with no end) is decoded only up to this: max_windows_per_file windows cover it anyway.
MAX_DECODE_SECONDS = 600.0
# A test set with less audio than this (the public copy's few files, or none) gives no rate worth the name:
# the rate is measured on this much generated audio instead.
RATE_PROBE_SECONDS = 30.0


@dataclass(frozen=True)
class Rate:
    audio_seconds: float  # audio predicted
    seconds: float  # time it took
    measured_on: str  # "the test files", or the generated audio of a probe

    @property
    def per_second(self) -> float:
        return self.audio_seconds / self.seconds if self.seconds > 0 else float("nan")


@dataclass(frozen=True)
class TeacherScores:
    """The pretrained teacher's logits of every span (runtime.TeacherChoice), after the model's own pass."""

    logits: np.ndarray  # [spans, classes of the model] NaN where it lacks the class or did not score the span
    files: int  # files it scored (the time limit may stop it first: those rows keep the model's scores)
    rate: Rate
    stopped: str | None = None


@dataclass(frozen=True)
class Predictions:
    """What prediction found: the spans' scores (with the files the deadline left among the problems), and how
    they were computed."""

    spans: SpanPredictions
    device: str
    files: int  # files the device was given
    engine: str  # what computed the batches
    engine_notes: tuple[str, ...]  # the engine's printed lines, for the report
    threads: int | None  # compute threads (CPU)
    rate: Rate
    teacher: TeacherScores | None = None


def predict(
    model: SpeakerClassifier,
    plan: RowPlan,
    runtime: Runtime,
    deadline: float | None = None,
    log: Callable[[str], None] = print,
) -> Predictions:
    """Every span of `plan`, longest files first, as `runtime` says; stops before `deadline` (time.time())."""
    if runtime.threads:
        torch.set_num_threads(runtime.threads)
    notes: list[str] = []

    def note(line: str) -> None:
        notes.append(line)
        log(line)

    embed = make_embedder(model, runtime, note)
    dataset = SpanWindows(plan, runtime.windows)
    wanted = [i for i in file_order(plan.root, plan.files, plan.seconds) if dataset.spans_of[i]]
    loader = DataLoader(
        dataset,
        batch_size=1,
        sampler=wanted,  # a file with no span to predict is not decoded
        collate_fn=itemgetter(0),  # batches of one file
        num_workers=runtime.num_workers,
        prefetch_factor=8 if runtime.num_workers > 0 else None,
        pin_memory=False,  # the assembled batch is what is pinned (run_windows' staging buffer)
    )
    windows = runtime.windows
    result = run_windows(
        model,
        iter(loader),
        len(plan.spans),
        windows,
        runtime.device,
        progress=runtime.progress,
        embed=embed,
        n_files=len(wanted),
        deadline=deadline,
        centre=runtime.centre,
    )
    if result.stopped:  # the files the deadline left: every one is named in the report
        left = {i: TIME_LIMIT_PROBLEM for i in wanted if i not in result.seen}
        result = replace(result, problems={**result.problems, **left})
    rate = Rate(result.audio_seconds, result.seconds, "the test files")
    if rate.audio_seconds < RATE_PROBE_SECONDS:
        rate = probe_rate(model, embed, runtime, plan.segment)
    engine = str(getattr(embed, "engine", "torch"))  # make_embedder's embedders say when torch took over
    threads = torch.get_num_threads() if runtime.device.type == "cpu" else None
    taught = teacher_scores(plan, runtime, [i for i in wanted if i in result.seen], deadline, note)
    return Predictions(result, str(runtime.device), len(wanted), engine, tuple(notes), threads, rate, taught)


def teacher_scores(
    plan: RowPlan, runtime: Runtime, files: Sequence[int], deadline: float | None, log: Callable[[str], None]
) -> TeacherScores | None:
    """The teacher's logits of the spans of `files` (those the model scored, in its order), each span the
    highest of its windows; it stops where the measured rate says the next file would pass `deadline`: the
    model's scores are the submission's, the teacher's what time allows on top."""
    choice = runtime.teacher
    if choice.teacher is None:
        return None
    teacher = choice.teacher
    model = choice.teacher.runtime(runtime.threads)
    outputs = np.asarray(choice.outputs)
    known = np.flatnonzero(outputs >= 0)
    logits = np.full((len(plan.spans), len(outputs)), np.nan, dtype=np.float32)
    spans_of = SpanWindows(plan, runtime.windows).spans_of  # each file's spans as (span index, start, end)
    started, audio, done, stopped = time.perf_counter(), 0.0, 0, None
    paths = [plan.root / plan.files[i] for i in files]
    for k, (_, samples, _) in enumerate(decoded(paths, teacher.sample_rate, MAX_DECODE_SECONDS)):
        spent = time.perf_counter() - started
        if deadline is not None and done and time.time() + 1.5 * spent / done > deadline:
            stopped = (
                f"teacher: the time limit left {len(files) - done} of {len(files)} files to the model alone"
            )
            log(stopped)
            break
        if samples is not None and len(samples):
            spans = spans_of[files[k]]
            index = [j for j, _, _ in spans]
            scored = span_logits(model, samples, [(start, end) for _, start, end in spans])
            logits[np.ix_(index, known)] = scored[:, outputs[known]]
            audio += len(samples) / teacher.sample_rate
        done += 1
    rate = Rate(audio, time.perf_counter() - started, "the test files")
    if audio < RATE_PROBE_SECONDS:
        probe = 0.05 * np.random.default_rng(0).standard_normal(int(RATE_PROBE_SECONDS * teacher.sample_rate))
        began = time.perf_counter()
        span_logits(model, probe.astype(np.float32), [(0.0, None)])
        rate = Rate(
            RATE_PROBE_SECONDS, time.perf_counter() - began, f"{RATE_PROBE_SECONDS:.0f} s of generated audio"
        )
    log(
        f"teacher {teacher.name}: {done} of {len(files)} files, {rate.per_second:.1f} s of audio per second "
        f"({rate.measured_on})"
    )
    return TeacherScores(logits, done, rate, stopped)


def probe_rate(model: SpeakerClassifier, embed: Embed, runtime: Runtime, segment: float | None) -> Rate:
    """The rate of predicting RATE_PROBE_SECONDS of noise in this run's windows, chunks and engine."""
    windows = runtime.windows
    noise = np.random.default_rng(0).standard_normal(int(RATE_PROBE_SECONDS * windows.sample_rate))
    noise = (0.05 * noise).astype(np.float32)
    if segment:
        spans = [(k, k * segment, (k + 1) * segment) for k in range(int(RATE_PROBE_SECONDS // segment))]
    else:
        spans = [(0, 0.0, None)]
    started = time.perf_counter()
    item = FileWindows(0, *span_windows(noise, spans, windows))
    run_windows(model, iter([item]), len(spans), windows, runtime.device, embed=embed)
    measured_on = f"{RATE_PROBE_SECONDS:.0f} s of generated audio (the test set has less)"
    return Rate(RATE_PROBE_SECONDS, time.perf_counter() - started, measured_on)


class SpanWindows(Dataset):
    """Decodes test files into their spans' windows in DataLoader workers; never raises for a bad file."""

    def __init__(self, rows: RowPlan, plan: WindowPlan) -> None:
        self.root, self.files, self.plan = rows.root, rows.files, plan
        self.spans_of: list[list[tuple[int, float, float | None]]] = [[] for _ in rows.files]
        for index, span in enumerate(rows.spans):  # each file's spans as (span index, start, end)
            self.spans_of[span.file].append((index, span.start, span.end))

    def __len__(self) -> int:
        return len(self.files)

    def __getitem__(self, index: int) -> FileWindows:
        rel_path, spans = self.files[index], self.spans_of[index]
        ends = [end for _, _, end in spans]
        # Decode what the spans need: a whole file up to the cap, chunks up to the last one's end.
        max_seconds = MAX_DECODE_SECONDS if None in ends else max(ends)
        try:
            path = resolve_inside(self.root, rel_path)
            samples, repairs = load_audio(path, sample_rate=self.plan.sample_rate, max_seconds=max_seconds)
        except AudioError as error:  # the report names the file as the test table does
            problem = f"{rel_path}: {error.detail}"
        except DataError as error:
            problem = str(error)
        except Exception as error:  # noqa: BLE001 - a bad file must cost its rows' scores, never the run
            problem = f"{rel_path}: {type(error).__name__}: {error}"
        else:
            wavs, lens, owner, weights = span_windows(samples, spans, self.plan)
            return FileWindows(
                index,
                wavs,
                lens,
                owner,
                weights,
                repairs=repairs,
                seconds=len(samples) / self.plan.sample_rate,
            )
        return FileWindows(index, None, None, None, problem=problem)


def file_order(root: Path, files: Sequence[str], seconds: Sequence[float | None]) -> list[int]:
    """Longest files first (by the duration their headers state, else by size on disk): big windows counts
    early keep batches full, let the progress bar's rate settle, and leave the cheapest files to the end, where
    a deadline may stop prediction."""

    def size(index: int) -> float:
        if seconds[index] is not None:
            return float(seconds[index])
        try:
            return (root / files[index]).stat().st_size / 1e12  # below every duration: unknown ones last
        except (OSError, ValueError):  # missing, or a name the OS refuses (NUL byte): it will fall back
            return -1.0

    return sorted(range(len(files)), key=lambda i: -size(i))
