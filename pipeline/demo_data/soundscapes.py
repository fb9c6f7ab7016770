"""Soundscape competitions in BirdCLEF's layout, fabricated from labelled clips: for tests and the benchmark.

    train.csv                    primary_label, secondary_labels ("['b']" or "[]"), type, filename, rating, ...
    train_audio/<label>/*.ogg    focal recordings: 3-6 calls of one class with pauses, some with a quiet call of
                                 a second class (its secondary label); quiet white background
    train_soundscapes/*.ogg      unlabelled soundscapes: the background of the test soundscapes, no calls (with
                                 `field`: drawn like the hidden set, calls and all, from other takes)
    train_soundscapes_truth.csv  (with `field`) their chunks' truth in the labelled table's format: hidden from
                                 the pipeline, for the benchmark's oracle
    train_soundscapes_labels.csv (with `labelled_soundscapes`, as in 2026) filename, start, end,
                                 primary_label ("a;b") of soundscapes with calls
    test_soundscapes/*.ogg       the hidden set: `soundscape_seconds` of background (coloured noise, wind,
                                 an insect-like tone) with 0-2 calls of other recordings per chunk; empty in the
                                 public copy (`public=True`)
    sample_submission.csv        row_id + one column per class, 3 placeholder rows of a soundscape that is not
                                 in the folder (as Kaggle's public copy has)
    solution.csv                 row_id (`<stem>_<end second>`) + 0/1 per class: the hidden chunks' truth
    solution_snr.csv             row_id, label, snr_db: each hidden call's level against its background (RMS
                                 of the call over RMS of the background), for analyses by SNR

`field=True` makes the soundscapes sound like BirdCLEF's rather than like the focal recordings mixed into noise:
each soundscape has 1-3 resident species that call in bouts over neighbouring chunks (and a rare visitor),
each call heard from a distance -- quieter (-9..+9 dB against the background), low-passed (1.5-5 kHz) and
reverberant (RT60 0.2-0.8 s) -- where the focal recordings stay close and clean; and the unlabelled
train_soundscapes are drawn the same way from other takes than the hidden set's: what self-training and
post-processing work on.

Audio is 32 kHz Ogg/Vorbis, as BirdCLEF's. The classes come from `species_from_fsdd` (FSDD speakers,
real speech, train and test from different takes) or `species_from_synthetic` (synthetic voices, no
download: what the tests use). Deterministic in `seed`.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import soundfile as sf
from scipy import signal

from ..core.data import resample
from ..core.tables import SOUNDSCAPE_COLUMNS, new_competition_folder, write_csv

PLACEHOLDER_ROWS = 3
CALLS_PER_CHUNK = (0.3, 0.45, 0.25)  # probability of 0, 1 and 2 calls in a chunk of a test soundscape
# field soundscapes: residents per soundscape (1, 2 or 3), and each resident's bouts as a two-state chain over
# chunks: calling in the first chunk, staying on, switching on; a visitor (any other class) per chunk.
RESIDENTS = (0.4, 0.4, 0.2)
BOUT_START, BOUT_STAY, BOUT_BEGIN = 0.4, 0.65, 0.2
VISITOR_PER_CHUNK = 0.05


@dataclass(frozen=True)
class Species:
    """Clips of each class at `rate`: `train` clips make the focal recordings, `test` clips the soundscapes."""

    train: dict[str, list[np.ndarray]]
    test: dict[str, list[np.ndarray]]
    rate: int


def species_from_fsdd(
    recordings: str | os.PathLike, n_species: int = 6, first_test_take: int = 40
) -> Species:
    """FSDD speakers as species: takes below `first_test_take` for training, the others for the soundscapes."""
    from .fsdd import scan_recordings

    found = scan_recordings(recordings)
    speakers = sorted({r.speaker for r in found})[:n_species]
    train: dict[str, list[np.ndarray]] = {s: [] for s in speakers}
    test: dict[str, list[np.ndarray]] = {s: [] for s in speakers}
    rate = 0
    for rec in sorted((r for r in found if r.speaker in train), key=lambda r: (r.speaker, r.digit, r.index)):
        samples, rate = sf.read(str(rec.path), dtype="float32", always_2d=True)
        (train if rec.index < first_test_take else test)[rec.speaker].append(_trim(samples.mean(axis=1)))
    return Species(train, test, rate)


def species_from_synthetic(
    n_species: int = 3, train_per: int = 24, test_per: int = 12, seed: int = 0
) -> Species:
    """Synthetic voices (pipeline/demo_data/synthetic.py) as species, at 16 kHz."""
    from .synthetic import voices

    clips = voices(n_species, train_per + test_per, seed=seed, sample_rate=16000)
    train = {label: [_trim(c) for c in v[:train_per]] for label, v in clips.items()}
    test = {label: [_trim(c) for c in v[train_per:]] for label, v in clips.items()}
    return Species(train, test, 16000)


def make_soundscape_competition(
    out_dir: str | os.PathLike,
    species: Species,
    *,
    seed: int = 0,
    focal_per_class: int = 75,
    secondary_fraction: float = 0.3,
    test_soundscapes: int = 40,
    train_soundscapes: int = 8,
    labelled_soundscapes: int = 0,
    soundscape_seconds: float = 60.0,
    segment_seconds: float = 5.0,
    sample_rate: int = 32000,
    public: bool = False,
    overwrite: bool = False,
    background_db: float = 0.0,
    field: bool = False,
) -> Path:
    """Write the folder (see the module docstring); refuses a non-empty `out_dir` unless it is one the data
    commands wrote and `overwrite` is set. `background_db` turns the hidden soundscapes' background up or down
    against their calls (-30: nearly clean calls, the ceiling an analysis compares with); the calls and
    everything else stay as they are. `field`: soundscapes like BirdCLEF's (the module docstring)."""
    out = Path(out_dir)
    labels = sorted(species.train)
    clips = {k: [_at_rate(c, species.rate, sample_rate) for c in v] for k, v in species.train.items()}
    calls = {k: [_at_rate(c, species.rate, sample_rate) for c in v] for k, v in species.test.items()}
    # field: the unlabelled soundscapes' calls are other takes than the hidden set's
    unlabelled_calls = {k: v[1::2] for k, v in calls.items()} if field else {}
    if field:
        calls = {k: v[0::2] for k, v in calls.items()}

    def scape(rng: np.random.Generator, takes: dict[str, list[np.ndarray]], background: float = 0.0):
        return _soundscape(rng, takes, soundscape_seconds, segment_seconds, sample_rate, background, field)

    with new_competition_folder(out, overwrite) as root:
        rng = np.random.default_rng([seed, 1])
        rows = []
        for k, label in enumerate(labels):
            for n in range(focal_per_class):
                secondary = None
                if len(labels) > 1 and rng.random() < secondary_fraction:
                    secondary = labels[(k + 1 + int(rng.integers(len(labels) - 1))) % len(labels)]
                audio = _focal(rng, clips[label], clips[secondary] if secondary else None, sample_rate)
                name = f"{label}/XC{seed:02d}{k:02d}{n:04d}.ogg"
                _write(root / "train_audio" / name, audio, sample_rate)
                rows.append(
                    [
                        label,
                        f"['{secondary}']" if secondary else "[]",
                        "['call']",
                        name,
                        "XC",
                        f"{rng.integers(1, 11) / 2:.1f}",
                        f"https://xeno-canto.org/{k}{n}",
                        "0.0",
                        "0.0",
                        label,
                        label,
                        "pipeline.soundscapes",
                        "cc-by-sa 4.0",
                    ]
                )
        write_csv(
            root / "train.csv",
            [
                "primary_label",
                "secondary_labels",
                "type",
                "filename",
                "collection",
                "rating",
                "url",
                "latitude",
                "longitude",
                "scientific_name",
                "common_name",
                "author",
                "license",
            ],
            rows,
        )
        scape_rng = np.random.default_rng([seed, 2])
        hidden_truth = []
        for n in range(train_soundscapes):
            name = f"unlabelled_{n:04d}.ogg"
            if field:
                audio, truth, _ = scape(scape_rng, unlabelled_calls)
                hidden_truth += _chunk_rows(name, truth, segment_seconds)
            else:
                audio = _background(scape_rng, soundscape_seconds, sample_rate)
            _write(root / "train_soundscapes" / name, audio, sample_rate)
        if field:
            write_csv(root / "train_soundscapes_truth.csv", SOUNDSCAPE_COLUMNS, hidden_truth)
        labelled = []
        for n in range(labelled_soundscapes):
            stem = f"labelled_{n:04d}"
            audio, truth, _ = scape(scape_rng, calls)
            _write(root / "train_soundscapes" / f"{stem}.ogg", audio, sample_rate)
            labelled += _chunk_rows(f"{stem}.ogg", truth, segment_seconds)
        if labelled_soundscapes:
            write_csv(root / "train_soundscapes_labels.csv", SOUNDSCAPE_COLUMNS, labelled)
        (root / "test_soundscapes").mkdir()
        test_rng = np.random.default_rng([seed, 3])
        solution, snr = [], []
        for _ in range(test_soundscapes):
            stem = f"soundscape_{int(test_rng.integers(10**6, 10**7))}"
            audio, truth, levels = scape(test_rng, calls, background_db)
            if not public:
                _write(root / "test_soundscapes" / f"{stem}.ogg", audio, sample_rate)
            row_ids = [f"{stem}_{(c + 1) * segment_seconds:g}" for c in range(len(truth))]
            solution += [
                [row_id, *(int(lab in present) for lab in labels)]
                for row_id, present in zip(row_ids, truth, strict=True)
            ]
            snr += [
                [row_id, label, f"{db:.2f}"]
                for row_id, chunk in zip(row_ids, levels, strict=True)
                for label, db in chunk
            ]
        placeholder = "soundscape_0000000"
        write_csv(
            root / "sample_submission.csv",
            ["row_id", *labels],
            [
                [f"{placeholder}_{(c + 1) * segment_seconds:g}", *[f"{1 / len(labels):.6f}"] * len(labels)]
                for c in range(PLACEHOLDER_ROWS)
            ],
        )
        if not public:
            write_csv(root / "solution.csv", ["row_id", *labels], solution)
            write_csv(root / "solution_snr.csv", ["row_id", "label", "snr_db"], snr)
    return out


