"""What a Kaggler sees: training curves and the confusion matrix (saved in the artifact), shown inline.

Figures are drawn on matplotlib `Figure` objects with the Agg canvas, never through pyplot: nothing is
added to pyplot's global figure list (so nothing to close or leak), no display is needed, and a notebook's
inline backend is left alone. matplotlib is optional (the `notebooks` extra): without it, or if drawing
fails, training still saves its artifact, only without figures.

The display helpers render inline when running in IPython (Jupyter, papermill, Kaggle) and print plain text
otherwise, so scripts and tests can call them too.
"""

from __future__ import annotations

import contextlib
import functools
import io
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

CURVES_FILE = "training_curves.png"
CONFUSION_FILE = "confusion_matrix.png"
PAIRS_FILE = "most_confused_pairs.png"
MAX_CONFUSION_CLASSES = 20  # beyond this a matrix is unreadable: the most confused pairs are drawn instead
MAX_PAIRS = 25
MAX_BAR_LABELS = 30  # predicted-label bar chart: the most frequent labels, the rest summed as "other"


# ------------------------------------------------------------------------------------------ data


def confusion_counts(
    truth: Sequence[int] | np.ndarray, pred: Sequence[int] | np.ndarray, n_classes: int
) -> np.ndarray:
    """[n_classes, n_classes] int matrix: row = true class, column = predicted class."""
    truth = np.asarray(truth, dtype=np.int64).reshape(-1)
    pred = np.asarray(pred, dtype=np.int64).reshape(-1)
    if truth.shape != pred.shape:
        raise ValueError(f"truth and pred differ in length: {truth.size} vs {pred.size}")
    for name, values in (("truth", truth), ("pred", pred)):
        if values.size and (values.min() < 0 or values.max() >= n_classes):
            raise ValueError(f"{name} has class indices outside [0, {n_classes})")
    matrix = np.zeros((n_classes, n_classes), dtype=np.int64)
    np.add.at(matrix, (truth, pred), 1)
    return matrix


def most_confused_pairs(matrix: np.ndarray, limit: int = MAX_PAIRS) -> list[tuple[int, int, int]]:
    """(true class, predicted class, count) of the most frequent errors, most frequent first (ties: class order)."""
    errors = matrix.copy()
    np.fill_diagonal(errors, 0)
    true, pred = np.nonzero(errors)
    order = sorted(zip(true.tolist(), pred.tolist(), strict=True), key=lambda tp: (-errors[tp], tp))
    return [(t, q, int(errors[t, q])) for t, q in order[:limit]]


def most_confused(matrix: np.ndarray, limit: int = MAX_CONFUSION_CLASSES) -> list[int]:
    """Class indices to draw: all of them up to `limit`, else the `limit` classes involved in the most errors
    (as truth or as prediction), in their original order so the diagonal stays a diagonal."""
    errors = matrix.sum(0) + matrix.sum(1) - 2 * np.diag(matrix)
    # Ties (e.g. no errors at all) fall back to the classes with the most validation files.
    support = matrix.sum(1)
    ranked = sorted(range(len(matrix)), key=lambda i: (-errors[i], -support[i], i))
    return sorted(ranked[:limit])


# ------------------------------------------------------------------------------------------ figures


def save_training_figures(
    history: list[dict[str, float]],
    val_truth: np.ndarray,
    val_pred: np.ndarray,
    labels: list[str],
    out_dir: Path,
    best_epoch: int | None = None,
    metric: str = "accuracy",
) -> dict[str, Path]:
    """Write figures into `out_dir`; returns {artifact file name: path} for save_artifact's extra_files.

    Never raises: the figures are a convenience, and losing a finished training run to a plotting error would
    not be. A figure that cannot be drawn is left out with a one-line note.
    """
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    figures: dict[str, Path] = {}
    try:
        import matplotlib  # noqa: F401 - probe only; the drawing functions import what they use
    except ImportError:
        print("figures skipped: matplotlib is not installed (pip install matplotlib)")
        return figures
    jobs = [(CURVES_FILE, lambda path: plot_training_curves(history, path, best_epoch, metric))]
    if len(val_truth):  # else no validation split: nothing to show
        matrix = confusion_counts(val_truth, val_pred, len(labels))
        if len(labels) <= MAX_CONFUSION_CLASSES:
            jobs.append((CONFUSION_FILE, lambda path: plot_confusion(matrix, labels, path)))
        else:  # a 1,000 x 1,000 matrix says nothing: the errors that happen most
            jobs.append((PAIRS_FILE, lambda path: plot_confused_pairs(matrix, labels, path)))
    for name, draw in jobs:
        try:
            draw(out_dir / name)
            figures[name] = out_dir / name
        except Exception as error:  # noqa: BLE001 - see the docstring
            print(f"figure {name} skipped: {type(error).__name__}: {error}")
    return figures


