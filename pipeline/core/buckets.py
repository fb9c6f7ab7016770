"""Short windows at shorter lengths: no compute spent on padding.

The model sees fixed windows (data.windows): a clip shorter than a window is one left-aligned window, zero-padded,
with its relative length. In training that is how short clips are seen, and inference keeps the same values in
the same places -- but nothing requires the padding to run the whole window. A short window is computed instead
at the shortest of a few lengths (`lengths`: `count` of them, evenly spaced from MARGIN_SECONDS to the window)
that holds its audio plus MARGIN_SECONDS of padding. Its relative length is rescaled so that the same feature
frames count as valid (`relative_at`): sentence mean normalisation, the squeeze-excitation means and the
attentive pooling then mask exactly the frames they masked in the full window.

What still differs is the far end of the tensor: ECAPA's "same" convolutions reflect-pad at the tensor's end,
and through the receptive field (dilated Res2 convolutions, about +-65 frames) that reaches back into the audio
when the padding is short. The margin keeps it away: measured on 300 held-out FSDD clips (median 0.42 s, 1 s
windows) with trained 'small' models, the largest difference of any cosine score to the full window's was
2e-4 (speakers) / 7e-5 (digits) at a 0.15 s margin and 9e-6 / 5e-6 at 0.2 s, with no label changed; at 0.1 s
it was 2e-3. With 4 lengths the FSDD windows then run 0.73 of the full windows' samples (0.69 at 0.15 s).

Pure arithmetic on sample counts (no torch): used by windows.run_windows and by model.WindowedEncoder, so
that SpeechBrain's EncoderClassifier on an artifact computes what the infer stage computes.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

FRAME_SECONDS = 0.01  # the Fbank's hop (SpeechBrain's 10 ms, model.fbank): frames = samples // hop + 1
MARGIN_SECONDS = 0.2  # padding kept after a short window's audio (see the module docstring)
DEFAULT_COUNT = 4  # InferConfig.length_buckets: a few tensor shapes (each a oneDNN / ONNX Runtime plan)


@dataclass(frozen=True)
class Buckets:
    """The tensor lengths windows of `window` samples are computed at (ascending, the last is `window`)."""

    window: int
    lengths: tuple[int, ...]
    hop: int  # samples per feature frame
    margin: int  # samples of padding kept after a short window's audio

    @classmethod
    def plan(cls, window: int, sample_rate: int, count: int = DEFAULT_COUNT) -> Buckets:
        """`count` lengths evenly spaced from MARGIN_SECONDS to the window, each a whole number of frames
        (count 1, or a window too short for a margin: the window alone, as training pads)."""
        if count < 1:
            raise ValueError(f"length_buckets={count}: use 1 (every window full length) or more")
        hop = max(1, int(round(FRAME_SECONDS * sample_rate)))
        margin = int(round(MARGIN_SECONDS * sample_rate))
        spaced = (margin + (window - margin) * k // count for k in range(1, count)) if margin < window else ()
        lengths = {window, *(min(window, math.ceil(length / hop) * hop) for length in spaced)}
        return cls(window, tuple(sorted(lengths)), hop, margin)

    def length_of(self, lens: np.ndarray) -> np.ndarray:
        """The tensor length of each window ([n] relative lengths of the full window): the shortest that holds
        its audio and the margin; the window itself for a full window."""
        valid = np.ceil(np.asarray(lens, dtype=np.float64) * self.window - 1e-6).astype(np.int64)
        needed = np.minimum(valid + self.margin, self.window)
        choices = np.asarray(self.lengths, dtype=np.int64)
        return choices[np.searchsorted(choices, needed)]

    def frames(self, length: int) -> int:
        return length // self.hop + 1

    def relative_at(self, lens: np.ndarray, length: int) -> np.ndarray:
        """Relative lengths at a tensor of `length` samples that make the same feature frames valid as `lens`
        did in the full window: valid frames = relative length x frames (SpeechBrain's masks and the
        normalisation count them so)."""
        if length == self.window:
            return np.asarray(lens, dtype=np.float32)
        scaled = np.asarray(lens, dtype=np.float64) * self.frames(self.window) / self.frames(length)
        return np.minimum(scaled, 1.0).astype(np.float32)


def length_groups(
    lens: np.ndarray, window: int, buckets: Buckets | None
) -> Iterator[tuple[int, np.ndarray, np.ndarray]]:
    """Windows grouped by the tensor length they run at: (length, their indices, their relative lengths at
    that length). Without buckets, or when every window is full, one group at `window`."""
    lens = np.asarray(lens, dtype=np.float32)
    if buckets is None or bool((lens >= 1.0).all()):
        yield window, np.arange(len(lens)), lens
        return
    lengths = buckets.length_of(lens)
    for length in np.unique(lengths):
        chosen = np.flatnonzero(lengths == length)
        yield int(length), chosen, buckets.relative_at(lens[chosen], int(length))
