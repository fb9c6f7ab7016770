"""Where inference runs: which devices, how the files are shared between them, and how big a batch is.

Kaggle's submission sessions are CPU or "GPU T4 x2". With several GPUs each gets a disjoint, length-balanced
shard of the files in its own spawned process (DataParallel would leave the second T4 idle with
`encode_batch`, see ../shared/NOTES.md); pipeline.inference.predict.predict_on_devices runs them.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ..core.model import ModelConfig
from ..devices.probe import cuda_device_count
from ..devices.threads import available_cores, plan_threads


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
# GPU batches: on an H100 (benchmarks/cuda.py, fp16) 64 windows ran the voxceleb size at 0.44x its rate at
# 1024 windows and 256 at 0.90x (the small size: 0.12x and 0.44x); a T4, with a tenth of the fp16 compute,
# fills sooner. 256 one-second windows of the voxceleb size take well under 2 GB: a T4 has 15.
GPU_BATCH_WINDOWS = 256
# One worker decodes ~700 s of 32 kHz Ogg/Vorbis per second (benchmarks/soundscape.py) where an H100 embeds
# ~6,000 s of audio (voxceleb size, windows half a window apart): decoding needs every core that is spare.
GPU_DECODE_WORKERS = 8


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
    FSDD), then one per 4 cores. GPU: GPU_BATCH_WINDOWS windows per batch, and every core of the process's
    share but one decoding (at least one, at most GPU_DECODE_WORKERS) while the GPU computes.
    """
    if device.type == "cpu":
        frames = model_config.window_samples * 100 // model_config.sample_rate + 1  # Fbank: 10 ms hop
        widest = model_config.channels[-1]  # the multi-layer feature aggregation: ECAPA's widest activation
        auto_batch = max(4, min(64, CPU_BATCH_BUDGET // (widest * frames)))
        auto_workers = plan_threads(cores if cores is not None else available_cores()).decode_workers
    else:
        auto_batch = GPU_BATCH_WINDOWS
        auto_workers = max(
            1, min(GPU_DECODE_WORKERS, (cores if cores is not None else available_cores()) - 1)
        )
    batch = batch_windows if batch_windows is not None else auto_batch
    workers = num_workers if num_workers is not None else auto_workers
    return batch, workers
