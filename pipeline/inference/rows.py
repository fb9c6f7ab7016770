"""The rows of a submission and the audio each is computed from: a plan made before any audio is decoded.

`plan_rows(sample, items, config)` returns the whole plan in one call.

    file rows   one row per test item, its whole file (`plan_file_rows`)
    chunk rows  one row per `segment_seconds` chunk of every test file (`plan_chunk_rows`; BirdCLEF: 5 s), the
                id written by a template: `{id}_{end}` gives `soundscape_123_5`, `..._10`, ... (`{id}`: the test
                item's id, `{stem}`/`{name}`: its file's stem or name, `{start}`/`{end}`: the chunk's seconds)

File or chunk rows (`segment_seconds`, default "auto": `choose_segment`): a row per file when
sample_submission's ids are the test items' ids; chunk rows when they follow `<file>_<seconds>` on a regular
grid (BirdCLEF's `soundscape_292520_5`, `_10`, `_15`: 5 s chunks). A number given for segment_seconds, or
None (a row per file), that the ids contradict stops the run with what to set instead: a Kaggle submission
with the wrong rows is rejected after the whole run.

Which rows, in which order (the same rule for both): the sample submission's ids in its order when every one
of them is a planned row -- or when the test items come from a table, the competition's own list, where an
id with no audio gets a fallback row. Otherwise (placeholder ids, as the public copy of a competition whose
test audio appears only in the scoring rerun has) one row per test file sorted by id, and its chunks in time.

A file's chunk count comes from its header: a trailing part of at least half a segment is a chunk of its own
(scored on the audio it has), a shorter one has no row, as competitions' solution files have none. Soundscape
sets have one length (BirdCLEF: 1 min, 4 min in 2024): a file whose header cannot be read, or says it is
shorter than the set's usual length -- truncated audio -- still gets the usual number of rows (the chunk count
at least half of the readable files share; with none readable, that of `usual_seconds`, when given). Rows whose
audio turns out unusable or missing get the prior (pipeline/inference/submission.py); the plan only says where to look.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from itertools import pairwise
from pathlib import Path
from typing import NamedTuple

import numpy as np

from ..core.config import DEFAULT_TEMPLATE, ConfigError, InferConfig
from ..core.data import audio_seconds
from ..core.progress import plural
from ..core.tables import DataError, SampleSubmission, TestItems, resolve_inside
from ..core.windows import Span

# `<file>_<seconds>`; seconds written with a leading zero ("007") number files, they are not seconds.
_NUMBERED = re.compile(r"^(?P<prefix>.+)_(?P<seconds>(?:0|[1-9][0-9]*)(?:\.[0-9]+)?)$")


@dataclass(frozen=True)
class RowPlan:
    """Every row of the submission and the audio behind it."""

    root: Path  # the data folder: `files` are relative to it
    ids: list[str]  # the submission's ids, in its order
    span_of: list[int | None]  # per row: its span (an index into spans), None when no audio stands behind it
    spans: list[Span]
    files: list[str]  # the audio of the spans, relative to `root`
    seconds: list[float | None]  # each file's duration as its header states it (None: no readable header)
    rule: str  # which rule chose the rows, and why (a sentence for the notebook and the report)
    item_ids: list[str] = field(default_factory=list)  # the test item of each file (how the report names it)
    source: str = "table"  # where the test items came from: "table" or "folder"
    notes: list[str] = field(default_factory=list)  # how the items were found, and what the plan noticed
    missing: dict[int, str] = field(default_factory=dict)  # row -> why it has no span
    segment: float | None = None  # chunk rows: the chunk's seconds; None: a row per file
    segment_rule: str | None = None  # why file or chunk rows (segment_seconds auto, or as given)
    template: str | None = None  # chunk rows: the id template

    @property
    def chunked(self) -> bool:
        return self.segment is not None


def plan_rows(sample: SampleSubmission, items: TestItems, config: InferConfig) -> RowPlan:
    """The rows of `config`'s competition: file or chunk rows (choose_segment), with the files' header
    durations (they order the work and count the chunks)."""
    root = Path(config.data_dir)
    where = config.test_table if items.source == "table" else f"the files under {config.test_audio_dir}"
    seconds = [_header_seconds(root, row.rel_path) for row in items.rows]
    segment, why = choose_segment(config.segment_seconds, sample.ids, items)
    if segment is None:
        return plan_file_rows(sample, items, where, root, seconds, segment_rule=why)
    return plan_chunk_rows(
        sample,
        items,
        seconds,
        segment,
        config.row_id_template,
        where,
        root=root,
        usual_seconds=config.expected_file_seconds,
        segment_rule=why,
    )


def _header_seconds(root: Path, rel_path: str) -> float | None:
    try:
        return audio_seconds(resolve_inside(root, rel_path))
    except DataError:
        return None


# ------------------------------------------------------------------------------- file or chunk rows


class ChunkIds(NamedTuple):
    """What sample_submission's ids say about chunk rows (`read_chunk_ids`)."""

    segment: float | None  # the chunk length the ids are spaced by; None: they are not chunk ids
    of_test_files: bool  # their `<file>` part names test items (not placeholders)
    why: str


