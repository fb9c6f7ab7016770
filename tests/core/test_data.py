import wave

import numpy as np
import pytest
import soundfile as sf
from helpers import tone

from pipeline.core.config import SAMPLE_RATE
from pipeline.core.data import (
    AudioError,
    crop_span,
    load_audio,
    pad_crop,
    padded_blocks,
    resample,
    windows,
)


@pytest.mark.parametrize("fmt,subtype", [("FLAC", "PCM_16"), ("OGG", "VORBIS"), ("MP3", "MPEG_LAYER_III"),
                                         ("WAV", "PCM_24"), ("WAV", "FLOAT"), ("AIFF", "PCM_16")])  # fmt: skip
def test_common_audio_formats_decode_to_16k_mono(tmp_path, fmt, subtype):
    path = tmp_path / f"clip.{fmt.lower()}"
    stereo = np.stack([tone(1.0, rate=44100), tone(1.0, freq=330, rate=44100)], axis=1)
    sf.write(path, stereo, 44100, format=fmt, subtype=subtype)
    samples, repairs = load_audio(path)
    assert samples.ndim == 1 and abs(samples.size - SAMPLE_RATE) < 0.06 * SAMPLE_RATE  # codecs pad a little
    assert np.abs(samples).max() > 0.1 and any("mixed down" in r for r in repairs)


def test_load_audio_repairs_stereo_rate_and_nan(tmp_path):
    stereo = np.stack([tone(0.5, rate=8000), tone(0.5, rate=8000)], axis=1)
    stereo[10, 0] = np.nan
    sf.write(tmp_path / "s.wav", stereo, 8000, subtype="FLOAT")
    samples, repairs = load_audio(tmp_path / "s.wav")
    assert samples.dtype == np.float32 and samples.ndim == 1
    assert abs(samples.size - SAMPLE_RATE * 0.5) <= 2
    assert np.isfinite(samples).all()
    assert any("mixed down" in r for r in repairs) and any("resampled 8000" in r for r in repairs)
    assert any("NaN" in r for r in repairs)


def test_load_audio_rejects_all_nan_and_header_only(tmp_path):
    sf.write(tmp_path / "nan.wav", np.full(100, np.nan, dtype=np.float32), SAMPLE_RATE, subtype="FLOAT")
    with pytest.raises(AudioError) as info:
        load_audio(tmp_path / "nan.wav")
    assert info.value.reason == "non-finite"
    with wave.open(str(tmp_path / "zero.wav"), "wb") as handle:  # a valid header with no frames
        handle.setnchannels(1), handle.setsampwidth(2), handle.setframerate(SAMPLE_RATE)
    with pytest.raises(AudioError) as info:
        load_audio(tmp_path / "zero.wav")
    assert info.value.reason in {"empty", "unreadable"}


def test_resampled_tone_keeps_its_frequency(tmp_path):
    sf.write(tmp_path / "t.wav", tone(1.0, 440.0, rate=22050), 22050)
    samples, _ = load_audio(tmp_path / "t.wav")
    spectrum = np.abs(np.fft.rfft(samples))
    peak_hz = np.argmax(spectrum) * SAMPLE_RATE / samples.size
    assert abs(peak_hz - 440.0) < 2.0