def readable(texts: Sequence[str]) -> tuple[list[str], list[str]]:
    """`texts` as they can be drawn, and the font families to draw them with: the default font, then installed
    fonts that have the characters it lacks (CJK labels, say); a character no installed font has is written as
    its code (U+4E2D) instead of the empty box and the "Glyph missing from font" warning matplotlib gives."""
    from matplotlib import font_manager, rcParams

    default = font_manager.findfont(font_manager.FontProperties(family=rcParams["font.family"]))
    missing = {ord(c) for text in texts for c in text} - _charmap(default)
    families = [font_manager.FontProperties(fname=default).get_name()]
    for entry in font_manager.fontManager.ttflist:
        if not missing:
            break
        covered = missing & _charmap(entry.fname)
        if covered and entry.name not in families:
            families.append(entry.name)
            missing -= covered
    return ["".join(f"U+{ord(c):04X}" if ord(c) in missing else c for c in text) for text in texts], families


@functools.cache
def _charmap(font_file: str) -> frozenset[int]:
    from matplotlib.ft2font import FT2Font

    try:
        return frozenset(FT2Font(font_file).get_charmap())
    except (OSError, RuntimeError):
        return frozenset()


def _fonts(families: list[str]):
    from matplotlib import rc_context

    return rc_context({"font.family": families})


