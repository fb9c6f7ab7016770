import json
import shutil

import numpy as np
import pytest
import torch
from helpers import classify_clips

from pipeline.core.artifact import (
    ArtifactError,
    check_training_outputs,
    load_artifact,
    save_artifact,
    verify_artifact,
)
from pipeline.core.config import InferConfig, TrainConfig
from pipeline.core.model import ModelConfig, SpeakerClassifier
from pipeline.core.staging import OutputRefused


def small_model():
    torch.manual_seed(0)
    return SpeakerClassifier(
        ModelConfig.from_preset("tiny", n_classes=3, n_mels=40, window_samples=8000)
    ).eval()


def test_roundtrip_reproduces_outputs_and_labels(tmp_path):
    model = small_model()
    path = save_artifact(tmp_path / "a", model, ["x", "y", "z"], {"note": "test"}, fallback_label="y")
    loaded = load_artifact(path)
    wavs = torch.randn(2, 8000)
    with torch.no_grad():
        torch.testing.assert_close(loaded.model(wavs, torch.ones(2)), model(wavs, torch.ones(2)))
    assert loaded.labels == ["x", "y", "z"] and loaded.manifest["fallback_label"] == "y"
    assert loaded.manifest["provenance"] == {"note": "test"}
    files = set(loaded.manifest["files"])
    assert {"model.safetensors", "hyperparams.yaml", "embedding_model.ckpt", "classifier.ckpt"} <= files


def test_the_embedding_centre_is_sealed_with_the_weights_and_checked_at_load(tmp_path):
    model = small_model()
    assert (
        load_artifact(save_artifact(tmp_path / "plain", model, ["x", "y", "z"], {})).embedding_centre is None
    )
    centre = [0.1] * model.config.embedding_size
    path = save_artifact(tmp_path / "a", model, ["x", "y", "z"], {}, embedding_centre=centre)
    assert load_artifact(path).embedding_centre.tolist() == pytest.approx(centre)
    manifest = json.loads((path / "manifest.json").read_text())
    for edited in ([0.2] * len(centre), None):  # changed, or taken out: either is refused
        (path / "manifest.json").write_text(json.dumps({**manifest, "embedding_centre": edited}))
        with pytest.raises(ArtifactError, match=r"'embedding_centre' differs from the value sealed"):
            load_artifact(path)
    short = save_artifact(tmp_path / "b", model, ["x", "y", "z"], {}, embedding_centre=[0.1, float("nan")])
    with pytest.raises(ArtifactError, match=r"embedding_centre is not \d+ finite numbers"):
        load_artifact(short)


def test_the_test_time_speeds_are_sealed_and_checked_at_load(tmp_path, tiny_artifact):
    """An artifact trained with speed perturbation records the speeds the infer stage reads files at; one
    trained without (the tiny fixture) records none, and its yaml reads files as they are."""
    assert load_artifact(tiny_artifact).test_time_speeds is None
    assert "speeds: null" in (tiny_artifact / "hyperparams.yaml").read_text()
    model = small_model()
    path = save_artifact(tmp_path / "a", model, ["x", "y", "z"], {}, test_time_speeds=[0.8, 1.0, 1.25])
    assert load_artifact(path).test_time_speeds == (0.8, 1.0, 1.25)
    assert "speeds: [0.8, 1.0, 1.25]" in (path / "hyperparams.yaml").read_text()
    manifest = json.loads((path / "manifest.json").read_text())
    for edited in ([1.0], None):  # changed, or taken out: either is refused
        (path / "manifest.json").write_text(json.dumps({**manifest, "test_time_speeds": edited}))
        with pytest.raises(ArtifactError, match=r"'test_time_speeds' differs from the value sealed"):
            load_artifact(path)
    wrong = save_artifact(tmp_path / "b", model, ["x", "y", "z"], {}, test_time_speeds=[0.1, 1.0])
    with pytest.raises(ArtifactError, match=r"test_time_speeds \[0.1, 1.0\] is not a list of speeds"):
        load_artifact(wrong)


