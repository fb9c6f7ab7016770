import torch

from pipeline.core.config import MODEL_PRESETS
from pipeline.core.model import ModelConfig, SpeakerClassifier, count_parameters, embed_waveforms


def tiny(n_classes=3):
    return SpeakerClassifier(
        ModelConfig.from_preset("tiny", n_classes=n_classes, n_mels=40, window_samples=8000)
    )


def test_forward_gives_cosine_scores_per_class():
    model = tiny().eval()
    wavs, lens = torch.randn(4, 8000), torch.tensor([1.0, 1.0, 0.5, 0.25])
    scores = model(wavs, lens)
    assert scores.shape == (4, 3)
    assert scores.abs().max() <= 1.0 + 1e-5  # cosines


def test_features_ready_path_equals_waveform_path():
    model = tiny().eval()
    wavs, lens = torch.randn(2, 8000), torch.ones(2)
    with torch.no_grad():
        direct = model(wavs, lens)
        via_features = model(model.features(wavs, lens), lens, features_ready=True)
    torch.testing.assert_close(direct, via_features)


def test_embed_waveforms_is_the_models_embedding_in_fp32_on_the_host():
    model = tiny().eval()
    wavs, lens = torch.randn(3, 8000), torch.tensor([1.0, 0.5, 0.25])
    with torch.no_grad():
        expected = model.embed(model.features(wavs, lens), lens)
        plain = embed_waveforms(model, wavs, lens, torch.device("cpu"))
        cast = embed_waveforms(
            model, wavs, lens, torch.device("cpu"), torch.autocast("cpu", dtype=torch.bfloat16)
        )
    torch.testing.assert_close(plain, expected)
    assert plain.device.type == cast.device.type == "cpu" and plain.dtype == cast.dtype == torch.float32
    assert torch.nn.functional.cosine_similarity(cast, expected).min() > 0.99  # bf16: close, not equal


def test_presets_grow():
    sizes = [
        count_parameters(SpeakerClassifier(ModelConfig.from_preset(p, n_classes=5))) for p in MODEL_PRESETS
    ]
    assert sizes == sorted(sizes) and sizes[0] < 200_000 < sizes[-1]


def test_scores_stay_fp32_under_bf16_autocast():
    """Issue 13: under TPU autocast the cosine classifier ran in bf16 (resolution 2^-8 near 1: 0.12 per logit
    at scale 30, more than the margin's effect). The scores are computed in fp32 whatever autocast says."""
    model = tiny(n_classes=50).eval()
    embeddings = torch.randn(16, model.config.lin_neurons)
    with torch.no_grad():
        exact = model.scores(embeddings)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            under_autocast = model.scores(embeddings)
    assert under_autocast.dtype == torch.float32
    torch.testing.assert_close(under_autocast, exact, rtol=0, atol=1e-4)


def test_fbank_under_fp16_autocast_stays_finite_fp32_at_full_scale():
    """The T4 path: fp16 autocast around the model; log-mel energies of full-scale audio overflow fp16."""
    model = tiny().eval()
    t = torch.arange(8000) / 16000
    full_scale = torch.stack(
        [torch.sin(2 * torch.pi * 440 * t), torch.sign(torch.sin(2 * torch.pi * 97 * t))]
    )
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.float16):
        feats = model.features(full_scale, torch.ones(2))
    assert feats.dtype == torch.float32 and torch.isfinite(feats).all()


def pcen_model(n_classes=3):
    return SpeakerClassifier(
        ModelConfig.from_preset("tiny", n_classes=n_classes, n_mels=40, window_samples=8000, frontend="pcen")
    )


def test_pcen_is_the_running_level_smoother_started_from_the_valid_frames_median():
    from pipeline.core.model import PCEN

    pcen = PCEN()
    feats_db = 20 * torch.randn(3, 60, 8, generator=torch.Generator().manual_seed(0)) - 30
    lens = torch.tensor([1.0, 0.5, 0.1])
    out = pcen(feats_db, lens)
    for row in range(3):
        energy = 10 ** (feats_db[row] / 10)
        valid = max(1, round(float(lens[row]) * 60))
        level = torch.nanmedian(energy[:valid], dim=0).values
        expected = []
        for frame in energy:  # M[t] = (1 - b) M[t-1] + b E[t], as librosa.pcen's filter
            level = (1 - pcen.b) * level + pcen.b * frame
            expected.append((frame / (1e-6 + level) ** 0.98 + 2) ** 0.5 - 2**0.5)
        torch.testing.assert_close(out[row], torch.stack(expected), rtol=1e-5, atol=1e-5)


