import numpy as np
import pytest
import soundfile as sf
import torch

from pipeline.artifact import load_artifact
from pipeline.data import load_audio
from pipeline.inference import classify_clips, file_order, predict_rows
from pipeline.tables import TestLayout, read_test_items


def test_batched_windows_equal_one_file_at_a_time(tiny_artifact, synthetic_data):
    """Dense batching must not change any file's scores (the naive loop is the reference)."""
    artifact = load_artifact(tiny_artifact)
    rows = read_test_items(synthetic_data, TestLayout()).rows[:9]
    clips = [load_audio(synthetic_data / r.rel_path)[0] for r in rows]
    window = artifact.window_samples
    batched = classify_clips(artifact.model, clips, window, batch_windows=5, device=torch.device("cpu"))
    for i, clip in enumerate(clips):
        alone = classify_clips(artifact.model, [clip], window, batch_windows=1, device=torch.device("cpu"))
        np.testing.assert_allclose(batched.scores[i], alone.scores[0], atol=2e-5)
    assert batched.ok.all()


def test_long_file_score_is_the_length_weighted_mean_of_its_windows(tiny_artifact):
    artifact = load_artifact(tiny_artifact)
    window = artifact.window_samples
    rng = np.random.default_rng(0)
    clip = (0.1 * rng.standard_normal(int(2.5 * window))).astype(np.float32)
    whole = classify_clips(artifact.model, [clip], window, device=torch.device("cpu"))
    # ceil(2.5) = 3 evenly spaced windows: the first at the start, the last ending at the end
    step = (clip.size - window) // 2
    parts = [clip[:window], clip[step : step + window], clip[-window:]]
    each = classify_clips(artifact.model, parts, window, device=torch.device("cpu"))
    # The file's embedding is the mean of its windows' unit embeddings; the classifier ranks classes on it
    # exactly as the mean of the windows' cosine scores does.
    np.testing.assert_allclose(whole.embeddings[0], each.embeddings.mean(0), atol=2e-6)
    np.testing.assert_allclose(np.linalg.norm(each.embeddings, axis=1), 1.0, atol=1e-5)
    assert whole.scores[0].argmax() == each.scores.mean(0).argmax()
    np.testing.assert_allclose(whole.scores[0] * np.linalg.norm(each.embeddings.mean(0)), each.scores.mean(0),
                               atol=2e-5)  # fmt: skip


def test_predict_rows_with_workers_matches_in_process(tiny_artifact, synthetic_data):
    artifact = load_artifact(tiny_artifact)
    rows = read_test_items(synthetic_data, TestLayout()).rows
    order = file_order(synthetic_data, rows)
    cpu = torch.device("cpu")
    a = predict_rows(artifact.model, synthetic_data, rows, order, cpu, 16, 64, num_workers=0)
    b = predict_rows(artifact.model, synthetic_data, rows, order, cpu, 16, 64, num_workers=2)
    np.testing.assert_allclose(a.scores, b.scores, atol=1e-6)
    assert a.ok.all() and sum(a.device_counts.values()) == len(rows)


def test_file_order_is_longest_first(synthetic_data):
    rows = read_test_items(synthetic_data, TestLayout()).rows
    sizes = [(synthetic_data / rows[i].rel_path).stat().st_size for i in file_order(synthetic_data, rows)]
    assert sizes == sorted(sizes, reverse=True)


@pytest.mark.parametrize("damage", ["missing", "empty", "garbage", "all_nan"])
def test_unusable_files_are_reported_not_raised(tiny_artifact, tmp_path, damage):
    artifact = load_artifact(tiny_artifact)
    (tmp_path / "test.csv").write_text("id,path\na,ok.wav\nb,bad.wav\n")
    sf.write(tmp_path / "ok.wav", np.zeros(8000, dtype=np.float32) + 0.01, 16000)
    if damage == "empty":
        (tmp_path / "bad.wav").write_bytes(b"")
    elif damage == "garbage":
        (tmp_path / "bad.wav").write_bytes(b"\x00\x01" * 500)
    elif damage == "all_nan":
        sf.write(tmp_path / "bad.wav", np.full(800, np.nan, dtype=np.float32), 16000, subtype="FLOAT")
    rows = read_test_items(tmp_path, TestLayout()).rows
    result = predict_rows(artifact.model, tmp_path, rows, [0, 1], torch.device("cpu"), 8, 8, num_workers=0)
    assert result.ok.tolist() == [True, False]
    assert 1 in result.problems and "bad.wav" in result.problems[1]


def test_fast_reflect_padding_is_bit_identical(tiny_artifact):
    import copy

    from pipeline.inference import use_fast_reflect_padding

    reference = load_artifact(tiny_artifact).model
    fast = copy.deepcopy(reference)
    assert use_fast_reflect_padding(fast) > 0
    wavs = 0.1 * torch.randn(3, reference.config.window_samples, generator=torch.Generator().manual_seed(0))
    lens = torch.tensor([1.0, 0.7, 0.3])
    with torch.inference_mode():
        expected = reference.scores(reference.embed(reference.features(wavs, lens), lens))
        actual = fast.scores(fast.embed(fast.features(wavs, lens), lens))
    assert torch.equal(actual, expected)
