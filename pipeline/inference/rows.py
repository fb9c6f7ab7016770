"""The rows of a submission and the audio each is computed from: a plan made before any audio is decoded.

    file rows   one row per test item, its whole file (`plan_file_rows`)
    chunk rows  one row per `segment_seconds` chunk of every test file (`plan_chunk_rows`; BirdCLEF: 5 s), the
                id written by a template: `{id}_{end}` gives `soundscape_123_5`, `..._10`, ... (`{id}`: the test
                item's id, `{stem}`/`{name}`: its file's stem or name, `{start}`/`{end}`: the chunk's seconds)

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
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from ..core.config import DEFAULT_TEMPLATE
from ..core.progress import plural
from ..core.tables import SampleSubmission, TestItems
from ..core.windows import Span

_NUMBERED = re.compile(r"^(?P<prefix>.+)_(?P<seconds>[0-9]+(?:\.[0-9]+)?)$")


@dataclass
class RowPlan:
    ids: list[str]  # the submission's ids, in its order
    span_of: list[int | None]  # per row: its span (an index into spans), None when no audio stands behind it
    spans: list[Span]
    files: list[str]  # the audio of the spans, relative to the data folder
    seconds: list[float | None]  # each file's duration as its header states it (None: no readable header)
    rule: str  # which rule chose the rows, and why (a sentence for the notebook and the report)
    notes: list[str] = field(default_factory=list)
    missing: dict[int, str] = field(default_factory=dict)  # row -> why it has no span
    chunked: bool = False
    template: str | None = None


def recognise_template(sample_ids: Sequence[str], segment: float) -> tuple[str, str]:
    """The id template sample_submission's ids follow, and why: `<file>_<seconds>` ids are chunk ends unless one
    of them is 0 (then starts). Ids of another shape give the BirdCLEF form, said so."""
    matches = [_NUMBERED.match(i) for i in sample_ids]
    if not sample_ids or not all(matches):
        return DEFAULT_TEMPLATE, (f"{'no' if not sample_ids else 'not every'} sample_submission id has the form "
                                  f"<file>_<seconds>: using BirdCLEF's {DEFAULT_TEMPLATE!r}")  # fmt: skip
    seconds = [float(m["seconds"]) for m in matches if m]
    off_grid = [s for s in seconds if abs(s / segment - round(s / segment)) > 1e-6]
    if off_grid:
        return DEFAULT_TEMPLATE, (f"sample_submission ids end in seconds that are not multiples of "
                                  f"segment_seconds={segment:g} (e.g. {off_grid[0]:g}): using {DEFAULT_TEMPLATE!r}")  # fmt: skip
    if 0.0 in seconds:
        return "{id}_{start}", "sample_submission ids end in chunk starts (one is 0)"
    return DEFAULT_TEMPLATE, "sample_submission ids end in chunk ends (none is 0)"


def chunk_count(seconds: float, segment: float) -> int:
    """Chunks of a file: whole segments, plus a trailing part of at least half a segment (at least one)."""
    return max(1, math.floor(seconds / segment + 0.5))


def seconds_text(value: float) -> str:
    """5.0 -> "5", 2.5 -> "2.5": how ids write seconds."""
    return str(int(round(value))) if abs(value - round(value)) < 1e-9 else f"{value:g}"


def plan_file_rows(sample: SampleSubmission, items: TestItems, where: str) -> RowPlan:
    """One row per test item, each the prediction of its whole file."""
    files = [row.rel_path for row in items.rows]
    spans = [Span(k) for k in range(len(files))]
    planned = {row.id: k for k, row in enumerate(items.rows)}
    plan = _choose(sample, planned, items.source, where, "test file", by_file=sorted(planned))
    plan.spans, plan.files = spans, files
    plan.seconds = [None] * len(files)
    return plan


def plan_chunk_rows(
    sample: SampleSubmission,
    items: TestItems,
    seconds: Sequence[float | None],
    segment: float,
    template: str,
    where: str,
    usual_seconds: float | None = None,
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
    by_file: list[str] = []
    guessed, short, trailing, repeated = [], [], 0, []
    for k in sorted(range(len(items.rows)), key=lambda i: items.rows[i].id):
        row = items.rows[k]
        duration = seconds[k]
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
            row_id = template.format(id=row.id, stem=path.stem, name=path.name, start=seconds_text(start),
                                     end=seconds_text(end))  # fmt: skip
            if row_id in planned:
                repeated.append(row_id)
                continue
            planned[row_id] = len(spans)
            by_file.append(row_id)
            spans.append(Span(k, start, end))
    if guessed:
        notes.append(f"{plural(len(guessed), 'file')} with no readable header get {plural(usual or 1, 'chunk')} "
                     f"({why_usual}): {', '.join(repr(i) for i in guessed[:5])}{' ...' if len(guessed) > 5 else ''}")  # fmt: skip
    if short:
        notes.append(f"{plural(len(short), 'file')} shorter than the set's {plural(usual, 'chunk')} ({why_usual}; "
                     "truncated?) keep all their rows, those past their audio get the prior: "
                     f"{', '.join(repr(i) for i in short[:5])}{' ...' if len(short) > 5 else ''}")  # fmt: skip
    if trailing:
        notes.append(f"{plural(trailing, 'file')} end in less than half a segment past their last chunk: that "
                     "tail has no row (a tail of at least half a segment is a chunk of its own)")  # fmt: skip
    if repeated:
        notes.append(f"{plural(len(repeated), 'chunk id')} repeat an earlier file's (the first is kept): "
                     f"{', '.join(repr(i) for i in repeated[:5])}")  # fmt: skip
    plan = _choose(sample, planned, items.source, where,
                   f"{segment:g}-second chunk", by_file=by_file)  # fmt: skip
    plan.spans, plan.files, plan.seconds = spans, [row.rel_path for row in items.rows], list(seconds)
    plan.notes = notes + plan.notes
    plan.chunked, plan.template = True, template
    return plan


def usual_chunks(
    seconds: Sequence[float | None], segment: float, usual_seconds: float | None
) -> tuple[int | None, str]:
    """The chunk count a file of this set should have, and why: the count at least half of the readable
    headers give; with no readable header, that of `usual_seconds` (the expected length, if the user gave one).
    None when the set has no usual length."""
    counts = Counter(chunk_count(s, segment) for s in seconds if s is not None)
    if counts:
        count, files = counts.most_common(1)[0]
        if files >= 0.5 * sum(counts.values()):
            return count, f"the length {files} of {sum(counts.values())} readable files have"
        return None, "no usual length among the readable files"
    if usual_seconds:
        return chunk_count(
            usual_seconds, segment
        ), f"no readable header; expected_file_seconds={usual_seconds:g}"
    return None, "no readable header and no expected length"


def _choose(
    sample: SampleSubmission, planned: dict[str, int], source: str, where: str, unit: str, by_file: list[str]
) -> RowPlan:
    """The rule both kinds of rows share (see the module docstring). `planned`: id -> span; `by_file`: the
    planned ids in file order (sorted by id), chunks in time."""
    placeholders = [i for i in sample.ids if i not in planned]
    notes = []
    if not placeholders or source == "table":
        rule = (f"rows: the {len(sample.ids)} ids of {sample.path.name}, in its order"
                + (f" ({len(placeholders)} of them not among the test items' {unit}s: fallback rows)"
                   if placeholders else ""))  # fmt: skip
        listed = set(sample.ids)
        unlisted = [i for i in by_file if i not in listed]
        if unlisted:
            notes.append(f"{plural(len(unlisted), unit)} not in {sample.path.name} get no row: "
                         f"{', '.join(repr(i) for i in unlisted[:5])}{' ...' if len(unlisted) > 5 else ''}")  # fmt: skip
        ids = list(sample.ids)
        missing = {
            r: f"id of {sample.path.name} is not in {where}" for r, i in enumerate(ids) if i not in planned
        }
    else:
        rule = (f"rows: one per {unit} ({len(by_file)}), test files sorted by id, because {len(placeholders)} of "
                f"the {len(sample.ids)} ids of {sample.path.name} name no {unit} (placeholders, as in the public "
                "copy of a competition whose test audio appears only in the scoring rerun)")  # fmt: skip
        ids, missing = list(by_file), {}
    span_of = [planned.get(i) for i in ids]
    return RowPlan(ids, span_of, [], [], [], rule, notes, missing)


__all__ = ["RowPlan", "chunk_count", "plan_chunk_rows", "plan_file_rows", "recognise_template"]