def test_pcen_frames_depend_only_on_what_came_before_so_padding_changes_no_valid_frame():
    model = pcen_model().eval()
    clip = 0.1 * torch.randn(4000, generator=torch.Generator().manual_seed(1))
    full, short = torch.zeros(1, 8000), torch.zeros(1, 6000)  # a window, and a length bucket's shorter tensor
    full[0, :4000] = short[0, :4000] = clip
    valid = (
        4000 // 160
    )  # frames of audio; relative lengths that keep that count, as pipeline/core/buckets.py makes
    with torch.no_grad():
        a = model.features(full, torch.tensor([valid / (8000 // 160 + 1)]))
        b = model.features(short, torch.tensor([valid / (6000 // 160 + 1)]))
    torch.testing.assert_close(a[0, :valid], b[0, :valid], rtol=1e-5, atol=1e-5)
    with torch.no_grad():  # the same without PCEN: the front end's other parts hold it too
        logmel = tiny().eval()
        c = logmel.features(full, torch.tensor([valid / (8000 // 160 + 1)]))
    assert not torch.allclose(a[0, :valid], c[0, :valid], atol=1e-2)


def members_and_singles(members=3, n_classes=4):
    """An ensemble model and, for each member, a one-member model with that member's encoder and centres."""
    torch.manual_seed(0)
    config = ModelConfig.from_preset(
        "tiny", n_classes=n_classes, n_mels=40, window_samples=8000, members=members
    )
    ensemble = SpeakerClassifier(config).eval()
    singles = []
    for k, encoder in enumerate(ensemble.embedding_model.encoders):
        single = SpeakerClassifier(ModelConfig(**{**config.to_dict(), "members": 1})).eval()
        single.embedding_model.load_state_dict(encoder.state_dict())
        width = config.lin_neurons
        with torch.no_grad():
            single.classifier.weight.copy_(ensemble.classifier.weight[:, k * width : (k + 1) * width])
        singles.append(single)
    return ensemble, singles


def test_an_ensembles_scores_are_the_mean_of_its_members_own_cosines_on_every_path():
    """Training sees each member's own scores; validation, inference (cosine with class_centres) and SpeechBrain's
    Classifier (given class_centres as its weight) all see their mean."""
    from speechbrain.lobes.models.ECAPA_TDNN import Classifier

    from pipeline.core.windows import cosine_scores

    ensemble, singles = members_and_singles()
    wavs, lens = torch.randn(5, 8000), torch.tensor([1.0, 1.0, 0.7, 0.5, 1.0])
    with torch.no_grad():
        own = torch.stack([single(wavs, lens) for single in singles], dim=1)  # [B, members, C]
        assert ensemble(wavs, lens).shape == (5, 3, 4)
        torch.testing.assert_close(ensemble(wavs, lens), own)
        embeddings = ensemble.embed(ensemble.features(wavs, lens), lens)
        assert embeddings.shape == (5, ensemble.config.embedding_size)
        torch.testing.assert_close(ensemble.scores(embeddings), own.mean(dim=1))
        torch.testing.assert_close(cosine_scores(embeddings, ensemble.class_centres()), own.mean(dim=1))
        speechbrain = Classifier(input_size=ensemble.config.embedding_size, out_neurons=4)
        speechbrain.weight.copy_(ensemble.class_centres())
        torch.testing.assert_close(speechbrain(embeddings.unsqueeze(1)).squeeze(1), own.mean(dim=1))
    # The lengths of a member's centres are free parameters in training: the scores must not depend on them.
    with torch.no_grad():
        ensemble.classifier.weight[:, : ensemble.config.lin_neurons] *= 7.0
    torch.testing.assert_close(cosine_scores(embeddings, ensemble.class_centres()), own.mean(dim=1))


def test_members_start_from_their_own_initialisations():
    ensemble, _ = members_and_singles(members=2)
    first, second = (dict(encoder.named_parameters()) for encoder in ensemble.embedding_model.encoders)
    weights = [
        name for name in first if name.endswith("conv.weight")
    ]  # BatchNorm's start at 1 in every model
    assert weights and all(not torch.equal(first[name], second[name]) for name in weights)
