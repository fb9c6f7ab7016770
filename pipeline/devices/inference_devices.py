"""Where inference runs: one device in this process, or one spawned process per GPU.

Kaggle's submission sessions are CPU or "GPU T4 x2". With several GPUs each gets a disjoint, length-balanced
shard of the files in its own spawned process (DataParallel would leave the second T4 idle with
`encode_batch`, see ../shared/NOTES.md) and the scores are merged back in file order. Weights are read from the
artifact on the CPU once per process and moved to that process's device.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch

from ..artifact import Artifact, load_artifact
from ..config import InferConfig
from ..data import TestRow
from ..inference import Predictions, file_order, predict_rows
from .probe import cuda_device_count


def choose_devices(config: InferConfig) -> list[torch.device]:
    """The devices to run on. `device="cpu", devices=N` runs N CPU processes: the multi-GPU code path with
    CPUs standing in for the GPUs (how it is tested here), and a speed-up on many-core CPU sessions."""
    if config.device == "cpu":
        return [torch.device("cpu")] * (config.devices or 1)
    available = cuda_device_count()
    if config.device == "cuda" and available == 0:
        raise RuntimeError("device='cuda' but no GPU is visible; use device='auto' or 'cpu'")
    if available == 0:
        return [torch.device("cpu")]
    count = min(config.devices or available, available)
    return [torch.device("cuda", i) for i in range(count)]


def shard_indices(order: Sequence[int], n_shards: int) -> list[list[int]]:
    """Deal files (longest first) round-robin, so every shard gets a similar amount of audio."""
    return [list(order[k::n_shards]) for k in range(n_shards)]


def predict_on_devices(
    artifact: Artifact, data_dir: Path, rows: Sequence[TestRow], config: InferConfig
) -> Predictions:
    devices = choose_devices(config)
    order = file_order(data_dir, rows)
    if len(devices) == 1:
        return predict_rows(
            artifact.model,
            data_dir,
            rows,
            order,
            devices[0],
            config.batch_windows,
            config.max_windows_per_file,
            config.num_workers,
            config.progress,
        )
    return _predict_multi_gpu(artifact, data_dir, rows, config, devices, order)


def _predict_multi_gpu(artifact, data_dir, rows, config, devices, order) -> Predictions:
    from .launch import launch

    shards = shard_indices(order, len(devices))
    with tempfile.TemporaryDirectory(prefix="infer-shards-") as tmp:
        launch(
            gpu_inference_worker,
            nprocs=len(devices),
            args=(
                str(artifact.path),
                str(data_dir),
                list(rows),
                shards,
                [str(d) for d in devices],
                config,
                tmp,
            ),
        )
        parts = [np.load(Path(tmp) / f"rank{rank}.npz", allow_pickle=False) for rank in range(len(devices))]
        problems: dict[int, str] = {}
        repairs: dict[int, list[str]] = {}
        for rank in range(len(devices)):
            notes = json.loads((Path(tmp) / f"rank{rank}.json").read_text())
            problems.update({int(i): text for i, text in notes["problems"].items()})
            repairs.update({int(i): done for i, done in notes["repairs"].items()})
    scores = parts[0]["scores"].copy()
    embeddings = parts[0]["embeddings"].copy()
    ok = np.zeros(len(rows), dtype=bool)
    counts = {}
    for rank, (part, shard) in enumerate(zip(parts, shards, strict=True)):
        scores[shard] = part["scores"][shard]
        embeddings[shard] = part["embeddings"][shard]
        ok[shard] = part["ok"][shard]
        counts[f"{devices[rank]}#{rank}"] = len(shard)
    return Predictions(scores, embeddings, ok, problems, dict(sorted(repairs.items())), counts)


def gpu_inference_worker(
    rank: int, world_size: int, artifact_dir, data_dir, rows, shards, devices, config, out_dir
) -> int:
    """One process per device (spawned, so CUDA initialises fresh in each): predict this rank's shard."""
    device = torch.device(devices[rank])
    if device.type == "cpu":
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // world_size))
    artifact = load_artifact(artifact_dir)
    result = predict_rows(
        artifact.model,
        Path(data_dir),
        rows,
        shards[rank],
        device,
        config.batch_windows,
        config.max_windows_per_file,
        config.num_workers,
        progress=config.progress and rank == 0,
    )
    target = Path(out_dir) / f"rank{rank}.npz"
    np.savez(target, scores=result.scores, embeddings=result.embeddings, ok=result.ok)
    # Why files fell back and what was repaired travel with the scores: the report needs both.
    notes = {"problems": result.problems, "repairs": result.repairs}
    (Path(out_dir) / f"rank{rank}.json").write_text(json.dumps(notes))
    return int(result.ok.sum())