def _trim(clip: np.ndarray, floor_db: float = -35.0) -> np.ndarray:
    """The clip between its first and last sample within `floor_db` of its peak: a call without its silence."""
    clip = np.asarray(clip, dtype=np.float32)
    loud = np.flatnonzero(np.abs(clip) >= np.abs(clip).max() * 10 ** (floor_db / 20))
    return clip[loud[0] : loud[-1] + 1] if len(loud) else clip


def _at_rate(clip: np.ndarray, rate: int, target: int) -> np.ndarray:
    """`clip` at `target` Hz and at full scale: levels come later."""
    out = resample(clip, rate, target) if rate != target else clip
    return (out / (np.abs(out).max() + 1e-9)).astype(np.float32)


def _db(value: float) -> float:
    return 10 ** (value / 20)


def _focal(
    rng: np.random.Generator, own: list[np.ndarray], other: list[np.ndarray] | None, rate: int
) -> np.ndarray:
    """3-6 calls of one class with 0.3-1.5 s pauses (and 0.2-1 s of lead-in), a quiet call of `other` mixed in
    somewhere, and a quiet white background: a focal recording."""
    parts = [np.zeros(int(rng.uniform(0.2, 1.0) * rate), np.float32)]
    for _ in range(int(rng.integers(3, 7))):
        parts.append(own[int(rng.integers(len(own)))] * _db(rng.uniform(-6, 0)))
        parts.append(np.zeros(int(rng.uniform(0.3, 1.5) * rate), np.float32))
    audio = np.concatenate(parts)
    if other is not None:
        call = other[int(rng.integers(len(other)))] * _db(rng.uniform(-14, -8))
        start = int(rng.integers(0, max(1, len(audio) - len(call))))
        audio[start : start + len(call)] += call[: len(audio) - start]
    audio += rng.standard_normal(len(audio)).astype(np.float32) * _db(-50)
    return 0.5 * audio / np.abs(audio).max()


