"""Validation during training: the kept weights, their BatchNorm statistics, and how they score held-out files.

Files are read from the audio cache one at a time and cut into the windows inference uses, so nothing holds the
validation split in memory. Each process validates its own share of the files on its own device (the batch
shape fixed on XLA, so one graph serves every batch) and the per-file results are summed across processes:
every rank ends with the same predictions, and so the same best-epoch decision.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import torch

from ..core import metrics
from ..core.config import DEFAULT_CHUNK_POOLING, TEST_TIME_SPEEDS, TrainConfig
from ..core.objectives import validation_loss
from ..core.windows import FileWindows, WindowPlan, run_windows, span_windows
from ..devices.strategy import Strategy
from .batches import crops
from .ema import WeightAverage, recompute_batchnorm
from .store import AudioStore

if TYPE_CHECKING:
    from .dataset import LabelledSoundscapes, TrainingData

# Windows per validation batch: a multiple of 8 (the XLA mesh splits it evenly), large enough for the devices.
VALIDATION_BATCH = 64
CPU = torch.device("cpu")
Embed = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]  # (wavs, lens) -> window embeddings on the host


@dataclass
class Validation:
    """One epoch's validation: metrics for the history, the predicted class of every validation file."""

    metrics: dict[str, float]
    predictions: np.ndarray  # [n_val] class index, in validation-split order


def recalibrates(config: TrainConfig) -> bool:
    """Whether validation gives the weights it validates BatchNorm statistics of their own (see ema.py)."""
    return config.bn_calibration_windows > 0 and not config.freeze_encoder


def calibration_windows(
    store: AudioStore, items: np.ndarray, train_idx: list[int], config: TrainConfig
) -> tuple[torch.Tensor, torch.Tensor] | None:
    """A fixed sample of training crops for recompute_batchnorm: the same every epoch and on every rank.
    None with freeze_encoder: the pretrained encoder's weights and statistics are kept exactly as they are."""
    if not recalibrates(config) or not train_idx:
        return None
    return sampled_crops(store, items, train_idx, config.bn_calibration_windows, config, salt=104729)


