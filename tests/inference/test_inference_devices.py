"""Inference on several devices: one spawned process per device over a disjoint shard, merged in file order.

`device="cpu", devices=2` runs exactly the multi-GPU code path (spawned workers, shards, merge) with two CPU
processes standing in for the two T4s of a Kaggle "GPU T4 x2" session.
"""

from __future__ import annotations

import csv
import json
import shutil

import numpy as np
import pytest
import soundfile as sf
import torch

from pipeline.core.config import InferConfig
from pipeline.core.tables import TestLayout, read_test_items
from pipeline.devices.probe import cuda_device_count
from pipeline.inference.inference_devices import choose_devices, shard_indices
from pipeline.inference.predict import file_order
from pipeline.inference.submission import run_inference


@pytest.mark.parametrize(("n_files", "n_shards"), [(10, 2), (7, 3), (2, 2), (1, 2), (0, 2), (5, 1)])
def test_shards_are_disjoint_cover_every_file_and_keep_the_order(n_files, n_shards):
    order = list(np.random.default_rng(n_files).permutation(n_files))
    shards = shard_indices(order, n_shards)
    assert len(shards) == n_shards
    flat = [i for shard in shards for i in shard]
    assert sorted(flat) == list(range(n_files))  # covering, and no file twice
    assert max(map(len, shards)) - min(map(len, shards)) <= 1  # balanced counts
    for shard in shards:  # each shard keeps the global (longest-first) order
        assert shard == sorted(shard, key=order.index)


def test_round_robin_balances_audio_between_devices():
    """Longest first, dealt round-robin: no device gets all the long files."""
    lengths = [100, 90, 80, 70, 10, 9, 8, 7]
    shards = shard_indices(list(range(8)), 2)
    totals = [sum(lengths[i] for i in shard) for shard in shards]
    assert shards == [[0, 2, 4, 6], [1, 3, 5, 7]]
    assert abs(totals[0] - totals[1]) <= max(lengths) - min(lengths)
    assert abs(totals[0] - totals[1]) < 0.1 * sum(lengths)


def test_choose_devices():
    assert choose_devices("cpu", 2) == [torch.device("cpu")] * 2
    assert choose_devices("cpu") == [torch.device("cpu")]
    if cuda_device_count() == 0:
        assert choose_devices("auto", 2) == [torch.device("cpu")]
        with pytest.raises(RuntimeError, match="no GPU"):
            choose_devices("cuda")


def test_batching_is_sized_for_the_device_unless_set():
    from pipeline.core.model import ModelConfig
    from pipeline.inference.inference_devices import batching_for

    cpu, gpu = torch.device("cpu"), torch.device("cuda", 0)
    base = ModelConfig.from_preset("base", n_classes=3)
    small = ModelConfig.from_preset("small", n_classes=3)
    assert batching_for(None, None, base, cpu, cores=2) == (8, 0)  # measured best on 2 cores
    assert batching_for(None, None, ModelConfig.from_preset("voxceleb", n_classes=3), cpu, cores=2) == (4, 0)
    assert batching_for(None, None, small, cpu, cores=2) == (32, 0)
    tiny = ModelConfig.from_preset("tiny", n_classes=3)
    assert batching_for(None, None, tiny, cpu, cores=2) == (64, 0)  # capped
    # Decoding workers from the session's cores, as threads.plan_threads shares them: one per 4 cores.
    assert batching_for(None, None, base, cpu, cores=4) == (8, 1)
    assert batching_for(None, None, base, cpu, cores=16) == (8, 4)
    half_second = ModelConfig.from_preset("base", n_classes=3, window_samples=8000)
    assert batching_for(None, None, half_second, cpu)[0] == 15  # shorter windows: more of them per batch
    assert batching_for(None, None, base, gpu, cores=2) == (256, 1)  # T4 x2 on 4 cores: 2 per GPU process
    assert batching_for(None, None, base, gpu, cores=4) == (256, 3)  # the spare cores decode
    assert batching_for(None, None, base, gpu, cores=1) == (256, 1)
    assert batching_for(None, None, base, gpu, cores=64) == (256, 8)
    assert batching_for(5, 3, base, cpu) == (5, 3)
    assert batching_for(None, 0, base, gpu) == (256, 0)


