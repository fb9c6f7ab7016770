import dataclasses

import numpy as np
import pytest
import soundfile as sf
import torch
from helpers import classify_clips, cpu_runtime, span_plan

from pipeline.core.artifact import load_artifact
from pipeline.core.data import load_audio
from pipeline.core.tables import TestLayout, read_test_items
from pipeline.core.windows import WindowPlan
from pipeline.inference.predict import file_order, predict


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


def test_long_file_score_is_the_energy_weighted_mean_of_its_windows(tiny_artifact):
    artifact = load_artifact(tiny_artifact)
    window = artifact.window_samples
    rng = np.random.default_rng(0)
    clip = (0.1 * rng.standard_normal(int(2.5 * window))).astype(np.float32)
    clip[window:] *= 0.5  # the first window is louder than the rest
    whole = classify_clips(artifact.model, [clip], window, device=torch.device("cpu"))
    # ceil(2.5) = 3 evenly spaced windows: the first at the start, the last ending at the end
    step = (clip.size - window) // 2
    parts = [clip[:window], clip[step : step + window], clip[-window:]]
    each = classify_clips(artifact.model, parts, window, device=torch.device("cpu"))
    energy = np.array([np.mean(np.square(p, dtype=np.float64)) for p in parts])
    weights = energy / energy.max()
    assert weights[0] == 1.0 and weights[2] < 0.3  # the windows weigh differently
    # The file's embedding is the energy-weighted mean of its windows' unit embeddings (as training draws its
    # crops); the classifier ranks classes on it exactly as the same mean of the windows' cosine scores does.
    mean = (weights[:, None] * each.embeddings).sum(0) / weights.sum()
    np.testing.assert_allclose(whole.embeddings[0], mean, atol=2e-6)
    assert not np.allclose(whole.embeddings[0], each.embeddings.mean(0), atol=1e-4)
    np.testing.assert_allclose(np.linalg.norm(each.embeddings, axis=1), 1.0, atol=1e-5)
    mean_score = (weights[:, None] * each.scores).sum(0) / weights.sum()
    assert whole.scores[0].argmax() == mean_score.argmax()
    np.testing.assert_allclose(whole.scores[0] * np.linalg.norm(mean), mean_score, atol=2e-5)
    equal = classify_clips(artifact.model, [clip], window, device=torch.device("cpu"), energy_weighted=False)
    np.testing.assert_allclose(equal.embeddings[0], each.embeddings.mean(0), atol=2e-6)


def test_a_file_read_at_several_speeds_scores_the_mean_of_its_views(tiny_artifact):
    """test_time_speeds: the file is also played at each speed (as training's speed perturbation plays crops),
    and its embedding is the mean of each view's own (energy-weighted) mean embedding: every view counts alike,
    though a slower view has more windows. A speed of 1.0 alone is the file as it is, bit for bit."""
    from pipeline.core.data import play_at

    artifact = load_artifact(tiny_artifact)
    window, cpu = artifact.window_samples, torch.device("cpu")
    rng = np.random.default_rng(5)
    clip = (np.linspace(0.02, 0.2, int(2.5 * window)) * rng.standard_normal(int(2.5 * window))).astype(
        np.float32
    )
    speeds = (0.8, 1.0, 1.25)
    views = [play_at(torch.from_numpy(clip), s).numpy() for s in speeds]
    assert [len(v) for v in views] == [round(len(clip) / s) for s in speeds]  # slower is longer
    whole = classify_clips(artifact.model, [clip], window, device=cpu, speeds=speeds)
    each = classify_clips(artifact.model, views, window, device=cpu)
    np.testing.assert_allclose(whole.embeddings[0], each.embeddings.mean(0), atol=2e-6)
    as_it_is = classify_clips(artifact.model, [clip], window, device=cpu)
    assert not np.allclose(whole.embeddings[0], as_it_is.embeddings[0], atol=1e-4)
    one = classify_clips(artifact.model, [clip], window, device=cpu, speeds=(1.0,))
    np.testing.assert_array_equal(one.embeddings, as_it_is.embeddings)


