"""Where inference runs: which devices, how the files are shared between them, and how big a batch is.

Kaggle's submission sessions are CPU or "GPU T4 x2". With several GPUs each gets a disjoint, length-balanced
shard of the files in its own spawned process (DataParallel would leave the second T4 idle with
`encode_batch`, see ../shared/NOTES.md); pipeline.inference.predict_on_devices runs them.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ..model import ModelConfig
from .probe import cuda_device_count
from .threads import available_cores, plan_threads


def choose_devices(device: str = "auto", devices: int | None = None) -> list[torch.device]:
    """The devices to run on (InferConfig's `device` and `devices`). `device="cpu", devices=N` runs N CPU
    processes: the multi-GPU code path with CPUs standing in for the GPUs (how it is tested here), and a
    speed-up on many-core CPU sessions."""
    if device == "cpu":
        return [torch.device("cpu")] * (devices or 1)
    available = cuda_device_count()
    if device == "cuda" and available == 0:
        raise RuntimeError("device='cuda' but no GPU is visible; use device='auto' or 'cpu'")
    if available == 0:
        return [torch.device("cpu")]
    count = min(devices or available, available)
    return [torch.device("cuda", i) for i in range(count)]


def shard_indices(order: Sequence[int], n_shards: int) -> list[list[int]]:
    """Deal files (longest first) round-robin, so every shard gets a similar amount of audio."""
    return [list(order[k::n_shards]) for k in range(n_shards)]


# Windows x channels x frames of ECAPA's widest activation (the multi-layer aggregation) per CPU batch: ~5 MB,
# so the elementwise ops between convolutions work in cache. Measured on 2 cores (benchmarks/inference.py,
# 300 FSDD files): C=512 fastest at 8-16 one-second windows, C=128 at 32; 64 windows cost 25-40%.
CPU_BATCH_BUDGET = 8 * 1536 * 101


def batching_for(
    batch_windows: int | None,
    num_workers: int | None,
    model_config: ModelConfig,
    device: torch.device,
    cores: int | None = None,
) -> tuple[int, int]:
    """(windows per batch, DataLoader workers) for `device`, where the parameters leave them to us (None).

    CPU: batches sized to the cache (CPU_BATCH_BUDGET) and decoding workers as devices/threads.plan_threads
    shares `cores` (default: this session's, threads.available_cores): none below 4 cores, where a worker
    process only takes cores from the compute threads (on 2 cores, 1 worker cost 10-30% of throughput on
    FSDD), then one per 4 cores. GPU: 64 windows per batch and one worker decoding while the GPU computes.
    """
    if device.type == "cpu":
        frames = model_config.window_samples * 100 // model_config.sample_rate + 1  # Fbank: 10 ms hop
        widest = model_config.channels[-1]  # the multi-layer feature aggregation: ECAPA's widest activation
        auto_batch = max(4, min(64, CPU_BATCH_BUDGET // (widest * frames)))
        auto_workers = plan_threads(cores if cores is not None else available_cores()).decode_workers
    else:
        auto_batch, auto_workers = 64, 1
    batch = batch_windows if batch_windows is not None else auto_batch
    workers = num_workers if num_workers is not None else auto_workers
    return batch, workers
