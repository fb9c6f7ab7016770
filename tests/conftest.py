"""Shared fixtures: a small synthetic competition folder and a tiny trained artifact, built once per session."""

from __future__ import annotations

import atexit
import importlib.util
import os
import shutil
import tempfile
from pathlib import Path

import pytest

# As `make test` runs the suite (Makefile: PYTEST), also for a plain `pytest -n 2`: OpenMP's idle threads sleep
# instead of spinning on the cores the other worker and the notebook kernels need. Set before anything imports
# torch in this process, and inherited by every process the tests start. Without it, `pytest -n 2` on
# tests/demo_data/test_soundscapes.py timed out training its fixture after 600 s in both workers; with it the
# module passed in 63 s (benchmarks/raw/soundscape_module_n2_{spinning,passive}.log).
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
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
# export takes ~20 s): the session artifact below has them, and the tests of the ONNX path use it. Crops made
# in the training process (num_workers 0): auto's loader process costs a tiny run ~5 s of CPU starting Python
# and torch (train() of a tiny table: 15 s against 19-21 s here), 10 s for two DDP ranks. The loader processes
# are guarded where they are the subject: test_batches, the SIGKILL resume, the DDP notebook and the notebook
# runs, which keep auto.
TINY_TRAIN = dict(model_size="tiny", epochs=3, per_device_batch_size=8, base_batch_size=8, n_mels=40,
                  window_seconds=0.5, accelerator="cpu", progress=False, num_threads=2, export_onnx=False,
                  sample_rate=16000, num_workers=0)  # fmt: skip


def built_once(tmp_path_factory, worker_id: str, name: str, build) -> Path:
    """`build(folder)`'s folder, built by the first pytest-xdist worker that asks and reused by the others (a
    session fixture is otherwise built once per worker: the tiny artifact took ~40 s of each worker's time).
    Tests only read these folders; the ones that damage them take a copy (artifact_copy)."""
    if worker_id == "master":  # one process: pytest's own temporary folder of this session
        return build(tmp_path_factory.mktemp(name))
    from filelock import FileLock

    shared = tmp_path_factory.getbasetemp().parent  # this session's folder, above each worker's own
    folder, done = shared / name, shared / f"{name}.done"
    with FileLock(str(shared / f"{name}.lock")):
        if not done.exists():
            shutil.rmtree(folder, ignore_errors=True)  # a worker that failed while building left it
            folder.mkdir()
            done.write_text(str(build(folder)))
    return Path(done.read_text())


@pytest.fixture(scope="session")
def synthetic_data(tmp_path_factory, worker_id) -> Path:
    from pipeline.demo_data.synthetic import make_synthetic_competition

    def build(folder: Path) -> Path:
        return make_synthetic_competition(
            folder / "data", seed=3, n_speakers=4, train_per_speaker=12, test_per_speaker=4
        )

    return built_once(tmp_path_factory, worker_id, "syn", build)


@pytest.fixture(scope="session")
def synthetic_training_data(synthetic_data):
    """The synthetic folder as training sees it: its audio in the cache, the split made."""
    from pipeline.core.config import TrainConfig
    from pipeline.training.plan import plan_training

    return plan_training(TrainConfig(data_dir=str(synthetic_data), **TINY_TRAIN), log=lambda *_: None)[1]


@pytest.fixture(scope="session")
def tiny_artifact(tmp_path_factory, worker_id, synthetic_data) -> Path:
    from pipeline.core.config import TrainConfig
    from pipeline.training.train import train

    # The embedding centre on, as the sound-event recipe has it (auto leaves this speech-like table without one):
    # the tests of the centre's path through inference, ONNX and SpeechBrain use this artifact.
    with_onnx = {**TINY_TRAIN, "export_onnx": True, "centre_embeddings": True}

    def build(folder: Path) -> Path:
        train(TrainConfig(data_dir=str(synthetic_data), artifact_dir=str(folder / "model"), **with_onnx))
        return folder / "model"

    return built_once(tmp_path_factory, worker_id, "art", build)


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