def sampled_crops(
    store: AudioStore, items: np.ndarray, rows: list[int], count: int, config: TrainConfig, salt: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Crops (waveforms, relative lengths) of up to `count` of `rows`, one each, drawn with the run's seed and
    `salt`: the same every time they are drawn."""
    rng = np.random.default_rng([config.seed, salt])
    chosen = rng.choice(np.asarray(rows), size=min(count, len(rows)), replace=False)
    return crops(store, items[chosen], config.window_samples, rng, on_sound=config.crop_on_sound)[:2]


def validation_model(
    model: torch.nn.Module, average: WeightAverage | None, strategy: Strategy, calibration
) -> torch.nn.Module:
    """The weights an epoch validates and may keep (the average, else the model itself), on the training
    device, in eval mode, with BatchNorm statistics of their own (computed in one batch: on XLA one graph)."""
    kept = average.module if average is not None else strategy.unwrap(model)
    if calibration is not None:  # (wavs, lens)
        recompute_batchnorm(kept, *calibration, forward=functools.partial(strategy.embeddings, kept))
    strategy.sync_buffers(kept)  # DDP: every rank validates (and may keep) exactly rank 0's statistics
    return kept.eval()


def evaluate(
    model: torch.nn.Module, strategy: Strategy, data: TrainingData, config: TrainConfig, metric: str
) -> Validation | None:
    """Validation exactly as at inference (windowed, length-weighted) of `model` (unwrapped, on the strategy's
    device) on the held-out files, and on the labelled soundscape chunks if there are any; None with neither.
    Every process scores its share; the scores are summed across processes, so every rank computes the same
    metrics from all of them."""
    if not data.val_idx and data.soundscapes is None:
        return None
    values: dict[str, float] = {}
    predicted = np.zeros(0, dtype=np.int64)
    if data.val_idx:
        scores = _scores_of_all(file_scores, model, strategy, data, len(data.val_idx), config)
        truth = data.truth(data.val_idx)
        losses = validation_loss(
            data.objective, torch.from_numpy(scores), torch.from_numpy(truth), config.aam_scale
        )
        values["val_accuracy"] = metrics.score("accuracy", truth, scores)
        values["val_loss"] = float(losses.mean())
        if metric != "accuracy":
            values[f"val_{metric}"] = score_or_nan(metric, truth, scores)
        values[f"val_{metric}_se"] = metrics.standard_error(metric, truth, scores)  # for is_better
        predicted = scores.argmax(axis=1)
    if (scapes := data.soundscapes) is not None:
        chunks = _scores_of_all(chunk_scores, model, strategy, scapes, len(scapes.items), config)
        values[f"val_soundscape_{metric}"] = score_or_nan(metric, scapes.truth, chunks)
        values[f"val_soundscape_{metric}_se"] = metrics.standard_error(metric, scapes.truth, chunks)
    return Validation(values, predicted)


def _scores_of_all(
    score, model: torch.nn.Module, strategy: Strategy, source, count: int, config: TrainConfig
) -> np.ndarray:
    """`score` (file_scores or chunk_scores) of all `count` rows of `source`: each process scores its share on
    its device, and the shares are summed across processes (other processes' rows are zeros here)."""
    mine = strategy.shard(list(range(count)))
    embed = functools.partial(strategy.embeddings, model, pad_to=VALIDATION_BATCH)
    return strategy.sum_across(score(model, source, config, embed, mine, strategy.device)).numpy()


def test_time_speeds(config: TrainConfig) -> tuple[float, ...]:
    """The speeds the infer stage reads a whole file at by default (its artifact records them): those a model
    trained with speed perturbation heard its classes at (InferConfig.test_time_speeds: ESC-10 +0.004 over four
    seeds through the notebooks); (1.0,), the file as it is, for any other model."""
    return TEST_TIME_SPEEDS if config.speed_probability else (1.0,)


def file_scores(
    model: torch.nn.Module,
    data: TrainingData,
    config: TrainConfig,
    embed: Embed,
    positions: list[int] | None = None,
    device: torch.device = CPU,
) -> torch.Tensor:
    """[validation files, classes] float64 cosine scores of the held-out files at `positions` in val_idx
    (default: all of them), their windows embedded by `embed(wavs, lens)` (on `device`); other rows are 0."""
    val_idx = data.val_idx
    mine = list(range(len(val_idx))) if positions is None else positions
    # The infer stage's defaults (for_model's: max windows, quiet windows, energy weights) and its speeds:
    # selection measures what it computes.
    plan = WindowPlan.for_model(config, VALIDATION_BATCH, speeds=test_time_speeds(config))

    with torch.inference_mode():
        files = _whole_files(data, [val_idx[position] for position in mine], plan)
        predictions = run_windows(model, files, len(mine), plan, device, embed=embed)
    scores = torch.zeros(len(val_idx), len(data.labels), dtype=torch.float64)
    if mine:
        scores[mine] = torch.from_numpy(predictions.scores).double()
    return scores


def _whole_files(data: TrainingData, rows: list[int], plan: WindowPlan) -> Iterator[FileWindows]:
    """The windows of the table's `rows`, read from the cache one at a time, each file one span."""
    for k, row in enumerate(rows):
        yield FileWindows(k, *span_windows(data.store.read(int(data.items[row])), [(k, 0.0, None)], plan))


# The artifact's embedding centre is the mean over this many training files (evenly spaced), of at most this many
# windows each: a mean of 256 unit vectors, within ~1/16 of their spread of the whole table's; ~10 s on 2 cores
# for ESC-10's 'medium' model.
CENTRE_FILES = 256
CENTRE_WINDOWS_PER_FILE = 8


def spread_evenly(rows: list[int], count: int) -> list[int]:
    """At most `count` of `rows`, evenly spaced from the first to the last (tables are often sorted by class: a
    stride cut off at `count` would leave the last classes out)."""
    return [
        rows[i] for i in np.unique(np.linspace(0, len(rows) - 1, min(count, len(rows))).round().astype(int))
    ]


def embedding_centre(model: torch.nn.Module, data: TrainingData, config: TrainConfig) -> list[float] | None:
    """The mean of training files' unit embeddings, each computed as inference computes a file's (its windows'
    weighted mean unit embedding, quiet windows left out) by `model` on the host: what inference subtracts before its
    cosines (core/windows.py). None unless config.centre_embeddings (training/plan.py decides an auto one) and
    the objective is aam (one class per clip, the cosine classifier).
    Files are read as they are, not at the test-time speeds as well: the speed views gained with this centre
    (docs/measurements.md) and would cost the pass five times its time."""
    if not config.centre_embeddings or data.objective != "aam" or not data.train_idx:
        return None
    chosen = spread_evenly(data.train_idx, CENTRE_FILES)
    plan = WindowPlan.for_model(config, VALIDATION_BATCH, max_windows_per_file=CENTRE_WINDOWS_PER_FILE)

    with torch.inference_mode():
        found = run_windows(model, _whole_files(data, chosen, plan), len(chosen), plan, CPU)
    unit = torch.nn.functional.normalize(torch.from_numpy(found.embeddings[found.ok]), dim=1)
    return unit.mean(dim=0).tolist()


def chunk_scores(
    model: torch.nn.Module,
    chunks: LabelledSoundscapes,
    config: TrainConfig,
    embed: Embed,
    positions: list[int] | None = None,
    device: torch.device = CPU,
) -> torch.Tensor:
    """[chunks, classes] float64 cosine scores of the labelled soundscape chunks at `positions` (default: all),
    their windows embedded by `embed(wavs, lens)` (on `device`); other rows are 0. Computed as the infer
    notebook's defaults compute a chunk's: windows half a window apart, pooled by the default chunk_pooling."""
    pooling = DEFAULT_CHUNK_POOLING
    # A chunk is never a whole file: the whole-file choices (quiet windows, energy weights) are off.
    plan = WindowPlan.for_model(config, VALIDATION_BATCH, quiet_window_db=None, energy_weighted_windows=False)
    mine = list(range(len(chunks.items))) if positions is None else positions
    rate = config.sample_rate

    def spans():
        for k, chunk in enumerate(mine):
            item, start, end = int(chunks.items[chunk]), chunks.starts[chunk], chunks.ends[chunk]
            samples = chunks.store.read(item, int(round(start * rate)), int(round(end * rate)))
            yield FileWindows(k, *span_windows(samples, [(k, 0.0, end - start)], plan))

    with torch.inference_mode():
        predictions = run_windows(model, spans(), len(mine), plan, device, embed=embed)
    scores = torch.zeros(len(chunks.items), chunks.truth.shape[1], dtype=torch.float64)
    if mine:
        scores[mine] = torch.from_numpy(np.nan_to_num(predictions.pooled[pooling], nan=-1.0)).double()
    return scores


def score_or_nan(metric: str, truth: np.ndarray, scores: np.ndarray) -> float:
    try:
        return metrics.score(metric, truth, scores)
    except metrics.MetricError:  # e.g. no class with both positive and negative held-out rows
        return float("nan")
