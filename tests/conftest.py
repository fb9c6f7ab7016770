"""Shared fixtures: a small synthetic competition folder and a tiny trained artifact, built once per session."""

from __future__ import annotations

import atexit
import importlib.util
import os
import shutil
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# Decoded training audio is cached under $XDG_CACHE_HOME when cache_dir is not given (pipeline/training/dataset.py):
# the tests' caches go to a folder of their own, shared by every test of the session and every process it
# starts, never into the user's ~/.cache.
os.environ["XDG_CACHE_HOME"] = tempfile.mkdtemp(prefix="pipeline-tests-cache-")
# ...and removed when the session ends (each left up to 60 MB in /tmp before).
atexit.register(shutil.rmtree, os.environ["XDG_CACHE_HOME"], ignore_errors=True)
FSDD = ROOT.parent / "shared" / "fsdd" / "recordings"

# What needs torch_xla installed (the dev venv and the matrix's TPU legs have it; Kaggle's GPU image and newer
# torch releases do not).
requires_torch_xla = pytest.mark.skipif(
    importlib.util.find_spec("torch_xla") is None, reason="torch_xla is not installed in this environment"
)

# Tiny settings that still train a real ECAPA-TDNN end to end in seconds on 2 cores. No ONNX files (their
# export takes ~20 s): the session artifact below has them, and the tests of the ONNX path use it.
TINY_TRAIN = dict(model_size="tiny", epochs=3, per_device_batch_size=8, base_batch_size=8, n_mels=40,
                  window_seconds=0.5, accelerator="cpu", progress=False, num_threads=2, export_onnx=False,
                  sample_rate=16000)  # fmt: skip


@pytest.fixture(scope="session")
def synthetic_data(tmp_path_factory) -> Path:
    from pipeline.demo_data.synthetic import make_synthetic_competition

    return make_synthetic_competition(
        tmp_path_factory.mktemp("syn") / "data",
        seed=3,
        n_speakers=4,
        train_per_speaker=12,
        test_per_speaker=4,
    )


@pytest.fixture(scope="session")
def synthetic_training_data(synthetic_data):
    """The synthetic folder as training sees it: its audio in the cache, the split made."""
    from pipeline.core.config import TrainConfig
    from pipeline.training.plan import plan_training

    return plan_training(TrainConfig(data_dir=str(synthetic_data), **TINY_TRAIN), log=lambda *_: None)[1]


@pytest.fixture(scope="session")
def tiny_artifact(tmp_path_factory, synthetic_data) -> Path:
    from pipeline.core.config import TrainConfig
    from pipeline.training.train import train

    out = tmp_path_factory.mktemp("art") / "model"
    # The embedding centre on, as the sound-event recipe has it (auto leaves this speech-like table without one):
    # the tests of the centre's path through inference, ONNX and SpeechBrain use this artifact.
    with_onnx = {**TINY_TRAIN, "export_onnx": True, "centre_embeddings": True}
    train(TrainConfig(data_dir=str(synthetic_data), artifact_dir=str(out), **with_onnx))
    return out


@pytest.fixture
def artifact_copy(tiny_artifact, tmp_path) -> Path:
    """A private copy of the session artifact for tests that damage it."""
    target = tmp_path / "artifact"
    shutil.copytree(tiny_artifact, target)
    return target


@pytest.fixture
def fsdd_recordings() -> Path:
    if not FSDD.is_dir() or not any(FSDD.glob("*.wav")):
        pytest.skip(f"FSDD recordings not found at {FSDD} (they live in ../shared beside the repo)")
    return FSDD
