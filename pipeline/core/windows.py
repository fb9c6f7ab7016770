"""Windows: how spans of audio become scores, the part of inference that training's validation shares.

A span is a whole file or a part of one (a 5 s chunk of a soundscape). Its samples are cut into fixed-length
windows exactly like the training crops (`span_windows`, `WindowPlan`), batched densely across files
(`run_windows`: every batch the same shape, so GPU kernels are reused), embedded, and pooled per span
(`SpanPooling`):

    mean      the weighted mean of the windows' unit embeddings, scored by the cosine classifier (a file's
              prediction: it is what SpeechBrain's EncoderClassifier computes from an artifact); each window
              weighs its valid share of a full window, and in a whole file also its energy relative to the
              loudest window's (`WindowPlan.energy_weighted`: as training draws a long clip's crops)
    max       the highest cosine score of each class over the span's windows (a call anywhere in the chunk)
    mean_max  the average of the windows' mean cosine score and their maximum, per class

A whole file may also be read at other speeds (`WindowPlan.speeds`: those a model trained with speed perturbation
heard; data.file_windows): each speed's windows join the file's span, every view weighing alike in its mean.

With a `centre` (the training clips' mean embedding, which an aam artifact carries), every pooling scores
unit embeddings minus the centre: the direction all clips share is taken out of the cosine, as speaker
verification subtracts its training mean before cosine scoring (docs/measurements.md: ESC-10).

Validation (pipeline/training/validation.py) scores held-out files through these functions, so it measures
what the infer stage computes; pipeline/inference/predict.py decodes test files and runs them on the
session's devices. This module never imports torch_xla.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field

import numpy as np
import torch

from .buckets import Buckets, length_groups
from .config import ENERGY_WEIGHTED_WINDOWS, MAX_WINDOWS_PER_FILE, QUIET_WINDOW_DB, TrainConfig
from .data import file_windows, windows
from .model import ModelConfig, SpeakerClassifier, add_windows, embed_waveforms
from .progress import heartbeat, progress_bar

POOLINGS = ("mean", "max", "mean_max")
# The problem of a file the deadline left unpredicted: a choice of the user's, not a flaw of the input.
TIME_LIMIT_PROBLEM = "time limit: not predicted"
# The deadline is kept with this margin over the measured cost of what is still to compute.
DEADLINE_SAFETY = 1.5


@dataclass(frozen=True)
class Span:
    """Seconds [start, end) of file `file` (an index into the files predicted); `end` None: to the file's end,
    covered by at most `max_windows` evenly spaced windows (a whole-file prediction)."""

    file: int
    start: float = 0.0
    end: float | None = None


def chunk_hop(window: int, hop_seconds: float | None, sample_rate: int) -> int:
    """Samples between a chunk's windows: `hop_seconds`, or by default half a window."""
    return int(round(hop_seconds * sample_rate)) if hop_seconds else max(1, window // 2)


@dataclass(frozen=True)
class WindowPlan:
    """How spans are cut into windows and batched."""

    window: int  # samples per window (the model's training crop)
    sample_rate: int
    batch_windows: int
    max_windows: int = MAX_WINDOWS_PER_FILE  # per whole-file span
    hop: int | None = None  # samples between the windows of a chunk span (None: as many as cover it)
    # Windows shorter than `window` run at the shortest of this many tensor lengths that holds them
    # (pipeline/core/buckets.py); 1: every window at full length, as training pads it.
    length_buckets: int = 1
    file_hop: int | None = None  # samples between a whole-file span's windows (None: as many as cover it)
    # A whole file's windows this far below its loudest are left out (data.windows).
    quiet_db: float | None = None
    # A whole file's windows weigh their energy in its pooling (data.energy_weights); a chunk's weigh alike.
    energy_weighted: bool = False
    # A whole file is also played at these speeds, each view's windows pooled into its mean (data.file_windows);
    # (1.0,): the file as it is. Chunks are never played at other speeds.
    speeds: tuple[float, ...] = (1.0,)

    @classmethod
    def for_model(
        cls,
        model: ModelConfig | TrainConfig,
        batch_windows: int,
        *,
        max_windows_per_file: int = MAX_WINDOWS_PER_FILE,
        window_hop_seconds: float | None = None,
        tiled: bool = True,
        clip_hop_seconds: float | None = None,
        length_buckets: int = 1,
        quiet_window_db: float | None = QUIET_WINDOW_DB,
        energy_weighted_windows: bool = ENERGY_WEIGHTED_WINDOWS,
        speeds: tuple[float, ...] = (1.0,),
    ) -> WindowPlan:
        """The plan of a model's windows (`model`: its ModelConfig, or the TrainConfig it is built from), the
        choices named and defaulted as the infer notebook's (InferConfig): a caller that leaves one out
        computes what the infer stage computes by default. A chunk's windows lie `window_hop_seconds` apart
        (None: half a window); a whole file's windows tile it, or when not `tiled` lie `clip_hop_seconds`
        apart (None: half a window), at most `max_windows_per_file` of them, quiet ones left out, weighted by
        their energy, the file read at each of `speeds`. Only `length_buckets` defaults otherwise: 1, every
        window at full length as training pads it (the infer stage's buckets save compute on short clips,
        scoring within 1e-5 of full windows; validation on XLA wants one batch shape)."""
        window, rate = model.window_samples, model.sample_rate
        return cls(
            window=window,
            sample_rate=rate,
            batch_windows=batch_windows,
            max_windows=max_windows_per_file,
            hop=chunk_hop(window, window_hop_seconds, rate),
            length_buckets=length_buckets,
            file_hop=None if tiled else chunk_hop(window, clip_hop_seconds, rate),
            quiet_db=quiet_window_db,
            energy_weighted=energy_weighted_windows,
            speeds=speeds,
        )

    def buckets(self) -> Buckets | None:
        count = self.length_buckets
        return Buckets.plan(self.window, self.sample_rate, count) if count > 1 else None


@dataclass
class FileWindows:
    """One file's windows for all of its spans (made in a DataLoader worker)."""

    index: int  # the file
    windows: np.ndarray | None  # [n, window] float32, None when the file could not be used
    lens: np.ndarray | None  # [n] relative lengths
    owner: np.ndarray | None  # [n] the span each window belongs to
    weights: np.ndarray | None = None  # [n] each window's weight in its span's pooling (None: `lens`)
    problem: str | None = None  # why the file's spans fall back
    repairs: list[str] = field(default_factory=list)
    seconds: float = 0.0  # audio decoded


@dataclass(frozen=True)
class SpanPredictions:
    pooled: dict[str, np.ndarray]  # pooling -> [n_spans, n_classes] cosine scores (NaN rows where not ok)
    embeddings: np.ndarray  # [n_spans, emb_dim] mean unit window embedding
    ok: np.ndarray  # [n_spans] bool: a real prediction was made
    problems: dict[int, str]  # file index -> why its spans fell back
    repairs: dict[int, list[str]]  # file index -> what was repaired
    audio_seconds: float = 0.0  # audio predicted
    seconds: float = 0.0  # time spent predicting it
    stopped: str | None = None  # why prediction stopped before every file (the deadline)
    seen: frozenset[int] = frozenset()  # the files taken or found unusable before any stop

    @property
    def scores(self) -> np.ndarray:
        """Whole-file scores: the mean pooling."""
        return self.pooled["mean"]


@torch.inference_mode()
def embed_windows(
    model: SpeakerClassifier, wavs: torch.Tensor, lens: torch.Tensor, device: torch.device
) -> torch.Tensor:
    """Embeddings [n, D] of one batch of windows at inference, returned on CPU in fp32: fp16 autocast on CUDA
    (T4 tensor cores; the Fbank front end stays in fp32, see model.py)."""
    fp16 = torch.autocast(device_type="cuda", dtype=torch.float16) if device.type == "cuda" else None
    return embed_waveforms(model, wavs, lens, device, fp16)


class SpanPooling:
    """Running per-span sums and maxima of window embeddings and scores (windows of a span may come in several
    batches)."""

    def __init__(
        self, n_spans: int, emb_dim: int, class_weight: torch.Tensor, centre: torch.Tensor | None = None
    ) -> None:
        self.unit_classes = torch.nn.functional.normalize(class_weight.detach().float().cpu(), dim=1)
        self.centre = None if centre is None else centre.detach().float().cpu()
        self.emb_sum = torch.zeros(n_spans, emb_dim)
        self.weight = torch.zeros(n_spans)
        self.score_sum = torch.zeros(n_spans, len(self.unit_classes))
        self.score_max = torch.full_like(self.score_sum, -torch.inf)

    def add(self, embeddings: torch.Tensor, weights: torch.Tensor, owner: torch.Tensor) -> None:
        add_windows(self.emb_sum, self.weight, embeddings, weights, owner)
        scores = cosine_scores(embeddings, self.unit_classes, self.centre)
        self.score_sum.index_add_(0, owner, scores * weights.float()[:, None])
        self.score_max.scatter_reduce_(0, owner[:, None].expand_as(scores), scores, reduce="amax")

    def result(self) -> tuple[dict[str, np.ndarray], np.ndarray, np.ndarray]:
        ok = self.weight > 0
        embeddings = torch.full(self.emb_sum.shape, float("nan"))
        embeddings[ok] = self.emb_sum[ok] / self.weight[ok][:, None]
        mean_score = self.score_sum / self.weight.clamp_min(1e-12)[:, None]
        pooled = {
            "mean": cosine_scores(embeddings, self.unit_classes, self.centre),
            "max": self.score_max,
            "mean_max": 0.5 * (mean_score + self.score_max),
        }
        for scores in pooled.values():
            scores[~ok] = float("nan")
        return {k: v.numpy().astype(np.float32) for k, v in pooled.items()}, embeddings.numpy(), ok.numpy()


def cosine_scores(
    embeddings: torch.Tensor, unit_classes: torch.Tensor, centre: torch.Tensor | None = None
) -> torch.Tensor:
    """Cosine of each embedding with each class centre, in fp32 on the host (what SpeechBrain's classify_batch
    returns for one embedding); with a `centre`, of each unit embedding minus it."""
    unit = torch.nn.functional.normalize(embeddings.float(), dim=1)
    if centre is not None:
        unit = torch.nn.functional.normalize(unit - centre, dim=1)
    return torch.nn.functional.linear(unit, unit_classes)


def run_windows(
    model: SpeakerClassifier,
    items: Iterator[FileWindows],
    n_spans: int,
    plan: WindowPlan,
    device: torch.device,
    *,
    progress: bool = False,
    embed: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None,
    n_files: int | None = None,
    deadline: float | None = None,
    centre: torch.Tensor | None = None,
) -> SpanPredictions:
    """Consume per-file windows, batch them densely, and pool window embeddings back to their spans.

    `embed(wavs, lens)` computes a batch's window embeddings on the host (default: `embed_windows` on
    `device`; training's validation passes its strategy's, which pads batches to one shape on XLA). Batches
    hold `plan.batch_windows` full windows. With the plan's length buckets, a window shorter than the model's
    runs at its bucket's tensor length, batched with windows of that length (as many windows per batch as
    keep the batch's samples at `plan.batch_windows` full windows); the pooling still weighs every window by
    its valid share of a full window. With a `deadline` (time.time()), a file is taken only while the
    measured seconds per window say that it and the windows already waiting finish before it (with
    DEADLINE_SAFETY); the files left have no predictions. `centre`: see SpanPooling."""
    embed = embed or (lambda wavs, lens: embed_windows(model, wavs, lens, device))
    window = model.config.window_samples
    batch_windows, buckets = plan.batch_windows, plan.buckets()
    # CUDA: every batch is staged in one page-locked buffer, so the copy to the GPU is a DMA that needs no
    # pageable bounce (batches are assembled here from several files' windows, so pinning each file's
    # windows in the DataLoader would not help). The embeddings' copy back to the host ends each batch:
    # the buffer is free again before the next one is staged.
    staging = None
    pooling = SpanPooling(n_spans, model.config.embedding_size, model.class_centres(), centre)
    problems: dict[int, str] = {}
    repairs: dict[int, list[str]] = {}
    pending: dict[int, list[tuple[np.ndarray, ...]]] = {}  # tensor length -> windows (see _by_length)
    started = time.perf_counter()
    computed = {"windows": 0, "seconds": 0.0}
    audio_seconds = 0.0
    stopped = None
    seen: set[int] = set()

    def batch_size(length: int) -> int:
        return max(1, batch_windows * window // length)

    def flush(length: int, full_only: bool) -> None:
        """Run full batches (or everything) of the pending windows of one tensor length."""
        nonlocal staging
        wavs, lens_at, owner, weights = (np.concatenate(part) for part in zip(*pending[length], strict=True))
        size = batch_size(length)
        stop = (len(wavs) // size) * size if full_only else len(wavs)
        for start in range(0, stop, size):
            end = min(start + size, stop)
            began = time.perf_counter()
            model_lens = torch.from_numpy(lens_at[start:end])
            batch = torch.from_numpy(wavs[start:end])
            if device.type == "cuda":
                if staging is None:
                    staging = torch.empty(batch_windows * window, pin_memory=True)
                batch = staging[: batch.numel()].view(batch.shape).copy_(batch)
            # Pooled by the window's weight (its valid share of a full window, whatever length it ran at).
            pooling.add(
                embed(batch, model_lens),
                torch.from_numpy(weights[start:end]),
                torch.from_numpy(owner[start:end]),
            )
            computed["windows"] += end - start
            computed["seconds"] += time.perf_counter() - began
            heartbeat()  # progress, for the launcher's stall check when this runs in a device worker
        pending[length] = [(wavs[stop:], lens_at[stop:], owner[stop:], weights[stop:])]

    def waiting() -> int:
        return sum(len(part[0]) for parts in pending.values() for part in parts)

    bar = progress_bar(n_files if n_files is not None else n_spans, "infer", "file", progress)
    for item in items:
        if item.windows is None:
            problems[item.index] = item.problem or "unusable"
            seen.add(item.index)
        elif deadline is not None and not _fits(deadline, waiting() + len(item.windows), computed, started):
            stopped = (
                f"time limit: stopped before the file's windows would end after the deadline "
                f"({computed['windows']} windows predicted at "
                f"{computed['seconds'] / max(1, computed['windows']) * 1000:.1f} ms each)"
            )
            problems[item.index] = TIME_LIMIT_PROBLEM
            break
        else:
            seen.add(item.index)
            if item.repairs:
                repairs[item.index] = item.repairs
            audio_seconds += item.seconds
            for length, part in _by_length(item, buckets, window):
                pending.setdefault(length, []).append(part)
                if sum(len(p[0]) for p in pending[length]) >= batch_size(length):
                    flush(length, full_only=True)
        if bar is not None:
            bar.update(1)
    for length in sorted(pending, reverse=True):
        flush(length, full_only=False)
    if bar is not None:
        bar.close()
    pooled = pooling.result()  # (pooled scores, embeddings, ok): the first three fields
    seconds = time.perf_counter() - started
    return SpanPredictions(*pooled, problems, repairs, audio_seconds, seconds, stopped, frozenset(seen))


def _by_length(
    item: FileWindows, buckets: Buckets | None, window: int
) -> Iterator[tuple[int, tuple[np.ndarray, ...]]]:
    """A file's windows grouped by the tensor length they run at: (length, (wavs [n, length], relative lengths
    at `length`, owner, pooling weights))."""
    wavs, lens, owner = np.asarray(item.windows), np.asarray(item.lens), np.asarray(item.owner)
    weights = lens if item.weights is None else np.asarray(item.weights, dtype=np.float32)
    for length, chosen, lens_at in length_groups(lens, window, buckets):
        if len(chosen) == len(lens):  # one group: every window at this length, no copy needed
            yield length, (wavs[:, :length], lens_at, owner, weights)
        else:
            yield (
                length,
                (np.ascontiguousarray(wavs[chosen, :length]), lens_at, owner[chosen], weights[chosen]),
            )


def _fits(deadline: float, windows: int, computed: dict[str, float], started: float) -> bool:
    """Whether `windows` more windows finish before `deadline` at the rate measured so far: wall time per
    window, decoding and waiting included (the first file is always taken: there is no rate yet)."""
    if computed["windows"] == 0:
        return time.time() < deadline
    per_window = (time.perf_counter() - started) / computed["windows"]
    return time.time() + DEADLINE_SAFETY * windows * per_window < deadline


def span_windows(
    samples: np.ndarray, spans: Sequence[tuple[int, float, float | None]], plan: WindowPlan
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The windows of a decoded file's spans ((span index, start s, end s)): [n, window], [n] relative lengths,
    [n] owning span, [n] pooling weights. A span past the decoded audio has no window (it keeps no prediction)."""
    cuts = []  # each span's (windows, relative lengths, owner, pooling weights)
    for span_index, start, end in spans:
        first = int(round(start * plan.sample_rate))
        if end is None:
            part = samples[first:]
            if part.size == 0:
                continue
            wavs, rel, weights = file_windows(
                part,
                plan.window,
                plan.max_windows,
                plan.file_hop,
                plan.quiet_db,
                plan.energy_weighted,
                plan.speeds,
            )
        else:
            part = samples[first : int(round(end * plan.sample_rate))]
            if part.size == 0:
                continue
            wavs, rel = windows(part, plan.window, 1 << 30, plan.hop)
            weights = rel
        cuts.append((wavs, rel, np.full(len(wavs), span_index, dtype=np.int64), weights))
    if not cuts:
        empty = np.zeros(0, np.float32)
        return np.zeros((0, plan.window), np.float32), empty, np.zeros(0, np.int64), empty
    return tuple(np.concatenate(column) for column in zip(*cuts, strict=True))
