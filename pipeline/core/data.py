"""Audio in: decoding to the model's rate, mono, and the windows and crops the model sees.

Audio becomes mono float32 at the model's sample rate (16 kHz by default; load_audio, repairing what can be
repaired); training and inference cut it into the same fixed-length windows (`windows`, `crop_span`), because
the model learns the statistics of a window (sentence mean normalisation over it), not of a whole file. The
tables that name the files are pipeline.core.tables.
"""

from __future__ import annotations

import contextlib
import math
import os
import sys
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import soundfile as sf
import torch
import torchaudio.functional as AF

from .config import SAMPLE_RATE


class AudioError(ValueError):
    """One audio file cannot be used. `reason` is a short machine-readable cause, `detail` says what is wrong
    without the file's path (reports that leave the machine must not carry absolute paths)."""

    def __init__(self, reason: str, path: Path, detail: str) -> None:
        super().__init__(f"{path}: {detail}")
        self.reason, self.path, self.detail = reason, path, detail


# libsndfile decodes mp3 (xeno-canto's, BirdCLEF 2020's) with mpg123, which writes its notes on a damaged or
# oddly framed file ("Note: Illegal Audio-MPEG-Header ...", "Warning: Xing stream size off by more than 1%")
# straight to file descriptor 2: a training set of field recordings floods the log. They are caught there and
# kept as the file's repairs; anything else written meanwhile goes on to stderr. One decode at a time per
# process holds the descriptor (the lock): mp3 files only.
_DECODER_NOTE = ("Note: ", "Warning: ")
_STDERR_LOCK = threading.Lock()


@contextlib.contextmanager
def decoder_notes(path: Path) -> Iterator[list[str]]:
    """For an mp3 `path`: what its decoder writes to stderr meanwhile, as a list filled on exit."""
    notes: list[str] = []
    if path.suffix.lower() != ".mp3":
        yield notes
        return
    with _STDERR_LOCK, tempfile.TemporaryFile(mode="w+b") as caught:
        sys.stderr.flush()
        saved = os.dup(2)
        os.dup2(caught.fileno(), 2)
        try:
            yield notes
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            caught.seek(0)
            lines = caught.read().decode("utf-8", "replace").splitlines()
            notes += [line.strip() for line in lines if line.startswith(_DECODER_NOTE)]
            if other := [line for line in lines if line.strip() and not line.startswith(_DECODER_NOTE)]:
                print("\n".join(other), file=sys.stderr)


def load_audio(
    path: Path, *, sample_rate: int = SAMPLE_RATE, max_seconds: float | None = None
) -> tuple[np.ndarray, list[str]]:
    """Decode `path` to mono float32 at `sample_rate`, repairing what can be repaired.

    Returns the samples and the list of repairs made (e.g. "stereo mixed down", "resampled 8000->16000").
    Raises AudioError when nothing usable is left. `max_seconds` bounds decoding of very long files.
    """
    try:
        if not path.is_file():
            raise AudioError("missing", path, "file not found")
        if path.stat().st_size == 0:
            raise AudioError("empty", path, "file is empty (0 bytes)")
        with decoder_notes(path) as notes:
            info = sf.info(str(path))
            frames = -1 if max_seconds is None else int(max_seconds * info.samplerate)
            samples, rate = sf.read(str(path), dtype="float32", always_2d=True, frames=frames)
    except AudioError:
        raise
    except (sf.LibsndfileError, OSError, RuntimeError, TypeError, ValueError) as error:
        # The decoder's message repeats the absolute path; the AudioError already carries it.
        message = str(error).replace(str(path), path.name)
        raise AudioError("unreadable", path, f"not readable as audio ({message})") from error
    repairs: list[str] = []
    if notes:
        repairs.append(f"the mp3 decoder's {len(notes)} note(s): {'; '.join(notes[:3])}")
    if samples.shape[1] > 1:
        samples = samples.mean(axis=1, keepdims=True)
        repairs.append(f"{info.channels} channels mixed down")
    mono = samples[:, 0]
    if bad := int((~np.isfinite(mono)).sum()):
        if bad == mono.size:
            raise AudioError("non-finite", path, "every sample is NaN or infinite")
        mono = np.nan_to_num(mono, nan=0.0, posinf=0.0, neginf=0.0)
        repairs.append(f"{bad} NaN/inf samples zeroed")
    if mono.size == 0:
        raise AudioError("empty", path, "no audio samples")
    if rate != sample_rate:
        mono = resample(mono, rate, sample_rate)
        repairs.append(f"resampled {rate}->{sample_rate}")
    return np.ascontiguousarray(mono, dtype=np.float32), repairs


