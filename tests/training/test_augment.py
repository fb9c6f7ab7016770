"""Training-crop augmentation (pipeline/training/augment.py) and crops that land on the sound (data.crop_span)."""

import numpy as np
import pytest
import soundfile as sf
import torch

from pipeline.core.data import crop_span
from pipeline.core.model import Frontend
from pipeline.training.augment import Augmentation, augment
from pipeline.training.store import open_or_build, source_files

RATE = 16000


@pytest.fixture(scope="module")
def noise_store(tmp_path_factory):
    root = tmp_path_factory.mktemp("noise")
    rng = np.random.default_rng(0)
    for k in range(3):
        sf.write(root / f"bg{k}.wav", (0.05 * rng.standard_normal(3 * RATE)).astype(np.float32), RATE)
    return open_or_build(
        source_files(root, [f"bg{k}.wav" for k in range(3)]), root / "cache", log=lambda _: None
    )


def batch(n=8, window=RATE):
    t = torch.arange(window) / RATE
    wavs = torch.stack([0.3 * torch.sin(2 * torch.pi * (300 + 100 * k) * t) for k in range(n)])
    return wavs, torch.ones(n), torch.eye(n)  # a class of its own for every crop


def test_augmentation_is_a_function_of_the_seed(noise_store):
    plan = Augmentation(noise_store, 0.5, (0, 10), 0.5, 0.5, 0.5)
    first = augment(*batch(), np.random.default_rng(7), plan)
    again = augment(*batch(), np.random.default_rng(7), plan)
    other = augment(*batch(), np.random.default_rng(8), plan)
    for a, b in zip(first, again, strict=True):
        assert torch.equal(a, b)
    assert not torch.equal(first[0], other[0])


def test_background_noise_is_mixed_at_the_asked_snr(noise_store):
    wavs, lens, labels = batch()
    out, _, same_labels = augment(
        wavs.clone(), lens, labels, np.random.default_rng(0), Augmentation(noise_store, 1.0, (5, 5))
    )
    # AddNoise scales the clean signal by (1 - f) and adds noise of RMS f x clean RMS, f = 1 / (10^(snr/20) + 1).
    factor = 1 / (10 ** (5 / 20) + 1)
    residual = out - (1 - factor) * wavs
    ratio = residual.pow(2).mean(1).sqrt() / wavs.pow(2).mean(1).sqrt()
    torch.testing.assert_close(ratio, torch.full((8,), factor), rtol=1e-3, atol=1e-4)
    assert torch.equal(same_labels, labels)


def test_mixed_crops_carry_the_union_of_their_labels():
    wavs, lens, labels = batch()
    out, _, mixed = augment(
        wavs.clone(), lens, labels, np.random.default_rng(0), Augmentation(mix_probability=1.0)
    )
    assert (mixed.sum(1) == 2).all()  # every row: its own class and its partner's (a different row's)
    assert (mixed >= labels).all() and not torch.equal(out, wavs)
    single = torch.arange(8)  # one class per clip (aam): crops are never mixed
    _, _, kept = augment(
        wavs.clone(), lens, single, np.random.default_rng(0), Augmentation(mix_probability=1.0)
    )
    assert torch.equal(kept, single)


def test_masks_change_the_crops_and_nothing_else():
    wavs, lens, labels = batch()
    timed, _, _ = augment(
        wavs.clone(), lens, labels, np.random.default_rng(0), Augmentation(time_mask_probability=1.0)
    )
    silenced = (timed == 0) & (wavs != 0)
    assert silenced.any(dim=1).all()  # every crop lost a stretch
    notched, _, _ = augment(
        wavs.clone(), lens, labels, np.random.default_rng(0), Augmentation(freq_mask_probability=1.0)
    )
    assert notched.shape == wavs.shape and not torch.allclose(notched, wavs)


