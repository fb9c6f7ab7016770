"""The notebooks as users run them: papermill from the repo root, jupytext pairing, parameter checking."""

import csv

import jupytext
import nbformat
import pytest
from helpers import ROOT, run_papermill

NOTEBOOKS = ["notebooks/train.ipynb", "notebooks/infer.ipynb"]


@pytest.mark.parametrize("notebook", NOTEBOOKS)
def test_ipynb_and_py_are_in_sync(notebook):
    ipynb = jupytext.read(ROOT / notebook)
    script = jupytext.read(ROOT / notebook.replace(".ipynb", ".py"))
    cells = lambda nb: [(c.cell_type, c.source.strip()) for c in nb.cells]  # noqa: E731
    assert cells(ipynb) == cells(script), "run `make format` (jupytext --sync)"


@pytest.mark.parametrize("notebook", NOTEBOOKS)
def test_first_code_cell_is_the_parameters_cell(notebook):
    nb = nbformat.read(ROOT / notebook, as_version=4)
    first_code = next(c for c in nb.cells if c.cell_type == "code")
    assert "parameters" in first_code.metadata.get("tags", [])
    assert "import" not in first_code.source  # only values: from_params inspects the notebook's globals
    assert not nb.metadata.get("kaggle", {}).get("dockerImageVersionId")


# test_kaggle_run.py's two Save Versions (make test) run both notebooks through papermill on the same data.
@pytest.mark.slow
@pytest.mark.extended
def test_train_then_infer_through_papermill(synthetic_data, tmp_path):
    artifact = tmp_path / "model"
    train = run_papermill("notebooks/train.ipynb", tmp_path / "train.out.ipynb", {
        "data_dir": synthetic_data, "artifact_dir": artifact, "accelerator": "cpu", "model_size": "tiny",
        "epochs": 4, "per_device_batch_size": 8, "base_batch_size": 8, "n_mels": 40, "window_seconds": 0.5,
    })  # fmt: skip
    assert train.returncode == 0, train.stderr[-3000:]
    assert (artifact / "manifest.json").is_file()
    submission = tmp_path / "submission.csv"
    infer = run_papermill("notebooks/infer.ipynb", tmp_path / "infer.out.ipynb", {
        "data_dir": synthetic_data, "artifact_dir": artifact, "submission_path": submission,
    })  # fmt: skip
    assert infer.returncode == 0, infer.stderr[-3000:]
    with open(submission) as handle:
        ids = [row["id"] for row in csv.DictReader(handle)]
    with open(synthetic_data / "sample_submission.csv") as handle:
        assert ids == [row["id"] for row in csv.DictReader(handle)]
    executed = nbformat.read(tmp_path / "train.out.ipynb", as_version=4)
    outputs = "".join(o.get("text", "") for c in executed.cells for o in c.get("outputs", []))
    assert "global batch 8" in outputs and "kept val accuracy" in outputs


@pytest.mark.slow
def test_unknown_parameter_fails_the_run_with_its_name(tmp_path):
    run = run_papermill("notebooks/infer.ipynb", tmp_path / "out.ipynb", {"submision_path": "x.csv"})
    assert run.returncode != 0
    assert "submision_path" in run.stderr and "did you mean 'submission_path'" in run.stderr


@pytest.mark.parametrize(("notebook", "config_name"), [("notebooks/train.ipynb", "TrainConfig"),
                                                        ("notebooks/infer.ipynb", "InferConfig")])  # fmt: skip
def test_the_parameters_cell_lists_every_field_at_its_default_and_parses_cleanly(
    notebook, config_name, caplog
):
    """Issue 14: valid fields missing from the cell made papermill say "Passed unknown parameter", and an "=" in
    a comment made it say "Unable to parse line 13" on every run."""
    import dataclasses
    import logging

    from papermill.translators import PythonTranslator

    import pipeline.core.config

    config_cls = getattr(pipeline.core.config, config_name)
    cell = next(c for c in nbformat.read(ROOT / notebook, as_version=4).cells if c.cell_type == "code")
    with caplog.at_level(logging.WARNING, logger="papermill"):
        parsed = PythonTranslator.inspect(cell)
    assert not caplog.records, [r.getMessage() for r in caplog.records]
    assert sorted(p.name for p in parsed) == sorted(f.name for f in dataclasses.fields(config_cls))
    namespace: dict = {}
    exec(cell.source, namespace)  # noqa: S102 - our own notebook's parameters cell: values only
    defaults = {f.name: getattr(config_cls(), f.name) for f in dataclasses.fields(config_cls)}
    assert {k: v for k, v in namespace.items() if not k.startswith("__")} == defaults
