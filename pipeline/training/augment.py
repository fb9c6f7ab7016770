"""Training-crop augmentation, run in the DataLoader workers (pipeline/training/batches.py) on the host.

The focal -> soundscape shift: BirdCLEF trains on focal recordings (one bird, close, clean) and scores
soundscapes (far, noisy, several birds or none). Each augmentation here narrows one side of that gap:

    noise      a crop of a background recording (`noise_dir`: the competition's unlabelled soundscapes) added
               at a random SNR -- SpeechBrain's AddNoise does the mixing
    mix        a second training crop added at a random level, the batch row then has the union of both
               crops' labels (multi-label objectives only: one class per clip cannot hold two)
    blend      between-class mixing for one-label objectives (Tokozume et al., ICLR 2018, "BC learning"):
               two crops at a random ratio r of their loudness, the target r of one class and 1 - r of the
               other (the aam objective takes soft targets); labels leave as [B, classes] rows
    background a crop replaced by background alone, with no label (multi-label objectives only): most of a
               soundscape is no call at all, and a model that only ever saw calls scores some class on it
    targets    self-training: a stretch of an unlabelled soundscape, with a teacher's soft targets, added to
               the crop at equal loudness; the crop's target is the union (maximum) of both (multi-label only)
    speed      a crop played 0.8-1.25x as fast, pitch with it (linear interpolation: EnvNet-v2's "scale"
               augmentation, Tokozume et al. 2018): one recording's dog barks or sneezes at other speeds
    time mask  SpeechBrain's DropChunk: short stretches set to silence
    freq mask  SpeechBrain's DropFreq: narrow frequency bands notched out

No gain augmentation: the front end's sentence mean normalisation subtracts each log-mel band's mean over
the window, so a constant gain changes nothing the model sees (tests/training/test_augment.py checks it).

Each batch's augmentation is a function of the batch's seed, like its crops: resumed runs and any number of
workers see the same batches.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from ..core.data import play_at
from .store import AudioStore


@dataclass(frozen=True)
class SoundscapeTargets:
    """Stretches of soundscapes with soft targets (TrainConfig.soundscape_targets after its controls), their
    audio in `store`."""

    store: AudioStore
    items: np.ndarray  # the cache index of each stretch's soundscape
    starts: np.ndarray  # samples
    ends: np.ndarray  # samples
    probs: np.ndarray  # [stretches, classes] float32

    def __len__(self) -> int:
        return len(self.items)


@dataclass(frozen=True)
class FocalTargets:
    """A teacher's probabilities over the windows of each training recording (TrainConfig.focal_targets:
    distillation, or self-distillation from the last round): a crop's target becomes (1 - weight) x its own
    label + weight x the teacher's window whose centre is nearest the crop's. Rows of the training table the
    file does not cover keep their labels.

    A teacher that does not know every class (a pretrained model: `known`) says nothing of the others: a crop
    of a class it lacks keeps its label, and a class it lacks keeps its label's value in a multi-label
    target. For one-label targets (`one_label`, the aam objective) its window becomes a distribution: its
    probabilities of the classes it knows (scaled to sum to at most 1), the rest on the crop's own label -- a
    window where it hears none of its classes teaches the label alone."""

    first: np.ndarray  # [rows + 1]: training row r's windows are first[r]:first[r + 1]
    centres: np.ndarray  # [windows] samples
    probs: np.ndarray  # [windows, classes] float32
    weight: float
    known: np.ndarray | None = None  # [classes] bool (None: every class)
    one_label: bool = False

    def apply(self, rows: np.ndarray, starts: np.ndarray, window: int, labels: torch.Tensor) -> torch.Tensor:
        """Targets [B, classes] of crops of training `rows` starting at `starts` (labels: classes [B] or
        targets [B, classes])."""
        out = _soft(labels, self.probs.shape[1]).clone()
        known = None if self.known is None else torch.from_numpy(self.known)
        for k, (row, start) in enumerate(zip(rows.tolist(), starts.tolist(), strict=True)):
            first, last = int(self.first[row]), int(self.first[row + 1])
            if last <= first:
                continue
            nearest = first + int(np.abs(self.centres[first:last] - (start + window / 2)).argmin())
            teacher = torch.from_numpy(self.probs[nearest]).to(out.dtype)
            if self.one_label:
                if known is not None and not bool(known[int(out[k].argmax())]):
                    continue  # a class the teacher lacks learns from its label alone
                # A softmax teacher's window sums to 1 (this is then the plain mix); a sigmoid teacher's may not.
                heard = teacher / max(1.0, float(teacher.sum()))
                out[k] = (1 - self.weight) * out[k] + self.weight * (heard + (1 - heard.sum()) * out[k])
            else:
                mixed = (1 - self.weight) * out[k] + self.weight * teacher
                out[k] = mixed if known is None else torch.where(known, mixed, out[k])
        return out


@dataclass(frozen=True)
class Augmentation:
    """TrainConfig's augmentation fields, with the background recordings' cache (pickled to every worker)."""

    noise: AudioStore | None = None
    noise_probability: float = 0.0
    noise_snr_db: tuple[float, float] = (0.0, 15.0)
    mix_probability: float = 0.0
    background_probability: float = 0.0
    speed_probability: float = 0.0
    time_mask_probability: float = 0.0
    freq_mask_probability: float = 0.0
    targets: SoundscapeTargets | None = None
    target_probability: float = 0.0
    blend_probability: float = 0.0
    classes: int = 0  # blend: the width of the soft targets one-label rows become
    multi_label: bool = True  # False: the aam objective's rows, one class each (the blend is theirs)

    @property
    def active(self) -> bool:
        return bool(self._parts())

    def describe(self) -> str:
        return "augmentation: " + ("; ".join(self._parts()) or "none")

    def _parts(self) -> list[str]:
        """What is applied, a phrase each: nothing when no probability is set (or its audio is missing)."""
        parts = []
        if self.noise is not None and self.noise_probability:
            parts.append(
                f"background noise on {self.noise_probability:.0%} of crops ({len(self.noise)} recordings, "
                f"SNR {self.noise_snr_db[0]:g}-{self.noise_snr_db[1]:g} dB)"
            )
        if self.mix_probability:
            parts.append(f"two crops mixed on {self.mix_probability:.0%}")
        if self.blend_probability and self.classes:
            parts.append(
                f"two clips' crops blended at a random ratio, targets in that ratio, on "
                f"{self.blend_probability:.0%}"
            )
        if self.noise is not None and self.background_probability:
            parts.append(f"{self.background_probability:.0%} of crops background alone, with no label")
        if self.targets is not None and self.target_probability:
            parts.append(
                f"a soundscape stretch with its soft targets mixed into {self.target_probability:.0%} "
                f"({len(self.targets)} stretches)"
            )
        if self.speed_probability:
            parts.append(f"speed {SPEED_RANGE[0]:g}-{SPEED_RANGE[1]:g}x on {self.speed_probability:.0%}")
        if self.time_mask_probability:
            parts.append(f"time masks on {self.time_mask_probability:.0%}")
        if self.freq_mask_probability:
            parts.append(f"frequency masks on {self.freq_mask_probability:.0%}")
        return parts


def augment(
    wavs: torch.Tensor, lens: torch.Tensor, labels: torch.Tensor, rng: np.random.Generator, plan: Augmentation
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The batch's crops [B, T], relative lengths [B] and labels ([B] classes or [B, C] targets), augmented.
    Draws only from `rng` (SpeechBrain's modules draw from torch's generator, seeded from it here)."""
    from speechbrain.augment.time_domain import AddNoise, DropChunk, DropFreq

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(int(rng.integers(2**31)))
        if plan.speed_probability:  # first: a recording's own speed, before it is mixed with anything
            wavs, lens = _speed(wavs, lens, rng, plan.speed_probability)
        if plan.blend_probability and plan.classes and not plan.multi_label:
            wavs, lens, labels = _blend(wavs, lens, labels, rng, plan.blend_probability, plan.classes)
        elif plan.mix_probability and labels.ndim == 2:
            wavs, lens, labels = _mix(wavs, lens, labels, rng, plan.mix_probability)
        if plan.targets is not None and plan.target_probability and labels.ndim == 2:
            wavs, lens, labels = _mix_targets(wavs, lens, labels, rng, plan.targets, plan.target_probability)
        if plan.noise is not None and plan.background_probability and labels.ndim == 2:
            if len(rows := _chosen(rng, len(wavs), plan.background_probability)):
                wavs, lens, labels = wavs.clone(), lens.clone(), labels.clone()
                wavs[rows] = _noise_crops(plan.noise, len(rows), wavs.shape[1], rng)
                lens[rows], labels[rows] = 1.0, 0.0
        if plan.noise is not None and len(rows := _chosen(rng, len(wavs), plan.noise_probability)):
            noise = _noise_crops(plan.noise, len(rows), wavs.shape[1], rng)
            adder = AddNoise(
                snr_low=plan.noise_snr_db[0],
                snr_high=plan.noise_snr_db[1],
                noise_funct=lambda _, noise=noise: noise,
            )
            wavs[rows] = adder(wavs[rows], lens[rows])
        if len(rows := _chosen(rng, len(wavs), plan.time_mask_probability)):
            window = wavs.shape[1]
            dropper = DropChunk(
                drop_length_low=window // 20,
                drop_length_high=window // 8,
                drop_count_low=1,
                drop_count_high=3,
            )
            wavs[rows] = dropper(wavs[rows], lens[rows])
        if len(rows := _chosen(rng, len(wavs), plan.freq_mask_probability)):
            wavs[rows] = DropFreq(drop_freq_count_low=1, drop_freq_count_high=3)(wavs[rows])
    return wavs, lens, labels