def test_speechbrain_reads_files_at_the_artifacts_test_time_speeds_as_inference_does(tmp_path, monkeypatch):
    """With test_time_speeds in the artifact, SpeechBrain's EncoderClassifier plays each file at every speed and
    returns the project's scores; the speeds change the scores (they are not a no-op)."""
    from speechbrain.inference.speaker import EncoderClassifier
    from speechbrain.utils.fetching import LocalStrategy

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    model, speeds = small_model(), (0.8, 1.0, 1.25)
    path = save_artifact(tmp_path / "a", model, ["x", "y", "z"], {}, test_time_speeds=list(speeds))
    loaded = load_artifact(path)
    sb = EncoderClassifier.from_hparams(source=str(path), savedir=str(tmp_path / "sb"),
                                        local_strategy=LocalStrategy.COPY)  # fmt: skip
    rng = np.random.default_rng(4)
    clips = [
        (np.linspace(0.01, 0.2, n) * rng.standard_normal(n)).astype(np.float32) for n in (3000, 8000, 26000)
    ]
    buckets = InferConfig().length_buckets
    expected = classify_clips(loaded.model, clips, 8000, device=torch.device("cpu"), length_buckets=buckets,
                              speeds=speeds)  # fmt: skip
    as_they_are = classify_clips(
        loaded.model, clips, 8000, device=torch.device("cpu"), length_buckets=buckets
    )
    assert not np.allclose(as_they_are.scores, expected.scores, atol=1e-3)
    with torch.no_grad():
        sb_scores = [sb.classify_batch(torch.from_numpy(clip)[None])[0][0].numpy() for clip in clips]
    np.testing.assert_allclose(np.stack(sb_scores), expected.scores, atol=2e-5)


def test_artifact_refers_to_nothing_outside_itself(tiny_artifact):
    for name in ("manifest.json", "hyperparams.yaml"):
        text = (tiny_artifact / name).read_text()
        assert str(tiny_artifact) not in text and "speechbrain/spkrec" not in text
        assert "/tmp" not in text and "pretrained_path" not in text