def test_speed_changes_pitch_and_duration_together_and_keeps_the_labels():
    wavs, lens, labels = batch(n=16)
    played, played_lens, kept = augment(
        wavs.clone(), lens, labels, np.random.default_rng(1), Augmentation(speed_probability=1.0)
    )
    assert torch.equal(kept, labels)
    window = wavs.shape[1]
    for row in range(len(wavs)):
        valid = int(round(float(played_lens[row]) * window))
        assert (played[row, valid:] == 0).all()  # a faster crop is padded, and says so in its length
        spectrum = np.abs(np.fft.rfft(played[row, :valid].numpy(), n=8 * window))
        speed = (spectrum.argmax() * RATE / (8 * window)) / (300 + 100 * row)
        assert 0.79 <= speed <= 1.26
        # Faster (pitch up) is shorter than the window; slower (pitch down) fills it.
        if speed > 1.01:
            assert valid / window == pytest.approx(1 / speed, abs=0.01)
        elif speed < 0.99:
            assert valid == window
    assert (played_lens < 1).any() and (played_lens == 1).any()  # both directions drawn


def test_a_constant_gain_changes_nothing_the_model_sees():
    """Why there is no gain augmentation: sentence mean normalisation of log-mel features removes it."""
    wavs, lens, _ = batch(2)
    wavs = wavs + 0.01 * torch.randn(2, RATE, generator=torch.Generator().manual_seed(0))
    frontend = Frontend(40)
    with torch.no_grad():
        torch.testing.assert_close(frontend(wavs, lens), frontend(0.2 * wavs, lens), atol=2e-4, rtol=1e-4)


