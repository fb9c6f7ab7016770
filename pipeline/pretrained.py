"""The model training starts from: a fresh ECAPA-TDNN of a preset size, or a SpeechBrain pretrained one.

(init_from / freeze_encoder: being implemented under the artifact-handoff issue.)
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .config import TrainConfig
from .model import ModelConfig, SpeakerClassifier


def initial_model(
    config: TrainConfig, model_size: str, labels: list[str], log: Callable[[str], Any] = print
) -> SpeakerClassifier:
    if config.init_from:
        raise NotImplementedError("init_from is not implemented yet")
    model_config = ModelConfig.from_preset(
        model_size,
        n_classes=len(labels),
        n_mels=config.n_mels,
        window_samples=config.window_samples,
        score_scale=config.aam_scale,
    )
    return SpeakerClassifier(model_config)
