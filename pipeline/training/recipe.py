"""Defaults that follow the data: what the training table decides for the parameters left to auto.

`epochs`, `blend_probability`, `speed_probability`, `val_fraction` and `centre_embeddings` default to None (auto),
and `model_size` to "auto". The hardware policy (devices/policy.py) sizes the model before any audio is read; once
the table is decoded, the kind of data it holds decides the rest, and one log line says which kind, why, and what
it chose:

    sound events   one label per clip (objective aam), no noise_dir, a median clip of at least
                   EVENT_MIN_SECONDS, an epoch of at most EVENT_MAX_CROPS crops, trained from scratch (ESC-10
                   and ESC-50's 5 s clips): EnvNet-v2's long training with between-class blending and speed
                   perturbation, on every clip (no validation split: the last epoch is kept), the training
                   files' mean embedding sealed in the artifact for inference to take out, and on a CPU the
                   'medium' ECAPA that such a small table can afford
    anything else  12 epochs, no blending, no speed change, no embedding centre, the hardware's model: what was
                   measured on speech (FSDD's digits and speakers: clips under a window) and on soundscapes

Why (docs/measurements.md, "Sound events"): ESC-10's official 5 folds through both notebooks, 3 training seeds, 15
paired folds: the defaults 0.873, this recipe 0.89-0.91 (every seed's fold 1 +0.06 to +0.11), 10 min a fold on this
machine's 2 cores; on an H200 with the 'voxceleb' model 0.875 -> 0.910. Each part alone on the 'small' model
(blending, speed, 24-36 epochs) was within the seeds' spread: it is the bigger model that needs the long, augmented
schedule. Its last epoch was the one validation kept in 15 of 23 folds, so the 10% held out to choose one now
trains too: seeds 1-2, 10 paired folds, 0.891 -> 0.906 (+0.015, 7 wins, 1 loss). Speed perturbation moves pitch,
which names a speaker or a species: the recipe stays off clips shorter than EVENT_MIN_SECONDS (FSDD's digits and
speakers, the demo's utterances) and off soundscapes and multi-label tables (birds); a speech table of long
one-label utterances gets it too, and the log line says how to turn it off. The embedding centre gained ESC-10
+0.01 (15 paired folds) and cost FSDD speakers 2 files in 1,620 over three splits, with torch and with int8 alike:
it is written for sound events only.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from ..core.config import DEFAULT_EPOCHS, DEFAULT_VAL_FRACTION, TrainConfig

# ESC's clips are 5 s, UrbanSound8K's 4 s; the scale benchmark's speech clips are 3 s and the demo's utterances
# 1.5 s (median): the recipe starts between them.
EVENT_MIN_SECONDS = 3.5
# The bigger model's CPU cost bounds the recipe: 36 epochs of ESC-10's 1,600 crops are 10 min on 2 cores here
# ('medium'); past this many crops an epoch nothing was measured, so the defaults stay.
EVENT_MAX_CROPS = 10_000
EVENT_EPOCHS = 36
EVENT_BLEND = 0.5
EVENT_SPEED = 0.5
EVENT_VAL_FRACTION = 0.0
EVENT_CPU_MODEL_SIZE = "medium"
# What each parameter left to auto becomes: (for anything else, for sound events).
AUTO_VALUES = {
    "epochs": (DEFAULT_EPOCHS, EVENT_EPOCHS),
    "blend_probability": (0.0, EVENT_BLEND),
    "speed_probability": (0.0, EVENT_SPEED),
    "val_fraction": (DEFAULT_VAL_FRACTION, EVENT_VAL_FRACTION),
    "centre_embeddings": (False, True),
}


@dataclass(frozen=True)
class DataKind:
    name: str  # "sound events" | "other"
    why: str


def kind_of_data(clip_seconds: np.ndarray, config: TrainConfig, objective: str, epoch_crops: int) -> DataKind:
    """What the training table holds, from its clips' lengths, the objective its labels chose and noise_dir."""
    median = float(np.median(clip_seconds)) if len(clip_seconds) else 0.0
    if config.noise_dir:
        return DataKind("other", f"soundscapes: noise_dir={config.noise_dir!r}")
    if objective != "aam":
        return DataKind("other", f"objective {objective}: several labels per clip")
    if median < EVENT_MIN_SECONDS:
        return DataKind("other", f"one label per clip, median clip {median:.2f} s < {EVENT_MIN_SECONDS:g} s")
    if epoch_crops > EVENT_MAX_CROPS:
        return DataKind("other", f"{epoch_crops} crops an epoch > {EVENT_MAX_CROPS}: a large table")
    if config.init_from:
        return DataKind("other", "fine-tuning init_from (the recipe was measured from scratch)")
    return DataKind(
        "sound events", f"one label per clip, median clip {median:.1f} s, {epoch_crops} crops an epoch"
    )


def auto_could_choose(name: str, value: object) -> bool:
    """Whether `value` of parameter `name` is one this module decides when the parameter is left to auto (an
    artifact trained with epochs None records the 12 or 36 the data chose)."""
    return value in AUTO_VALUES.get(name, ())


def follow_the_data(
    config: TrainConfig,
    hardware_size: str,
    accelerator: str,
    clip_seconds: np.ndarray,
    objective: str,
    epoch_crops: int,
    log: Callable[[str], object] = print,
) -> tuple[TrainConfig, str]:
    """`config` with its auto (None) AUTO_VALUES decided, and the model size
    (`hardware_size`, policy.resolve_model_size, unless the data asks for more on a CPU)."""
    kind = kind_of_data(clip_seconds, config, objective, epoch_crops)
    events = kind.name == "sound events"
    chosen = {name: values[events] for name, values in AUTO_VALUES.items() if getattr(config, name) is None}
    size = hardware_size
    if events and config.model_size == "auto" and accelerator == "cpu":
        size = EVENT_CPU_MODEL_SIZE
    said = [
        f"{name} {value}" if isinstance(value, bool) else f"{name} {value:g}"
        for name, value in chosen.items()
    ]
    if size != hardware_size:
        said.append(f"model_size '{size}' (the CPU default is '{hardware_size}')")
    how = "; set a parameter to choose it" if events else ""
    log(f"data kind: {kind.name} ({kind.why}); auto: {', '.join(said) or 'nothing left to decide'}{how}")
    return dataclasses.replace(config, **chosen), size
