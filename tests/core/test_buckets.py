"""pipeline/core/buckets.py: short windows at shorter lengths, and what they change in the predictions."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from helpers import classify_clips, clip_items

from pipeline.core.artifact import load_artifact
from pipeline.core.buckets import Buckets
from pipeline.core.data import load_audio
from pipeline.core.windows import WindowPlan, run_windows

# Largest difference of any cosine score allowed between a short window at its bucket's length and the same
# window at full length. Measured (max over clips): 4e-6 on 300 held-out FSDD digits with a trained 'small'
# model (1 s windows), 9e-6 for FSDD speakers; 3e-5 with the tiny session artifact (0.5 s windows) on FSDD
# recordings cut to 0.03-0.3 s. It is also the ONNX engine's tolerance against torch.
TOLERANCE = 1e-4


def test_lengths_are_a_few_whole_frames_ending_at_the_window():
    buckets = Buckets.plan(16000, 16000, 4)
    # 0.2 s of margin, then evenly spaced up to the window: 0.4, 0.6, 0.8 and 1 s
    assert buckets.lengths == (6400, 9600, 12800, 16000) and buckets.hop == 160 and buckets.margin == 3200
    odd = Buckets.plan(12345, 16000, 3)
    assert odd.lengths[-1] == 12345 and all(length % 160 == 0 for length in odd.lengths[:-1])
    assert Buckets.plan(16000, 16000, 1).lengths == (16000,)
    assert Buckets.plan(64000, 32000, 3).hop == 320  # 10 ms frames at 32 kHz
    with pytest.raises(ValueError, match="length_buckets=0"):
        Buckets.plan(16000, 16000, 0)


def test_a_window_goes_to_the_shortest_length_that_holds_its_audio_and_the_margin():
    buckets = Buckets.plan(16000, 16000, 4)
    valid = np.array([100, 5000, 9000, 12799, 16000])
    chosen = buckets.length_of(valid / 16000)
    for n, length in zip(valid, chosen, strict=True):
        assert length >= min(16000, n + buckets.margin)
        shorter = [x for x in buckets.lengths if x < length]
        assert not shorter or shorter[-1] < n + buckets.margin
    assert chosen[-1] == 16000  # a full window stays full


@pytest.mark.parametrize("n", [1, 800, 4321, 9000])
def test_relative_lengths_keep_the_same_valid_frames(n):
    """SpeechBrain's normalisation counts round(rel x frames) frames and its masks frames < rel x frames: both
    must see exactly the frames of the full window."""
    buckets = Buckets.plan(16000, 16000, 4)
    rel = np.array([n / 16000], dtype=np.float32)
    length = int(buckets.length_of(rel)[0])
    assert length < 16000
    at = buckets.relative_at(rel, length)
    full, short = float(rel[0]) * buckets.frames(16000), float(at[0]) * buckets.frames(length)
    assert round(full) == round(short) and abs(full - short) < 1e-4
    frames = torch.arange(buckets.frames(length))
    assert int((frames < short).sum()) == int((torch.arange(buckets.frames(16000)) < full).sum())


def short_clips(model, paths, seed: int = 0) -> list[np.ndarray]:
    """Recordings cut to 6-60% of a window: every one runs at a bucket's length."""
    rng = np.random.default_rng(seed)
    window = model.config.window_samples
    clips = [load_audio(path, sample_rate=model.config.sample_rate)[0] for path in paths]
    return [clip[: int(rng.uniform(0.06, 0.6) * window)] for clip in clips]


