"""Synthetic speaker-classification competition, for tests and smoke runs without Kaggle data.

Every voice is a small source-filter model: an LF-like glottal pulse train at a speaker-specific pitch
(with intonation, jitter and shimmer) plus aspiration noise, shaped by cascaded formant resonators whose
frequencies come from a shared vowel table scaled by the speaker's vocal-tract length, and by a fixed
nasal pole-zero pair. Level, duration, background noise and sample rate are drawn independently of the
speaker, so a model can only win by listening to the voice.
"""

from __future__ import annotations

import functools
import math
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import soundfile as sf
from scipy import signal

from ..core.tables import new_competition_folder, write_csv

SAMPLE_RATES = (8000, 16000, 22050, 44100)

# Adult-male formants F1-F3 (Hz) from Peterson & Barney (1952); F4/F5 are nearly vowel-independent.
_VOWELS = np.array(
    [
        [270, 2290, 3010],  # i
        [390, 1990, 2550],  # I
        [530, 1840, 2480],  # E
        [660, 1720, 2410],  # ae
        [730, 1090, 2440],  # a
        [570, 840, 2410],  # O
        [440, 1020, 2240],  # U
        [300, 870, 2240],  # u
        [520, 1190, 2390],  # ^
        [490, 1350, 1690],  # er
    ],
    dtype=np.float64,
)
_F4_F5 = (3400.0, 4300.0)
_BANDWIDTHS = np.array([60.0, 90.0, 140.0, 200.0, 260.0])

_F0_RANGE = (90.0, 260.0)
_VTL_RANGE = (0.85, 1.2)
_PEAK_DBFS = (-20.0, -3.0)
_DURATION_S = (0.6, 2.5)
_SNR_DB = (15.0, 35.0)
_SYLLABLE_S = 0.29  # mean consonant + vowel + gap length at rate 1.0, used to size utterances
_BLOCK_S = 0.01  # formant trajectories are updated every 10 ms
_SYNTH_SR = 16000  # voices are synthesised at this rate, then resampled to each file's rate


@dataclass(frozen=True)
class _Speaker:
    f0: float  # mean pitch, Hz
    vtl: float  # vocal-tract length relative to the table's speaker; formants scale by 1 / vtl
    formant_quirk: np.ndarray  # per-formant multiplicative offsets: voices differ beyond a uniform scale
    bw_scale: float  # formant bandwidth multiplier (damping of the tract)
    rate: float  # speaking rate; segment durations are divided by it
    breathiness: float  # aspiration-noise level relative to the voiced source
    open_quotient: float  # glottal open phase fraction; larger = softer, breathier voice
    tilt_hz: float  # corner of an extra one-pole low-pass on the source (spectral tilt)
    jitter: float  # relative cycle-to-cycle F0 perturbation
    shimmer: float  # relative cycle-to-cycle amplitude perturbation
    intonation_st: float  # pitch excursion, semitones
    nasal_hz: float  # a fixed pole-zero pair from nasal/sinus coupling: a vowel-independent timbre cue


