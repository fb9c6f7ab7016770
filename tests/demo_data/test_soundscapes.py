"""Soundscape competitions (BirdCLEF's layout) through both notebooks: chunk rows, secondary labels, the
public copy, broken soundscapes and a time limit. Folders fabricated from synthetic voices (no download)."""

from __future__ import annotations

import csv
import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import TINY_TRAIN
from helpers import run_papermill

from pipeline.demo_data.soundscapes import make_soundscape_competition, species_from_synthetic

LAYOUT = {"train_table": "train.csv", "path_column": "filename", "label_column": "primary_label",
          "secondary_labels_column": "secondary_labels", "audio_dir": "train_audio"}  # fmt: skip
CHUNKS = {"test_audio_dir": "test_soundscapes", "segment_seconds": 5}
SCAPE_SECONDS = 20


def read_rows(path: Path) -> list[dict[str, str]]:
    with open(path, newline="") as handle:
        return list(csv.DictReader(handle))


def header(path: Path) -> list[str]:
    with open(path, newline="") as handle:
        return next(csv.reader(handle))


@pytest.fixture(scope="module")
def species():
    return species_from_synthetic(3, train_per=10, test_per=6, seed=1)


@pytest.fixture(scope="module")
def hidden(tmp_path_factory, species) -> Path:
    """The scoring rerun's folder: test_soundscapes holds the hidden soundscapes."""
    return make_soundscape_competition(tmp_path_factory.mktemp("hidden") / "data", species, focal_per_class=10,
                                       test_soundscapes=3, train_soundscapes=2, soundscape_seconds=SCAPE_SECONDS)  # fmt: skip


@pytest.fixture(scope="module")
def trained(tmp_path_factory, hidden) -> Path:
    """The artifact the train notebook writes with the layout parameters (tiny settings, with the notebook's
    default ONNX files: an ensemble is what the infer runs below load). Two members where noise_dir's auto
    brings 3 (tests/training/test_pretrained.py checks that rule): each member costs this fixture ~30 s of
    training and export."""
    out = tmp_path_factory.mktemp("model")
    tiny = {k: v for k, v in TINY_TRAIN.items() if k not in ("progress", "num_threads", "export_onnx")}
    run = run_papermill("notebooks/train.ipynb", out / "train.out.ipynb", {
        "data_dir": hidden, "artifact_dir": out / "model", **LAYOUT, **tiny, "noise_dir": "train_soundscapes",
        "mix_probability": 0.5, "ensemble_members": 2,
    })  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    manifest = json.loads((out / "model" / "manifest.json").read_text())
    assert manifest["model_config"]["objective"] == "bce"  # secondary labels: several labels per file
    assert "val_macro_roc_auc" in manifest["provenance"]["validation"]
    assert manifest["model_config"]["members"] == 2 and "embedding_model.onnx" in manifest["files"]
    return out / "model"