def read_chunk_ids(sample_ids: Sequence[str], item_ids: Collection[str]) -> ChunkIds:
    """Whether the ids are `<file>_<seconds>` chunk ids, and their chunk length: the common step between one
    file's ids, every id a multiple of it. Ids that are the test items' own are file rows, whatever they look
    like (FSDD's `3_theo_12` is a file)."""
    items = set(item_ids)
    if sample_ids and all(i in items for i in sample_ids):
        return ChunkIds(None, False, "sample_submission's ids are the test items' ids")
    matches = [_NUMBERED.match(i) for i in sample_ids]
    if not sample_ids or not all(matches):
        return ChunkIds(None, False, "sample_submission's ids do not all have the form <file>_<seconds>")
    by_file: dict[str, list[float]] = {}
    for match in matches:
        by_file.setdefault(match["prefix"], []).append(float(match["seconds"]))
    values = [float(match["seconds"]) for match in matches]
    steps = {round(b - a, 6) for seconds in by_file.values() for a, b in pairwise(sorted(seconds))}
    if len(steps) > 1 or 0.0 in steps:
        return ChunkIds(
            None,
            False,
            f"the seconds of one file's sample_submission ids are not evenly spaced "
            f"(steps {sorted(steps)[:4]})",
        )
    of_test_files = any(prefix in items for prefix in by_file)
    if steps:
        segment = steps.pop()
    elif of_test_files and len(set(values)) == 1:
        segment = values[0]  # one id per file, `<file>_<end>` of its only chunk
    else:
        return ChunkIds(None, False, "each file has a single sample_submission id: no chunk length to read")
    if segment <= 0 or any(abs(v / segment - round(v / segment)) > 1e-6 for v in values):
        return ChunkIds(
            None, False, f"sample_submission's seconds are not multiples of their step {segment:g}"
        )
    example = ", ".join(sample_ids[:3])
    whose = "chunks of the test files" if of_test_files else "placeholder chunk ids"
    return ChunkIds(
        segment, of_test_files, f"sample_submission's ids ({example}) are {segment:g}-second {whose}"
    )


def choose_segment(
    segment_seconds: float | str | None, sample_ids: Sequence[str], items: TestItems
) -> tuple[float | None, str]:
    """The chunk length of the rows (None: a row per file) and why. "auto" reads it from the ids; a number or
    None that the ids contradict raises ConfigError with what to set."""
    item_ids = {row.id for row in items.rows}
    ids = read_chunk_ids(sample_ids, item_ids)
    if segment_seconds == "auto":
        if ids.segment is None:
            return None, f"segment_seconds auto: a row per test file ({ids.why})"
        return ids.segment, f"segment_seconds auto: {ids.why}"
    if segment_seconds is None:
        if ids.segment is not None and ids.of_test_files:
            raise ConfigError(
                f"parameter segment_seconds=None asks for a row per test file, but {ids.why}: "
                f"use segment_seconds='auto' or {ids.segment:g}"
            )
        return None, "segment_seconds=None: a row per test file"
    segment = float(segment_seconds)
    if ids.segment is not None and abs(ids.segment - segment) > 1e-6:
        raise ConfigError(
            f"parameter segment_seconds={segment:g}, but {ids.why}: use segment_seconds='auto' "
            f"or {ids.segment:g}"
        )
    if ids.segment is None and sample_ids and set(sample_ids) <= item_ids:  # the ids name the test files
        raise ConfigError(
            f"parameter segment_seconds={segment:g} asks for chunk rows, but {ids.why}: a row per "
            "file. Use segment_seconds='auto' or None"
        )
    return segment, f"segment_seconds={segment:g}"


# ------------------------------------------------------------------------------------- the plans