def test_flipped_byte_is_refused_naming_the_file(artifact_copy):
    weights = artifact_copy / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[len(data) // 2] ^= 0xFF
    weights.write_bytes(bytes(data))
    with pytest.raises(ArtifactError, match=r"model.safetensors: sha256 does not match"):
        load_artifact(artifact_copy)


def test_truncated_and_missing_files_are_refused(artifact_copy):
    ckpt = artifact_copy / "classifier.ckpt"
    ckpt.write_bytes(ckpt.read_bytes()[:-10])
    with pytest.raises(ArtifactError, match=r"classifier.ckpt: size"):
        verify_artifact(artifact_copy)
    ckpt.unlink()
    with pytest.raises(ArtifactError, match=r"classifier.ckpt: listed in the manifest but missing"):
        verify_artifact(artifact_copy)


def test_unknown_format_version_and_missing_manifest(artifact_copy):
    manifest = json.loads((artifact_copy / "manifest.json").read_text())
    manifest["format_version"] = 99
    (artifact_copy / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(ArtifactError, match="format_version 99 is not supported"):
        load_artifact(artifact_copy)
    manifest["format_version"] = 1  # an artifact of an older version of this project
    (artifact_copy / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(ArtifactError, match="format_version 1 is not supported .*retrain"):
        load_artifact(artifact_copy)
    (artifact_copy / "manifest.json").unlink()
    with pytest.raises(ArtifactError, match=r"manifest.json: not found"):
        load_artifact(artifact_copy)


def test_a_failed_save_leaves_no_valid_looking_directory(tmp_path):
    with pytest.raises(FileNotFoundError):
        save_artifact(
            tmp_path / "a", small_model(), ["x", "y", "z"], {}, extra_files={"p.png": tmp_path / "no"}
        )
    assert not (tmp_path / "a").exists()
    assert list(tmp_path.iterdir()) == []  # the staging directory is gone too


def test_a_failed_save_keeps_the_previous_artifact(tmp_path):
    first = save_artifact(tmp_path / "a", small_model(), ["x", "y", "z"], {"run": 1})
    with pytest.raises(FileNotFoundError):
        save_artifact(
            first, small_model(), ["x", "y", "z"], {"run": 2}, extra_files={"p.png": tmp_path / "no"}
        )
    assert load_artifact(first).manifest["provenance"] == {"run": 1}


def test_a_new_artifact_never_replaces_a_file_put_into_the_old_one_or_edited_there(tmp_path):
    first = save_artifact(tmp_path / "a", small_model(), ["x", "y", "z"], {"run": 1})
    (first / "analysis.ipynb").write_text("precious")
    with pytest.raises(OutputRefused, match=r"holds files this project did not write \(analysis.ipynb\)"):
        save_artifact(first, small_model(), ["x", "y", "z"], {"run": 2})
    assert (first / "analysis.ipynb").read_text() == "precious"
    (first / "analysis.ipynb").unlink()
    with (first / "hyperparams.yaml").open("a") as yaml:
        yaml.write("# my note\n")
    with pytest.raises(OutputRefused, match=r"\(hyperparams.yaml \(changed since\)\)"):
        check_training_outputs(TrainConfig(artifact_dir=str(first), data_dir=str(tmp_path / "data")))
    assert (first / "hyperparams.yaml").read_text().endswith("# my note\n")


def test_moved_artifact_still_loads(artifact_copy, tmp_path):
    moved = tmp_path / "elsewhere" / "deep" / "model"
    shutil.move(str(artifact_copy), moved)
    assert load_artifact(moved).labels


def test_speechbrain_encoder_classifier_loads_it_offline_and_agrees(artifact_copy, tmp_path, monkeypatch):
    """SpeechBrain's own EncoderClassifier, given whole files of any length as a padded batch, returns the
    project's scores and labels: short files (one padded window), long ones (several windows) and both."""
    from speechbrain.inference.speaker import EncoderClassifier
    from speechbrain.utils.fetching import LocalStrategy

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    moved = tmp_path / "mounted" / "elsewhere"
    shutil.move(str(artifact_copy), moved)  # Kaggle mounts the artifact wherever it likes
    ours = load_artifact(moved)
    sb = EncoderClassifier.from_hparams(
        source=str(moved), savedir=str(tmp_path / "sb"), local_strategy=LocalStrategy.COPY
    )
    window = ours.window_samples
    rng = np.random.default_rng(1)
    lengths = [int(0.3 * window), window, int(1.7 * window), int(3.2 * window)]
    # Loudness that rises through each clip: its windows weigh their energy in the mean, as inference weighs them.
    clips = [(np.linspace(0.01, 0.2, n) * rng.standard_normal(n)).astype(np.float32) for n in lengths]
    # The yaml runs short windows at shorter lengths as the infer notebook's default does.
    buckets = InferConfig().length_buckets
    assert f"length_buckets: {buckets}" in (moved / "hyperparams.yaml").read_text()
    assert (
        ours.embedding_centre is not None
    )  # an aam artifact: the yaml takes the centre out as inference does
    assert "energy_weighted: true" in (moved / "hyperparams.yaml").read_text()
    expected = classify_clips(ours.model, clips, window, device=torch.device("cpu"), length_buckets=buckets,
                              centre=ours.embedding_centre, energy_weighted=True)  # fmt: skip
    plain = classify_clips(ours.model, clips, window, device=torch.device("cpu"), length_buckets=buckets,
                           energy_weighted=True)  # fmt: skip
    by_length = classify_clips(ours.model, clips, window, device=torch.device("cpu"), length_buckets=buckets,
                               centre=ours.embedding_centre, energy_weighted=False)  # fmt: skip
    assert not np.allclose(plain.scores, expected.scores, atol=1e-3)
    assert not np.allclose(
        by_length.scores[2:], expected.scores[2:], atol=1e-4
    )  # the clips of several windows
    batch = torch.zeros(len(clips), max(lengths))
    for row, clip in enumerate(clips):
        batch[row, : clip.size] = torch.from_numpy(clip)
    wav_lens = torch.tensor([n / max(lengths) for n in lengths])
    with torch.no_grad():
        sb_scores, _, sb_index, sb_labels = sb.classify_batch(batch, wav_lens)
        one_by_one = [sb.classify_batch(torch.from_numpy(clip)[None])[3][0] for clip in clips]
    np.testing.assert_allclose(sb_scores.numpy(), expected.scores, atol=2e-5)
    our_labels = [ours.labels[i] for i in expected.scores.argmax(1)]
    assert sb_labels == our_labels == one_by_one
    # Past max_windows a file is covered by evenly spaced windows: the yaml states the count it was built for.
    assert sb.mods.embedding_model.max_windows == InferConfig().max_windows_per_file
    assert f"max_windows: {InferConfig().max_windows_per_file}" in (moved / "hyperparams.yaml").read_text()

    # classify_file: SpeechBrain's own decoding and resampling of an 8 kHz file, against the project's.
    import soundfile as sf

    from pipeline.core.data import load_audio

    sf.write(tmp_path / "clip.wav", clips[2][::2], 8000)
    from_file = classify_clips(ours.model, [load_audio(tmp_path / "clip.wav")[0]], window,
                               device=torch.device("cpu"), length_buckets=buckets,
                               centre=ours.embedding_centre, energy_weighted=True)  # fmt: skip
    sb_file_scores, _, _, sb_file_label = sb.classify_file(str(tmp_path / "clip.wav"))
    np.testing.assert_allclose(sb_file_scores.numpy()[0], from_file.scores[0], atol=1e-4)
    assert sb_file_label == [ours.labels[int(from_file.scores[0].argmax())]]


def test_speechbrain_checks_the_label_count_against_the_classifier(artifact_copy, tmp_path, monkeypatch):
    """The yaml tells SpeechBrain's label encoder the classifier's class count: no "expect_len was never
    called" warning on load, and a label_encoder.ckpt that disagrees fails when SpeechBrain decodes (SpeechBrain
    does not read manifest.json, so this is its only guard)."""
    from speechbrain.inference.speaker import EncoderClassifier
    from speechbrain.utils.fetching import LocalStrategy

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    n_classes = len(load_artifact(artifact_copy).labels)

    def load(name: str) -> EncoderClassifier:
        return EncoderClassifier.from_hparams(
            source=str(artifact_copy), savedir=str(tmp_path / name), local_strategy=LocalStrategy.COPY
        )

    assert load("ok").hparams.label_encoder.expected_len == n_classes
    encoder_file = artifact_copy / "label_encoder.ckpt"
    encoder_file.write_text(
        encoder_file.read_text().replace("================", f"'extra' => {n_classes}\n" + "=" * 16, 1)
    )
    wavs = torch.zeros(1, 16000)
    with pytest.raises(
        RuntimeError, match=rf"expect_len\({n_classes}\) was called, but {n_classes + 1} categories"
    ):
        load("edited").classify_batch(wavs)


@pytest.mark.parametrize(
    "edit",
    [
        lambda m: m.update(labels=list(reversed(m["labels"]))),  # would silently rename every class
        lambda m: m["model_config"].update(score_scale=1.0),
        lambda m: m.update(fallback_label=m["labels"][-1]),
    ],
    ids=["labels", "model_config", "fallback_label"],
)
def test_an_edited_manifest_is_refused(artifact_copy, edit):
    path = artifact_copy / "manifest.json"
    manifest = json.loads(path.read_text())
    edit(manifest)
    path.write_text(json.dumps(manifest))
    with pytest.raises(ArtifactError, match=r"manifest.json: '\w+' differs from the value sealed"):
        load_artifact(artifact_copy)


def test_a_file_dropped_from_the_manifest_is_refused(artifact_copy):
    path = artifact_copy / "manifest.json"
    manifest = json.loads(path.read_text())
    del manifest["files"]["classifier.ckpt"]
    path.write_text(json.dumps(manifest))
    (artifact_copy / "classifier.ckpt").write_bytes(b"junk")  # no longer hashed: must still be refused
    with pytest.raises(ArtifactError, match=r"manifest.json: does not list classifier.ckpt"):
        load_artifact(artifact_copy)


def test_the_artifact_is_readable_by_others(tmp_path):
    path = save_artifact(tmp_path / "a", small_model(), ["x", "y", "z"], {})
    assert path.stat().st_mode & 0o777 == 0o755
    assert {p.stat().st_mode & 0o777 for p in path.iterdir()} == {0o644}


def test_a_missing_folder_or_a_data_folder_is_named_for_what_it_is(tmp_path, synthetic_data):
    """Issue 14: both read "is not a complete artifact (was training interrupted before it saved?)"."""
    with pytest.raises(ArtifactError, match=r"artifact_dir .*nope does not exist"):
        load_artifact(tmp_path / "nope")
    with pytest.raises(ArtifactError, match="is a competition folder, not an artifact"):
        load_artifact(synthetic_data)


def test_a_pcen_model_loads_in_speechbrain_with_its_front_end_and_agrees(tmp_path, monkeypatch):
    """frontend pcen travels in the manifest and in hyperparams.yaml: SpeechBrain's EncoderClassifier computes
    the same PCEN features and so the project's scores; a reloaded artifact keeps the front end."""
    from speechbrain.inference.speaker import EncoderClassifier
    from speechbrain.utils.fetching import LocalStrategy

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    torch.manual_seed(0)
    model = SpeakerClassifier(
        ModelConfig.from_preset("tiny", n_classes=3, n_mels=40, window_samples=8000, frontend="pcen")
    ).eval()
    path = save_artifact(tmp_path / "a", model, ["x", "y", "z"], {})
    loaded = load_artifact(path)
    assert loaded.model.config.frontend == "pcen" and loaded.model.pcen is not None
    assert "frontend: pcen" in (path / "hyperparams.yaml").read_text()
    sb = EncoderClassifier.from_hparams(source=str(path), savedir=str(tmp_path / "sb"),
                                        local_strategy=LocalStrategy.COPY)  # fmt: skip
    rng = np.random.default_rng(3)
    clips = [(0.1 * rng.standard_normal(n)).astype(np.float32) for n in (3000, 8000, 20000)]
    buckets = InferConfig().length_buckets
    expected = classify_clips(loaded.model, clips, 8000, device=torch.device("cpu"), length_buckets=buckets)
    with torch.no_grad():
        sb_scores = [sb.classify_batch(torch.from_numpy(clip)[None])[0][0].numpy() for clip in clips]
    np.testing.assert_allclose(np.stack(sb_scores), expected.scores, atol=2e-5)
    logmel = classify_clips(small_model(), clips, 8000, device=torch.device("cpu"), length_buckets=buckets)
    assert not np.allclose(logmel.scores, expected.scores, atol=1e-3)  # the front end is not a no-op


def test_an_ensemble_roundtrips_and_loads_in_speechbrain_with_the_mean_of_its_members(tmp_path, monkeypatch):
    """members travel in the manifest and in hyperparams.yaml (MemberEncoders around SpeechBrain's ECAPA_TDNNs,
    a Classifier over the side-by-side embeddings): the reloaded artifact and SpeechBrain's EncoderClassifier both
    give the project's scores, which are the mean of the members' own."""
    from speechbrain.inference.speaker import EncoderClassifier
    from speechbrain.utils.fetching import LocalStrategy

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    torch.manual_seed(0)
    model = SpeakerClassifier(
        ModelConfig.from_preset(
            "tiny", n_classes=3, n_mels=40, window_samples=8000, members=2, frontend="pcen"
        )
    ).eval()
    with torch.no_grad():  # unequal centre lengths, as training leaves them: the saved centres must not care
        model.classifier.weight[:, : model.config.lin_neurons] *= 3.0
    path = save_artifact(tmp_path / "a", model, ["x", "y", "z"], {})
    loaded = load_artifact(path)
    assert loaded.model.config.members == 2
    assert "pipeline.core.model.MemberEncoders" in (path / "hyperparams.yaml").read_text()
    rng = np.random.default_rng(4)
    clips = [(0.1 * rng.standard_normal(n)).astype(np.float32) for n in (3000, 8000, 20000)]
    buckets = InferConfig().length_buckets
    expected = classify_clips(model, clips, 8000, device=torch.device("cpu"), length_buckets=buckets)
    reloaded = classify_clips(loaded.model, clips, 8000, device=torch.device("cpu"), length_buckets=buckets)
    np.testing.assert_allclose(reloaded.scores, expected.scores, atol=1e-6)
    members = []
    for encoder in model.embedding_model.encoders:  # each member alone, as a one-member model
        single = SpeakerClassifier(ModelConfig(**{**model.config.to_dict(), "members": 1})).eval()
        single.embedding_model.load_state_dict(encoder.state_dict())
        members.append(single)
    width = model.config.lin_neurons
    for k, single in enumerate(members):
        with torch.no_grad():
            single.classifier.weight.copy_(model.classifier.weight[:, k * width : (k + 1) * width])
    singles = [
        classify_clips(m, clips, 8000, device=torch.device("cpu"), length_buckets=buckets) for m in members
    ]
    # A file's score averages its windows' unit embeddings first (as one model does), so the mean of the members'
    # file scores equals the ensemble's only for one-window files; every window's does (test_model.py).
    np.testing.assert_allclose(
        expected.scores[:2], np.mean([s.scores[:2] for s in singles], axis=0), atol=1e-5
    )
    sb = EncoderClassifier.from_hparams(source=str(path), savedir=str(tmp_path / "sb"),
                                        local_strategy=LocalStrategy.COPY)  # fmt: skip
    with torch.no_grad():
        sb_scores = [sb.classify_batch(torch.from_numpy(clip)[None])[0][0].numpy() for clip in clips]
    np.testing.assert_allclose(np.stack(sb_scores), expected.scores, atol=2e-5)