def _draw_speakers(rng: np.random.Generator, n: int) -> list[_Speaker]:
    """Speakers spread over (log F0, VTL) with a minimum spacing, so none are near-twins."""
    lo_f0, hi_f0 = math.log(_F0_RANGE[0]), math.log(_F0_RANGE[1])
    # Rejection sampling in the unit square; relax the spacing if it cannot be met (many speakers).
    min_dist = min(0.45, 1.0 / math.sqrt(n))
    points: list[np.ndarray] = []
    tries = 0
    while len(points) < n:
        cand = rng.uniform(0.0, 1.0, size=2)
        tries += 1
        if all(np.hypot(*(cand - p)) >= min_dist for p in points):
            points.append(cand)
            tries = 0
        elif tries > 500:
            min_dist *= 0.9
            tries = 0

    # Secondary voice-quality traits are stratified (each speaker its own slice of the range, in random
    # order) so that speakers that happen to be close in F0 and VTL still differ in timbre.
    def strata(lo: float, hi: float) -> np.ndarray:
        return lo + (rng.permutation(n) + rng.uniform(0.15, 0.85, size=n)) / n * (hi - lo)

    tilts = strata(1200.0, 4000.0)
    breaths = strata(0.02, 0.25)
    nasals = strata(600.0, 2800.0)
    return [
        _Speaker(
            f0=math.exp(lo_f0 + u * (hi_f0 - lo_f0)),
            vtl=_VTL_RANGE[0] + v * (_VTL_RANGE[1] - _VTL_RANGE[0]),
            formant_quirk=1.0 + rng.uniform(-0.1, 0.1, size=5),
            bw_scale=float(rng.uniform(0.8, 1.4)),
            rate=float(rng.uniform(0.8, 1.3)),
            breathiness=float(breaths[i]),
            open_quotient=float(rng.uniform(0.4, 0.75)),
            tilt_hz=float(tilts[i]),
            jitter=float(rng.uniform(0.005, 0.02)),
            shimmer=float(rng.uniform(0.02, 0.08)),
            intonation_st=float(rng.uniform(1.0, 4.0)),
            nasal_hz=float(nasals[i]),
        )
        for i, (u, v) in enumerate(points)
    ]


def _resonator_sos(freqs: np.ndarray, bws: np.ndarray, sr: int) -> np.ndarray:
    """Cascade of Klatt-style 2-pole resonators (unity gain at DC) as second-order sections.

    Formants the sample rate cannot carry become pass-through sections, keeping the section count fixed
    so filter state survives formant glides across the limit.
    """
    usable = freqs < 0.45 * sr
    r = np.exp(-np.pi * bws / sr)
    theta = 2.0 * np.pi * freqs / sr
    a1 = np.where(usable, -2.0 * r * np.cos(theta), 0.0)
    a2 = np.where(usable, r * r, 0.0)
    zero = np.zeros(len(freqs))
    return np.stack([1.0 + a1 + a2, zero, zero, zero + 1.0, a1, a2], axis=1)  # b0 b1 b2 a0 a1 a2 per section


def _pole_zero_sos(zero_hz: float, sr: int) -> np.ndarray:
    """Anti-resonance at zero_hz with a resonance just above it, unity gain at DC."""
    rz, rp = math.exp(-math.pi * 120.0 / sr), math.exp(-math.pi * 250.0 / sr)
    tz, tp = 2 * math.pi * zero_hz / sr, 2 * math.pi * zero_hz * 1.15 / sr
    b = np.array([1.0, -2 * rz * math.cos(tz), rz * rz])
    a = np.array([1.0, -2 * rp * math.cos(tp), rp * rp])
    b *= a.sum() / b.sum()
    return np.concatenate([b, a])[None, :]