def test_prediction_with_decode_workers_matches_in_process(tiny_artifact, synthetic_data):
    artifact = load_artifact(tiny_artifact)
    files = [row.rel_path for row in read_test_items(synthetic_data, TestLayout()).rows]
    plan = span_plan(synthetic_data, files)
    a = predict(artifact.model, plan, cpu_runtime(artifact.model, num_workers=0), log=lambda _: None)
    b = predict(artifact.model, plan, cpu_runtime(artifact.model, num_workers=2), log=lambda _: None)
    for pooling in a.spans.pooled:
        np.testing.assert_allclose(a.spans.pooled[pooling], b.spans.pooled[pooling], atol=1e-6)
    assert a.spans.ok.all() and a.files == len(files) and a.engine == "torch"


def test_file_order_is_longest_first(synthetic_data):
    files = [row.rel_path for row in read_test_items(synthetic_data, TestLayout()).rows]
    sizes = [
        (synthetic_data / files[i]).stat().st_size
        for i in file_order(synthetic_data, files, [None] * len(files))
    ]
    assert sizes == sorted(sizes, reverse=True)
    seconds = [float(k % 5) for k in range(len(files))]
    assert [seconds[i] for i in file_order(synthetic_data, files, seconds)] == sorted(seconds, reverse=True)


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
    files = [row.rel_path for row in read_test_items(tmp_path, TestLayout()).rows]
    predicted = predict(artifact.model, span_plan(tmp_path, files), cpu_runtime(artifact.model, 8, 8),
                        log=lambda _: None)  # fmt: skip
    result = predicted.spans
    assert result.ok.tolist() == [True, False]
    assert 1 in result.problems and "bad.wav" in result.problems[1]


def test_fast_reflect_padding_is_bit_identical(tiny_artifact):
    import copy

    from pipeline.inference.engines import use_fast_reflect_padding

    reference = load_artifact(tiny_artifact).model
    fast = copy.deepcopy(reference)
    assert use_fast_reflect_padding(fast) > 0
    wavs = 0.1 * torch.randn(3, reference.config.window_samples, generator=torch.Generator().manual_seed(0))
    lens = torch.tensor([1.0, 0.7, 0.3])
    with torch.inference_mode():
        expected = reference.scores(reference.embed(reference.features(wavs, lens), lens))
        actual = fast.scores(fast.embed(fast.features(wavs, lens), lens))
    assert torch.equal(actual, expected)