def audio_seconds(path: Path) -> float | None:
    """The duration a file's header states, without decoding it; None when there is no usable header."""
    try:
        with decoder_notes(path):
            info = sf.info(str(path))
    except (sf.LibsndfileError, OSError, RuntimeError, TypeError, ValueError):
        return None
    return info.frames / info.samplerate if info.samplerate > 0 and info.frames > 0 else None


# oneDNN (torch's CPU convolution, which torchaudio's resampler runs) keeps a primitive for every input shape
# it sees, up to 1,024, and never frees them: reading 150 / 600 files of distinct lengths kept +84 / +220 MB
# (benchmarks/raw/decode_memory.json). Inputs are zero-padded to a length from a geometric series instead
# (RESAMPLE_BUCKET apart, in whole blocks of the rate ratio): a few dozen shapes, +8 / +13 MB. torchaudio pads
# with zeros itself, so trimming the output gives the unpadded call's samples.
RESAMPLE_BUCKET = 1.25


def resample(samples: np.ndarray, rate: int, target: int = SAMPLE_RATE) -> np.ndarray:
    """Resample from `rate` to `target` with torchaudio's windowed-sinc resampler (the one SpeechBrain uses)."""
    divisor = math.gcd(int(rate), int(target))
    orig_freq, new_freq = int(rate) // divisor, int(target) // divisor
    blocks = padded_blocks(-(-len(samples) // orig_freq))
    padded = np.zeros(blocks * orig_freq, dtype=np.float32)
    padded[: len(samples)] = samples
    out = AF.resample(torch.from_numpy(padded), orig_freq=orig_freq, new_freq=new_freq)
    # The unpadded call's length, computed as torchaudio computes it (in float32, which math.ceil is not).
    length = int(torch.ceil(torch.as_tensor(new_freq * len(samples) / orig_freq)))
    return out[:length].numpy()


def padded_blocks(blocks: int) -> int:
    """The smallest length of RESAMPLE_BUCKET's geometric series (1, 2, ..., then 25% steps) >= `blocks`."""
    size = 1
    while size < blocks:
        size = max(size + 1, int(size * RESAMPLE_BUCKET))
    return size


def crop_span(
    length: int,
    window: int,
    rng: np.random.Generator,
    min_short_fraction: float = 1.0,
    loudness: np.ndarray | None = None,
    frame: int = 0,
) -> tuple[int, int]:
    """Where a training example is cut from a clip of `length` samples: [start, stop), at most `window` long.

    A clip at least a window long gives a random `window`-sample crop: anywhere with equal chance, or, given
    the clip's `loudness` (RMS per `frame` samples, pipeline/training/store.py), with a chance proportional to the
    energy the crop holds, so that crops of long recordings with pauses land on the sound, not on silence. A
    shorter clip is taken whole (it is zero-padded after the cut, see `pad_crop`), except that with
    `min_short_fraction` < 1 half of them are first cut to a random part of at least that fraction of their
    length (augmentation: see TrainConfig.min_short_fraction). The draws from `rng` depend only on the clip,
    so a crop is a function of the seed whether the clip is in memory or in the audio cache.
    """
    if length >= window:
        if loudness is None or frame <= 0 or len(loudness) * frame < window:
            start = int(rng.integers(0, length - window + 1))
        else:  # a chance proportional to the energy of the window each start begins
            energy = np.asarray(loudness, dtype=np.float64) ** 2
            span = max(1, window // frame)  # frames a crop covers
            totals = np.convolve(energy, np.ones(span), mode="valid")  # of the crop starting at each frame
            # Silence keeps a small chance: background is data too.
            weights = totals + 1e-3 * totals.mean() + 1e-30
            first = int(rng.choice(len(weights), p=weights / weights.sum()))
            start = min(first * frame + int(rng.integers(0, frame)), length - window)
        return start, start + window
    if min_short_fraction < 1.0 and rng.random() < 0.5:
        keep = max(1, int(length * rng.uniform(min_short_fraction, 1.0)))
        start = int(rng.integers(0, length - keep + 1))
        return start, start + keep
    return 0, length


def pad_crop(samples: np.ndarray, window: int) -> tuple[np.ndarray, float]:
    """`samples` (at most a window) left-aligned and zero-padded to `window`, and their relative length (valid
    samples / window), which the model uses to ignore padding exactly as at inference."""
    if samples.size == window:
        return np.ascontiguousarray(samples, dtype=np.float32), 1.0
    padded = np.zeros(window, dtype=np.float32)
    padded[: samples.size] = samples
    return padded, samples.size / window


def windows(
    samples: np.ndarray, window: int, max_windows: int, hop: int | None = None, quiet_db: float | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """Cut a clip into inference windows: [n, window] samples and [n] relative lengths.

    A short clip is one left-aligned padded window (as in training). A long one is covered by evenly spaced
    windows, the first at the start and the last aligned to the end: ceil(len / window) of them (`hop` None),
    or as many as keep consecutive starts at most `hop` samples apart (overlapping windows); past
    `max_windows`, that many evenly spaced windows stand for the clip so minutes-long audio costs a bounded
    amount of compute. `quiet_db`: windows whose RMS is more than this many dB below the loudest window's are
    left out -- the silence a short event is padded with (ESC-50's clips: digital zeros), which training's
    crops, drawn where a clip is loud, never show the model.
    """
    if samples.size <= window:
        padded, relative = pad_crop(samples, window)
        return padded[None], np.array([relative], dtype=np.float32)
    needed = math.ceil(samples.size / window) if hop is None else math.ceil((samples.size - window) / hop) + 1
    count = min(needed, max_windows)
    starts = np.linspace(0, samples.size - window, count).round().astype(np.int64)
    stacked = np.stack([samples[s : s + window] for s in starts])
    if quiet_db is not None and count > 1:
        rms = np.sqrt(np.mean(np.square(stacked, dtype=np.float64), axis=1))
        stacked = stacked[rms >= rms.max() * 10 ** (-quiet_db / 20)]  # the loudest window always stays
    return stacked, np.ones(len(stacked), dtype=np.float32)


def play_at(samples: torch.Tensor, speed: float) -> torch.Tensor:
    """`samples` [n] played `speed` times as fast, pitch with it (duration x 1 / speed), by linear interpolation:
    training's speed perturbation (pipeline/training/augment.py) and inference's speed views (`file_windows`)."""
    length = max(2, int(round(samples.numel() / speed)))
    return torch.nn.functional.interpolate(
        samples[None, None], size=length, mode="linear", align_corners=False
    )[0, 0]


def file_windows(
    samples: np.ndarray,
    window: int,
    max_windows: int,
    hop: int | None = None,
    quiet_db: float | None = None,
    energy_weighted: bool = False,
    speeds: tuple[float, ...] = (1.0,),
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A whole file's windows (`windows`), their relative lengths and their weights in its mean embedding: the
    valid share, times the energy with `energy_weighted` (`energy_weights`).

    With several `speeds`, the file is also played at each (`play_at`: the speeds a model trained with speed
    perturbation has heard its classes at) and each such view is cut into windows of its own; each view's
    weights are scaled to sum to one, so every view counts alike in the file's mean however many windows it
    has (a slower view is longer). One speed of 1.0: the file's own windows, weights unscaled."""
    parts = []
    for speed in speeds:
        # torch.tensor copies: a file read from the audio cache may be a read-only memory map.
        played = (
            samples if speed == 1.0 else play_at(torch.tensor(samples, dtype=torch.float32), speed).numpy()
        )
        wavs, rel = windows(played, window, max_windows, hop, quiet_db)
        weights = energy_weights(wavs, rel) if energy_weighted else rel
        if len(speeds) > 1:
            weights = (weights / max(float(weights.sum()), 1e-30)).astype(np.float32)
        parts.append((wavs, rel, weights))
    if len(parts) == 1:
        return parts[0]
    return tuple(np.concatenate(column) for column in zip(*parts, strict=True))


def energy_weights(wavs: np.ndarray, lens: np.ndarray) -> np.ndarray:
    """Each of a clip's windows' weight in its mean embedding: its valid share (`lens`) times its energy (mean
    square) relative to the loudest window's. Training draws its crops of a long clip with a chance
    proportional to their energy (crop_span), so a clip's embedding weighs its windows the way training saw them:
    the loud part of an event counts, the background between events little. A silent clip keeps `lens`."""
    energy = np.mean(np.square(wavs, dtype=np.float64), axis=1)
    loudest = float(energy.max()) if energy.size else 0.0
    if not loudest > 0.0:
        return np.asarray(lens, dtype=np.float32)
    return (np.asarray(lens, dtype=np.float64) * energy / loudest).astype(np.float32)