def _glottal_source(spk: _Speaker, rng: np.random.Generator, n: int, sr: int) -> np.ndarray:
    """Voiced excitation for n samples: glottal flow derivative plus aspiration noise, spectrally tilted."""
    t = np.arange(n) / sr
    dur = n / sr
    # Intonation: declination over the utterance plus a slow random wobble, in semitones.
    st = spk.intonation_st * (0.5 - t / max(dur, 1e-3))
    for _ in range(2):
        freq, phase, amp = rng.uniform(0.4, 2.0), rng.uniform(0, 2 * np.pi), rng.uniform(0.3, 1.0)
        st = st + amp * spk.intonation_st * 0.5 * np.sin(2 * np.pi * freq * t + phase)
    # Jitter and shimmer: random values at roughly one per pitch period, linearly interpolated.
    n_knots = int(dur * spk.f0 * 1.5) + 2
    knots = np.linspace(0.0, dur, n_knots)
    jit = np.interp(t, knots, rng.standard_normal(n_knots))
    shim = np.interp(t, knots, rng.standard_normal(n_knots))
    f0 = spk.f0 * 2.0 ** (st / 12.0) * (1.0 + spk.jitter * jit)

    frac = np.cumsum(f0 / sr) % 1.0
    # LF-like flow pulse: raised-cosine opening, quarter-cosine closing, then a closed phase.
    oq = spk.open_quotient
    tp, tn = oq * 0.7, oq * 0.3
    flow = np.where(frac < tp, 0.5 * (1.0 - np.cos(np.pi * frac / tp)), 0.0)
    closing = (frac >= tp) & (frac < tp + tn)
    flow = np.where(closing, np.cos(0.5 * np.pi * (frac - tp) / tn), flow)
    flow = flow * (1.0 + spk.shimmer * shim)
    dflow = np.diff(flow, prepend=0.0)
    dflow /= np.std(dflow) + 1e-12
    # Aspiration noise is louder while the glottis is open, as in real breathy phonation.
    # The sqrt(sr) factor keeps the noise's spectral density, hence breathiness, independent of sample rate.
    aspiration = rng.standard_normal(n) * (0.3 + flow) * spk.breathiness * 2.0 * math.sqrt(sr / 16000)
    # Spectral tilt: one-pole low-pass with a speaker-specific corner (defined in Hz, so rate-independent).
    a = math.exp(-2.0 * math.pi * min(spk.tilt_hz, 0.45 * sr) / sr)
    return signal.lfilter([1.0 - a], [1.0, -a], dflow + aspiration)