def test_chunk_spans_pool_their_own_overlapping_windows(tiny_artifact):
    """Every chunk's windows lie inside it, `hop` apart (the last ends at the chunk's end); max, mean and
    mean_max pool the windows' cosine scores exactly as computed one window at a time."""
    from pipeline.core.data import windows
    from pipeline.core.windows import FileWindows, run_windows, span_windows

    artifact = load_artifact(tiny_artifact)
    model, config = artifact.model, artifact.model.config
    rate, window = config.sample_rate, config.window_samples
    clip = (0.1 * np.random.default_rng(1).standard_normal(int(6.3 * rate))).astype(np.float32)
    spans = [(0, 0.0, 2.5), (1, 2.5, 5.0), (2, 5.0, 7.5)]  # the last has 1.3 s of audio
    plan = WindowPlan(window, rate, batch_windows=3, hop=window // 2)
    result = run_windows(
        model, iter([FileWindows(0, *span_windows(clip, spans, plan))]), 3, plan, torch.device("cpu")
    )
    unit_classes = torch.nn.functional.normalize(model.classifier.weight.detach(), dim=1)
    for k, (_, start, end) in enumerate(spans):
        part = clip[int(start * rate) : int(end * rate)]
        wavs, lens = windows(part, window, 1000, window // 2)
        expected_count = int(np.ceil((len(part) - window) / (window // 2))) + 1
        assert len(wavs) == expected_count
        with torch.inference_mode():
            each = model.embed(
                model.features(torch.from_numpy(wavs), torch.from_numpy(lens)), torch.from_numpy(lens)
            )
            cosines = torch.nn.functional.normalize(each, dim=1) @ unit_classes.T
        np.testing.assert_allclose(result.pooled["max"][k], cosines.max(0).values.numpy(), atol=2e-5)
        mean = (cosines * torch.from_numpy(lens)[:, None]).sum(0) / lens.sum()
        np.testing.assert_allclose(result.pooled["mean_max"][k], (0.5 * (mean + cosines.max(0).values)).numpy(),
                                   atol=2e-5)  # fmt: skip
    assert result.ok.all()


def test_the_artifacts_centre_is_taken_out_of_every_pooling_and_the_infer_config_can_keep_it_in(
    tiny_artifact, synthetic_data
):
    """The tiny artifact (aam) carries its training files' mean embedding; the runtime scores unit embeddings
    minus it (mean: the span's mean unit embedding minus it; max: each window's), and not with
    centre_embeddings=False."""
    from pipeline.core.config import InferConfig
    from pipeline.inference.runtime import Hardware, resolve_runtime

    artifact = load_artifact(tiny_artifact)
    centre = artifact.embedding_centre
    assert centre is not None and centre.shape == (artifact.model.config.embedding_size,)
    config = InferConfig(
        data_dir=str(synthetic_data), artifact_dir=str(tiny_artifact), num_workers=0, engine="torch"
    )
    runtime = resolve_runtime(config, artifact, Hardware(0, 2))
    assert torch.equal(runtime.centre, centre)
    plain = resolve_runtime(dataclasses.replace(config, centre_embeddings=False), artifact, Hardware(0, 2))
    assert plain.centre is None
    files = [row.rel_path for row in read_test_items(synthetic_data, TestLayout()).rows][:6]
    plan = span_plan(synthetic_data, files)
    centred = predict(artifact.model, plan, runtime, log=lambda _: None).spans
    uncentred = predict(artifact.model, plan, plain, log=lambda _: None).spans
    unit_classes = torch.nn.functional.normalize(artifact.model.class_centres(), dim=1)
    unit = torch.nn.functional.normalize(torch.from_numpy(uncentred.embeddings), dim=1)
    expected = torch.nn.functional.normalize(unit - centre, dim=1) @ unit_classes.T
    np.testing.assert_allclose(centred.pooled["mean"], expected.numpy(), atol=2e-5)
    np.testing.assert_allclose(centred.embeddings, uncentred.embeddings)  # the embeddings file: as computed
    assert not np.allclose(centred.pooled["mean"], uncentred.pooled["mean"], atol=1e-3)
    assert not np.allclose(centred.pooled["max"], uncentred.pooled["max"], atol=1e-3)


def test_a_span_past_the_decoded_audio_has_no_prediction(tiny_artifact):
    from pipeline.core.windows import FileWindows, run_windows, span_windows

    model = load_artifact(tiny_artifact).model
    rate, window = model.config.sample_rate, model.config.window_samples
    clip = np.full(int(2 * rate), 0.05, dtype=np.float32)
    plan = WindowPlan(window, rate, 4, hop=window)
    spans = [(0, 0.0, 2.0), (1, 2.0, 4.0)]  # the header said 4 s, the file held 2
    result = run_windows(
        model, iter([FileWindows(0, *span_windows(clip, spans, plan))]), 2, plan, torch.device("cpu")
    )
    assert result.ok.tolist() == [True, False] and np.isnan(result.pooled["max"][1]).all()


def test_a_deadline_stops_prediction_and_names_every_file_it_left(tiny_artifact, synthetic_data):
    import time

    artifact = load_artifact(tiny_artifact)
    files = [row.rel_path for row in read_test_items(synthetic_data, TestLayout()).rows][:6]
    plan, runtime = span_plan(synthetic_data, files), cpu_runtime(artifact.model)
    late = predict(artifact.model, plan, runtime, deadline=time.time() - 1, log=lambda _: None).spans
    assert late.stopped and "time limit" in late.stopped and not late.ok.any()
    assert late.problems == {k: "time limit: not predicted" for k in range(6)}
    early = predict(artifact.model, plan, runtime, deadline=time.time() + 3600, log=lambda _: None).spans
    assert early.stopped is None and early.ok.all() and early.audio_seconds > 0


def test_a_whole_file_span_overlaps_its_windows_by_file_hop():
    """clip_pooling other than mean: a file's windows lie `file_hop` apart, the last ending at the file's end,
    so an event cut by one window's edge is whole in the next; without file_hop they tile the file."""
    from pipeline.core.windows import span_windows

    rate, window = 1000, 1000
    clip = np.arange(5000, dtype=np.float32)
    tiled, _, _, _ = span_windows(clip, [(0, 0.0, None)], WindowPlan(window, rate, 8))
    halves, _, owner, _ = span_windows(clip, [(0, 0.0, None)], WindowPlan(window, rate, 8, file_hop=500))
    assert [int(w[0]) for w in tiled] == [0, 1000, 2000, 3000, 4000]
    assert [int(w[0]) for w in halves] == [0, 500, 1000, 1500, 2000, 2500, 3000, 3500, 4000]
    assert (owner == 0).all()


def test_a_files_silent_windows_are_left_out_with_quiet_window_db():
    """A short event padded with digital silence (ESC-50's clips): only the windows with sound are kept, and
    the loudest always; without quiet_db, and for chunk spans, every window stays."""
    from pipeline.core.windows import span_windows

    rate, window = 1000, 1000
    clip = np.zeros(5000, dtype=np.float32)
    clip[1200:1700] = 0.5  # the event, inside the second window only
    clip[3000:4000] = 0.002  # a window 45 dB below it
    plan = WindowPlan(window, rate, 8)
    every, _, _, _ = span_windows(clip, [(0, 0.0, None)], plan)
    kept, lens, _, _ = span_windows(clip, [(0, 0.0, None)], dataclasses.replace(plan, quiet_db=40.0))
    wide, _, _, _ = span_windows(clip, [(0, 0.0, None)], dataclasses.replace(plan, quiet_db=60.0))
    chunk, _, _, _ = span_windows(clip, [(0, 0.0, 5.0)], dataclasses.replace(plan, quiet_db=40.0, hop=window))
    assert len(every) == 5 and len(kept) == 1 and float(kept[0].max()) == 0.5 and lens.tolist() == [1.0]
    assert len(wide) == 2 and len(chunk) == 5
    silent, _, _, _ = span_windows(
        np.zeros(3000, np.float32), [(0, 0.0, None)], dataclasses.replace(plan, quiet_db=40.0)
    )
    assert len(silent) == 3  # all equally quiet: nothing to leave out


def test_a_files_windows_weigh_their_energy_and_a_chunks_weigh_alike():
    """energy_weighted: a whole file's windows weigh their valid share times their energy relative to the
    loudest window's (as training draws crops); chunk spans and plans without it weigh the valid share alone,
    and a silent file keeps its valid shares (its embedding must not vanish)."""
    from pipeline.core.windows import span_windows

    rate, window = 1000, 1000
    clip = np.full(2500, 0.1, dtype=np.float32)
    clip[:1000] = 0.2  # the first window holds 4x the energy of the second
    plan = WindowPlan(window, rate, 8, energy_weighted=True)
    _, lens, _, weights = span_windows(clip, [(0, 0.0, None)], plan)
    _, _, _, plain = span_windows(clip, [(0, 0.0, None)], dataclasses.replace(plan, energy_weighted=False))
    _, chunk_lens, _, chunk = span_windows(clip, [(0, 0.0, 2.5)], dataclasses.replace(plan, hop=window))
    # Windows start at 0, 750 and 1500 (the last ends at the file's end): 1, (250 * 4 + 750) / 4000, 1/4.
    np.testing.assert_allclose(weights, [1.0, 0.4375, 0.25], rtol=1e-5)
    np.testing.assert_array_equal(plain, lens)
    np.testing.assert_array_equal(chunk, chunk_lens)
    _, silent_lens, _, silent = span_windows(np.zeros(2500, np.float32), [(0, 0.0, None)], plan)
    np.testing.assert_array_equal(silent, silent_lens)


def test_speed_views_are_cut_for_whole_files_only_each_views_weights_summing_to_one():
    from pipeline.core.windows import span_windows

    rate, window = 1000, 1000
    clip = np.random.default_rng(0).standard_normal(2500).astype(np.float32)
    plan = WindowPlan(window, rate, 8, energy_weighted=True, speeds=(0.5, 1.0, 2.0))
    wavs, lens, owner, weights = span_windows(clip, [(0, 0.0, None), (1, 0.0, 2.5)], plan)
    whole = owner == 0
    # 5000, 2500 and 1250 samples: 5 + 3 + 2 windows for the whole file; the chunk's 3 windows as they are.
    assert whole.sum() == 10 and (~whole).sum() == 3
    views = np.split(weights[whole], [5, 8])
    assert [len(v) for v in views] == [5, 3, 2]
    for view in views:
        assert view.sum() == pytest.approx(1.0, rel=1e-6)
    as_it_is = dataclasses.replace(plan, speeds=(1.0,))
    np.testing.assert_array_equal(weights[~whole], lens[~whole])  # a chunk keeps its valid shares
    np.testing.assert_array_equal(wavs[~whole], span_windows(clip, [(1, 0.0, 2.5)], as_it_is)[0])
    np.testing.assert_array_equal(wavs[whole][5:8], span_windows(clip, [(0, 0.0, None)], as_it_is)[0])
