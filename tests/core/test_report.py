"""Figures saved into the artifact, and the notebook display helpers (run here outside IPython)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from pipeline.core import report

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"

HISTORY = [
    {"epoch": e, "train_loss": 3.0 / e, "val_accuracy": min(1.0, 0.5 + 0.1 * e), "val_loss": 2.0 / e,
     "lr": 2e-3 * (1 - e / 10), "seconds": 10.0 * e}
    for e in range(1, 7)
]  # fmt: skip


def assert_png(path: Path, min_kb: float) -> None:
    data = Path(path).read_bytes()
    assert data[:8] == PNG_MAGIC, path
    assert len(data) > min_kb * 1024, f"{path}: only {len(data)} bytes"


def test_confusion_counts_match_the_inputs():
    truth = np.array([0, 0, 1, 2, 2, 2, 1])
    pred = np.array([0, 1, 1, 2, 0, 2, 1])
    matrix = report.confusion_counts(truth, pred, 4)
    expected = np.zeros((4, 4), dtype=int)
    for t, p in zip(truth, pred, strict=True):
        expected[t, p] += 1
    np.testing.assert_array_equal(matrix, expected)
    assert matrix.sum() == len(truth) and np.trace(matrix) == 5
    assert matrix[3].sum() == 0 and matrix[:, 3].sum() == 0  # a class without files stays empty
    with pytest.raises(ValueError, match="outside"):
        report.confusion_counts([0, 4], [0, 0], 4)
    with pytest.raises(ValueError, match="length"):
        report.confusion_counts([0, 1], [0], 4)


def test_most_confused_caps_large_matrices_at_the_classes_with_errors():
    matrix = np.diag(np.full(30, 5))
    matrix[3, 17] = 4  # 3 confused for 17
    matrix[25, 8] = 1
    shown = report.most_confused(matrix, limit=4)
    assert len(shown) == 4 and {3, 17, 25, 8} == set(shown)
    assert shown == sorted(shown)
    assert report.most_confused(matrix[:5, :5], limit=20) == list(range(5))


def test_save_training_figures_writes_two_pngs_without_leaking_pyplot_figures(tmp_path):
    import matplotlib.pyplot as plt

    before = plt.get_fignums()
    rng = np.random.default_rng(0)
    truth = rng.integers(0, 6, size=200)
    pred = np.where(rng.random(200) < 0.9, truth, rng.integers(0, 6, size=200))
    labels = ["george", "jackson", "lucas", "nicolas", "theo", "yweweler"]
    figures = report.save_training_figures(HISTORY, truth, pred, labels, tmp_path)
    assert set(figures) == {"training_curves.png", "confusion_matrix.png"}
    for path in figures.values():
        assert path.parent == tmp_path
        assert_png(path, min_kb=15)
    assert plt.get_fignums() == before


def test_many_classes_draw_a_capped_confusion_matrix(tmp_path):
    labels = [f"speaker_with_a_long_name_{i:03d}" for i in range(120)]
    truth = np.repeat(np.arange(120), 3)
    pred = truth.copy()
    pred[::7] = (pred[::7] + 1) % 120
    path = report.plot_confusion(report.confusion_counts(truth, pred, 120), labels, tmp_path / "c.png")
    assert_png(path, min_kb=15)
    from PIL import Image

    with Image.open(path) as image:  # capped: not a 120-row monster
        assert max(image.size) < 2000


def test_no_validation_split_gives_curves_only(tmp_path):
    history = [{k: v for k, v in r.items() if not k.startswith("val")} for r in HISTORY]
    figures = report.save_training_figures(history, np.zeros(0, int), np.zeros(0, int), ["a", "b"], tmp_path)
    assert list(figures) == ["training_curves.png"]


def test_a_drawing_error_never_stops_training(tmp_path, monkeypatch, capsys):
    def broken(*args, **kwargs):
        raise RuntimeError("font cache exploded")

    monkeypatch.setattr(report, "plot_training_curves", broken)
    figures = report.save_training_figures(HISTORY, np.array([0, 1]), np.array([0, 1]), ["a", "b"], tmp_path)
    assert list(figures) == ["confusion_matrix.png"]
    assert "font cache exploded" in capsys.readouterr().out


def train_result(artifact_dir: Path) -> SimpleNamespace:
    return SimpleNamespace(
        artifact_dir=artifact_dir,
        history=HISTORY,
        best_val_accuracy=0.9954,
        best_epoch=6,
        seconds=123.4,
        plan={"per_device_batch": 32, "num_devices": 8, "grad_accum": 1, "global_batch": 256, "base_lr": 2e-3,
              "base_batch": 32, "rule": "sqrt", "lr": 5.66e-3, "warmup_steps": 60},
        topology={"accelerator": "tpu", "num_devices": 8, "device_kind": "TPU v5 lite"},
        compile_count=3,
        schedule={},
        metric="accuracy",
        best_val_metric=0.9954,
        onnx={},
        stopped_early=None,
        skipped_rows=[],
        data_notes=[],
    )  # fmt: skip


def inference_result(fallbacks: int) -> SimpleNamespace:
    rows = [{"id": f"id{i}", "reason": f"id{i}.wav: file is empty (0 bytes)"} for i in range(fallbacks)]
    return SimpleNamespace(
        label_counts={"george": 40, "theo": 35, "lucas": 5},
        device_counts={"cpu": 80 - fallbacks},
        seconds=3.2,
        report={"rows": 80, "fallback_label": "george", "fallbacks": rows, "repaired": [{"id": "x"}]},
    )


def test_show_training_report_outside_ipython_prints_the_summary(tmp_path, capsys):
    report.save_training_figures(HISTORY, np.array([0, 1, 1]), np.array([0, 1, 0]), ["a", "b"], tmp_path)
    assert report.show_training_report(train_result(tmp_path)) is None  # no Out[] echo in a notebook
    text = capsys.readouterr().out
    for expected in ("tpu x8", "256 = 32 per device x 8", "2.0e-03 at batch 32 -> 5.7e-03 (sqrt rule)",
                     "| XLA compilations | 3 |", "0.9954 (epoch 6)", "123 s"):  # fmt: skip
        assert expected in text, expected
    assert "training_curves.png" in text and "confusion_matrix.png" in text


def test_show_inference_report_lists_fallbacks_and_label_counts(capsys):
    report.show_inference_report(inference_result(fallbacks=25), max_fallback_rows=20)
    text = capsys.readouterr().out
    assert "george: 40, theo: 35, lucas: 5" in text
    assert "| id3 | id3.wav: file is empty (0 bytes) |" in text
    assert "id22" not in text and "and 5 more" in text
    assert "| fallbacks | 25 (label 'george') |" in text
    report.show_inference_report(inference_result(fallbacks=0))
    assert "No fallbacks" in capsys.readouterr().out


def test_in_ipython_the_helpers_display_images(tmp_path, monkeypatch):
    from IPython.display import Image, Markdown

    shown = []
    monkeypatch.setattr(report, "in_ipython", lambda: True)
    monkeypatch.setattr("IPython.display.display", lambda *objs, **_: shown.extend(objs))
    report.save_training_figures(HISTORY, np.array([0, 1]), np.array([0, 1]), ["a", "b"], tmp_path)
    report.show_training_report(train_result(tmp_path))
    assert [type(o) for o in shown] == [Markdown, Image, Image]
    shown.clear()
    report.show_inference_report(inference_result(fallbacks=1))
    assert [type(o) for o in shown] == [Image, Markdown]
    assert shown[0].data[:8] == PNG_MAGIC and len(shown[0].data) > 5 * 1024


def test_markdown_table_escapes_pipes():
    table = report.markdown_table([("a|b", "c\nd")], ("k", "v"))
    assert table.splitlines() == ["| k | v |", "|---|---|", "| a\\|b | c d |"]


def test_training_saves_both_figures_into_the_artifact(tiny_artifact):
    import json

    manifest = json.loads((tiny_artifact / "manifest.json").read_text())
    for name in ("training_curves.png", "confusion_matrix.png"):
        assert name in manifest["files"], name  # checksummed with the weights, so it travels with them
        assert_png(tiny_artifact / name, min_kb=10)


def test_labels_no_font_can_draw_are_written_as_codes_without_warnings(tmp_path):
    """Issue 14: CJK labels filled the log with "Glyph ... missing from font" warnings (and empty boxes)."""
    import warnings

    labels = ["话者一", "話者二", "speaker", "ü-umlaut"]
    names, families = report.readable(labels)
    assert names[2:] == ["speaker", "ü-umlaut"] and families
    for original, shown in zip(labels[:2], names[:2], strict=True):
        # Drawn as themselves where an installed font has them, as codes otherwise: never as boxes.
        assert shown == original or shown.startswith("U+")
    truth = np.array([0, 1, 2, 3, 0, 1])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        report.plot_confusion(report.confusion_counts(truth, truth[::-1], 4), labels, tmp_path / "c.png")
        report.label_bar_chart({label: k + 1 for k, label in enumerate(labels)})
        report.plot_confused_pairs(report.confusion_counts(truth, truth[::-1], 4), labels, tmp_path / "p.png")


def test_a_thousand_classes_get_the_most_confused_pairs_not_a_matrix(tmp_path):
    """Issue 11: with >= 1,000 classes the report shows the errors that happen most."""
    labels = [f"bird_{i:04d}" for i in range(1000)]
    truth = np.repeat(np.arange(1000), 2)
    pred = truth.copy()
    pred[:40:2] = 999  # 20 classes confused with the last one once each
    pred[1] = 5  # and one other error
    pairs = report.most_confused_pairs(report.confusion_counts(truth, pred, 1000), limit=3)
    assert pairs == [(0, 5, 1), (0, 999, 1), (1, 999, 1)]
    figures = report.save_training_figures(HISTORY, truth, pred, labels, tmp_path)
    assert set(figures) == {"training_curves.png", "most_confused_pairs.png"}
    assert_png(figures["most_confused_pairs.png"], min_kb=5)


def test_the_summaries_say_which_engine_ran_and_what_training_exported():
    result = inference_result(fallbacks=0)
    result.report["engine"] = {
        "ran": "onnx-int8",
        "precision": "int8",
        "threads": 4,
        "length_buckets": 4,
    }
    rows = dict(report.inference_summary(result))
    assert rows["engine"] == "onnx-int8 (int8), 4 compute thread(s); length buckets 4"
    passed = {"fp32": {"file": "embedding_model.onnx"}, "int8": {"passed": True}, "seconds": 31.5}
    assert report.onnx_summary(passed) == (
        "fp32 and int8 (int8 passed its accuracy rule: the infer stage runs it), written in 31.5 s"
    )
    failed = {**passed, "int8": {"passed": False}}
    assert "auto inference runs torch: it failed its accuracy rule" in report.onnx_summary(failed)
    assert report.onnx_summary({"skipped": "export_onnx=False"}) == "none (export_onnx=False)"