def _background(rng: np.random.Generator, seconds: float, rate: int) -> np.ndarray:
    """A soundscape's background: brown-ish noise, gusts of band-passed wind, and an insect-like tone."""
    n = int(round(seconds * rate))
    brown = signal.sosfilt(signal.butter(1, 300, fs=rate, output="sos"), rng.standard_normal(n))
    gust_sos = signal.butter(
        2, [rng.uniform(200, 600), rng.uniform(1500, 3000)], btype="bandpass", fs=rate, output="sos"
    )
    gusts = signal.sosfilt(gust_sos, rng.standard_normal(n))
    envelope = np.interp(np.arange(n), np.linspace(0, n, 12), rng.uniform(0.1, 1.0, 12))
    t = np.arange(n) / rate
    pitch, flutter = rng.uniform(3000, 7000), rng.uniform(4, 30)
    tone = np.sin(2 * np.pi * pitch * t) * (0.5 + 0.5 * np.sin(2 * np.pi * flutter * t))
    audio = brown / np.std(brown) + 0.7 * gusts * envelope / np.std(gusts) + _db(rng.uniform(-20, -8)) * tone
    return (audio / np.std(audio) * _db(-30)).astype(np.float32)


def _soundscape(
    rng: np.random.Generator,
    calls: dict[str, list[np.ndarray]],
    seconds: float,
    segment: float,
    rate: int,
    background_db: float = 0.0,
    field: bool = False,
) -> tuple[np.ndarray, list[list[str]], list[list[tuple[str, float]]]]:
    """Background with calls, each wholly inside its chunk: 0-2 calls of distinct classes per chunk at -6 to +12 dB
    to the background, or with `field` as BirdCLEF's sound (the module docstring): residents calling in bouts, a
    rare visitor, every call distant, at -9 to +9 dB. `background_db` turns the background after the calls'
    levels are set. Returns the audio, each chunk's classes, and each chunk's (class, SNR in dB against the
    background as written)."""
    audio = _background(rng, seconds, rate)
    noise_rms = float(np.sqrt(np.mean(audio**2)))
    audio *= _db(background_db)
    labels = sorted(calls)
    if field:
        count = min(len(labels), 1 + int(rng.choice(len(RESIDENTS), p=RESIDENTS)))
        residents = rng.choice(labels, size=count, replace=False).tolist()
        calling = {label: rng.random() < BOUT_START for label in residents}
    truth, levels = [], []
    for c in range(int(math.floor(seconds / segment))):
        if not field:
            count = min(len(labels), int(rng.choice(len(CALLS_PER_CHUNK), p=CALLS_PER_CHUNK)))
            present = sorted(rng.choice(labels, size=count, replace=False).tolist()) if count else []
        else:
            if c:
                calling = {
                    label: rng.random() < (BOUT_STAY if on else BOUT_BEGIN) for label, on in calling.items()
                }
            chosen = {label for label, on in calling.items() if on}
            if rng.random() < VISITOR_PER_CHUNK:
                chosen.add(str(rng.choice(labels)))
            present = sorted(chosen)
        start, size = int(c * segment * rate), int(segment * rate)
        chunk = []
        for label in present:
            call = calls[label][int(rng.integers(len(calls[label])))]
            call = (_distant(rng, call, rate) if field else call)[:size]
            snr_db = rng.uniform(-9, 9) if field else rng.uniform(-6, 12)
            level = noise_rms * _db(snr_db) / (float(np.sqrt(np.mean(call**2))) + 1e-9)
            at = start + int(rng.integers(0, size - len(call) + 1))
            audio[at : at + len(call)] += call * level
            chunk.append((label, snr_db - background_db))
        truth.append(present)
        levels.append(chunk)
    return audio, truth, levels


