"""Validation during training: the kept weights, their BatchNorm statistics, and how they score held-out files.

Files are read from the audio cache one at a time and cut into the windows inference uses, so nothing holds the
validation split in memory. Each process validates its own share of the files on its own device (the batch
shape fixed on XLA, so one graph serves every batch) and the per-file results are summed across processes:
every rank ends with the same predictions, and so the same best-epoch decision.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np
import torch

from .batches import crops
from .config import MAX_WINDOWS_PER_FILE, TrainConfig
from .data import windows
from .ema import WeightAverage, recompute_batchnorm
from .inference import FileWindows, run_windows
from .store import AudioStore

# Windows per validation batch: a multiple of 8 (the XLA mesh splits it evenly), large enough for the devices.
VALIDATION_BATCH = 64


@dataclass
class Validation:
    """One epoch's validation: metrics for the history, the predicted class of every validation file."""

    metrics: dict[str, float]
    predictions: np.ndarray  # [n_val] class index, in validation-split order


def calibration_windows(
    store: AudioStore, items: np.ndarray, train_idx: list[int], config: TrainConfig
) -> tuple[torch.Tensor, torch.Tensor] | None:
    """A fixed sample of training crops for recompute_batchnorm: the same every epoch and on every rank.
    None with freeze_encoder: the pretrained encoder's weights and statistics are kept exactly as they are."""
    count = min(config.bn_calibration_windows, len(train_idx))
    if count == 0 or config.freeze_encoder:
        return None
    rng = np.random.default_rng([config.seed, 104729])
    rows = rng.choice(np.asarray(train_idx), size=count, replace=False)
    return crops(store, items[rows], config.window_samples, rng)


def validation_model(
    model: torch.nn.Module, average: WeightAverage | None, strategy, calibration
) -> torch.nn.Module:
    """The weights an epoch validates and may keep (the average, else the model itself), on the training
    device, in eval mode, with BatchNorm statistics of their own (computed in one batch: on XLA one graph)."""
    kept = average.module if average is not None else strategy.unwrap(model)
    if calibration is not None:
        wavs, lens = calibration
        recompute_batchnorm(kept, wavs, lens, forward=functools.partial(strategy.embeddings, kept))
    strategy.sync_buffers(kept)  # DDP: every rank validates (and may keep) exactly rank 0's statistics
    return kept.eval()


def evaluate(
    model: torch.nn.Module,
    strategy,
    store: AudioStore,
    items: np.ndarray,
    targets: np.ndarray,
    val_idx: list[int],
    config: TrainConfig,
) -> Validation | None:
    """Validation exactly as at inference (windowed, length-weighted) of `model` (unwrapped, on the strategy's
    device) on the held-out files; None without a validation split."""
    if not val_idx:
        return None
    mine = strategy.shard(list(range(len(val_idx))))  # positions in val_idx this process scores

    def files():
        for k, position in enumerate(mine):
            samples = store.read(int(items[val_idx[position]]))
            yield FileWindows(k, *windows(samples, config.window_samples, MAX_WINDOWS_PER_FILE))

    embed = functools.partial(strategy.embeddings, model, pad_to=VALIDATION_BATCH)
    with torch.inference_mode():
        predictions = run_windows(model, files(), len(mine), VALIDATION_BATCH, strategy.device, embed=embed)
    truth = torch.from_numpy(targets[np.asarray(val_idx)[mine]])
    logits = torch.from_numpy(predictions.scores) * config.aam_scale
    # Per file, summed across processes: predicted class + 1 (0 = another process's file) and the loss.
    predicted = torch.zeros(len(val_idx), dtype=torch.float64)
    losses = torch.zeros(len(val_idx), dtype=torch.float64)
    if mine:
        predicted[mine] = torch.from_numpy(predictions.scores.argmax(1) + 1).double()
        losses[mine] = torch.nn.functional.cross_entropy(logits, truth, reduction="none").double()
    predicted, losses = strategy.sum_across(torch.stack([predicted, losses])).unbind(0)
    classes = predicted.long().numpy() - 1
    accuracy = float((classes == targets[np.asarray(val_idx)]).mean())
    return Validation({"val_accuracy": accuracy, "val_loss": float(losses.mean())}, classes)
