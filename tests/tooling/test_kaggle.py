"""Kaggle awareness against fake /kaggle trees in both input layouts, the notebook defaults resolved through
it, and the notebooks' offline bootstrap cell run for real in a fresh interpreter."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import nbformat
import pytest
from helpers import ROOT, bootstrap_source, fresh_python, run_bootstrap

from pipeline.core import kaggle
from pipeline.core.config import ConfigError, InferConfig, TrainConfig
from pipeline.safety import analyse
from pipeline.tooling.notebook import resolve_infer_paths
from pipeline.tooling.packaging import build_project_wheel
from pipeline.training.plan import resolve_session

COMPETITION_FILES = ("train.csv", "test.csv", "sample_submission.csv")
ARTIFACT_FILES = ("manifest.json", "model.safetensors")


def touch(folder: Path, *names: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for name in names:
        (folder / name).write_text("x")
    return folder


@pytest.fixture
def fake_kaggle(tmp_path, monkeypatch) -> Path:
    """An empty /kaggle (input/ and working/) with a Batch (Save Version) session pointed at it."""
    root = tmp_path / "kaggle"
    (root / "input").mkdir(parents=True)
    (root / "working").mkdir()
    monkeypatch.setenv("KAGGLE_ROOT", str(root))
    monkeypatch.setenv("KAGGLE_KERNEL_RUN_TYPE", "Batch")
    for name in ("ISTPUVM", "TPU_ACCELERATOR_TYPE", "PJRT_DEVICE", "KAGGLE_IS_COMPETITION_RERUN"):
        monkeypatch.delenv(name, raising=False)
    return root


def test_session_detection_reads_the_run_type():
    assert kaggle.on_kaggle({"KAGGLE_KERNEL_RUN_TYPE": "Interactive"})
    assert kaggle.run_type({"KAGGLE_KERNEL_RUN_TYPE": "Batch"}) == "Batch"
    assert not kaggle.on_kaggle({}) and kaggle.run_type({}) is None
    assert kaggle.is_competition_rerun({"KAGGLE_IS_COMPETITION_RERUN": "1"})
    assert not kaggle.is_competition_rerun({"KAGGLE_KERNEL_RUN_TYPE": "Batch"})


def test_old_flat_layout(fake_kaggle):
    competition = touch(fake_kaggle / "input" / "speaker-id", *COMPETITION_FILES)
    artifact = touch(fake_kaggle / "input" / "speaker-id-ecapa-train" / "model", *ARTIFACT_FILES)
    assert kaggle.find_competition_dir() == competition
    assert kaggle.find_test_dir() == competition
    assert kaggle.find_artifact_dir() == artifact


def test_2026_layout_every_kind_of_input(fake_kaggle):
    inputs = fake_kaggle / "input"
    competition = touch(inputs / "competitions" / "speaker-id", *COMPETITION_FILES)
    # A dataset that happens to hold a copy of the competition files is deeper: the competition wins.
    touch(inputs / "datasets" / "bob" / "speaker-id-copy", *COMPETITION_FILES)
    touch(
        inputs / "datasets" / "alice" / "speaker-id-ecapa-code",
        "kaggle_ecapa_pipeline-0.1.0-py3-none-any.whl",
    )
    assert kaggle.find_competition_dir() == competition

    notebook_output = touch(
        inputs / "notebooks" / "alice" / "speaker-id-ecapa-train" / "model", *ARTIFACT_FILES
    )
    assert kaggle.find_artifact_dir() == notebook_output


def test_artifact_published_as_a_kaggle_model_is_found_six_levels_down(fake_kaggle):
    version = fake_kaggle / "input" / "models" / "alice" / "ecapa" / "pytorch" / "speaker-id" / "3"
    touch(version, *ARTIFACT_FILES)
    assert kaggle.find_artifact_dir() == version
    shutil.rmtree(version)
    nested = touch(version / "model", *ARTIFACT_FILES)  # an artifact folder inside the version
    assert kaggle.find_artifact_dir() == nested


def test_artifact_in_working_is_found_when_no_input_has_one(fake_kaggle):
    working = touch(fake_kaggle / "working" / "model", *ARTIFACT_FILES)
    assert kaggle.find_artifact_dir() == working
    attached = touch(fake_kaggle / "input" / "notebooks" / "a" / "b" / "model", *ARTIFACT_FILES)
    assert kaggle.find_artifact_dir() == attached  # an attached input beats a leftover in working


def test_interrupted_or_replaced_artifacts_in_hidden_folders_are_never_picked(fake_kaggle):
    # An artifact save killed mid-swap leaves `.model.partial-*` (complete but unpublished) and
    # `.model.old-*` (the replaced one); "." sorts before letters, so a plain search would pick them.
    output = fake_kaggle / "input" / "notebooks" / "alice" / "speaker-id-ecapa-train"
    touch(output / ".model.old-1-2", *ARTIFACT_FILES)
    touch(output / ".model.partial-x", *ARTIFACT_FILES)
    assert kaggle.find_artifact_dir() is None
    model = touch(output / "model", *ARTIFACT_FILES)
    assert kaggle.find_artifact_dir() == model


def test_nothing_found_says_where_it_looked(fake_kaggle):
    with pytest.raises(
        ConfigError,
        match=r"data_dir is None and a folder with train.csv.* was not found under .*kaggle/input",
    ):
        resolve_session(TrainConfig())
    touch(fake_kaggle / "input" / "competitions" / "x", *COMPETITION_FILES)
    with pytest.raises(ConfigError, match="artifact_dir is None"):
        resolve_infer_paths(InferConfig())


def test_train_defaults_on_kaggle_working_dir_checkpoints_and_budget(fake_kaggle):
    competition = touch(fake_kaggle / "input" / "competitions" / "speaker-id", *COMPETITION_FILES)
    config = resolve_session(TrainConfig())
    assert config.data_dir == str(competition)
    assert config.artifact_dir == str(fake_kaggle / "working" / "model")
    assert config.checkpoint_dir == str(fake_kaggle / "working" / "checkpoints")
    assert config.cache_dir == str(Path("/tmp") / "ecapa-audio-cache")  # no /kaggle/tmp in this fake tree
    elapsed = kaggle.session_elapsed_seconds() or 0.0
    expected = 12 * 60 - kaggle.SESSION_MARGIN_MINUTES - elapsed / 60
    assert config.time_budget_minutes == pytest.approx(max(expected, 1.0), abs=0.5)
    # An explicit budget is the user's: kept as given.
    assert resolve_session(TrainConfig(time_budget_minutes=30.0)).time_budget_minutes == 30.0


def test_train_defaults_off_kaggle_have_no_budget(monkeypatch, tmp_path):
    monkeypatch.delenv("KAGGLE_KERNEL_RUN_TYPE", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    config = resolve_session(TrainConfig(data_dir=str(tmp_path)))
    assert config.time_budget_minutes is None and config.checkpoint_dir is None
    assert config.artifact_dir == "artifacts/model"
    assert config.cache_dir == str(tmp_path / "xdg" / "kaggle-ecapa-pipeline" / "audio")
    assert resolve_session(config) == config  # resolving twice changes nothing


def test_budget_follows_the_session_limit():
    tpu = {"KAGGLE_KERNEL_RUN_TYPE": "Batch", "ISTPUVM": "1"}
    gpu = {"KAGGLE_KERNEL_RUN_TYPE": "Batch"}
    assert kaggle.default_time_budget_minutes(tpu, elapsed_seconds=600) == 9 * 60 - 20 - 10
    assert kaggle.default_time_budget_minutes(gpu, elapsed_seconds=600) == 12 * 60 - 20 - 10
    assert kaggle.default_time_budget_minutes(gpu, elapsed_seconds=13 * 3600) == 1.0  # still saves something
    assert kaggle.default_time_budget_minutes({}, elapsed_seconds=0) is None
    # torch_xla's CPU stand-in is not a TPU session.
    assert kaggle.session_limit_hours({"PJRT_DEVICE": "CPU"}) == 12


def write_proc(proc: Path, uptime: float, starts: dict[str, float]) -> Path:
    ticks = os.sysconf("SC_CLK_TCK")
    (proc).mkdir(parents=True, exist_ok=True)
    (proc / "uptime").write_text(f"{uptime:.2f} 1234.00\n")
    for pid, started in starts.items():
        (proc / pid).mkdir()
        # The command name may hold spaces and parentheses; field 22 (start time) comes after it.
        fields = ["S", *["0"] * 18, str(int(started * ticks)), "0"]
        (proc / pid / "stat").write_text(f"{pid} (odd (name) x) " + " ".join(fields) + "\n")
    return proc


def test_session_elapsed_from_proc(tmp_path):
    proc = write_proc(tmp_path / "a", uptime=5000.0, starts={"1": 4400.0, "self": 4700.0})
    # PID 1: the container
    assert kaggle.session_elapsed_seconds(proc, env={}) == pytest.approx(600.0, abs=0.1)
    # A PID 1 older than any session (a long-lived host): the kernel's own start is used instead.
    proc = write_proc(tmp_path / "b", uptime=10 * 86400.0, starts={"1": 1.0, "self": 10 * 86400.0 - 90})
    assert kaggle.session_elapsed_seconds(proc, env={}) == pytest.approx(90.0, abs=0.1)
    assert kaggle.session_elapsed_seconds(tmp_path / "missing", env={}) is None
    # A PID 1 younger than a session on a host that only stands in for Kaggle (KAGGLE_ROOT): not the session's.
    starts = {"1": 50000.0 - 11.9 * 3600, "self": 50000.0 - 30}
    proc = write_proc(tmp_path / "c", uptime=50000.0, starts=starts)
    assert kaggle.session_elapsed_seconds(proc, env={}) == pytest.approx(11.9 * 3600, abs=0.1)
    assert kaggle.session_elapsed_seconds(proc, env={"KAGGLE_ROOT": "/tmp/k"}) == pytest.approx(30.0, abs=0.1)


def test_checkpoints_among_the_inputs_seed_working(fake_kaggle, capsys):
    touch(fake_kaggle / "input" / "competitions" / "speaker-id", *COMPETITION_FILES)
    output = fake_kaggle / "input" / "notebooks" / "alice" / "speaker-id-ecapa-train" / "checkpoints"
    for run in ("0123456789abcdef", "fedcba9876543210"):  # two runs' checkpoints: both are kept
        (touch(output / run) / "latest.pt").write_bytes(f"previous version {run}".encode())
    (output / "latest.pt").write_bytes(b"an older layout")
    config = resolve_session(TrainConfig())
    assert "is from an older version of this project" in capsys.readouterr().out
    assert sorted(p.parent.name for p in Path(config.checkpoint_dir).glob("*/latest.pt")) == [
        "0123456789abcdef", "fedcba9876543210"]  # fmt: skip
    seeded = Path(config.checkpoint_dir) / "0123456789abcdef" / "latest.pt"
    assert seeded.read_bytes() == b"previous version 0123456789abcdef"
    # A checkpoint already in working (interactive session with Files persistence) is newer: kept.
    seeded.write_bytes(b"working")
    resolve_session(TrainConfig())
    assert seeded.read_bytes() == b"working"


def test_infer_defaults_on_kaggle(fake_kaggle):
    competition = touch(fake_kaggle / "input" / "competitions" / "speaker-id", *COMPETITION_FILES)
    artifact = touch(fake_kaggle / "input" / "notebooks" / "alice" / "x-train" / "model", *ARTIFACT_FILES)
    config = resolve_infer_paths(InferConfig())
    assert (config.data_dir, config.artifact_dir) == (str(competition), str(artifact))
    assert config.submission_path == str(fake_kaggle / "working" / "submission.csv")


# ------------------------------------------------------------------------------------ bootstrap cell


def test_both_notebooks_carry_the_same_bootstrap():
    assert bootstrap_source("notebooks/train.ipynb") == bootstrap_source("notebooks/infer.ipynb")
    assert "kaggle_ecapa_pipeline-*.whl" in bootstrap_source(
        "notebooks/infer.ipynb"
    )  # packaging.WHEEL_PREFIX


def test_the_checker_reads_the_bootstrap_and_would_catch_an_online_install(tmp_path):
    assert analyse(ROOT / "notebooks" / "infer.ipynb").ok
    nb = nbformat.read(ROOT / "notebooks" / "infer.ipynb", as_version=4)
    cell = next(c for c in nb.cells if c.source.startswith("# Kaggle bootstrap"))
    cell.source = cell.source.replace(
        '"--no-index", ', "", 1
    )  # the project's install; the teacher's keeps it
    nbformat.write(nb, tmp_path / "infer.ipynb")
    findings = analyse(tmp_path / "infer.ipynb", root=ROOT).findings
    assert [f.rule for f in findings] == ["pip-online"]


@pytest.mark.slow
def test_bootstrap_installs_the_project_offline_from_the_code_dataset(tmp_path):
    code = tmp_path / "kaggle" / "input" / "datasets" / "alice" / "speaker-id-ecapa-code"
    code.mkdir(parents=True)
    build_project_wheel(code)
    python = fresh_python(tmp_path, hide=())
    run = run_bootstrap(python, tmp_path / "kaggle", cwd=tmp_path)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert f"from {code}" in run.stdout
    assert f"pipeline from {tmp_path / 'venv'}" in run.stdout  # installed, not borrowed from the repo
    # Importable now: a second run of the cell (Run All again) does nothing.
    again = run_bootstrap(python, tmp_path / "kaggle", cwd=tmp_path)
    assert again.returncode == 0 and "installed" not in again.stdout


@pytest.mark.slow
def test_bootstrap_names_what_the_code_dataset_lacks(tmp_path):
    code = tmp_path / "kaggle" / "input" / "speaker-id-ecapa-code"  # the old flat layout
    code.mkdir(parents=True)
    build_project_wheel(code)
    python = fresh_python(tmp_path, hide=("speechbrain",))  # an image without speechbrain, no wheel for it
    run = run_bootstrap(python, tmp_path / "kaggle", cwd=tmp_path)
    assert run.returncode != 0
    assert f"offline install from {code} failed" in run.stderr
    assert "speechbrain" in run.stderr and "No matching distribution" in run.stderr


def test_bootstrap_without_the_code_dataset_says_so(tmp_path):
    (tmp_path / "kaggle" / "input").mkdir(parents=True)
    python = fresh_python(tmp_path, hide=())
    run = run_bootstrap(python, tmp_path / "kaggle", cwd=tmp_path)
    assert run.returncode != 0 and "attach the code dataset" in run.stderr


def test_a_hidden_test_competition_is_found_by_its_test_folder(fake_kaggle):
    """No test.csv: the submission notebook's folder is the one with sample_submission.csv and test_audio_dir."""
    competition = touch(
        fake_kaggle / "input" / "competitions" / "birdclef", "sample_submission.csv", "train.csv"
    )
    (competition / "test_soundscapes").mkdir()
    assert kaggle.find_test_dir() is None  # the default layout wants test.csv
    assert kaggle.find_test_dir(test_audio_dir="test_soundscapes") == competition
    assert kaggle.find_competition_dir("train.csv") == competition
    config = resolve_infer_paths(InferConfig(test_audio_dir="test_soundscapes", artifact_dir="model"))
    assert config.data_dir == str(competition)
