import pytest

from pipeline.core.config import ConfigError, InferConfig, TrainConfig, from_params


def test_from_params_takes_known_parameters_and_coerces_ints_to_floats():
    config = from_params(TrainConfig, {"data_dir": "d", "epochs": 3, "base_lr": 1, "devices": None})
    assert config.epochs == 3 and config.data_dir == "d"
    assert isinstance(config.base_lr, float) and config.base_lr == 1.0


def test_from_params_ignores_ipython_and_private_names_and_non_data():
    namespace = {
        "In": ["x"],
        "Out": {},
        "_i1": "code",
        "TrainConfig": TrainConfig,
        "math": pytest,
        "epochs": 2,
    }
    assert from_params(TrainConfig, namespace).epochs == 2


def test_unknown_parameter_is_named_with_a_suggestion():
    with pytest.raises(ConfigError, match=r"'epoch' \(did you mean 'epochs'\?\)"):
        from_params(TrainConfig, {"epoch": 3})


def test_mistyped_parameter_is_named():
    with pytest.raises(ConfigError, match=r"epochs='3' has type str; expected int"):
        from_params(TrainConfig, {"epochs": "3"})
    with pytest.raises(ConfigError, match="progress"):
        from_params(TrainConfig, {"progress": 1})


@pytest.mark.parametrize(
    "field, value",
    [
        ("accelerator", "gpu0"),
        ("lr_scaling", "cubic"),
        ("precision", "fp8"),
        ("epochs", 0),
        ("base_lr", -1.0),
        ("sample_rate", 4000),
        ("objective", "softmax"),
        ("metric", "f1"),
        ("noise_probability", 1.5),
        ("mix_probability", -0.1),
        ("secondary_label_weight", 0.0),
        ("crops_per_file", 0),
        ("frontend", "mfcc"),
        ("ensemble_members", 0),
    ],
)
def test_invalid_values_name_the_parameter(field, value):
    with pytest.raises(ConfigError, match=field):
        TrainConfig(**{field: value})


def test_freeze_encoder_needs_init_from():
    with pytest.raises(ConfigError, match="init_from"):
        TrainConfig(freeze_encoder=True)


def test_a_noise_range_must_go_from_low_to_high():
    with pytest.raises(ConfigError, match="noise_snr_db_low=10.0 > noise_snr_db_high=5.0"):
        TrainConfig(noise_snr_db_low=10.0, noise_snr_db_high=5.0)


def test_infer_config_validation():
    with pytest.raises(ConfigError, match="device"):
        InferConfig(device="tpu")
    for field, value in (("segment_seconds", 0.0), ("chunk_pooling", "median"), ("time_limit_minutes", -5.0),
                         ("expected_test_files", 0), ("window_hop_seconds", 0.0)):  # fmt: skip
        with pytest.raises(ConfigError, match=field):
            InferConfig(**{field: value})
    with pytest.raises(ConfigError, match="submision_path"):
        from_params(InferConfig, {"submision_path": "x.csv"})


def test_a_number_for_a_text_parameter_says_to_use_papermills_raw_flag():
    """Issue 14: `-p fallback_label 3` was refused as an int without saying how to pass the text 3."""
    with pytest.raises(ConfigError, match=r"fallback_label=3 .*pass the text with -r fallback_label 3"):
        from_params(InferConfig, {"fallback_label": 3})
    assert from_params(InferConfig, {"fallback_label": "3"}).fallback_label == "3"
