"""Surviving session limits for real: SIGKILL a training process mid-run, rerun it, and it resumes; a tiny
time budget stops early with a valid artifact."""

from __future__ import annotations

import dataclasses
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from conftest import TINY_TRAIN
from helpers import ROOT, venv_env

from pipeline.core.artifact import load_artifact
from pipeline.core.config import TrainConfig
from pipeline.training.train import train

EPOCHS = 8  # 5 steps per epoch on the synthetic set: 40 steps, long enough to kill in the middle
INTERVAL_MINUTES = 0.002  # 0.12 s: a checkpoint after (nearly) every step
KILL_AFTER_STEP = 12  # kill once a checkpoint past the second epoch is on disk


def training_command(data: Path, artifact: Path, **overrides) -> list[str]:
    params = {**TINY_TRAIN, "epochs": EPOCHS, "checkpoint_every_minutes": INTERVAL_MINUTES, **overrides}
    code = (
        "from pipeline.core.config import TrainConfig\n"
        "from pipeline.training.train import train\n"
        f"train(TrainConfig(data_dir={str(data)!r}, artifact_dir={str(artifact)!r}, **{params!r}))\n"
    )
    return [sys.executable, "-c", code]


def checkpoint_of(checkpoint_dir: Path) -> Path | None:
    """The one run's checkpoint in `checkpoint_dir` (each run keeps it in a folder named by its fingerprint)."""
    found = sorted(checkpoint_dir.glob("*/latest.pt"))
    assert len(found) <= 1, found
    return found[0] if found else None


def read_checkpoint(path: Path | None) -> dict | None:
    if path is None:
        return None
    try:  # written to a temporary name and renamed: whatever is at `path` is complete
        return torch.load(path, map_location="cpu", weights_only=True)
    except (FileNotFoundError, EOFError, RuntimeError):
        return None


@pytest.mark.slow
def test_sigkill_mid_run_then_rerun_resumes_and_finishes(synthetic_data, tmp_path):
    artifact = tmp_path / "model"
    checkpoints = tmp_path / "model.checkpoints"
    command = training_command(synthetic_data, artifact, num_workers=None)  # auto: with its loader process
    log = (tmp_path / "first.log").open("w")
    first = subprocess.Popen(command, cwd=ROOT, env=venv_env(), stdout=log, stderr=subprocess.STDOUT,
                             start_new_session=True)  # fmt: skip
    deadline = time.monotonic() + 300
    checkpoint = None
    positions_seen = set()  # (epoch, step in epoch) of every checkpoint observed while polling
    try:
        while time.monotonic() < deadline and first.poll() is None:
            checkpoint = read_checkpoint(checkpoint_of(checkpoints))
            if checkpoint:
                positions_seen.add((checkpoint["epoch"], checkpoint["step_in_epoch"]))
            if checkpoint and checkpoint["global_step"] >= KILL_AFTER_STEP:
                break
            time.sleep(0.05)
        assert first.poll() is None, "training finished before it could be killed: give it more epochs"
        assert checkpoint and checkpoint["global_step"] >= KILL_AFTER_STEP, "no checkpoint within 300 s"
        os.killpg(first.pid, signal.SIGKILL)  # the whole group we started: nothing gets to clean up
        killed_at = time.time()
        first.wait(timeout=30)
    finally:
        if first.poll() is None:
            os.killpg(first.pid, signal.SIGKILL)
            first.wait()
        log.close()
    assert first.returncode == -signal.SIGKILL
    assert not (artifact / "manifest.json").exists(), "a killed run must not leave a valid-looking artifact"

    latest = checkpoint_of(checkpoints)
    on_disk = read_checkpoint(latest)  # what the rerun will find: possibly newer than the one we saw
    assert on_disk["global_step"] >= checkpoint["global_step"]
    lost_seconds = killed_at - on_disk["saved_at"]
    print(f"killed at global step >= {on_disk['global_step']} (epoch {on_disk['epoch'] + 1}, step "
          f"{on_disk['step_in_epoch']}); checkpoint {lost_seconds:.2f} s old at the kill")  # fmt: skip
    # Checkpoints are written inside epochs, on the clock, not only at epoch ends...
    assert any(step > 0 for _, step in positions_seen), positions_seen
    # ...so at most one checkpoint interval was lost, plus the step (or epoch-end validation) in flight.
    assert lost_seconds < INTERVAL_MINUTES * 60 + 3

    started = time.monotonic()
    second = subprocess.run(command, cwd=ROOT, env=venv_env(), capture_output=True, text=True, timeout=600)
    print(f"rerun took {time.monotonic() - started:.1f} s")
    assert second.returncode == 0, second.stdout[-3000:] + second.stderr[-3000:]
    where = f"epoch {on_disk['epoch'] + 1}, step {on_disk['step_in_epoch']} (global step {on_disk['global_step']})"
    assert f"resuming from checkpoint {latest}: {where}" in second.stdout
    # The rerun continues: it never prints the epochs the killed run finished.
    reported = [
        int(line.split()[1].split("/")[0]) for line in second.stdout.splitlines() if line.startswith("epoch ")
    ]
    assert reported and reported[0] == len(on_disk["history"]) + 1 > 1
    assert reported == list(range(reported[0], EPOCHS + 1))

    loaded = load_artifact(artifact)
    provenance = loaded.manifest["provenance"]
    assert [int(record["epoch"]) for record in provenance["history"]] == list(range(1, EPOCHS + 1))
    assert provenance["resumed_from"] and provenance["stopped_early"] is None
    assert not checkpoints.exists(), "checkpoints are dropped once the artifact is saved"

    # Exact, not just "continued": the same data order, crops and optimizer state as a run never killed.
    params = {**TINY_TRAIN, "epochs": EPOCHS, "checkpoint_every_minutes": INTERVAL_MINUTES}
    straight = train(
        TrainConfig(data_dir=str(synthetic_data), artifact_dir=str(tmp_path / "straight"), **params)
    )
    # Tensors, not file bytes: safetensors writes its header metadata in a per-process hash order.
    resumed_weights, straight_weights = (
        loaded.model.state_dict(),
        load_artifact(tmp_path / "straight").model.state_dict(),
    )
    assert all(torch.equal(resumed_weights[k], straight_weights[k]) for k in straight_weights)
    assert [r["val_loss"] for r in provenance["history"]] == [r["val_loss"] for r in straight.history]


