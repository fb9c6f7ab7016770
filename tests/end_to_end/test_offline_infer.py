"""Submission safety at run time: the infer notebook, run through papermill in a kernel with the network and
torch_xla taken away (as in a Kaggle code-competition rerun on the GPU image), on a test set salted with
broken files, still writes a row for every id and reports every fallback.

The guard is a `sitecustomize.py` put first on PYTHONPATH, so it is active from interpreter start in every
process of the run: papermill, the kernel, spawned inference workers and DataLoader workers. It
- refuses outgoing connections and name lookups except loopback and AF_UNIX (papermill talks to the kernel
  over local ZMQ sockets, which libzmq opens in C, untouched by Python's socket module);
- makes torch_xla absent: `import torch_xla` raises ModuleNotFoundError and `importlib.util.find_spec`
  returns None (a `None` entry in sys.modules), with a meta-path finder as a backstop;
- writes a line to a log file when it loads and whenever it blocks something, so the test can prove the
  kernel ran under it.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest
import soundfile as sf
from conftest import requires_torch_xla
from helpers import read_rows, run_papermill, venv_env
from offline_guard import GUARD

CONTROL = r"""
import importlib.util, socket, urllib.request, urllib.error
try:
    import torch_xla
    print("TORCH_XLA IMPORTED")
except ModuleNotFoundError as error:
    print("torch_xla:", error)
assert importlib.util.find_spec("torch_xla") is None
for attempt in (lambda: urllib.request.urlopen("http://example.com", timeout=5),
                lambda: socket.create_connection(("93.184.215.14", 80), timeout=5),
                lambda: socket.socket().connect(("8.8.8.8", 53)),
                lambda: socket.getaddrinfo("example.com", 443)):
    try:
        attempt()
        print("NETWORK REACHED")
    except (OSError, urllib.error.URLError) as error:
        assert "blocked by the offline guard" in str(error), error