def test_crops_of_a_long_quiet_clip_land_on_its_loud_second():
    frame, window, length = 1600, RATE, 10 * RATE
    loudness = np.full(length // frame, 1e-3)
    loudness[50:60] = 1.0  # 5-6 s
    rng = np.random.default_rng(0)
    on_sound = [crop_span(length, window, rng, 1.0, loudness, frame)[0] for _ in range(200)]
    uniform = [crop_span(length, window, rng)[0] for _ in range(200)]
    covers = lambda start: start < 6 * RATE and start + window > 5 * RATE  # noqa: E731
    assert np.mean([covers(s) for s in on_sound]) > 0.95
    assert np.mean([covers(s) for s in uniform]) < 0.4
    assert all(0 <= s <= length - window for s in on_sound)


def test_the_cache_records_each_files_loudness(noise_store):
    envelope = noise_store.envelope(0)
    assert len(envelope) == int(np.ceil(noise_store.lengths[0] / noise_store.envelope_frame))
    samples = noise_store.read(0)
    rms = np.sqrt(np.mean(samples[: noise_store.envelope_frame] ** 2))
    assert envelope[0] == pytest.approx(rms, rel=1e-3)


def test_background_crops_carry_no_label_and_only_for_several_labels_per_clip(noise_store):
    wavs, lens, labels = batch()
    plan = Augmentation(noise_store, background_probability=1.0)
    out, out_lens, out_labels = augment(wavs.clone(), lens * 0.5, labels, np.random.default_rng(0), plan)
    assert (out_labels == 0).all() and (out_lens == 1).all()
    level = out.pow(2).mean(1).sqrt()  # every crop is background now, at the recordings' level (0.05 RMS)
    torch.testing.assert_close(level, torch.full((8,), 0.05), rtol=0.1, atol=0)
    single = torch.arange(8)  # aam: a crop must keep its one class
    _, _, kept = augment(wavs.clone(), lens, single, np.random.default_rng(0), plan)
    assert torch.equal(kept, single)


def test_a_soundscape_stretch_is_mixed_in_at_equal_loudness_with_its_soft_targets(noise_store):
    from pipeline.training.augment import SoundscapeTargets

    probs = np.array([[0.9, 0.0, 0.3], [0.0, 0.6, 0.0]], np.float32)
    # bg0 from 1 s to 2 s (a window inside it), bg2 from 0.2 s to 0.6 s (shorter: the window goes around it)
    targets = SoundscapeTargets(noise_store, np.array([0, 2]), np.array([RATE, RATE // 5]),
                                np.array([2 * RATE, 3 * RATE // 5]), probs)  # fmt: skip
    plan = Augmentation(targets=targets, target_probability=1.0)
    wavs, lens, labels = batch(4)
    lens[0], labels = 0.5, torch.zeros(4, 3)
    labels[1, 2] = 1.0
    out, out_lens, out_labels = augment(
        wavs.clone(), lens.clone(), labels.clone(), np.random.default_rng(3), plan
    )
    assert out_lens.tolist() == [1.0] * 4  # every row is a whole window of sound now
    for row in range(4):
        added = (out[row] - wavs[row]).numpy()
        rms = float(np.sqrt(np.mean(wavs[row, : int(lens[row] * RATE)].numpy() ** 2)))
        assert np.sqrt(np.mean(added**2)) == pytest.approx(rms, rel=1e-3)  # at the row's own loudness
        # Where each stretch's window must be: bg0's 1-2 s exactly; bg2's 0.4 s centred, clamped to the start.
        windows = (noise_store.read(0, RATE, 2 * RATE), noise_store.read(2, 0, RATE))
        which = next(k for k, part in enumerate(windows) if _scaled_copy(added, part))
        np.testing.assert_allclose(out_labels[row].numpy(), np.maximum(labels[row].numpy(), probs[which]))
    assert not plan.describe().endswith("none") and "2 stretches" in plan.describe()


def _scaled_copy(crop: np.ndarray, part: np.ndarray) -> bool:
    scale = float(np.dot(part, crop) / max(float(np.dot(part, part)), 1e-12))
    return scale > 0 and np.allclose(crop, scale * part, atol=1e-5)


def test_blended_crops_carry_their_classes_in_the_blend_ratio():
    wavs, lens, _ = batch()
    classes = torch.tensor([0, 0, 1, 1, 2, 2, 3, 3])
    out, _, targets = augment(
        wavs.clone(),
        lens,
        classes,
        np.random.default_rng(0),
        Augmentation(blend_probability=1.0, classes=5, multi_label=False),
    )
    assert targets.shape == (8, 5) and torch.allclose(targets.sum(1), torch.ones(8))
    assert (targets[:, 4] == 0).all()  # no row holds a class that no crop had
    for row in range(8):
        shares = targets[row][targets[row] > 0]
        assert len(shares) == 2 and targets[row, classes[row]] > 0  # its own class and a different one
    assert not torch.allclose(out, wavs)
    # Off: the same one-hot rows, the crops untouched (the batch keeps its shape either way).
    plain, _, one_hot = augment(
        wavs.clone(),
        lens,
        classes,
        np.random.default_rng(0),
        Augmentation(blend_probability=1e-9, classes=5, multi_label=False),
    )
    assert torch.equal(plain, wavs) and torch.equal(one_hot, torch.eye(5)[classes])


def test_a_blend_weights_the_crops_by_their_loudness():
    """Equal-level crops at ratio r are weighted r : 1 - r; a crop 20 dB louder gets 10x less weight."""
    from pipeline.training.augment import _blend

    t = torch.arange(RATE) / RATE
    quiet, loud = 0.01 * torch.sin(2 * torch.pi * 440 * t), 0.1 * torch.sin(2 * torch.pi * 440 * t)
    wavs = torch.stack([quiet, loud])
    out, _, targets = _blend(wavs, torch.ones(2), torch.tensor([0, 1]), np.random.default_rng(3), 1.0, 2)
    r = float(targets[0, 0])
    p = 1 / (1 + 0.1 * (1 - r) / r)  # G1 - G2 = -20 dB: the quiet crop is weighted 10x up
    expected = (p * quiet + (1 - p) * loud) / (p**2 + (1 - p) ** 2) ** 0.5
    torch.testing.assert_close(out[0], expected, rtol=1e-4, atol=1e-6)


def test_focal_targets_blend_the_teachers_nearest_window_into_a_crops_target():
    from pipeline.training.augment import FocalTargets

    # Row 0 has windows centred at 0.5 s and 1.5 s; row 1 none.
    focal = FocalTargets(np.array([0, 2, 2]), np.array([RATE // 2, 3 * RATE // 2]),
                         np.array([[1.0, 0.0, 0.0], [0.0, 0.0, 1.0]], np.float32), weight=0.25)  # fmt: skip
    labels = torch.tensor([1, 1, 1])  # one class per clip (aam): become soft rows
    out = focal.apply(np.array([0, 0, 1]), np.array([0, RATE, 0]), RATE // 2, labels)
    torch.testing.assert_close(
        out[0], torch.tensor([0.25, 0.75, 0.0])
    )  # crop centre 0.25 s: the first window
    torch.testing.assert_close(out[1], torch.tensor([0.0, 0.75, 0.25]))  # centre 1.25 s: the second
    torch.testing.assert_close(out[2], torch.tensor([0.0, 1.0, 0.0]))  # no teacher window: its label alone