def read_rows(path):
    with open(path, newline="") as handle:
        return list(csv.DictReader(handle))


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
def test_two_cpu_processes_predict_what_one_process_predicts(tiny_artifact, salted_data, tmp_path):
    def infer(devices: int, out_dir):
        out_dir.mkdir()
        config = InferConfig(data_dir=str(salted_data), artifact_dir=str(tiny_artifact), device="cpu",
                             devices=devices, submission_path=str(out_dir / "submission.csv"), progress=False,
                             write_probabilities=True, write_embeddings=True, batch_windows=8)  # fmt: skip
        result = run_inference(config)
        return result, json.loads(result.report_path.read_text())

    one, one_report = infer(1, tmp_path / "one")
    two, two_report = infer(2, tmp_path / "two")
    rows = read_test_items(salted_data, TestLayout()).rows

    # The multi-device path ran: two workers, each with a share of the files, together all of them.
    assert one_report["files_per_device"] == {"cpu": len(rows)}
    counts = two_report["files_per_device"]
    assert sorted(counts) == ["cpu#0", "cpu#1"]
    assert sum(counts.values()) == len(rows) and min(counts.values()) >= len(rows) // 2
    shards = shard_indices(file_order(salted_data, [r.rel_path for r in rows]), 2)
    assert [len(s) for s in shards] == [counts["cpu#0"], counts["cpu#1"]]

    # Same predictions, same fallbacks and repairs, rows in sample_submission order.
    assert read_rows(one.submission_path) == read_rows(two.submission_path)
    ids = [r["id"] for r in read_rows(salted_data / "sample_submission.csv")]
    assert [r["id"] for r in read_rows(two.submission_path)] == ids
    a, b = np.load(tmp_path / "one" / "embeddings.npz"), np.load(tmp_path / "two" / "embeddings.npz")
    assert (a["ids"] == b["ids"]).all() and (a["ok"] == b["ok"]).all()
    np.testing.assert_allclose(a["embeddings"], b["embeddings"], atol=1e-4, rtol=1e-4, equal_nan=True)
    pa = np.array(
        [
            [float(v) for k, v in r.items() if k != "id"]
            for r in read_rows(tmp_path / "one" / "probabilities.csv")
        ]
    )
    pb = np.array(
        [
            [float(v) for k, v in r.items() if k != "id"]
            for r in read_rows(tmp_path / "two" / "probabilities.csv")
        ]
    )
    np.testing.assert_allclose(pa, pb, atol=1e-4, equal_nan=True)
    assert one_report["fallbacks"] == two_report["fallbacks"]
    assert {f["id"] for f in two_report["fallbacks"]} == {"x_empty", "x_missing"}
    assert one_report["repaired"] == two_report["repaired"]
    repaired = {r["id"]: r["repairs"] for r in two_report["repaired"]}
    assert any("mixed down" in x for x in repaired["x_stereo"])
    assert repaired["x_8k"] == ["resampled 8000->16000"]
    # The stereo copy of a test file (both channels equal) is predicted exactly like the original.
    row_ids = [row.id for row in rows]  # probabilities.csv follows test.csv
    stereo, original = row_ids.index("x_stereo"), 0
    np.testing.assert_allclose(pb[stereo], pb[original], atol=1e-5)


def test_a_failing_device_worker_falls_back_to_one_device(
    tiny_artifact, synthetic_data, tmp_path, monkeypatch, capsys
):
    import csv

    from launch_fixtures.workers import broken_inference_worker

    from pipeline.core.config import InferConfig
    from pipeline.inference import predict as inference
    from pipeline.inference.submission import run_inference

    monkeypatch.setattr(inference, "gpu_inference_worker", broken_inference_worker)
    out = tmp_path / "sub.csv"
    result = run_inference(InferConfig(data_dir=str(synthetic_data), artifact_dir=str(tiny_artifact),
                                       submission_path=str(out), device="cpu", devices=2, progress=False))  # fmt: skip
    assert "multi-device inference failed" in capsys.readouterr().out
    with open(out) as handle:
        assert len(list(csv.DictReader(handle))) == result.n_rows and result.n_fallbacks == 0
    assert list(result.device_counts) == ["cpu"]


def test_a_hung_device_worker_is_given_up_on_and_the_cpu_predicts(
    tiny_artifact, synthetic_data, tmp_path, monkeypatch, capsys
):
    """Issue 13: one hung GPU must not block a submission. A worker that stops reporting batches for
    STALL_MINUTES is killed with the others, and this process predicts every file on the CPU."""
    import csv

    from launch_fixtures.workers import hung_inference_worker

    from pipeline.core.config import InferConfig
    from pipeline.inference import predict as inference
    from pipeline.inference.submission import run_inference

    monkeypatch.setattr(inference, "gpu_inference_worker", hung_inference_worker)
    monkeypatch.setattr(inference, "STALL_MINUTES", 3 / 60)
    out = tmp_path / "sub.csv"
    result = run_inference(InferConfig(data_dir=str(synthetic_data), artifact_dir=str(tiny_artifact),
                                       submission_path=str(out), device="cpu", devices=2, progress=False))  # fmt: skip
    said = capsys.readouterr().out
    assert "made no progress for 3.0 s" in said and "predicting on cpu in this process" in said
    with open(out) as handle:
        assert len(list(csv.DictReader(handle))) == result.n_rows and result.n_fallbacks == 0