def _new_figure(width: float, height: float, *grid: int):
    """A figure on the Agg canvas and its axes (`grid`: rows, columns; none: one axis)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    figure = Figure(figsize=(width, height), dpi=100, layout="constrained")
    FigureCanvasAgg(figure)
    return figure, figure.subplots(*grid)


def plot_training_curves(
    history: list[dict[str, float]], path: Path, best_epoch: int | None = None, metric: str = "accuracy"
) -> Path:
    """Loss (train and validation), the validation metric and learning rate against epoch, side by side; the
    epoch whose weights were kept (`best_epoch`, else the first best value) is marked."""
    figure, (ax_loss, ax_acc, ax_lr) = _new_figure(12, 3.4, 1, 3)
    epochs = [int(r["epoch"]) for r in history]

    def series(key: str) -> list[float]:
        return [float(r.get(key, math.nan)) for r in history]

    ax_loss.plot(epochs, series("train_loss"), marker="o", label="train")
    if any("val_loss" in r for r in history):
        ax_loss.plot(epochs, series("val_loss"), marker="o", label="validation")
    ax_loss.set(title="Loss", xlabel="epoch")
    ax_loss.legend(fontsize=8)
    key = f"val_{metric}"
    if any(key in r for r in history):
        accuracy = series(key)
        ax_acc.plot(epochs, accuracy, marker="o", color="tab:green")
        best = epochs.index(best_epoch) if best_epoch in epochs else int(np.nanargmax(accuracy))
        ax_acc.annotate(
            f"kept: epoch {epochs[best]}, {accuracy[best]:.4f}",
            (epochs[best], accuracy[best]),
            textcoords="offset points",
            xytext=(0, -14),
            ha="center",
            fontsize=8,
        )
        # Zoom to the data: the interesting part of a good run is 0.98 vs 0.995, not 0 vs 1.
        low = float(np.nanmin(accuracy))
        ax_acc.set_ylim(max(0.0, low - 0.1 * (1.0 - low) - 0.005), 1.0 + 0.05 * (1.0 - low) + 0.002)
    else:
        ax_acc.text(0.5, 0.5, "no validation split", ha="center", va="center", transform=ax_acc.transAxes)
    ax_acc.set(title=f"Validation {metric}", xlabel="epoch")
    ax_lr.plot(epochs, series("lr"), marker="o", color="tab:orange")
    ax_lr.set(title="Learning rate (end of epoch)", xlabel="epoch")
    ax_lr.ticklabel_format(axis="y", style="sci", scilimits=(-2, 2))
    for axis in (ax_loss, ax_acc, ax_lr):
        axis.grid(alpha=0.3)
        if epochs:
            axis.set_xticks(epochs[:: max(1, math.ceil(len(epochs) / 12))])
    figure.savefig(path)
    return Path(path)


def plot_confusion(
    matrix: np.ndarray, labels: Sequence[str], path: Path, limit: int = MAX_CONFUSION_CLASSES
) -> Path:
    """Counts with true labels on rows; above `limit` classes only the most-confused are drawn (titled so)."""
    shown = most_confused(matrix, limit)
    sub = matrix[np.ix_(shown, shown)]
    names, families = readable([_short(str(labels[i])) for i in shown])
    size = max(4.0, 0.4 * len(shown) + 2.0)
    total, correct = int(matrix.sum()), int(np.trace(matrix))
    title = f"Validation confusion: {correct}/{total} correct"
    if len(shown) < matrix.shape[0]:
        title += f"\n{len(shown)} most-confused of {matrix.shape[0]} classes"
    with _fonts(families):
        figure, axis = _new_figure(size + 1.0, size)
        image = axis.imshow(sub, cmap="Blues", interpolation="nearest")
        figure.colorbar(image, ax=axis, shrink=0.8)
        tilted = {"rotation": 60, "ha": "right"} if len(shown) > 6 else {"rotation": 0, "ha": "center"}
        axis.set_xticks(range(len(shown)), names, **tilted)
        axis.set_yticks(range(len(shown)), names)
        axis.set(xlabel="predicted", ylabel="true")
        axis.set_title(title, fontsize=10)
        if len(shown) <= 20:  # numbers in cells stay legible up to about this size
            threshold = sub.max() / 2 if sub.size else 0
            for (i, j), count in np.ndenumerate(sub):
                if count:
                    axis.text(
                        j,
                        i,
                        str(count),
                        ha="center",
                        va="center",
                        fontsize=8,
                        color="white" if count > threshold else "black",
                    )
        figure.savefig(path)
    return Path(path)


def _short(label: str, width: int = 16) -> str:
    """Shorten in the middle: long labels often share a prefix ("speaker_0012") and differ at the end."""
    if len(label) <= width:
        return label
    head = (width - 1) // 2
    return label[:head] + "…" + label[-(width - 1 - head) :]


def plot_confused_pairs(
    matrix: np.ndarray, labels: Sequence[str], path: Path, limit: int = MAX_PAIRS
) -> Path:
    """The most frequent validation errors as bars, "true -> predicted" (for more classes than a matrix shows)."""
    pairs = most_confused_pairs(matrix, limit)
    names, families = readable([f"{_short(str(labels[t]))} -> {_short(str(labels[q]))}" for t, q, _ in pairs])
    total, correct = int(matrix.sum()), int(np.trace(matrix))
    with _fonts(families):
        figure, axis = _new_figure(7, max(1.8, 0.28 * len(pairs) + 1.1))
        counts = [count for _, _, count in pairs]
        axis.barh(names[::-1], counts[::-1], color="tab:red")
        axis.set(
            xlabel="validation files",
            title=f"Most confused pairs (true -> predicted): {correct}/{total} "
            f"correct over {matrix.shape[0]} classes",
        )
        if not pairs:
            axis.text(0.5, 0.5, "no validation errors", ha="center", va="center", transform=axis.transAxes)
        figure.savefig(path)
    return Path(path)


def label_bar_chart(label_counts: Mapping[str, int], limit: int = MAX_BAR_LABELS) -> bytes:
    """PNG bytes of a horizontal bar chart of predicted labels (most frequent first, the rest as 'other')."""
    ranked = sorted(label_counts.items(), key=lambda item: (-item[1], item[0]))
    if len(ranked) > limit:
        rest = sum(count for _, count in ranked[limit - 1 :])
        ranked = ranked[: limit - 1] + [(f"other ({len(label_counts) - limit + 1} labels)", rest)]
    names, families = readable([_short(str(name), 24) for name, _ in ranked][::-1])
    counts = [count for _, count in ranked][::-1]
    buffer = io.BytesIO()
    with _fonts(families):
        figure, axis = _new_figure(6, max(1.6, 0.28 * len(ranked) + 0.9))
        axis.barh(names, counts, color="tab:blue")
        for y, count in enumerate(counts):
            axis.text(count, y, f" {count}", va="center", fontsize=8)
        axis.set(title=f"Most probable labels ({sum(label_counts.values())} rows)", xlabel="rows")
        axis.margins(x=0.12)
        figure.savefig(buffer, format="png")
    return buffer.getvalue()


# ------------------------------------------------------------------------------------------ display


def in_ipython() -> bool:
    """True inside a Jupyter/IPython kernel (papermill and Kaggle included)."""
    try:
        from IPython import get_ipython
    except ImportError:
        return False
    return get_ipython() is not None


def training_summary(result: Any) -> list[tuple[str, str]]:
    """(field, value) rows describing a TrainResult: device, batch/lr scaling, input pipeline, compiles, time,
    accuracy, and what happened to the data on the way."""
    topo, plan = result.topology, result.plan
    acc = "n/a" if result.best_val_metric is None else f"{result.best_val_metric:.4f}"
    warmup = result.schedule.get("warmup_steps", plan.get("warmup_steps"))
    rows = [
        (
            "device",
            f"{topo.get('accelerator', '?')} x{topo.get('num_devices', '?')} ({topo.get('device_kind', '?')})",
        ),
        (
            "global batch",
            f"{plan.get('global_batch')} = {plan.get('per_device_batch')} per device x "
            f"{plan.get('num_devices')} x {plan.get('grad_accum')} accum",
        ),
        (
            "learning rate",
            f"{plan.get('base_lr', 0):.1e} at batch {plan.get('base_batch')} -> {plan.get('lr', 0):.1e} "
            f"({plan.get('rule')} rule), warmup {warmup} steps",
        ),
        ("XLA compilations", "n/a (eager)" if result.compile_count is None else str(result.compile_count)),
        ("time", f"{result.seconds:.0f} s, {len(result.history)} epochs"),
        (f"kept validation {result.metric}", f"{acc} (epoch {result.best_epoch})"),
        ("artifact", str(result.artifact_dir)),
    ]
    if timed := [r for r in result.history if "data_wait_share" in r]:
        waits = [r["data_wait_share"] for r in timed]
        rows.insert(
            4,
            (
                "input pipeline",
                f"{timed[-1].get('samples_per_s', 0):.0f} samples/s in the last epoch; "
                f"steps waited for data {min(waits):.1%}-{max(waits):.1%} of the time",
            ),
        )
    if result.onnx:
        rows.append(("ONNX files", onnx_summary(result.onnx)))
    if result.stopped_early:
        rows.append(("stopped early", str(result.stopped_early)))
    if result.skipped_rows:
        rows.append(("skipped training rows", str(len(result.skipped_rows))))
    return rows + [("data", note) for note in result.data_notes]


def onnx_summary(record: dict[str, Any]) -> str:
    """One line for provenance["onnx"]: which files training wrote and whether int8 passed its rule."""
    if "skipped" in record or "error" in record:
        return f"none ({record.get('skipped') or record.get('error')})"
    int8 = record.get("int8") or {}
    if "error" in int8:
        verdict = f"fp32 only (int8: {int8['error'][:120]})"
    elif int8.get("passed"):
        verdict = "fp32 and int8 (int8 passed its accuracy rule: the infer stage runs it)"
    else:
        why = int8.get("reason") or "it failed its accuracy rule"
        verdict = f"fp32 and int8 (auto inference runs torch: {why})"
    return f"{verdict}, written in {record.get('seconds', '?')} s"


def inference_summary(result: Any) -> list[tuple[str, str]]:
    """(field, value) rows describing an InferenceResult."""
    report = result.report or {}
    devices = ", ".join(f"{d}: {n}" for d, n in result.device_counts.items())
    rows = [
        ("rows", str(report.get("rows", sum(result.label_counts.values())))),
        ("format", str(report.get("format", "label"))),
        ("fallbacks", f"{len(report.get('fallbacks', []))} (label {report.get('fallback_label')!r})"),
        ("repaired files", str(len(report.get("repaired", [])))),
        ("files per device", devices),
        ("time", f"{result.seconds:.1f} s"),
    ]
    if chunks := report.get("chunks"):
        rows.insert(
            2,
            (
                "chunks",
                f"{chunks['segment_seconds']:g} s, ids {chunks['template']!r}, windows pooled by "
                f"{chunks['pooling']}",
            ),
        )
    if engine := report.get("engine"):
        threads = engine.get("threads")
        rows.append(
            (
                "engine",
                f"{engine['ran']} ({engine['precision']})"
                + (f", {threads} compute thread(s)" if threads else "")
                + f"; length buckets {engine.get('length_buckets')}",
            )
        )
    if speed := report.get("speed"):
        projected = speed.get("projected_seconds")
        rows.append(
            (
                "rate",
                f"{speed['audio_seconds_per_second']:.1f} s of audio per second ({speed['measured_on']})"
                + (f"; projected hidden set: {projected / 60:.1f} min" if projected else ""),
            )
        )
    if report.get("stopped"):
        rows.append(("stopped", str(report["stopped"])))
    # Which rows, how the test items were found, classes the header and the model do not share, repeats.
    rows += [("note", note) for note in report.get("notes", [])]
    return rows


def markdown_table(rows: Sequence[Sequence[Any]], header: Sequence[str]) -> str:
    """A GitHub-flavoured markdown table (pipes in cells escaped)."""

    def cell(value: Any) -> str:
        return str(value).replace("|", "\\|").replace("\n", " ")

    lines = ["| " + " | ".join(cell(h) for h in header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in rows]
    return "\n".join(lines)


def show_training_report(result: Any) -> None:
    """Show the run summary and the artifact's figures (inline in a notebook, as text elsewhere).

    Returns None on purpose: as the last line of a cell, a returned value would be echoed again as Out[].
    """
    table = markdown_table(training_summary(result), ("training run", ""))
    figures = [Path(result.artifact_dir) / name for name in (CURVES_FILE, CONFUSION_FILE, PAIRS_FILE)]
    figures = [path for path in figures if path.is_file()]
    if in_ipython():
        from IPython.display import Image, Markdown, display

        display(Markdown(table))
        for path in figures:
            display(Image(filename=str(path)))
    else:
        print(table)
        for path in figures:
            print(f"figure: {path}")


def show_inference_report(result: Any, max_fallback_rows: int = 20) -> None:
    """Show the predicted-label distribution, the fallback report and a run summary (returns None, see
    show_training_report)."""
    report = result.report or {}
    parts = [markdown_table(inference_summary(result), ("inference run", ""))]
    summary = report.get("fallback_summary") or {}
    if fallbacks := report.get("fallbacks", []):
        if causes := summary.get("causes"):
            parts.append(
                "**Fallbacks by cause**:\n\n"
                + markdown_table([(c["cause"], c["rows"]) for c in causes[:10]], ("cause", "rows"))
            )
        rows = [(f["id"], f["reason"]) for f in fallbacks[:max_fallback_rows]]
        more = len(fallbacks) - len(rows)
        parts.append(
            f"**Fallbacks** (got label {report.get('fallback_label')!r}):\n\n"
            + markdown_table(rows, ("id", "reason"))
            + (f"\n\n... and {more} more" if more > 0 else "")
        )
    else:
        parts.append("No fallbacks: every test file got a model prediction.")
    text = "\n\n".join(parts)
    alarm = summary.get("alarm")
    if in_ipython():
        from IPython.display import Image, Markdown, display

        with contextlib.suppress(ImportError):  # no matplotlib: the table below still tells the story
            display(Image(data=label_bar_chart(result.label_counts)))
        display(Markdown(text))
    else:
        counts = sorted(result.label_counts.items(), key=lambda item: (-item[1], item[0]))
        print("predicted labels: " + ", ".join(f"{label}: {n}" for label, n in counts[:MAX_BAR_LABELS]))
        print(text)
    if alarm:  # the last thing the notebook shows, as plain text: papermill's log and Kaggle's both keep it
        print(f"\n{'!' * 80}\n{alarm}\n{'!' * 80}")


__all__ = [
    "confusion_counts",
    "in_ipython",
    "label_bar_chart",
    "markdown_table",
    "most_confused",
    "plot_confusion",
    "plot_training_curves",
    "save_training_figures",
    "show_inference_report",
    "show_training_report",
]
