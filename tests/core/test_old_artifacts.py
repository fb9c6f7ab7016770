"""Artifacts written before pipeline/ had subpackages: their hyperparams.yaml names pipeline.model.* (kept by
the alias module pipeline/model.py), and SpeechBrain still loads them and predicts the project's scores."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from helpers import classify_clips

from pipeline.core.artifact import save_artifact
from pipeline.core.config import InferConfig
from pipeline.core.model import ModelConfig, SpeakerClassifier

OLD, NEW = "pipeline.model.", "pipeline.core.model."


@pytest.mark.parametrize("members", [1, 2])
def test_an_artifact_naming_the_old_class_paths_loads_in_speechbrain_and_predicts(
    tmp_path, monkeypatch, members
):
    from speechbrain.inference.speaker import EncoderClassifier
    from speechbrain.utils.fetching import LocalStrategy

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    torch.manual_seed(0)
    model = SpeakerClassifier(
        ModelConfig.from_preset("tiny", n_classes=3, n_mels=40, window_samples=8000, members=members)
    ).eval()
    path = save_artifact(tmp_path / "a", model, ["x", "y", "z"], {})
    yaml = path / "hyperparams.yaml"
    written = yaml.read_text()
    assert NEW + "WindowedEncoder" in written and OLD not in written
    old = written.replace(NEW, OLD)  # what an artifact of the flat layout says
    for name in ("WindowedEncoder", "PassThrough", "label_encoder") + (
        ("MemberEncoders",) if members > 1 else ()
    ):
        assert OLD + name in old, name
    yaml.write_text(old)
    sb = EncoderClassifier.from_hparams(source=str(path), savedir=str(tmp_path / "sb"),
                                        local_strategy=LocalStrategy.COPY)  # fmt: skip
    assert type(sb.mods.embedding_model).__module__ == "pipeline.core.model"  # the alias is the same class
    rng = np.random.default_rng(5)
    clips = [(0.1 * rng.standard_normal(n)).astype(np.float32) for n in (3000, 8000, 20000)]
    buckets = InferConfig().length_buckets
    expected = classify_clips(model, clips, 8000, device=torch.device("cpu"), length_buckets=buckets)
    with torch.no_grad():
        found = [sb.classify_batch(torch.from_numpy(clip)[None]) for clip in clips]
    np.testing.assert_allclose(np.stack([f[0][0].numpy() for f in found]), expected.scores, atol=2e-5)
    assert [f[3][0] for f in found] == [["x", "y", "z"][i] for i in expected.scores.argmax(1)]
