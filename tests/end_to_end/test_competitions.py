"""Competitions as they are (issue 12): their own training table and folders, a hidden test set with
placeholder rows, and probability submissions -- folders fabricated in those layouts from the synthetic voices."""

from __future__ import annotations

import csv
import shutil
from pathlib import Path

import numpy as np
import pytest
from conftest import TINY_TRAIN
from helpers import run_papermill

from pipeline.core.config import InferConfig
from pipeline.inference.submission import run_inference
from pipeline.tooling.scoring import score_submission


def read_rows(path: Path) -> list[dict[str, str]]:
    with open(path, newline="") as handle:
        return list(csv.DictReader(handle))


def write(path: Path, header: list[str], rows: list[list[str]]) -> None:
    with open(path, "w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(header)
        writer.writerows(rows)


def freesound_layout(
    synthetic: Path, root: Path, sample: str = "probabilities", extra_class: bool = True
) -> Path:
    """Freesound Audio Tagging style: train_curated.csv (fname,labels), audio in train_curated/, test audio in
    test/ with no test.csv; sample_submission.csv is `fname` + one column per class, or placeholder rows."""
    root.mkdir(parents=True)
    (root / "train_curated").mkdir()
    (root / "test").mkdir()
    train = read_rows(synthetic / "train.csv")
    for row in train:
        shutil.copy(synthetic / row["path"], root / "train_curated" / Path(row["path"]).name)
    # Names without their extension, as some competitions write them.
    write(
        root / "train_curated.csv", ["fname", "labels"], [[Path(r["path"]).stem, r["label"]] for r in train]
    )
    solution = {r["id"]: r["label"] for r in read_rows(synthetic / "solution.csv")}
    for row in read_rows(synthetic / "test.csv"):
        shutil.copy(synthetic / row["path"], root / "test" / f"{row['id']}.wav")
    write(root / "solution.csv", ["fname", "label"], [[f"{i}.wav", label] for i, label in solution.items()])
    classes = sorted(set(solution.values())) + (["Unseen_class"] if extra_class else [])
    ids = [f"{i}.wav" for i in solution][::-1]  # not sorted: the sample's own order must be kept
    if sample == "probabilities":
        write(root / "sample_submission.csv", ["fname", *classes], [[i, *["0"] * len(classes)] for i in ids])
    else:  # the public copy of a hidden-test competition: rows that name no file
        write(root / "sample_submission.csv", ["fname", *classes], [[f"placeholder_{k}.wav", *["0"] * len(classes)]
                                                                     for k in range(3)])  # fmt: skip
    return root


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_probability_competition_in_its_own_layout_through_the_notebooks(synthetic_data, tmp_path):
    data = freesound_layout(synthetic_data, tmp_path / "data")
    artifact = tmp_path / "model"
    train = run_papermill("notebooks/train.ipynb", tmp_path / "train.out.ipynb", {
        "data_dir": data, "artifact_dir": artifact, "train_table": "train_curated.csv", "path_column": "fname",
        "label_column": "labels", "audio_dir": "train_curated", **{k: v for k, v in TINY_TRAIN.items()
                                                                      if k not in ("progress", "num_threads")},
        "epochs": 4,
    })  # fmt: skip
    assert train.returncode == 0, train.stderr[-3000:]
    submission = tmp_path / "out"
    submission.mkdir()  # a folder: submission.csv is written inside it
    infer = run_papermill("notebooks/infer.ipynb", tmp_path / "infer.out.ipynb", {
        "data_dir": data, "artifact_dir": artifact, "submission_path": submission, "test_audio_dir": "test",
    })  # fmt: skip
    assert infer.returncode == 0, infer.stderr[-3000:]
    sample = read_rows(data / "sample_submission.csv")
    written = read_rows(submission / "submission.csv")
    with open(submission / "submission.csv") as handle:
        header = handle.readline().strip().split(",")
    assert header == list(sample[0].keys())  # the same header, in the same order
    assert [r["fname"] for r in written] == [r["fname"] for r in sample]  # the same ids in the same order
    for row in written:
        probs = np.array([float(v) for k, v in row.items() if k != "fname"])
        assert probs.min() >= 0 and abs(probs.sum() - 1) < 1e-4 and float(row["Unseen_class"]) == 0.0
    assert "Unseen_class" in infer.stderr and "never saw" in infer.stderr  # said in the notebook's output
    assert (
        score_submission(submission / "submission.csv", data / "solution.csv")[1] >= 0.6
    )  # argmax, tiny model


def test_placeholder_rows_give_one_row_per_test_file(tiny_artifact, synthetic_data, tmp_path, capsys):
    data = freesound_layout(synthetic_data, tmp_path / "data", sample="placeholders", extra_class=False)
    files = sorted(p.name for p in (data / "test").iterdir())
    config = InferConfig(data_dir=str(data), artifact_dir=str(tiny_artifact), test_audio_dir="test",
                         submission_path=str(tmp_path / "sub.csv"), progress=False)  # fmt: skip
    result = run_inference(config)
    written = read_rows(tmp_path / "sub.csv")
    assert [r["fname"] for r in written] == files  # one per file, sorted by id, named like the sample (name)
    assert "one per test file" in result.report["row_rule"] and "placeholders" in capsys.readouterr().out
    assert score_submission(tmp_path / "sub.csv", data / "solution.csv")[1] >= 0.5

    # The same notebook on the public copy, where the test folder is empty or nearly so.
    for keep in (2, 0):
        for extra in sorted((data / "test").iterdir())[keep:]:
            extra.unlink()
        result = run_inference(config)
        assert [r["fname"] for r in read_rows(tmp_path / "sub.csv")] == files[:keep] and result.n_rows == keep


def test_header_classes_and_model_labels_that_do_not_match_are_reported(
    tiny_artifact, synthetic_data, tmp_path
):
    data = freesound_layout(synthetic_data, tmp_path / "data")
    labels = sorted({r["label"] for r in read_rows(synthetic_data / "train.csv")})
    sample = read_rows(data / "sample_submission.csv")
    header = ["fname", *labels[1:], "Unseen_class"]  # the header lacks one label the model knows
    write(data / "sample_submission.csv", header, [[r["fname"], *["0"] * (len(header) - 1)] for r in sample])
    (data / "test" / f"{sample[0]['fname']}").write_text("not audio")  # a broken file: the prior
    result = run_inference(InferConfig(data_dir=str(data), artifact_dir=str(tiny_artifact), test_audio_dir="test",
                                       submission_path=str(tmp_path / "sub.csv"), progress=False))  # fmt: skip
    notes = " ".join(result.report["notes"])
    assert (
        "'Unseen_class'" in notes
        and f"have no column in sample_submission.csv (their share goes to the others): {labels[0]!r}"
        in notes
    )
    rows = read_rows(tmp_path / "sub.csv")
    for row in rows:
        assert abs(sum(float(v) for k, v in row.items() if k != "fname") - 1) < 1e-4
    broken = rows[0]
    assert result.report["fallbacks"][0]["id"] == broken["fname"]
    prior = np.array([float(broken[label]) for label in labels[1:]])
    assert np.allclose(prior, 1 / len(prior), atol=1e-4)  # the synthetic speakers are balanced


def test_a_label_submission_keeps_the_samples_column_names(tiny_artifact, synthetic_data, tmp_path):
    data = tmp_path / "data"
    shutil.copytree(synthetic_data, data)
    sample = read_rows(data / "sample_submission.csv")
    write(data / "sample_submission.csv", ["clip", "speaker"], [[r["id"], "?"] for r in sample])
    run_inference(InferConfig(data_dir=str(data), artifact_dir=str(tiny_artifact),
                              submission_path=str(tmp_path / "sub.csv"), progress=False))  # fmt: skip
    written = read_rows(tmp_path / "sub.csv")
    assert list(written[0].keys()) == ["clip", "speaker"] and [r["clip"] for r in written] == [
        r["id"] for r in sample
    ]
