import torch

from pipeline.config import MODEL_PRESETS
from pipeline.model import ModelConfig, SpeakerClassifier, count_parameters


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
