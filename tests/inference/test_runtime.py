"""Where inference runs, decided once: the device, batches, decode workers, threads (runtime.py)."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import soundfile as sf
import torch
from helpers import read_rows

from pipeline.core.config import InferConfig
from pipeline.core.model import ModelConfig
from pipeline.core.tables import TestLayout, read_test_items
from pipeline.inference.runtime import Hardware, batching_for, choose_device, window_plan
from pipeline.inference.submission import run_inference


def test_choose_device():
    assert choose_device("cpu", Hardware(gpus=2, cores=4)) == torch.device("cpu")
    assert choose_device("auto", Hardware(gpus=2, cores=4)) == torch.device("cuda", 0)
    assert choose_device("auto", Hardware(gpus=0, cores=4)) == torch.device("cpu")
    with pytest.raises(RuntimeError, match="no GPU"):
        choose_device("cuda", Hardware(gpus=0, cores=4))


def test_batching_is_sized_for_the_device_unless_set():
    cpu, gpu = torch.device("cpu"), torch.device("cuda", 0)
    base = ModelConfig.from_preset("base", n_classes=3)
    small = ModelConfig.from_preset("small", n_classes=3)
    assert batching_for(None, None, base, cpu, 2) == (8, 0)  # measured best on 2 cores
    assert batching_for(None, None, ModelConfig.from_preset("voxceleb", n_classes=3), cpu, 2) == (4, 0)
    assert batching_for(None, None, small, cpu, 2) == (32, 0)
    tiny = ModelConfig.from_preset("tiny", n_classes=3)
    assert batching_for(None, None, tiny, cpu, 2) == (64, 0)  # capped
    # Decoding workers from the session's cores, as threads.plan_threads shares them: one per 4 cores.
    assert batching_for(None, None, base, cpu, 4) == (8, 1)
    assert batching_for(None, None, base, cpu, 16) == (8, 4)
    half_second = ModelConfig.from_preset("base", n_classes=3, window_samples=8000)
    assert batching_for(None, None, half_second, cpu, 2)[0] == 15  # shorter windows: more of them per batch
    assert batching_for(None, None, base, gpu, 4) == (256, 3)  # the spare cores decode
    assert batching_for(None, None, base, gpu, 1) == (256, 1)
    assert batching_for(None, None, base, gpu, 64) == (256, 8)
    assert batching_for(5, 3, base, cpu, 2) == (5, 3)
    assert batching_for(None, 0, base, gpu, 4) == (256, 0)


def test_a_files_windows_tile_it_for_the_mean_and_overlap_when_asked_or_for_other_poolings():
    model = ModelConfig.from_preset("tiny", n_classes=3)  # 1 s windows at 16 kHz
    assert window_plan(InferConfig(), model, 8).file_hop is None
    assert window_plan(InferConfig(clip_hop_seconds=0.25), model, 8).file_hop == 4000
    assert window_plan(InferConfig(clip_pooling="max"), model, 8).file_hop == 8000
    assert window_plan(InferConfig(window_hop_seconds=0.2), model, 8).hop == 3200


def test_whole_files_are_read_at_the_artifacts_speeds_unless_the_parameter_says_otherwise(
    tmp_path, tiny_artifact
):
    from pipeline.core.artifact import load_artifact, save_artifact
    from pipeline.core.config import ConfigError, from_params
    from pipeline.inference.runtime import choose_speeds, resolve_runtime

    plain = load_artifact(tiny_artifact)  # trained without speed perturbation: no speeds recorded
    model = plain.model
    sped = load_artifact(
        save_artifact(tmp_path / "sped", model, plain.labels, {}, test_time_speeds=[0.9, 1.0, 1.1])
    )
    assert choose_speeds(InferConfig(), plain) == (1.0,)
    assert choose_speeds(InferConfig(), sped) == (0.9, 1.0, 1.1)
    assert choose_speeds(InferConfig(test_time_speeds=None), sped) == (1.0,)
    assert choose_speeds(InferConfig(test_time_speeds="none"), sped) == (1.0,)
    assert choose_speeds(InferConfig(test_time_speeds="0.8, 1,1.25"), plain) == (0.8, 1.0, 1.25)
    assert choose_speeds(InferConfig(test_time_speeds="[0.8 1]"), plain) == (0.8, 1.0)
    assert choose_speeds(from_params(InferConfig, {"test_time_speeds": [1.0, 1.2]}), plain) == (1.0, 1.2)
    for wrong in ("fast", "0.1,1", "1,1", [0.9, "x"]):
        with pytest.raises(ConfigError, match=r"test_time_speeds=.*distinct speeds from 0.25 to 4"):
            InferConfig(test_time_speeds=wrong)
    runtime = resolve_runtime(InferConfig(device="cpu"), sped, Hardware(gpus=0, cores=2))
    assert runtime.windows.speeds == (0.9, 1.0, 1.1)
    assert "whole files read at 0.9, 1, 1.1x" in runtime.describe()
    assert "read at" not in resolve_runtime(InferConfig(device="cpu"), plain, Hardware(0, 2)).describe()


@pytest.fixture
def salted_data(synthetic_data, tmp_path):
    """The synthetic test set plus files that need repair (stereo, 8 kHz) or a fallback (missing, empty)."""
    data = tmp_path / "data"
    shutil.copytree(synthetic_data, data)
    clip, rate = sf.read(data / read_rows(data / "test.csv")[0]["path"], dtype="float32")
    sf.write(data / "audio" / "x_stereo.wav", np.stack([clip, clip], axis=1), rate)
    sf.write(data / "audio" / "x_8k.wav", 0.1 * np.random.default_rng(1).standard_normal(8000), 8000)
    (data / "audio" / "x_empty.wav").write_bytes(b"")
    extra = {"x_stereo": "audio/x_stereo.wav", "x_8k": "audio/x_8k.wav", "x_empty": "audio/x_empty.wav",
             "x_missing": "audio/x_missing.wav"}  # fmt: skip
    with open(data / "test.csv", "a") as handle:
        handle.writelines(f"{i},{p}\n" for i, p in extra.items())
    with open(data / "sample_submission.csv", "a") as handle:
        handle.writelines(f"{i},?\n" for i in extra)
    return data


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_repairs_and_fallbacks_are_reported_and_a_stereo_copy_scores_as_its_original(
    tiny_artifact, salted_data, tmp_path
):
    config = InferConfig(data_dir=str(salted_data), artifact_dir=str(tiny_artifact), device="cpu",
                         submission_path=str(tmp_path / "submission.csv"), progress=False,
                         write_probabilities=True, write_embeddings=True, batch_windows=8)  # fmt: skip
    result = run_inference(config)
    report = json.loads(result.report_path.read_text())
    rows = read_test_items(salted_data, TestLayout()).rows
    assert report["files_per_device"] == {"cpu": len(rows)}
    ids = [r["id"] for r in read_rows(salted_data / "sample_submission.csv")]
    assert [r["id"] for r in read_rows(result.submission_path)] == ids  # sample_submission's order
    assert {f["id"] for f in report["fallbacks"]} == {"x_empty", "x_missing"}
    repaired = {r["id"]: r["repairs"] for r in report["repaired"]}
    assert any("mixed down" in x for x in repaired["x_stereo"])
    assert repaired["x_8k"] == ["resampled 8000->16000"]
    embeddings = np.load(tmp_path / "embeddings.npz")
    assert list(embeddings["ids"]) == [row.id for row in rows]
    assert embeddings["ok"].tolist() == [row.id not in ("x_empty", "x_missing") for row in rows]
    # The stereo copy of a test file (both channels equal) is predicted exactly like the original.
    probs = np.array([[float(v) for k, v in r.items() if k != "id"]
                      for r in read_rows(tmp_path / "probabilities.csv")])  # fmt: skip
    row_ids = [row.id for row in rows]  # probabilities.csv follows test.csv
    np.testing.assert_allclose(probs[row_ids.index("x_stereo")], probs[0], atol=1e-5)
    assert np.isnan(probs[row_ids.index("x_empty")]).all()