def test_bucketed_predictions_equal_full_windows_and_no_compute_runs_on_padding(
    tiny_artifact, synthetic_data
):
    model = load_artifact(tiny_artifact).model
    window, cpu = model.config.window_samples, torch.device("cpu")
    paths = sorted((synthetic_data / "audio").rglob("*.wav"))
    clips = [*short_clips(model, paths[:24]), load_audio(paths[0])[0]]  # and a file longer than a window
    shapes: list[tuple[int, ...]] = []

    def recording(wavs, lens):
        shapes.append(tuple(wavs.shape))
        with torch.inference_mode():
            return model.embed(model.features(wavs, lens), lens)

    plan = WindowPlan(window, model.config.sample_rate, 8, length_buckets=4, energy_weighted=True)
    items = clip_items(clips, plan)
    bucketed = run_windows(model, items, len(clips), plan, cpu, embed=recording)
    full = classify_clips(model, clips, window, batch_windows=8, device=cpu)
    assert bucketed.ok.all()
    np.testing.assert_allclose(bucketed.scores, full.scores, atol=TOLERANCE)
    assert (bucketed.scores.argmax(1) == full.scores.argmax(1)).all()
    np.testing.assert_allclose(bucketed.embeddings, full.embeddings, atol=TOLERANCE)
    lengths = {shape[1] for shape in shapes}
    assert min(lengths) < window and lengths <= set(plan.buckets().lengths) and len(lengths) <= 4
    # Every short window ran at the shortest length that holds its audio and the margin, the long file's at full
    # length; no batch holds more samples than `batch_windows` full windows.
    margin, lengths = plan.buckets().margin, plan.buckets().lengths
    expected = [min(x for x in lengths if x >= min(window, clip.size + margin)) for clip in clips[:-1]]
    expected += [window] * len(clip_items_of(clips[-1:], plan))
    assert sorted(length for rows, length in shapes for _ in range(rows)) == sorted(expected)
    assert all(rows * length <= 8 * window for rows, length in shapes)
    assert sum(expected) < 0.85 * window * len(expected)


def test_a_pcen_models_bucketed_predictions_equal_full_windows(tiny_artifact, synthetic_data):
    """PCEN's level smoother runs through the frames in order: the frames after a short window's audio (its
    bucket's padding or the full window's) never reach the frames before them."""
    from pipeline.core.model import ModelConfig, SpeakerClassifier

    config = load_artifact(tiny_artifact).model.config.to_dict()
    torch.manual_seed(0)
    model = SpeakerClassifier(ModelConfig(**{**config, "frontend": "pcen"})).eval()
    window, cpu = model.config.window_samples, torch.device("cpu")
    clips = short_clips(model, sorted((synthetic_data / "audio").rglob("*.wav"))[:16])
    plan = WindowPlan(window, model.config.sample_rate, 8, length_buckets=4)
    bucketed = run_windows(model, clip_items(clips, plan), len(clips), plan, cpu)
    full = classify_clips(model, clips, window, batch_windows=8, device=cpu)
    np.testing.assert_allclose(bucketed.scores, full.scores, atol=TOLERANCE)


def clip_items_of(clips, plan) -> np.ndarray:
    return np.concatenate([item.windows for item in clip_items(clips, plan)])


def test_fsdd_labels_are_those_of_full_windows(tiny_artifact, fsdd_recordings):
    """Real speech cut short: the same label as the full window wherever the full window's two best classes
    are further apart than the tolerance (closer than that, a tie could go either way)."""
    model = load_artifact(tiny_artifact).model
    clips = short_clips(model, sorted(fsdd_recordings.glob("*.wav"))[::20], seed=1)
    window, cpu = model.config.window_samples, torch.device("cpu")
    full = classify_clips(model, clips, window, batch_windows=16, device=cpu)
    bucketed = classify_clips(model, clips, window, batch_windows=16, device=cpu, length_buckets=4)
    np.testing.assert_allclose(bucketed.scores, full.scores, atol=TOLERANCE)
    best_two = np.sort(full.scores, axis=1)[:, -2:]
    clear = best_two[:, 1] - best_two[:, 0] > 2 * TOLERANCE
    assert clear.mean() > 0.9
    assert (bucketed.scores.argmax(1) == full.scores.argmax(1))[clear].all()


def test_speechbrains_windowed_encoder_buckets_as_the_infer_stage_does(tiny_artifact):
    from pipeline.core.model import WindowedEncoder

    model = load_artifact(tiny_artifact).model
    config = model.config
    encoder = WindowedEncoder(model.embedding_model, config.n_mels, config.window_samples,
                              sample_rate=config.sample_rate, length_buckets=4, energy_weighted=True).eval()  # fmt: skip
    rng = np.random.default_rng(2)
    lengths = [int(f * config.window_samples) for f in (0.1, 0.35, 0.7, 1.0, 2.4)]
    clips = [(np.linspace(0.02, 0.2, n) * rng.standard_normal(n)).astype(np.float32) for n in lengths]
    batch = torch.zeros(len(clips), max(lengths))
    for row, clip in enumerate(clips):
        batch[row, : clip.size] = torch.from_numpy(clip)
    with torch.inference_mode():
        found = encoder(batch, torch.tensor([n / max(lengths) for n in lengths])).squeeze(1)
    ours = classify_clips(model, clips, config.window_samples, device=torch.device("cpu"), length_buckets=4)
    np.testing.assert_allclose(found.numpy(), ours.embeddings, atol=1e-5)