def _ramp(n: int, sr: int, ramp_s: float = 0.015) -> np.ndarray:
    env = np.ones(n)
    k = min(int(ramp_s * sr), n // 2)  # segments are at least 10 ms long: k > 0
    edge = 0.5 * (1.0 - np.cos(np.pi * np.arange(k) / k))
    env[:k] = edge
    env[n - k :] = edge[::-1]
    return env


def _vowel_formants(index: int | None) -> np.ndarray:
    """F1-F5 of a table vowel, or of a neutral schwa for None."""
    f123 = np.array([500.0, 1500.0, 2500.0]) if index is None else _VOWELS[index]
    return np.concatenate([f123, _F4_F5])


def _vocal_tract(excitation: np.ndarray, track: tuple, spk: _Speaker, sr: int) -> np.ndarray:
    """Filter through formant resonators following a piecewise-linear (sample, formants) track."""
    times = np.array([t for t, _ in track], dtype=np.float64)
    formants = np.stack([f for _, f in track]) * (spk.formant_quirk / spk.vtl)
    bws = _BANDWIDTHS * spk.bw_scale
    block = max(1, int(_BLOCK_S * sr))
    glide_end = int(times[-1])
    out = np.empty_like(excitation)
    zi = np.zeros((formants.shape[1], 2))
    # Coefficients change every block while the formants move; the steady part is one call.
    # Tracks start at sample 0 and have 2-3 points; the excitation rings on past the last one.
    starts = [*range(0, glide_end, block), glide_end]
    for b0, b1 in zip(starts, [*starts[1:], len(excitation)], strict=True):
        j = min(int(np.searchsorted(times, b0, side="right")) - 1, len(times) - 2)
        w = np.clip((b0 - times[j]) / max(times[j + 1] - times[j], 1.0), 0.0, 1.0)
        freqs = formants[j] + w * (formants[j + 1] - formants[j])
        sos = _resonator_sos(freqs, bws, sr)
        out[b0:b1], zi = signal.sosfilt(sos, excitation[b0:b1], zi=zi)
    return out


def _render_utterance(spk: _Speaker, rng: np.random.Generator, sr: int) -> np.ndarray:
    """One utterance of 2-6 syllables at rate sr in [-1, 1]; level and length independent of speaker."""
    fs = _SYNTH_SR
    target_s = rng.uniform(*_DURATION_S)
    # Fill ~80% of the target with syllables at this speaker's rate: fast talkers say more syllables,
    # so the duration itself carries (almost) no information about the speaker.
    n_syl = int(np.clip(round(0.8 * target_s * spk.rate / _SYLLABLE_S), 2, 6))

    # Plan each syllable as segments (kind, n_samples, params): a vowel's formant track, a consonant's band.
    syllables: list[list[tuple[str, int, tuple]]] = []
    prev = _vowel_formants(None)
    for _ in range(n_syl):
        plan: list[tuple[str, int, tuple]] = []
        if rng.random() < 0.75:
            if rng.random() < 0.6:
                centre = min(rng.uniform(2500.0, 6000.0) / spk.vtl, 0.4 * fs)
                band = (centre * 0.7, min(centre * 1.3, 0.45 * fs))
                plan.append(("fric", int(rng.uniform(0.04, 0.12) / spk.rate * fs), band))
            else:
                plan.append(("gap", int(rng.uniform(0.03, 0.06) / spk.rate * fs), ()))
                plan.append(("burst", int(rng.uniform(0.01, 0.02) * fs), (1500.0, 6000.0)))
        n_vowel = int(rng.uniform(0.10, 0.26) / spk.rate * fs)
        v1 = _vowel_formants(int(rng.integers(len(_VOWELS))))
        # Formants start 40% of the way from the previous vowel (coarticulation) and settle on the
        # target; some vowels are diphthongs gliding on to a second target.
        track = [(0, 0.6 * v1 + 0.4 * prev), (int(0.3 * n_vowel), v1)]
        if rng.random() < 0.3:
            prev = _vowel_formants(int(rng.integers(len(_VOWELS))))
            track.append((int(0.8 * n_vowel), prev))
        else:
            prev = v1
        plan.append(("vowel", n_vowel, tuple(track)))
        plan.append(("gap", int(rng.uniform(0.02, 0.10) / spk.rate * fs), ()))
        syllables.append(plan)
    # Drop trailing syllables that overrun the target (keeping two), so durations stay within range.
    room = int((target_s - 0.1) * fs)
    while len(syllables) > 2 and sum(seg[1] for syl in syllables for seg in syl) > room:
        syllables.pop()
    plan = [seg for syl in syllables for seg in syl]

    n_speech = sum(seg[1] for seg in plan)
    source = _glottal_source(spk, rng, n_speech, fs)
    speech, consonants = np.zeros(n_speech), np.zeros(n_speech)
    voiced = np.zeros(n_speech, dtype=bool)
    fric_level = 10.0 ** (rng.uniform(-18.0, -8.0) / 20.0)
    ring = int(0.03 * fs)  # let resonators ring out past the vowel end

    pos = 0
    for kind, n, params in plan:  # every segment is at least 10 ms long
        if kind == "vowel":
            excitation = np.concatenate([source[pos : pos + n] * _ramp(n, fs), np.zeros(ring)])
            out = _vocal_tract(excitation, params, spk, fs)
            end = min(pos + n + ring, n_speech)
            speech[pos:end] += out[: end - pos]
            voiced[pos : pos + n] = True
        elif kind != "gap":  # a fricative or a burst: band-passed noise, ramped or decaying
            sos = signal.butter(2, params, btype="bandpass", fs=fs, output="sos")
            noise = signal.sosfilt(sos, rng.standard_normal(n))
            shape = _ramp(n, fs, 0.01) if kind == "fric" else 2.0 * np.exp(-np.arange(n) / (0.3 * n))
            consonants[pos : pos + n] = noise / (np.std(noise) + 1e-12) * fric_level * shape
        pos += n

    speech = signal.sosfilt(_pole_zero_sos(spk.nasal_hz, fs), speech)
    # Consonant levels are set relative to the vowels, whose loudness the glottal model leaves arbitrary.
    speech = speech / (np.sqrt(np.mean(speech[voiced] ** 2)) + 1e-12) + consonants
    # The voice is always synthesised at one rate and then resampled, like a recording made at another
    # rate: a speaker's spectrum must not depend on the file's rate (8 kHz files just lose the top band).
    if sr != fs:
        speech = signal.resample_poly(speech, sr, fs)  # it divides both rates by their gcd

    # Place the speech inside a buffer of the target length at a random offset.
    n_total = max(int(target_s * sr), len(speech) + int(0.1 * sr))
    offset = int(rng.integers(int(0.05 * sr), n_total - len(speech) - int(0.05 * sr) + 1))
    audio = np.pad(speech, (offset, n_total - offset - len(speech)))

    # Background noise: white, at a random SNR to the active speech as measured at 16 kHz; scaling by
    # sqrt(sr) fixes its spectral density so the in-band noise floor does not depend on the sample rate.
    snr_db = rng.uniform(*_SNR_DB)
    audio += rng.standard_normal(n_total) * 10.0 ** (-snr_db / 20.0) * math.sqrt(sr / fs)

    audio *= 10.0 ** (rng.uniform(*_PEAK_DBFS) / 20.0) / np.max(np.abs(audio))
    return audio


def _write_audio(path: Path, audio: np.ndarray, sr: int) -> None:
    # Quantise ourselves so the bytes do not depend on libsndfile's float-to-int conversion.
    pcm = np.round(np.clip(audio, -1.0, 1.0) * 32767.0).astype(np.int16)
    path.parent.mkdir(parents=True, exist_ok=True)
    sf.write(str(path), pcm, sr, subtype="PCM_16", format={".wav": "WAV", ".flac": "FLAC"}[path.suffix])


@dataclass(frozen=True)
class _File:
    rel: str
    speaker: int
    stream: tuple[int, ...]  # the file's own random stream: sizes of other splits never shift its content


def _render_file(
    root: Path, spec: _File, speakers: list[_Speaker], rates: tuple[int, ...], clip_seconds: float | None
) -> None:
    """One file: an utterance, or utterances with pauses between them cut to exactly `clip_seconds`."""
    rng = np.random.default_rng(list(spec.stream))
    sr = int(rng.choice(rates))
    speaker = speakers[spec.speaker]
    if clip_seconds is None:
        audio = _render_utterance(speaker, rng, sr)
    else:
        parts, total, want = [], 0, int(round(clip_seconds * sr))
        while total < want:
            parts += [_render_utterance(speaker, rng, sr), np.zeros(int(rng.uniform(0.05, 0.3) * sr))]
            total += len(parts[-2]) + len(parts[-1])
        audio = np.concatenate(parts)[:want]
    _write_audio(root / spec.rel, audio, sr)


def _render_many(root: Path, files: list[_File], speakers, rates, clip_seconds, workers: int) -> None:
    render = functools.partial(_render_file, root, speakers=speakers, rates=rates, clip_seconds=clip_seconds)
    if workers <= 1 or len(files) < 200:
        for spec in files:
            render(spec)
        return
    import concurrent.futures

    from ..devices.launch import helper_spawn_context

    with concurrent.futures.ProcessPoolExecutor(workers, mp_context=helper_spawn_context()) as pool:
        # Four chunks per worker; list() raises a worker's error.
        list(pool.map(render, files, chunksize=-(-len(files) // (workers * 4))))


def _build(
    root: Path,
    seed: int,
    n_speakers: int,
    train_per_speaker: int,
    test_per_speaker: int,
    clip_seconds: float | None,
    rates: tuple[int, ...],
    formats: tuple[str, ...],
    workers: int,
) -> None:
    speakers = _draw_speakers(np.random.default_rng([seed, 0]), n_speakers)
    width = max(2, len(str(n_speakers - 1)))
    labels = [f"spk{i:0{width}d}" for i in range(n_speakers)]
    files, train_rows = [], []
    for s, label in enumerate(labels):
        for k in range(train_per_speaker):
            rel = f"audio/train/{label}_{k:04d}.{formats[k % len(formats)]}"
            files.append(_File(rel, s, (seed, 1, 0, s, k)))
            train_rows.append([rel, label])

    # Test ids are assigned after a seeded shuffle so neither id nor order reveals the speaker.
    pairs = [(s, k) for s in range(n_speakers) for k in range(test_per_speaker)]
    order = np.random.default_rng([seed, 2]).permutation(len(pairs))
    test_rows, solution_rows = [], []
    for i, j in enumerate(order):
        s, k = pairs[int(j)]
        test_id = f"t{i:05d}"
        rel = f"audio/test/{test_id}.{formats[i % len(formats)]}"
        files.append(_File(rel, s, (seed, 1, 1, s, k)))
        test_rows.append([test_id, rel])
        solution_rows.append([test_id, labels[s]])
    _render_many(root, files, speakers, rates, clip_seconds, workers)

    default_label = sorted(labels)[0]
    write_csv(root / "train.csv", ["path", "label"], train_rows)
    write_csv(root / "test.csv", ["id", "path"], test_rows)
    write_csv(root / "sample_submission.csv", ["id", "label"], [[r[0], default_label] for r in test_rows])
    write_csv(root / "solution.csv", ["id", "label"], solution_rows)


def voices(
    n_speakers: int, per_speaker: int, seed: int = 0, sample_rate: int = 16000
) -> dict[str, list[np.ndarray]]:
    """`per_speaker` utterances of each of `n_speakers` voices, in memory, by label (spk00, spk01, ...)."""
    speakers = _draw_speakers(np.random.default_rng([seed, 0]), n_speakers)
    width = max(2, len(str(n_speakers - 1)))
    return {
        f"spk{s:0{width}d}": [
            _render_utterance(speaker, np.random.default_rng([seed, 3, s, k]), sample_rate).astype(np.float32)
            for k in range(per_speaker)
        ]
        for s, speaker in enumerate(speakers)
    }


def make_synthetic_competition(
    out_dir: str | os.PathLike,
    seed: int = 0,
    n_speakers: int = 6,
    train_per_speaker: int = 40,
    test_per_speaker: int = 15,
    overwrite: bool = False,
    clip_seconds: float | None = None,
    sample_rates: tuple[int, ...] = SAMPLE_RATES,
    formats: tuple[str, ...] = ("wav",),
    workers: int = 1,
) -> Path:
    """Write a synthetic competition folder (train/test/sample_submission/solution CSVs + audio).

    Deterministic in ``seed``. Refuses a non-empty ``out_dir`` unless ``overwrite`` is True. The defaults are
    the embedded demo; `clip_seconds` (every file exactly that long), `sample_rates`, `formats` (wav, flac:
    alternating) and `workers` (processes) make folders of real size for benchmarks (see `folder_of_hours`).
    """
    if set(formats) - {"wav", "flac"} or not formats:
        raise ValueError(f"formats={formats!r}: use wav and/or flac")
    if seed < 0 or n_speakers < 1 or train_per_speaker < 1 or test_per_speaker < 0:
        raise ValueError(
            "need seed >= 0, n_speakers >= 1, train_per_speaker >= 1, test_per_speaker >= 0; got "
            f"{seed}, {n_speakers}, {train_per_speaker}, {test_per_speaker}"
        )
    out = Path(out_dir)
    with new_competition_folder(out, overwrite) as staging:
        _build(
            staging,
            seed,
            n_speakers,
            train_per_speaker,
            test_per_speaker,
            clip_seconds,
            tuple(sample_rates),
            tuple(formats),
            workers,
        )
    return out


def folder_of_hours(
    out_dir: str | os.PathLike,
    hours: float,
    clip_seconds: float = 3.0,
    n_speakers: int = 50,
    sample_rates: tuple[int, ...] = (8000,),
    formats: tuple[str, ...] = ("wav", "flac"),
    seed: int = 0,
    overwrite: bool = False,
    workers: int | None = None,
) -> Path:
    """A competition folder with `hours` of training audio in clips of `clip_seconds` (and a test split of a
    tenth of that), e.g. 16.7 h = 20,000 clips of 3 s: what the scale benchmark trains on."""
    per_speaker = max(1, round(hours * 3600 / clip_seconds / n_speakers))
    return make_synthetic_competition(
        out_dir,
        seed=seed,
        n_speakers=n_speakers,
        train_per_speaker=per_speaker,
        test_per_speaker=max(1, per_speaker // 10),
        overwrite=overwrite,
        clip_seconds=clip_seconds,
        sample_rates=sample_rates,
        formats=formats,
        workers=workers or len(os.sched_getaffinity(0)),
    )


def make_high_band_competition(
    out_dir: str | os.PathLike,
    seed: int = 0,
    n_classes: int = 3,
    train_per_class: int = 16,
    test_per_class: int = 10,
    sample_rate: int = 32000,
    overwrite: bool = False,
) -> Path:
    """Classes that differ only above 8 kHz, in 32 kHz WAV files (the project's layout): every clip is tones in
    the speech band drawn from one distribution for all classes, plus a few quiet chirps in a class-specific
    band between 9 and 15 kHz. A 16 kHz model cannot hear the difference; a 32 kHz one can
    (tests/end_to_end/test_sample_rate.py). The chirps come and go: a steady tone would be removed by the front end's
    mean normalisation as a channel colouring would."""
    bands = np.linspace(9000.0, 15000.0, n_classes + 1)
    labels = [f"band{k}" for k in range(n_classes)]

    def clip(rng: np.random.Generator, k: int) -> np.ndarray:
        n = int(rng.uniform(1.0, 2.0) * sample_rate)
        t = np.arange(n) / sample_rate
        low = sum(
            np.sin(2 * np.pi * f * t + rng.uniform(0, 6.3)) * rng.uniform(0.2, 1.0)
            for f in rng.uniform(300, 3500, 4)
        )
        low = low * (0.6 + 0.4 * np.sin(2 * np.pi * rng.uniform(2, 8) * t)) + 0.05 * rng.standard_normal(n)
        chirps = np.zeros(n)
        for _ in range(int(rng.integers(4, 8))):
            size = int(rng.uniform(0.05, 0.15) * sample_rate)
            at = int(rng.integers(0, n - size))
            f0, f1 = rng.uniform(bands[k], bands[k + 1], 2)
            phase = 2 * np.pi * np.cumsum(np.linspace(f0, f1, size)) / sample_rate
            chirps[at : at + size] += np.sin(phase) * np.hanning(size)
        audio = low / np.abs(low).max() + 0.3 * chirps
        return 0.5 * audio / np.abs(audio).max()

    out = Path(out_dir)
    with new_competition_folder(out, overwrite) as root:
        train_rows, test_rows, solution = [], [], []
        for k, label in enumerate(labels):
            for n in range(train_per_class + test_per_class):
                audio = clip(np.random.default_rng([seed, k, n]), k)
                if n < train_per_class:
                    rel = f"audio/train/{label}_{n:03d}.wav"
                    train_rows.append([rel, label])
                else:
                    test_id = f"t{k:02d}{n:03d}"
                    rel = f"audio/test/{test_id}.wav"
                    test_rows.append([test_id, rel])
                    solution.append([test_id, label])
                _write_audio(root / rel, audio, sample_rate)
        write_csv(root / "train.csv", ["path", "label"], train_rows)
        write_csv(root / "test.csv", ["id", "path"], test_rows)
        write_csv(root / "sample_submission.csv", ["id", "label"], [[i, labels[0]] for i, _ in test_rows])
        write_csv(root / "solution.csv", ["id", "label"], solution)
    return out