SPEED_RANGE = (0.8, 1.25)  # EnvNet-v2's scale augmentation; log-uniform, so as many crops faster as slower


def _speed(
    wavs: torch.Tensor, lens: torch.Tensor, rng: np.random.Generator, probability: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows chosen with `probability` resampled to a random speed factor s (duration x 1/s, pitch x s). A slower
    crop is longer than the window: a random window of it is kept. A faster one is shorter: it is zero-padded
    and its relative length says so, as a short clip's does (the front end and pooling ignore the padding)."""
    if not len(rows := _chosen(rng, len(wavs), probability)):
        return wavs, lens
    window = wavs.shape[1]
    speeds = np.exp(rng.uniform(np.log(SPEED_RANGE[0]), np.log(SPEED_RANGE[1]), len(rows)))
    wavs, lens = wavs.clone(), lens.clone()
    for row, speed in zip(rows.tolist(), speeds.tolist(), strict=True):
        valid = max(2, int(round(float(lens[row]) * window)))
        played = play_at(wavs[row, :valid], speed)
        length = len(played)
        first = int(rng.integers(0, length - window + 1)) if length > window else 0
        kept = played[first : first + window]
        wavs[row] = torch.nn.functional.pad(kept, (0, window - len(kept)))
        lens[row] = len(kept) / window
    return wavs, lens


def _chosen(rng: np.random.Generator, count: int, probability: float) -> torch.Tensor:
    if not probability:
        return torch.zeros(0, dtype=torch.long)
    return torch.from_numpy(np.flatnonzero(rng.random(count) < probability))


def _noise_crops(store: AudioStore, count: int, window: int, rng: np.random.Generator) -> torch.Tensor:
    """`count` random `window`-sample stretches of the background recordings (shorter ones repeated)."""
    usable = np.flatnonzero(store.lengths > 0)
    out = np.zeros((count, window), dtype=np.float32)
    for k in range(count):
        item = int(usable[rng.integers(len(usable))])
        length = int(store.lengths[item])
        if length >= window:
            start = int(rng.integers(0, length - window + 1))
            out[k] = store.read(item, start, start + window)
        else:
            out[k] = np.resize(store.read(item), window)
    return torch.from_numpy(out)


def _mix_targets(
    wavs: torch.Tensor,
    lens: torch.Tensor,
    labels: torch.Tensor,
    rng: np.random.Generator,
    targets: SoundscapeTargets,
    probability: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Rows chosen with `probability` get a random stretch's crop (a window inside it, or around it when it is
    shorter) added at the RMS of the row's own audio, and the maximum of both targets; the row is then a
    whole window long."""
    if not len(rows := _chosen(rng, len(wavs), probability)):
        return wavs, lens, labels
    window = wavs.shape[1]
    picks = rng.integers(len(targets), size=len(rows))
    crops = np.zeros((len(rows), window), dtype=np.float32)
    for k, pick in enumerate(picks):
        item, start, end = int(targets.items[pick]), int(targets.starts[pick]), int(targets.ends[pick])
        length = int(targets.store.lengths[item])
        if end - start > window:
            first = start + int(rng.integers(0, end - start - window + 1))
        else:
            first = start - (window - (end - start)) // 2
        first = max(0, min(first, length - window))
        part = targets.store.read(item, first, min(length, first + window))
        crops[k, : len(part)] = part
    crops = torch.from_numpy(crops)
    wavs, lens, labels = wavs.clone(), lens.clone(), labels.clone()
    valid = (lens[rows] * window).long().clamp_min(1)
    own = torch.stack(
        [wavs[r, :n].pow(2).mean().sqrt() for r, n in zip(rows.tolist(), valid.tolist(), strict=True)]
    )
    theirs = crops.pow(2).mean(dim=1).sqrt().clamp_min(1e-6)
    wavs[rows] = wavs[rows] + crops * (own.clamp_min(1e-6) / theirs)[:, None]
    labels[rows] = torch.maximum(labels[rows], torch.from_numpy(targets.probs[picks]).to(labels.dtype))
    lens[rows] = 1.0
    return wavs, lens, labels


def _blend(
    wavs: torch.Tensor,
    lens: torch.Tensor,
    labels: torch.Tensor,
    rng: np.random.Generator,
    probability: float,
    classes: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Class indices [B] become soft targets [B, classes] (every row, so the batch's shape does not depend on
    the draw; soft targets stay as they are). Rows chosen with `probability` are blended with another row whose class differs, as BC learning
    does: with r ~ U(0, 1) and each crop's level G (its loudest 100 ms, dB), the crops are weighted p and 1 - p,
    p = 1 / (1 + 10^((G1 - G2) / 20) (1 - r) / r), so that r is the ratio a listener hears, and the target is
    r of the row's class and 1 - r of the other's."""
    targets = _soft(labels, classes)
    if not len(rows := _chosen(rng, len(wavs), probability)) or len(wavs) < 2:
        return wavs, lens, targets
    main = targets.argmax(dim=1).numpy()  # soft targets (focal_targets): the class each row mostly is
    chosen, partners = [], []
    for row in rows.tolist():
        others = np.flatnonzero(main != main[row])
        if len(others):
            chosen.append(row)
            partners.append(int(others[rng.integers(len(others))]))
    if not chosen:  # a batch of one class: nothing to blend
        return wavs, lens, targets
    rows, partners = torch.tensor(chosen), torch.tensor(partners)
    ratio = torch.from_numpy(rng.uniform(0.0, 1.0, len(rows)).astype(np.float32)).clamp(0.01, 0.99)
    valid = (lens * wavs.shape[1]).long().clamp_min(1)
    level = torch.tensor([_loudest_db(wavs[r, : valid[r]]) for r in range(len(wavs))])
    p = 1.0 / (1.0 + 10 ** ((level[rows] - level[partners]) / 20) * (1 - ratio) / ratio)
    wavs, lens, targets = wavs.clone(), lens.clone(), targets.clone()
    norm = (p**2 + (1 - p) ** 2).sqrt()
    wavs[rows] = (p[:, None] * wavs[rows] + (1 - p[:, None]) * wavs[partners]) / norm[:, None]
    lens[rows] = torch.maximum(lens[rows], lens[partners])
    targets[rows] = ratio[:, None] * targets[rows] + (1 - ratio[:, None]) * targets[partners]
    return wavs, lens, targets


def _soft(labels: torch.Tensor, classes: int) -> torch.Tensor:
    """Targets [B, classes]: class indices [B] one-hot, targets as they are (float)."""
    return torch.nn.functional.one_hot(labels.long(), classes).float() if labels.ndim == 1 else labels.float()


def _loudest_db(wav: torch.Tensor, frame: int = 1600) -> float:
    """The level of the loudest `frame`-sample stretch (100 ms at 16 kHz) in dB, as BC learning measures it."""
    usable = max(1, len(wav) // frame) * frame
    padded = torch.nn.functional.pad(wav, (0, max(0, usable - len(wav))))
    frames = padded[:usable].reshape(-1, min(frame, usable))
    return float(10 * torch.log10(frames.pow(2).mean(dim=1).max().clamp_min(1e-10)))


def _mix(
    wavs: torch.Tensor, lens: torch.Tensor, labels: torch.Tensor, rng: np.random.Generator, probability: float
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Rows chosen with `probability` get another row's crop added at 0.3-1x its peak-relative level and the
    union of both rows' targets (their element-wise maximum)."""
    if not len(rows := _chosen(rng, len(wavs), probability)) or len(wavs) < 2:
        return wavs, lens, labels
    partners = torch.from_numpy((rows.numpy() + rng.integers(1, len(wavs), len(rows))) % len(wavs))
    level = torch.from_numpy(rng.uniform(0.3, 1.0, len(rows)).astype(np.float32))
    peak = wavs.abs().amax(dim=1).clamp_min(1e-6)
    scale = level * peak[rows] / peak[partners]
    wavs, lens, labels = wavs.clone(), lens.clone(), labels.clone()
    wavs[rows] = wavs[rows] + scale[:, None] * wavs[partners]
    lens[rows] = torch.maximum(lens[rows], lens[partners])
    labels[rows] = torch.maximum(labels[rows], labels[partners])
    return wavs, lens, labels


__all__ = ["Augmentation", "FocalTargets", "SoundscapeTargets", "augment"]