server = socket.socket()
server.bind(("127.0.0.1", 0))
server.listen(1)
client = socket.create_connection(server.getsockname(), timeout=5)  # loopback still works
client.close()
server.close()
print("CONTROL OK")
"""


@pytest.fixture
def guarded_env(tmp_path):
    guard = tmp_path / "guard"
    guard.mkdir()
    (guard / "sitecustomize.py").write_text(GUARD)
    log = tmp_path / "guard.log"
    pythonpath = os.pathsep.join(p for p in (str(guard), os.environ.get("PYTHONPATH", "")) if p)
    env = venv_env(PYTHONPATH=pythonpath, OFFLINE_GUARD_LOG=str(log), HF_HUB_OFFLINE="1")
    return env, log


def test_the_guard_blocks_network_and_torch_xla_but_not_loopback(guarded_env):
    env, log = guarded_env
    run = subprocess.run([sys.executable, "-c", CONTROL], capture_output=True, text=True, env=env, timeout=60)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "CONTROL OK" in run.stdout and "NETWORK REACHED" not in run.stdout
    assert "TORCH_XLA IMPORTED" not in run.stdout
    assert "blocked connect" in log.read_text() and "blocked getaddrinfo" in log.read_text()


@requires_torch_xla
def test_torch_xla_is_installed_here_but_never_imported_by_the_submission_path():
    """torch_xla is in this venv (the TPU path uses it), so its absence from sys.modules means something."""
    code = ("import importlib.util, sys; assert importlib.util.find_spec('torch_xla') is not None, 'not installed'; "
            "import pipeline.core.config, pipeline.tooling.notebook, pipeline.inference.submission, pipeline.inference.predict; "
            "print('torch_xla' in sys.modules)")  # fmt: skip
    run = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=venv_env(), timeout=120
    )
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.strip() == "False"


@pytest.fixture
def salted_data(synthetic_data, tmp_path):
    """The synthetic competition with every kind of bad test file added. Returns (data dir, expectations)."""
    data = tmp_path / "data"
    shutil.copytree(synthetic_data, data)
    # Issue 51: the audio folder is a link to a folder elsewhere, as Kagglers compose data folders out of
    # links to /kaggle/input; the table's paths through it are inside the data folder as written.
    shutil.move(data / "audio", tmp_path / "linked_audio")
    (data / "audio").symlink_to(tmp_path / "linked_audio", target_is_directory=True)
    audio = data / "audio"
    first = read_rows(data / "test.csv")[0]
    clip, rate = sf.read(data / first["path"], dtype="float32")
    rng = np.random.default_rng(7)
    sf.write(audio / "b_stereo.wav", np.stack([clip, clip], axis=1), rate)
    sf.write(audio / "b_8k.wav", 0.1 * rng.standard_normal(12000).astype(np.float32), 8000)
    partly_nan = (0.1 * rng.standard_normal(16000)).astype(np.float32)
    partly_nan[100:300] = np.nan
    sf.write(audio / "b_some_nan.wav", partly_nan, 16000, subtype="FLOAT")
    sf.write(audio / "b_all_nan.wav", np.full(16000, np.nan, dtype=np.float32), 16000, subtype="FLOAT")
    sf.write(audio / "b_long.wav", np.tile(clip, int(np.ceil(180 * rate / clip.size)))[: 180 * rate], rate)
    (audio / "b_empty.wav").write_bytes(b"")
    (audio / "b_text.wav").write_text("this is not audio\n")
    sf.write(tmp_path / "outside.wav", clip, rate)  # real audio, but outside DATA
    extra = {
        "b_stereo": "audio/b_stereo.wav",
        "b_8k": "audio/b_8k.wav",
        "b_some_nan": "audio/b_some_nan.wav",
        "b_long": "audio/b_long.wav",
        "b_all_nan": "audio/b_all_nan.wav",
        "b_empty": "audio/b_empty.wav",
        "b_text": "audio/b_text.wav",
        "b_missing": "audio/b_missing.wav",
        "b_outside": "../outside.wav",
        "b_absolute": str(tmp_path / "outside.wav"),
    }
    with open(data / "test.csv", "a") as handle:
        handle.writelines(f"{i},{p}\n" for i, p in extra.items())
    with open(data / "sample_submission.csv", "a") as handle:
        handle.writelines(f"{i},?\n" for i in [*extra, "b_not_in_test"])
    expected_fallbacks = {
        "b_all_nan": "NaN",
        "b_empty": "empty",
        "b_text": "not readable as audio",
        "b_missing": "not found",
        "b_outside": "outside the data folder",
        "b_absolute": "outside the data folder",
        "b_not_in_test": "not in test.csv",
    }
    return data, first["id"], expected_fallbacks


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_infer_notebook_offline_without_torch_xla_on_broken_files(
    tiny_artifact, salted_data, guarded_env, tmp_path
):
    data, first_id, expected_fallbacks = salted_data
    env, log = guarded_env
    submission = tmp_path / "out" / "submission.csv"
    params = {"data_dir": data, "artifact_dir": tiny_artifact, "submission_path": submission,
              "write_probabilities": True, "progress": False}  # fmt: skip
    run = run_papermill("notebooks/infer.ipynb", tmp_path / "infer.out.ipynb", params, env=env)
    assert run.returncode == 0, run.stderr[-4000:]

    # The kernel ran under the guard.
    loaded = [line for line in log.read_text().splitlines() if " loaded " in line]
    assert any("ipykernel" in line for line in loaded), loaded

    # Every id of sample_submission.csv has a row, in order, with a label the model knows.
    ids = [r["id"] for r in read_rows(data / "sample_submission.csv")]
    written = read_rows(submission)
    assert [r["id"] for r in written] == ids
    labels = json.loads((tiny_artifact / "manifest.json").read_text())["labels"]
    assert all(r["label"] in labels for r in written)

    report = json.loads((submission.parent / "submission_report.json").read_text())
    reasons = {f["id"]: f["reason"] for f in report["fallbacks"]}
    assert reasons.keys() == expected_fallbacks.keys()
    for sid, fragment in expected_fallbacks.items():
        assert fragment in reasons[sid], (sid, reasons[sid])
    by_id = {r["id"]: r["label"] for r in written}
    assert all(by_id[sid] == report["fallback_label"] for sid in reasons)
    assert sum(report["files_per_device"].values()) == len(read_rows(data / "test.csv"))
    assert len(report["files_per_device"]) == 1

    # Repairable files got real predictions: listed as repaired, finite probabilities.
    repaired = {r["id"]: " ".join(r["repairs"]) for r in report["repaired"]}
    assert "mixed down" in repaired["b_stereo"]
    assert "resampled 8000->16000" in repaired["b_8k"]
    assert "NaN/inf samples zeroed" in repaired["b_some_nan"]
    probabilities = {r["id"]: np.array([float(v) for k, v in r.items() if k != "id"])
                     for r in read_rows(submission.parent / "probabilities.csv")}  # fmt: skip
    for sid in ("b_stereo", "b_8k", "b_some_nan", "b_long"):
        assert np.isfinite(probabilities[sid]).all() and abs(probabilities[sid].sum() - 1) < 1e-3, sid
    # Mixing down two equal channels gives back the original clip: the same prediction.
    np.testing.assert_allclose(probabilities["b_stereo"], probabilities[first_id], atol=1e-5)