def _chunk_rows(filename: str, truth: list[list[str]], segment: float) -> list[list[str]]:
    """The labelled table's rows (filename, start, end, "a;b") of a soundscape's chunks that hold calls."""
    return [
        [filename, f"{c * segment:g}", f"{(c + 1) * segment:g}", ";".join(present)]
        for c, present in enumerate(truth)
        if present
    ]


def _distant(rng: np.random.Generator, call: np.ndarray, rate: int) -> np.ndarray:
    """A call as a far recorder hears it: high frequencies absorbed (low-pass, 1.5-5 kHz) and the room's or
    forest's reverberation (exponentially decaying noise, RT60 0.2-0.8 s) mixed in at 30-70%."""
    dull = signal.sosfilt(signal.butter(2, rng.uniform(1500, 5000), fs=rate, output="sos"), call)
    rt60 = rng.uniform(0.2, 0.8)
    t = np.arange(int(rt60 * rate)) / rate
    response = rng.standard_normal(len(t)) * np.exp(-6.9 * t / rt60)  # -60 dB at rt60
    wet = signal.fftconvolve(dull, response)[: len(dull) + len(t) // 2]
    dry = np.pad(dull, (0, len(wet) - len(dull)))
    mix = rng.uniform(0.3, 0.7)
    return ((1 - mix) * dry / (np.std(dry) + 1e-9) + mix * wet / (np.std(wet) + 1e-9)).astype(np.float32)


def _write(path: Path, audio: np.ndarray, rate: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    peak = float(np.abs(audio).max())
    sf.write(str(path), audio / peak * 0.9 if peak > 0.9 else audio, rate, format="OGG", subtype="VORBIS")


__all__ = ["Species", "make_soundscape_competition", "species_from_fsdd", "species_from_synthetic"]