def recognise_template(sample_ids: Sequence[str], segment: float) -> tuple[str, str]:
    """The id template sample_submission's ids follow, and why: `<file>_<seconds>` ids are chunk ends unless one
    of them is 0 (then starts). Ids of another shape give the BirdCLEF form, said so."""
    matches = [_NUMBERED.match(i) for i in sample_ids]
    if not sample_ids or not all(matches):
        return DEFAULT_TEMPLATE, (
            f"{'no' if not sample_ids else 'not every'} sample_submission id has the form "
            f"<file>_<seconds>: using BirdCLEF's {DEFAULT_TEMPLATE!r}"
        )
    seconds = [float(m["seconds"]) for m in matches]
    if off_grid := [s for s in seconds if abs(s / segment - round(s / segment)) > 1e-6]:
        return DEFAULT_TEMPLATE, (
            f"sample_submission ids end in seconds that are not multiples of "
            f"segment_seconds={segment:g} (e.g. {off_grid[0]:g}): using {DEFAULT_TEMPLATE!r}"
        )
    if 0.0 in seconds:
        return "{id}_{start}", "sample_submission ids end in chunk starts (one is 0)"
    return DEFAULT_TEMPLATE, "sample_submission ids end in chunk ends (none is 0)"


def chunk_count(seconds: float, segment: float) -> int:
    """Chunks of a file: whole segments, plus a trailing part of at least half a segment (at least one)."""
    return max(1, math.floor(seconds / segment + 0.5))


def seconds_text(value: float) -> str:
    """5.0 -> "5", 2.5 -> "2.5": how ids write seconds."""
    return str(int(round(value))) if abs(value - round(value)) < 1e-9 else f"{value:g}"


def plan_file_rows(
    sample: SampleSubmission,
    items: TestItems,
    where: str,
    root: Path = Path("."),
    seconds: Sequence[float | None] | None = None,
    segment_rule: str | None = None,
) -> RowPlan:
    """One row per test item, each the prediction of its whole file."""
    files = [row.rel_path for row in items.rows]
    planned = dict(sorted({row.id: k for k, row in enumerate(items.rows)}.items()))
    rows = _choose(sample, planned, items.source, where, "test file")
    return RowPlan(
        root,
        rows.ids,
        rows.span_of,
        [Span(k) for k in range(len(files))],
        files,
        list(seconds) if seconds is not None else [None] * len(files),
        rows.rule,
        [row.id for row in items.rows],
        items.source,
        [*items.notes, *rows.notes],
        rows.missing,
        segment_rule=segment_rule,
    )


def plan_chunk_rows(
    sample: SampleSubmission,
    items: TestItems,
    seconds: Sequence[float | None],
    segment: float,
    template: str,
    where: str,
    *,
    root: Path = Path("."),
    usual_seconds: float | None = None,
    segment_rule: str | None = None,
) -> RowPlan:
    """A row per `segment`-second chunk of every test file. `seconds`: each item's header duration (None when
    unreadable); `usual_seconds`: the length of the set's files, if known (see the module docstring)."""
    notes = []
    if template == "auto":
        template, why = recognise_template(sample.ids, segment)
        notes.append(f"row ids: {template!r} ({why})")
    usual, why_usual = usual_chunks(seconds, segment, usual_seconds)
    spans: list[Span] = []
    planned: dict[str, int] = {}
    guessed, short, trailing, repeated = [], [], 0, []
    for k in sorted(range(len(items.rows)), key=lambda i: items.rows[i].id):
        row, duration = items.rows[k], seconds[k]
        if duration is None:
            guessed.append(row.id)
            count = usual or 1
        else:
            count = chunk_count(duration, segment)
            trailing += duration - count * segment >= 1e-6
            if usual and count < usual:
                short.append(row.id)
                count = usual
        path = Path(row.rel_path)
        for c in range(count):
            start, end = c * segment, (c + 1) * segment
            row_id = template.format(
                id=row.id, stem=path.stem, name=path.name, start=seconds_text(start), end=seconds_text(end)
            )
            if row_id in planned:
                repeated.append(row_id)
                continue
            planned[row_id] = len(spans)
            spans.append(Span(k, start, end))
    if guessed:
        notes.append(
            f"{plural(len(guessed), 'file')} with no readable header get {plural(usual or 1, 'chunk')} "
            f"({why_usual}): {_some(guessed)}"
        )
    if short:
        notes.append(
            f"{plural(len(short), 'file')} shorter than the set's {plural(usual, 'chunk')} ({why_usual}; "
            f"truncated?) keep all their rows, those past their audio get the prior: {_some(short)}"
        )
    if trailing:
        notes.append(
            f"{plural(trailing, 'file')} end in less than half a segment past their last chunk: that "
            "tail has no row (a tail of at least half a segment is a chunk of its own)"
        )
    if repeated:
        notes.append(
            f"{plural(len(repeated), 'chunk id')} repeat an earlier file's (the first is kept): "
            f"{_some(repeated)}"
        )
    rows = _choose(sample, planned, items.source, where, f"{segment:g}-second chunk")
    return RowPlan(
        root,
        rows.ids,
        rows.span_of,
        spans,
        [row.rel_path for row in items.rows],
        list(seconds),
        rows.rule,
        [row.id for row in items.rows],
        items.source,
        [*items.notes, *notes, *rows.notes],
        rows.missing,
        segment,
        segment_rule,
        template,
    )


