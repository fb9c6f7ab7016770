"""Defaults that follow the data: the `auto` settings that what the training table holds decides.

The hardware policy (devices/policy.py) sizes the model before any audio is read: VoxCeleb's size on a TPU or
GPU, 'small' on a CPU. Once the table is decoded, the kind of data it holds can ask for more on a CPU:

    long clips     one label per clip, clips of at least EVENT_MIN_WINDOWS windows: sound events (ESC-50,
                   UrbanSound8K, Freesound-style clips of a few seconds, where a short event sits somewhere in
                   a longer clip) or utterances of several seconds; with an epoch of at most EVENT_MAX_CROPS
                   crops -> 'medium' (EVENT_MODEL_SIZE), whose extra compute such a table can afford
    short clips    one label per clip, clips about a window long (FSDD's digits and speakers) -> the hardware's
                   size
    soundscapes    `noise_dir` names background recordings -> the hardware's size, in 3 members
                   (pretrained.resolve_members)
    multi-label    several labels per clip (objective bce / focal) -> the hardware's size

The log says which kind the table is, why, and what that chose.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from ..core.config import TrainConfig

# ESC-10's official 5 folds through both notebooks (benchmarks/esc10.py, docs/measurements.md): 'small' 0.8725,
# 0.8925 (seed 0, twice) and 0.8625 (seed 1); 'medium' 0.9125 (seed 0). Its 4x the compute per window is ~6 min
# a fold on one core here, inside the benchmark's 15 minutes.
EVENT_MODEL_SIZE = "medium"
EVENT_MIN_WINDOWS = 2.0  # the median training clip, in windows (ESC: 5 s clips, 1 s windows)
# The bigger model's CPU cost bounds where it is chosen: ~50 crops per second per core here for 'medium', so
# 12 epochs of 10,000 crops are ~20 minutes on 2 cores. Past that, the hardware's size.
EVENT_MAX_CROPS = 10_000


@dataclass(frozen=True)
class DataKind:
    name: str  # "long clips" | "short clips" | "soundscapes" | "multi-label"
    why: str


def kind_of_data(
    clip_seconds: np.ndarray, window_seconds: float, objective: str, noise_dir: str | None, epoch_crops: int
) -> DataKind:
    """What the training table holds, from its clips' lengths, the objective its labels chose and noise_dir."""
    median = float(np.median(clip_seconds)) if len(clip_seconds) else 0.0
    windows = median / window_seconds
    if noise_dir:
        return DataKind("soundscapes", f"noise_dir={noise_dir!r} names background recordings")
    if objective != "aam":
        return DataKind("multi-label", f"objective {objective!r}: a probability per class")
    if windows < EVENT_MIN_WINDOWS:
        return DataKind(
            "short clips", f"one label per clip, median clip {median:.2f} s = {windows:.1f} window(s)"
        )
    why = f"one label per clip, median clip {median:.1f} s = {windows:.1f} windows, {epoch_crops} crops an epoch"
    if epoch_crops > EVENT_MAX_CROPS:
        return DataKind(
            "long clips", f"{why} (more than {EVENT_MAX_CROPS}: too many for a bigger model on CPU)"
        )
    return DataKind("long clips", why)


def model_size_for_data(
    config: TrainConfig, hardware_size: str, accelerator: str, kind: DataKind, epoch_crops: int
) -> str:
    """`hardware_size` (policy.resolve_model_size), or EVENT_MODEL_SIZE for long clips on a CPU when model_size
    is auto and the model is trained from scratch."""
    if config.model_size != "auto" or config.init_from or accelerator != "cpu":
        return hardware_size
    if kind.name == "long clips" and epoch_crops <= EVENT_MAX_CROPS:
        return EVENT_MODEL_SIZE
    return hardware_size


def decide(
    config: TrainConfig,
    hardware_size: str,
    accelerator: str,
    clip_seconds: np.ndarray,
    objective: str,
    epoch_crops: int,
    log: Callable[[str], object] = print,
) -> str:
    """The model size for this data, said in the log with the kind of data and why."""
    kind = kind_of_data(clip_seconds, config.window_seconds, objective, config.noise_dir, epoch_crops)
    size = model_size_for_data(config, hardware_size, accelerator, kind, epoch_crops)
    chosen = "" if config.model_size != "auto" else f"; model_size auto -> '{size}'"
    if size != hardware_size:
        chosen += f" (the CPU default is '{hardware_size}'; set model_size to choose)"
    log(f"data kind: {kind.name} ({kind.why}){chosen}")
    return size