@pytest.mark.parametrize("rate", [8000, 11025, 22050, 32000, 44100, 48000])
def test_resampling_padded_to_a_bounded_length_gives_torchaudios_samples(rate):
    import math

    import torch
    import torchaudio.functional as AF

    rng = np.random.default_rng(rate)
    divisor = math.gcd(rate, SAMPLE_RATE)
    for n in {1, 2, max(1, rate // divisor - 1), rate // divisor + 1, *rng.integers(3, 8 * rate, 12)}:
        samples = (0.1 * rng.standard_normal(int(n))).astype(np.float32)
        plain = AF.resample(torch.from_numpy(samples), rate // divisor, SAMPLE_RATE // divisor).numpy()
        padded = resample(samples, rate)
        assert padded.dtype == np.float32 and padded.shape == plain.shape, n
        # oneDNN picks its algorithm by shape: a few lengths differ in the last bit, most are identical.
        np.testing.assert_allclose(padded, plain, rtol=0, atol=1e-7)


def test_inputs_of_any_length_reach_the_convolution_in_a_few_dozen_shapes():
    lengths = range(1, 60 * 441 + 1)  # every length up to 60 s of 44.1 kHz audio, in blocks of 441 samples
    shapes = {padded_blocks(n) for n in lengths}
    assert len(shapes) <= 50
    assert all(n <= padded_blocks(n) <= max(n + 1, 1.25 * n) for n in lengths)


def random_crop(samples, window, rng, min_short_fraction=1.0):
    """A training example from a clip in memory, as batches.crops makes one from the cache."""
    start, stop = crop_span(samples.size, window, rng, min_short_fraction)
    return pad_crop(samples[start:stop], window)


def test_random_crop_pads_short_and_crops_long():
    rng = np.random.default_rng(0)
    short, rel = random_crop(np.ones(30, dtype=np.float32), 100, rng)
    assert short.shape == (100,) and rel == pytest.approx(0.3) and short[30:].sum() == 0
    long = np.arange(1000, dtype=np.float32)
    crop, rel = random_crop(long, 100, rng)
    assert rel == 1.0 and np.all(np.diff(crop) == 1)


def test_short_clip_augmentation_keeps_a_contiguous_part_half_the_time():
    rng = np.random.default_rng(0)
    clip = np.arange(1, 61, dtype=np.float32)  # 60 samples, all non-zero
    kept = []
    for _ in range(400):
        crop, rel = random_crop(clip, 100, rng, min_short_fraction=0.7)
        valid = crop[: int(round(rel * 100))]
        assert np.all(crop[valid.size :] == 0) and np.all(np.diff(valid) == 1)  # one contiguous piece
        kept.append(valid.size)
    assert min(kept) >= 42 and 0.4 < np.mean(np.array(kept) == 60) < 0.6  # >= 70 %, whole about half the time
    longer = np.arange(1000, dtype=np.float32)
    assert random_crop(longer, 100, rng, min_short_fraction=0.7)[1] == 1.0  # only short clips are cut


def test_windows_cover_long_clips_and_cap_very_long_ones():
    clip = np.arange(250, dtype=np.float32)
    w, lens = windows(clip, 100, max_windows=10)
    assert w.shape == (3, 100) and lens.tolist() == [1, 1, 1]
    assert w[0, 0] == 0 and w[-1, -1] == 249  # first window at the start, last one ends at the end
    w, lens = windows(np.zeros(100_000, dtype=np.float32), 100, max_windows=7)
    assert w.shape == (7, 100)
    w, lens = windows(np.ones(40, dtype=np.float32), 100, max_windows=7)
    assert w.shape == (1, 100) and lens[0] == pytest.approx(0.4)


def test_overlapping_windows_cover_a_clip_with_starts_at_most_a_hop_apart():
    clip = np.arange(10_000, dtype=np.float32)
    wavs, lens = windows(clip, 4000, 100, hop=2000)
    starts = [int(w[0]) for w in wavs]
    assert starts[0] == 0 and starts[-1] == 6000 and max(np.diff(starts)) <= 2000 and len(wavs) == 4
    assert (lens == 1).all()
    assert len(windows(clip, 4000, 100)[0]) == 3  # no hop: ceil(10000 / 4000) windows, as before


def test_audio_seconds_reads_the_header_only(tmp_path):
    from pipeline.core.data import audio_seconds

    sf.write(tmp_path / "a.wav", np.zeros(24_000, dtype=np.float32), 8000)
    assert audio_seconds(tmp_path / "a.wav") == 3.0
    (tmp_path / "b.wav").write_bytes(b"not audio")
    assert audio_seconds(tmp_path / "b.wav") is None and audio_seconds(tmp_path / "missing.wav") is None


def test_an_mp3_decoders_notes_become_repairs_and_never_reach_stderr(tmp_path, capfd):
    """Issue 50: mpg123 writes "Note: Illegal Audio-MPEG-Header ..." to file descriptor 2 for damaged
    xeno-canto files, flooding a training log; they are kept as the file's repairs instead."""
    import soundfile as sf

    from pipeline.core.data import audio_seconds, load_audio

    clip = (0.1 * np.sin(np.arange(16000) / 10)).astype(np.float32)
    sf.write(tmp_path / "clean.mp3", clip, 16000, format="MP3")
    data = (tmp_path / "clean.mp3").read_bytes()
    (tmp_path / "damaged.mp3").write_bytes(
        data[: len(data) // 2] + b"PETA not a frame " * 4 + data[len(data) // 2 :]
    )
    samples, repairs = load_audio(tmp_path / "damaged.mp3", sample_rate=16000)
    assert audio_seconds(tmp_path / "damaged.mp3") is not None
    assert len(samples) > 8000 and any(
        "the mp3 decoder's" in r and "Illegal Audio-MPEG-Header" in r for r in repairs
    )
    assert not load_audio(tmp_path / "clean.mp3", sample_rate=16000)[1]  # a clean file: nothing to say
    out, err = capfd.readouterr()
    assert "MPEG" not in err and "Xing" not in err and "Note:" not in err + out
