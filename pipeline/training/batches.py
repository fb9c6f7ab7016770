"""Training batches: random crops read from the audio cache, made in DataLoader worker processes.

The training process only waits for finished batches: worker processes (spawned, so they work from a notebook
cell, after CUDA was touched and inside DDP ranks; devices.launch.helper_spawn_context) read each crop from the
memory-mapped cache, pad it and, on XLA, compute the Fbank features the TPU step expects; the DataLoader pins
them (CUDA) and keeps `prefetch_factor` batches per worker ready. One loader serves the whole run, so the next
epoch's first batches are made while this epoch validates.

Every batch is a pure function of (seed, epoch, rank, position in the epoch): the rows of an epoch are a
seeded permutation of the process's shard, and the crops come from a generator seeded with the batch's
position. A run resumed from a checkpoint at step k therefore sees exactly the batches an uninterrupted run
sees from step k on, however many workers make them and in whatever order they finish.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, Sampler

from ..core.data import crop_span, pad_crop
from ..devices.launch import helper_spawn_context
from .augment import Augmentation, FocalTargets, augment
from .store import AudioStore


def epoch_order(rows: list[int], needed: int, seed: int, epoch: int) -> list[int]:
    """This epoch's shuffled row order, repeated if the shard is smaller than one epoch of batches."""
    rng = np.random.default_rng([seed, epoch, 7919])
    order: list[int] = []
    while len(order) < needed:
        order += [rows[i] for i in rng.permutation(len(rows))]
    return order[:needed]


@dataclass
class BatchRecipe:
    """Everything a worker process needs to make any batch of the run (pickled once per worker)."""

    store: AudioStore
    items: np.ndarray  # the cache index of each row of the training table
    targets: np.ndarray  # the class of each row, or (multi-label objectives) its [classes] targets
    rows: list[int]  # the rows this process trains on (its shard of the training split)
    rows_per_batch: int  # one micro-batch of this process (SPMD: of all devices)
    batches_per_epoch: int  # micro-batches: optimizer steps x gradient accumulation
    window: int
    seed: int
    rank: int = 0
    min_short_fraction: float = 1.0
    host_features_mels: int | None = None  # XLA: Fbank features with this many mel bands, made here...
    host_features_frontend: str = "logmel"  # ...through this front end (model.Frontend)
    crop_on_sound: bool = False  # crops of long clips drawn by loudness (data.crop_span)
    augmentation: Augmentation | None = None
    focal_targets: FocalTargets | None = None  # a teacher's window probabilities (distillation)


class TrainingBatches(Dataset):
    """Batch `(epoch, index)` of the run as a dict of CPU tensors: inputs (waveforms, or features on XLA),
    relative lengths, labels."""

    def __init__(self, recipe: BatchRecipe) -> None:
        self.recipe = recipe
        self._order_epoch, self._order = -1, []
        self._frontend = None

    def __len__(self) -> int:
        return self.recipe.batches_per_epoch

    def order(self, epoch: int) -> list[int]:
        if epoch != self._order_epoch:  # computed once per epoch per worker
            r = self.recipe
            self._order = epoch_order(r.rows, r.batches_per_epoch * r.rows_per_batch, r.seed, epoch)
            self._order_epoch = epoch
        return self._order

    def __getitem__(self, position: tuple[int, int]) -> dict[str, torch.Tensor]:
        epoch, index = position
        r = self.recipe
        start = index * r.rows_per_batch
        rows = self.order(epoch)[start : start + r.rows_per_batch]
        wavs, lens, starts = crops(
            r.store,
            r.items[rows],
            r.window,
            np.random.default_rng([r.seed, epoch, r.rank, start]),
            r.min_short_fraction,
            r.crop_on_sound,
        )
        labels = torch.from_numpy(r.targets[rows])
        labels = labels.float() if labels.ndim == 2 else labels.long()
        if r.focal_targets is not None:
            labels = r.focal_targets.apply(np.asarray(rows), starts, r.window, labels)
        if r.augmentation is not None and r.augmentation.active:
            rng = np.random.default_rng([r.seed, epoch, r.rank, start, 1])
            wavs, lens, labels = augment(wavs, lens, labels, rng, r.augmentation)
        inputs = self.features(wavs, lens) if r.host_features_mels else wavs
        return {"inputs": inputs, "lens": lens, "labels": labels}

    def features(self, wavs: torch.Tensor, lens: torch.Tensor) -> torch.Tensor:
        if self._frontend is None:
            from ..core.model import Frontend  # SpeechBrain's Fbank: only the XLA path's workers need it

            r = self.recipe
            self._frontend = Frontend(r.host_features_mels, r.store.sample_rate, r.host_features_frontend)
        with torch.no_grad():
            return self._frontend(wavs, lens)


def crops(
    store: AudioStore,
    items: np.ndarray,
    window: int,
    rng: np.random.Generator,
    min_short_fraction: float = 1.0,
    on_sound: bool = False,
) -> tuple[torch.Tensor, torch.Tensor, np.ndarray]:
    """One random crop of each cached file `items` ([n, window] waveforms, [n] relative lengths, [n] first
    samples): only the cropped samples are read from the cache. `on_sound`: long clips are cropped where they
    are loud."""
    wavs, lens = np.zeros((len(items), window), dtype=np.float32), np.zeros(len(items), dtype=np.float32)
    starts = np.zeros(len(items), dtype=np.int64)
    for k, item in enumerate(items):
        loudness = store.envelope(int(item)) if on_sound else None
        start, stop = crop_span(
            int(store.lengths[item]), window, rng, min_short_fraction, loudness, store.envelope_frame
        )
        wavs[k], lens[k] = pad_crop(store.read(int(item), start, stop), window)
        starts[k] = start
    return torch.from_numpy(wavs), torch.from_numpy(lens), starts


class RunPositions(Sampler):
    """(epoch, batch) from a position to the end of the run, in training order."""

    def __init__(self, first_epoch: int, first_batch: int, epochs: int, batches_per_epoch: int) -> None:
        self.first_epoch, self.first_batch = first_epoch, first_batch
        self.epochs, self.batches_per_epoch = epochs, batches_per_epoch

    def __iter__(self) -> Iterator[tuple[int, int]]:
        for epoch in range(self.first_epoch, self.epochs):
            start = self.first_batch if epoch == self.first_epoch else 0
            for index in range(start, self.batches_per_epoch):
                yield epoch, index

    def __len__(self) -> int:
        return max(0, (self.epochs - self.first_epoch) * self.batches_per_epoch - self.first_batch)


def training_loader(
    recipe: BatchRecipe, first_epoch: int, first_batch: int, epochs: int, workers: int, pin_memory: bool
) -> DataLoader:
    """The run's batches from (first_epoch, first_batch) on, made by `workers` spawned processes (0: in this
    process, for tests and debugging)."""
    return DataLoader(
        TrainingBatches(recipe),
        batch_size=None,  # each position is already a whole batch
        sampler=RunPositions(first_epoch, first_batch, epochs, recipe.batches_per_epoch),
        num_workers=workers,
        multiprocessing_context=helper_spawn_context() if workers else None,
        prefetch_factor=4 if workers else None,
        pin_memory=pin_memory,
    )


__all__ = ["BatchRecipe", "TrainingBatches", "crops", "epoch_order", "training_loader"]