def test_tiny_time_budget_stops_early_with_a_valid_artifact_and_a_rerun_continues(synthetic_data, tmp_path):
    artifact = tmp_path / "model"
    checkpoints = tmp_path / "model.checkpoints"
    # 0.6 s is less than the 30 s kept back for validation and saving: it stops after the first step.
    config = TrainConfig(data_dir=str(synthetic_data), artifact_dir=str(artifact),
                         **{**TINY_TRAIN, "epochs": 4, "time_budget_minutes": 0.01})  # fmt: skip
    result = train(config)
    assert result.stopped_early and "time budget" in result.stopped_early
    provenance = load_artifact(artifact).manifest["provenance"]
    assert provenance["stopped_early"] == result.stopped_early
    assert provenance["epochs_run"] == 1 and provenance["epochs_planned"] == 4
    # The position is kept for the next session (the next Save Version, or the same command again).
    latest = checkpoint_of(checkpoints)
    kept = read_checkpoint(latest)
    assert (kept["epoch"], kept["step_in_epoch"], kept["global_step"]) == (0, 1, 1)

    again = train(config)
    assert again.resumed_from == "checkpoint at epoch 1, step 1 (global step 1)"
    assert read_checkpoint(latest)["global_step"] == 2  # progress accumulates across budget-limited runs
    assert load_artifact(artifact).manifest["provenance"]["resumed_from"] == again.resumed_from


def test_a_rerun_with_other_parameters_keeps_the_stopped_runs_checkpoint(synthetic_data, tmp_path, capsys):
    """Issue 14: a mistyped parameter on the rerun must not discard the stopped run's progress."""
    checkpoints = tmp_path / "model.checkpoints"
    stopped = TrainConfig(data_dir=str(synthetic_data), artifact_dir=str(tmp_path / "model"),
                          **{**TINY_TRAIN, "epochs": 4, "time_budget_minutes": 0.01})  # fmt: skip
    train(stopped)
    first = checkpoint_of(checkpoints)
    kept = first.read_bytes()
    capsys.readouterr()

    other = dataclasses.replace(stopped, n_mels=32, epochs=1, time_budget_minutes=None)  # finishes
    assert train(other).stopped_early is None
    log = capsys.readouterr().out
    assert "other parameters or data, left untouched" in log and str(first) in log
    assert first.read_bytes() == kept, "the stopped run's checkpoint must survive another run's finish"
    assert sorted(checkpoints.glob("*/latest.pt")) == [first]  # the finished run removed only its own

    again = train(stopped)  # the first run's parameters again: it continues where it stopped
    assert again.resumed_from == "checkpoint at epoch 1, step 1 (global step 1)"


def test_a_checkpoint_follows_the_data_not_its_mount_point(synthetic_data, tmp_path):
    """Kaggle mounts the same competition under /kaggle/input/<slug> or /kaggle/input/competitions/<slug>:
    the next version must still resume. Other rows or other parameters must not."""
    import shutil

    from pipeline.devices.probe import detect_topology
    from pipeline.training.plan import plan_training
    from pipeline.training.provenance import run_fingerprint

    def data(folder):
        return plan_training(TrainConfig(data_dir=str(folder), **TINY_TRAIN), log=lambda *_: None)[1]

    moved = tmp_path / "competitions" / "speaker-id"
    shutil.copytree(synthetic_data, moved)
    topology = detect_topology("cpu")
    config = TrainConfig(data_dir=str(synthetic_data), artifact_dir="a", **TINY_TRAIN)
    here = run_fingerprint(config, data(synthetic_data), topology)
    there = run_fingerprint(TrainConfig(data_dir=str(moved), artifact_dir="b", cache_dir="elsewhere", **TINY_TRAIN),
                            data(moved), topology)  # fmt: skip
    assert here == there
    assert run_fingerprint(TrainConfig(data_dir=str(moved), artifact_dir="b", **{**TINY_TRAIN, "epochs": 9}),
                           data(moved), topology) != here  # fmt: skip
    with open(moved / "train.csv") as handle:
        lines = handle.readlines()
    (moved / "train.csv").write_text("".join(lines[:-1]))  # one row fewer: another run
    assert run_fingerprint(config, data(moved), topology) != here
