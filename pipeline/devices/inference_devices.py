"""Where inference runs: one device in this process, or one spawned process per GPU.

Kaggle's submission sessions are CPU or "GPU T4 x2". With several GPUs each gets a disjoint, length-balanced
shard of the files in its own spawned process (DataParallel would leave the second T4 idle with
`encode_batch`, see ../shared/NOTES.md) and the scores are merged back in file order. The artifact is read and
verified once, on the CPU, in this process; the workers receive its weights (CPU tensors) with their task
and move them to their device.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch

from ..artifact import Artifact
from ..config import InferConfig
from ..data import TestRow
from ..inference import Predictions, file_order, predict_rows
from ..model import ModelConfig
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


# Windows x channels x frames of ECAPA's widest activation (the multi-layer aggregation) per CPU batch: ~5 MB,
# so the elementwise ops between convolutions work in cache. Measured on 2 cores (benchmarks/inference.py,
# 300 FSDD files): C=512 fastest at 8-16 one-second windows, C=128 at 32; 64 windows cost 25-40%.
CPU_BATCH_BUDGET = 8 * 1536 * 101


def batching_for(config: InferConfig, model_config: ModelConfig, device: torch.device) -> tuple[int, int]:
    """(windows per batch, DataLoader workers) for `device`, where the config leaves them to us (None).

    CPU: batches sized to the cache (CPU_BATCH_BUDGET) and decoding in the compute process: a worker
    process only takes cores from torch's threads (on 2 cores, 1 worker cost 10-30% of throughput on FSDD).
    GPU: 64 windows per batch and one worker decoding while the GPU computes.
    """
    if device.type == "cpu":
        frames = model_config.window_samples // 160 + 1  # Fbank: 10 ms hop
        widest = model_config.channels[-1]  # the multi-layer feature aggregation: ECAPA's widest activation
        auto_batch, auto_workers = max(4, min(64, CPU_BATCH_BUDGET // (widest * frames))), 0
    else:
        auto_batch, auto_workers = 64, 1
    batch = config.batch_windows if config.batch_windows is not None else auto_batch
    workers = config.num_workers if config.num_workers is not None else auto_workers
    return batch, workers


def predict_on_devices(
    artifact: Artifact, data_dir: Path, rows: Sequence[TestRow], config: InferConfig
) -> Predictions:
    devices = choose_devices(config)
    order = file_order(data_dir, rows)
    if len(devices) > 1:
        from .launch import LaunchError

        try:
            return _predict_multi_gpu(artifact, data_dir, rows, config, devices, order)
        except LaunchError as error:
            # A submission must still be written: fall back to one device in this process.
            print(f"multi-device inference failed ({error}); predicting on {devices[0]} in this process")
    batch_windows, num_workers = batching_for(config, artifact.model.config, devices[0])
    return predict_rows(
        artifact.model,
        data_dir,
        rows,
        order,
        devices[0],
        batch_windows,
        config.max_windows_per_file,
        num_workers,
        config.progress,
    )


def _predict_multi_gpu(artifact, data_dir, rows, config, devices, order) -> Predictions:
    from .launch import launch

    shards = shard_indices(order, len(devices))
    with tempfile.TemporaryDirectory(prefix="infer-shards-") as tmp:
        launch(
            gpu_inference_worker,
            nprocs=len(devices),
            args=(
                artifact.model,  # verified CPU weights, read once here: workers never re-read the artifact
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
    rank: int, world_size: int, model, data_dir, rows, shards, devices, config, out_dir
) -> int:
    """One process per device (spawned, so CUDA initialises fresh in each): predict this rank's shard with
    the weights the parent read from the artifact."""
    device = torch.device(devices[rank])
    if device.type == "cpu":
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // world_size))
    batch_windows, num_workers = batching_for(config, model.config, device)
    result = predict_rows(
        model.eval(),
        Path(data_dir),
        rows,
        shards[rank],
        device,
        batch_windows,
        config.max_windows_per_file,
        num_workers,
        progress=config.progress and rank == 0,
    )
    target = Path(out_dir) / f"rank{rank}.npz"
    np.savez(target, scores=result.scores, embeddings=result.embeddings, ok=result.ok)
    # Why files fell back and what was repaired travel with the scores: the report needs both.
    notes = {"problems": result.problems, "repairs": result.repairs}
    (Path(out_dir) / f"rank{rank}.json").write_text(json.dumps(notes))
    return int(result.ok.sum())
