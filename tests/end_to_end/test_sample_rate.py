"""The sample rate is a parameter: 32 kHz keeps what birds sing above 8 kHz, and 16 kHz cannot."""

import json

import numpy as np
import pytest
from conftest import TINY_TRAIN

from pipeline.core.config import InferConfig, TrainConfig
from pipeline.core.model import fbank
from pipeline.demo_data.synthetic import make_high_band_competition
from pipeline.inference.submission import run_inference
from pipeline.tooling.scoring import score_submission
from pipeline.training.train import train


def test_the_fbank_spans_half_the_sample_rate_with_25_ms_windows():
    for rate in (16000, 32000, 44100):
        bank = fbank(40, rate)
        assert bank.compute_fbanks.f_max == rate // 2 and bank.compute_STFT.n_fft == round(0.025 * rate)


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_32_khz_separates_classes_that_differ_only_above_8_khz_and_16_khz_cannot(tmp_path):
    data = make_high_band_competition(tmp_path / "data", n_classes=3, train_per_class=16, test_per_class=10)
    accuracy = {}
    for rate in (16000, 32000):
        settings = {**TINY_TRAIN, "epochs": 6, "window_seconds": 0.5, "sample_rate": rate}
        model = tmp_path / f"model{rate}"
        train(
            TrainConfig(
                data_dir=str(data), artifact_dir=str(model), cache_dir=str(tmp_path / "cache"), **settings
            )
        )
        manifest = json.loads((model / "manifest.json").read_text())
        assert manifest["model_config"]["sample_rate"] == rate
        assert f"sample_rate: {rate}" in (model / "hyperparams.yaml").read_text()
        out = tmp_path / f"sub{rate}.csv"
        run_inference(
            InferConfig(data_dir=str(data), artifact_dir=str(model), submission_path=str(out), progress=False)
        )
        accuracy[rate] = score_submission(out, data / "solution.csv")[1]
    assert accuracy[32000] >= 0.9, accuracy
    assert accuracy[16000] <= 0.6, accuracy  # 3 classes: chance is 1/3; 18 of 30 by luck is p < 0.001
    # The cache keeps one copy per rate (the fingerprint includes it).
    assert len(list((tmp_path / "cache").glob("*/cache.json"))) == 2
    assert np.isfinite(list(accuracy.values())).all()