def infer(data: Path, model: Path, out: Path, **extra) -> subprocess.CompletedProcess:
    out.mkdir(parents=True, exist_ok=True)
    return run_papermill("notebooks/infer.ipynb", out / "infer.out.ipynb", {
        "data_dir": data, "artifact_dir": model, "submission_path": out / "submission.csv", **CHUNKS, **extra,
    })  # fmt: skip


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_every_chunk_of_every_hidden_soundscape_gets_a_row_in_kaggles_format(hidden, trained, tmp_path):
    run = infer(hidden, trained, tmp_path, expected_test_files=700, expected_file_seconds=60)
    assert run.returncode == 0, run.stderr[-3000:]
    submission = tmp_path / "submission.csv"
    solution = read_rows(hidden / "solution.csv")
    written = read_rows(submission)
    assert header(submission) == header(hidden / "sample_submission.csv")
    # One row per 5 s chunk, file by file (sorted), chunk by chunk in time: <stem>_5, <stem>_10, ...
    stems = sorted(p.stem for p in (hidden / "test_soundscapes").iterdir())
    expected = [f"{stem}_{end}" for stem in stems for end in range(5, SCAPE_SECONDS + 1, 5)]
    assert [r["row_id"] for r in written] == expected and sorted(expected) == sorted(
        r["row_id"] for r in solution
    )
    values = np.array([[float(v) for k, v in r.items() if k != "row_id"] for r in written])
    assert ((values >= 0) & (values <= 1)).all()
    assert not np.allclose(values.sum(1), 1.0)  # independent probabilities, not a softmax over the classes
    report = json.loads((tmp_path / "submission_report.json").read_text())
    assert report["chunks"]["template"] == "{id}_{end}" and report["probabilities"] == "independent"
    # The artifact's ONNX files ran (or lost the race fairly): none failed on the ensemble's embeddings.
    engine = report["engine"]
    assert not any("failed" in line or "differs" in line for line in engine["lines"]), engine["lines"]
    assert "projected for 700 files x 60 s" in run.stderr + run.stdout
    scored = subprocess.run([sys.executable, "-m", "pipeline", "score", "--submission", str(submission),
                             "--solution", str(hidden / "solution.csv")], capture_output=True, text=True)  # fmt: skip
    assert scored.returncode == 0 and scored.stdout.startswith("macro_roc_auc=")
    assert float(scored.stdout.strip().split("=")[1]) > 0.6  # a 3-epoch tiny model on 3 voices


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_the_public_copy_runs_and_writes_a_submission_with_its_header(species, trained, tmp_path):
    public = make_soundscape_competition(tmp_path / "public", species, focal_per_class=10, test_soundscapes=3,
                                         train_soundscapes=2, soundscape_seconds=SCAPE_SECONDS, public=True)  # fmt: skip
    assert (
        not any((public / "test_soundscapes").iterdir())
        and len(read_rows(public / "sample_submission.csv")) == 3
    )
    run = infer(public, trained, tmp_path / "out", expected_test_files=700, expected_file_seconds=60)
    assert run.returncode == 0, run.stderr[-3000:]
    submission = tmp_path / "out" / "submission.csv"
    assert header(submission) == header(public / "sample_submission.csv") and read_rows(submission) == []
    # No test audio: the rate is measured on generated audio, and the hidden set's time projected from it.
    assert (
        "generated audio" in run.stderr + run.stdout and "projected for 700 files" in run.stderr + run.stdout
    )


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_broken_soundscapes_keep_their_rows_and_a_short_time_limit_still_writes_every_row(
    hidden, trained, tmp_path
):
    data = tmp_path / "data"
    shutil.copytree(hidden, data)
    scapes = sorted((data / "test_soundscapes").iterdir())
    (data / "test_soundscapes" / "soundscape_garbage.ogg").write_bytes(b"OggS" + bytes(300))  # no header
    truncated = scapes[0].read_bytes()
    scapes[0].write_bytes(truncated[: len(truncated) // 3])  # its header promises more than it holds
    run = infer(data, trained, tmp_path / "broken")
    assert run.returncode == 0, run.stderr[-3000:]
    written = read_rows(tmp_path / "broken" / "submission.csv")
    garbage = [r for r in written if r["row_id"].startswith("soundscape_garbage_")]
    assert [r["row_id"] for r in garbage] == [
        f"soundscape_garbage_{e}" for e in range(5, SCAPE_SECONDS + 1, 5)
    ]
    report = json.loads((tmp_path / "broken" / "submission_report.json").read_text())
    fallback_ids = {f["id"] for f in report["fallbacks"]}
    assert {r["row_id"] for r in garbage} <= fallback_ids
    assert any("no readable header" in note for note in report["notes"])
    # The prior fills a fallback row: every garbage row equals it.
    assert len({tuple(r.values())[1:] for r in garbage}) == 1
    assert len(written) == 4 * (len(scapes) + 1)

    # A limit the set cannot fit in: prediction stops at once, and every row is still written (the prior).
    run = infer(hidden, trained, tmp_path / "late", time_limit_minutes=0.01)
    assert run.returncode == 0, run.stderr[-3000:]
    late = json.loads((tmp_path / "late" / "submission_report.json").read_text())
    assert "time limit" in (late["stopped"] or "") and late["rows"] == 4 * len(scapes)
    assert len(read_rows(tmp_path / "late" / "submission.csv")) == late["rows"] == len(late["fallbacks"])


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_labelled_soundscapes_validate_and_select_the_kept_epoch(species, tmp_path, capsys):
    from pipeline.core.config import TrainConfig
    from pipeline.training.train import train

    data = make_soundscape_competition(tmp_path / "data", species, focal_per_class=8, test_soundscapes=0,
                                       train_soundscapes=2, labelled_soundscapes=2, soundscape_seconds=SCAPE_SECONDS)  # fmt: skip
    labelled = read_rows(data / "train_soundscapes_labels.csv")
    assert labelled and {"filename", "start", "end", "primary_label"} <= set(labelled[0])
    # One member: the subject is validation and the kept epoch, not the 3 members noise_dir brings (~2/3 of
    # the time).
    result = train(TrainConfig(data_dir=str(data), artifact_dir=str(tmp_path / "model"), **LAYOUT,
                               noise_dir="train_soundscapes", val_soundscapes_table="train_soundscapes_labels.csv",
                               **{**TINY_TRAIN, "epochs": 3, "ensemble_members": 1}))  # fmt: skip
    said = capsys.readouterr().out
    files = len({row["filename"] for row in labelled})  # a soundscape with no call has no labelled row
    assert (
        f"validation soundscapes: {len(labelled)} labelled chunk{'s' if len(labelled) > 1 else ''} of {files}"
        in said
    )
    assert f"{files} validation soundscape{'s' if files > 1 else ''} left out of the background" in said
    values = [epoch["val_soundscape_macro_roc_auc"] for epoch in result.history]
    assert all(0.0 <= v <= 1.0 for v in values)
    best = max(range(3), key=lambda k: (values[k], k))  # the highest, the later one on a tie
    assert result.best_epoch == best + 1 and result.best_val_metric == values[best]


def test_each_hidden_calls_snr_is_recorded_and_the_background_can_be_turned_down(species, tmp_path):
    """solution_snr.csv (benchmarks/soundscape_snr.py's analysis by SNR) and background_db (its clean ceiling)."""
    import soundfile as sf

    options = {"focal_per_class": 2, "test_soundscapes": 2, "train_soundscapes": 1,
               "soundscape_seconds": SCAPE_SECONDS}  # fmt: skip
    noisy = make_soundscape_competition(tmp_path / "noisy", species, **options)
    quiet = make_soundscape_competition(tmp_path / "quiet", species, background_db=-30, **options)
    solution = read_rows(noisy / "solution.csv")
    calls = read_rows(noisy / "solution_snr.csv")
    positives = {(r["row_id"], k) for r in solution for k, v in r.items() if k != "row_id" and v == "1"}
    assert len(calls) == len(positives) and {(c["row_id"], c["label"]) for c in calls} == positives
    assert all(-6 <= float(c["snr_db"]) <= 12 for c in calls)
    quiet_calls = read_rows(quiet / "solution_snr.csv")
    assert [(c["row_id"], c["label"]) for c in quiet_calls] == [(c["row_id"], c["label"]) for c in calls]
    for q, c in zip(quiet_calls, calls, strict=True):
        assert float(q["snr_db"]) == pytest.approx(float(c["snr_db"]) + 30, abs=0.01)
    # A chunk without a call is background alone: 30 dB quieter in the quiet folder.
    empty = next(r["row_id"] for r in solution if not any(v == "1" for k, v in r.items() if k != "row_id"))
    stem, end = empty.rsplit("_", 1)
    levels = []
    for folder in (noisy, quiet):
        audio, rate = sf.read(folder / "test_soundscapes" / f"{stem}.ogg", dtype="float32")
        chunk = audio[(int(end) - 5) * rate : int(end) * rate]
        levels.append(20 * np.log10(np.sqrt(np.mean(chunk**2))))
    assert levels[1] - levels[0] == pytest.approx(-30, abs=1.5)