def plan_window_rows(root: Path, files: Sequence[str], window: float, hop: float) -> RowPlan:
    """A row per `window`-second stretch of every file (relative to `root`), `hop` seconds apart, from its
    header's duration (a file shorter than a window: one stretch; no readable header: none): what a teacher
    scores for self-training's targets (inference/targets.py). Rows are named `<file index>@<start>`."""
    seconds = [_header_seconds(root, rel) for rel in files]
    spans = [
        Span(k, float(start), float(start) + window)
        for k, duration in enumerate(seconds)
        if duration
        for start in np.arange(0.0, max(duration - window, 0.0) + 1e-6, hop)
    ]
    ids = [f"{span.file}@{span.start:g}" for span in spans]
    unread = [files[k] for k, duration in enumerate(seconds) if not duration]
    notes = (
        [f"{plural(len(unread), 'file')} with no readable header have no window: {_some(unread)}"]
        if unread
        else []
    )
    return RowPlan(
        root,
        ids,
        list(range(len(spans))),
        spans,
        list(files),
        seconds,
        f"rows: {window:g}-second windows, {hop:g} s apart, of {plural(len(files), 'file')}",
        notes=notes,
        segment=window,
    )


def usual_chunks(
    seconds: Sequence[float | None], segment: float, usual_seconds: float | None
) -> tuple[int | None, str]:
    """The chunk count a file of this set should have, and why: the count at least half of the readable
    headers give; with no readable header, that of `usual_seconds` (the expected length, if the user gave one).
    None when the set has no usual length."""
    if counts := Counter(chunk_count(s, segment) for s in seconds if s is not None):
        count, files = counts.most_common(1)[0]
        if files >= 0.5 * sum(counts.values()):
            return count, f"the length {files} of {sum(counts.values())} readable files have"
        return None, "no usual length among the readable files"
    if usual_seconds:
        why = f"no readable header; expected_file_seconds={usual_seconds:g}"
        return chunk_count(usual_seconds, segment), why
    return None, "no readable header and no expected length"


class _Rows(NamedTuple):
    ids: list[str]
    span_of: list[int | None]
    rule: str
    notes: list[str]
    missing: dict[int, str]


def _choose(sample: SampleSubmission, planned: dict[str, int], source: str, where: str, unit: str) -> _Rows:
    """The rule both kinds of rows share (see the module docstring). `planned`: id -> span, in file order
    (sorted by id), chunks in time."""
    placeholders = [i for i in sample.ids if i not in planned]
    notes = []
    if not placeholders or source == "table":
        rule = f"rows: the {len(sample.ids)} ids of {sample.path.name}, in its order" + (
            f" ({len(placeholders)} of them not among the test items' {unit}s: fallback rows)"
            if placeholders
            else ""
        )
        listed = set(sample.ids)
        if unlisted := [i for i in planned if i not in listed]:
            notes.append(
                f"{plural(len(unlisted), unit)} not in {sample.path.name} get no row: {_some(unlisted)}"
            )
        ids = list(sample.ids)
        missing = {
            r: f"id of {sample.path.name} is not in {where}" for r, i in enumerate(ids) if i not in planned
        }
    else:
        rule = (
            f"rows: one per {unit} ({len(planned)}), test files sorted by id, because {len(placeholders)} of "
            f"the {len(sample.ids)} ids of {sample.path.name} name no {unit} (placeholders, as in the public "
            "copy of a competition whose test audio appears only in the scoring rerun)"
        )
        ids, missing = list(planned), {}
    return _Rows(ids, [planned.get(i) for i in ids], rule, notes, missing)


def _some(ids: Sequence[str]) -> str:
    return f"{', '.join(repr(i) for i in ids[:5])}{' ...' if len(ids) > 5 else ''}"


__all__ = [
    "RowPlan",
    "chunk_count",
    "choose_segment",
    "plan_chunk_rows",
    "plan_file_rows",
    "plan_rows",
    "plan_window_rows",
]
