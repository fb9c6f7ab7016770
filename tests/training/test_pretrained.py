"""init_from / freeze_encoder: starting from a SpeechBrain pretrained directory, offline.

The tests build a small pretrained directory in SpeechBrain's own format: hyperparams.yaml modelled on
speechbrain/spkrec-ecapa-voxceleb's (its `pretrained_path` and Pretrainer `paths` name the hub, as the real one
does) beside embedding_model.ckpt, classifier.ckpt, mean_var_norm_emb.ckpt and label_encoder.txt written by
SpeechBrain's own classes. Network access is refused while they run, and every refused attempt is recorded.
"""

from __future__ import annotations

import json
import shutil
import socket
from pathlib import Path

import pytest
import torch
from conftest import TINY_TRAIN
from safetensors.torch import load_file

from pipeline.core.config import ConfigError, TrainConfig
from pipeline.training.plan import choose_frontend, choose_members
from pipeline.training.pretrained import PretrainedError, initial_model

N_MELS = TINY_TRAIN["n_mels"]
ARCH = dict(channels=[32, 32, 32, 32, 96], lin_neurons=64, attention_channels=16, se_channels=16)
LABELS = ["a", "b", "c", "d"]

# Modelled on spkrec-ecapa-voxceleb's hyperparams.yaml (a smaller network, the same structure and keys).
HYPERPARAMS = """\
# ############################################################################
# Model: ECAPA big for Speaker verification (test copy, tiny)
# ############################################################################

# Feature parameters
n_mels: {n_mels}

# Pretrain folder (HuggingFace)
pretrained_path: speechbrain/spkrec-ecapa-voxceleb

# Output parameters
out_n_neurons: 7

# Model params
compute_features: !new:speechbrain.lobes.features.Fbank
    n_mels: !ref <n_mels>

mean_var_norm: !new:speechbrain.processing.features.InputNormalization
    norm_type: sentence
    std_norm: False

embedding_model: !new:speechbrain.lobes.models.ECAPA_TDNN.ECAPA_TDNN
    input_size: !ref <n_mels>
    channels: {channels}
    kernel_sizes: {kernel_sizes}
    dilations: [1, 2, 3, 4, 1]
    attention_channels: {attention_channels}
    se_channels: {se_channels}
    lin_neurons: {lin_neurons}

classifier: !new:speechbrain.lobes.models.ECAPA_TDNN.Classifier
    input_size: {lin_neurons}
    out_neurons: !ref <out_n_neurons>

mean_var_norm_emb: !new:speechbrain.processing.features.InputNormalization
    norm_type: global
    std_norm: False

modules:
    compute_features: !ref <compute_features>
    mean_var_norm: !ref <mean_var_norm>
    embedding_model: !ref <embedding_model>
    mean_var_norm_emb: !ref <mean_var_norm_emb>
    classifier: !ref <classifier>

label_encoder: !new:speechbrain.dataio.encoder.CategoricalEncoder

pretrainer: !new:speechbrain.utils.parameter_transfer.Pretrainer
    loadables:
        embedding_model: !ref <embedding_model>
        mean_var_norm_emb: !ref <mean_var_norm_emb>
        classifier: !ref <classifier>
        label_encoder: !ref <label_encoder>
    paths:
        embedding_model: !ref <pretrained_path>/embedding_model.ckpt
        mean_var_norm_emb: !ref <pretrained_path>/mean_var_norm_emb.ckpt
        classifier: !ref <pretrained_path>/classifier.ckpt
        label_encoder: !ref <pretrained_path>/label_encoder.txt
"""


def write_hyperparams(directory: Path, **changes) -> Path:
    values = dict(n_mels=N_MELS, kernel_sizes=[5, 3, 3, 3, 1], **ARCH)
    values.update(changes)
    path = directory / "hyperparams.yaml"
    path.write_text(HYPERPARAMS.format(**values))
    return path


def make_pretrained_dir(directory: Path, seed: int = 123) -> dict[str, torch.Tensor]:
    """A SpeechBrain-format pretrained ECAPA; returns its encoder state dict. BatchNorm running statistics
    are set away from their initial values so tests can tell whether they were kept."""
    from speechbrain.dataio.encoder import CategoricalEncoder
    from speechbrain.lobes.models.ECAPA_TDNN import ECAPA_TDNN, Classifier
    from speechbrain.processing.features import InputNormalization

    directory.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(seed)
    encoder = ECAPA_TDNN(input_size=N_MELS, **ARCH)
    for name, buffer in encoder.named_buffers():
        if name.endswith("running_mean"):
            buffer.normal_(0.0, 0.5)
        elif name.endswith("running_var"):
            buffer.uniform_(0.5, 2.0)
    state = {k: v.clone() for k, v in encoder.state_dict().items()}
    torch.save(state, directory / "embedding_model.ckpt")
    torch.save(
        Classifier(input_size=ARCH["lin_neurons"], out_neurons=7).state_dict(), directory / "classifier.ckpt"
    )
    norm = InputNormalization(norm_type="global", std_norm=False)
    norm(torch.randn(4, 1, ARCH["lin_neurons"]), torch.ones(4))
    norm._save(directory / "mean_var_norm_emb.ckpt")
    labels = CategoricalEncoder()
    for label in [f"id1000{i}" for i in range(7)]:
        labels.add_label(label)
    labels.save(directory / "label_encoder.txt")
    write_hyperparams(directory)
    return state


@pytest.fixture
def network_attempts(monkeypatch) -> list[str]:
    """Refuse every outgoing network connection and name lookup in this process; the list records each attempt.
    AF_UNIX sockets are local IPC (DataLoader workers hand tensors back through them), not the network."""
    attempts: list[str] = []

    def refuse(what, original=None):
        def blocked(*args, **kwargs):
            if original is not None and args and args[0].family == socket.AF_UNIX:
                return original(*args, **kwargs)
            attempts.append(f"{what}{args[1:2] if what.startswith('socket.') else args[:1]}")
            raise OSError(f"network access blocked by the test ({what})")

        return blocked

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    for name in ("connect", "connect_ex"):
        monkeypatch.setattr(socket.socket, name, refuse(f"socket.{name}", getattr(socket.socket, name)))
    monkeypatch.setattr(socket, "create_connection", refuse("create_connection"))
    monkeypatch.setattr(socket, "getaddrinfo", refuse("getaddrinfo"))
    return attempts


@pytest.fixture
def pretrained_dir(tmp_path) -> tuple[Path, dict[str, torch.Tensor]]:
    directory = tmp_path / "spkrec-ecapa-voxceleb"
    return directory, make_pretrained_dir(directory)


def tiny_config(init_from: Path, **overrides) -> TrainConfig:
    return TrainConfig(**{**TINY_TRAIN, "init_from": str(init_from), **overrides})


def encoder_state(model) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.embedding_model.state_dict().items()}


def test_the_hub_yaml_would_fetch_and_the_block_stops_it(pretrained_dir, network_attempts, tmp_path):
    """Control: SpeechBrain's own Pretrainer, given this yaml, goes to the hub, and here that fails."""
    from hyperpyyaml import load_hyperpyyaml

    directory, _ = pretrained_dir
    with open(directory / "hyperparams.yaml") as handle:
        hparams = load_hyperpyyaml(handle)
    assert str(hparams["pretrainer"].paths["embedding_model"]).startswith("speechbrain/spkrec-ecapa-voxceleb")
    with pytest.raises(Exception):  # noqa: B017 - any failure to fetch; which one depends on huggingface_hub
        hparams["pretrainer"].set_collect_in(tmp_path / "collect")
        hparams["pretrainer"].collect_files()
    with pytest.raises(OSError, match="blocked"):
        socket.create_connection(("example.com", 80))


def test_initial_model_loads_the_pretrained_encoder_offline(pretrained_dir, network_attempts):
    directory, state = pretrained_dir
    messages: list[str] = []
    model = initial_model(tiny_config(directory), "small", LABELS, messages.append)
    assert model.config.channels == ARCH["channels"] and model.config.lin_neurons == ARCH["lin_neurons"]
    assert model.config.se_channels == 16 and model.config.n_mels == N_MELS
    assert model.config.window_samples == tiny_config(directory).window_samples
    loaded = encoder_state(model)
    assert loaded.keys() == state.keys()
    for key, value in state.items():
        assert torch.equal(loaded[key], value), key
    assert model.classifier.weight.shape == (len(LABELS), ARCH["lin_neurons"])  # new, our labels
    assert all(p.requires_grad for p in model.parameters())  # not frozen unless asked
    assert "encoder weights from embedding_model.ckpt" in messages[0]
    assert network_attempts == []


def test_our_encoder_computes_what_speechbrain_computes_from_the_same_directory(pretrained_dir, tmp_path):
    """The architecture read from the yaml and the weights are SpeechBrain's own: the embeddings agree with
    EncoderClassifier's (loaded from local files by pointing pretrained_path at the directory)."""
    from speechbrain.inference.speaker import EncoderClassifier
    from speechbrain.utils.fetching import LocalStrategy

    directory, _ = pretrained_dir
    model = initial_model(tiny_config(directory), "small", LABELS, lambda _: None).eval()
    reference = EncoderClassifier.from_hparams(
        source=str(directory), savedir=str(tmp_path / "sb"), overrides={"pretrained_path": str(directory)},
        local_strategy=LocalStrategy.COPY,
    )  # fmt: skip
    wavs = 0.1 * torch.randn(3, 8000, generator=torch.Generator().manual_seed(0))
    lens = torch.tensor([1.0, 0.8, 0.6])
    with torch.inference_mode():
        ours = model.embed(model.features(wavs, lens), lens)
        theirs = reference.encode_batch(wavs, lens).squeeze(1)
    torch.testing.assert_close(ours, theirs, atol=1e-5, rtol=1e-4)


def test_batchnorm_step_counters_may_be_missing_other_keys_may_not(pretrained_dir):
    directory, state = pretrained_dir
    without_counters = {k: v for k, v in state.items() if not k.endswith("num_batches_tracked")}
    assert len(without_counters) < len(state)
    torch.save(without_counters, directory / "embedding_model.ckpt")
    model = initial_model(tiny_config(directory), "small", LABELS, lambda _: None)
    for key, value in without_counters.items():
        assert torch.equal(model.embedding_model.state_dict()[key], value), key
    del without_counters["fc.conv.weight"]
    torch.save(without_counters, directory / "embedding_model.ckpt")
    with pytest.raises(PretrainedError, match=r"missing keys \['fc.conv.weight'\]"):
        initial_model(tiny_config(directory), "small", LABELS, lambda _: None)


def test_kaggle_style_nested_directory_is_found(pretrained_dir, tmp_path):
    directory, state = pretrained_dir
    nested = tmp_path / "input" / "spkrec-ecapa-voxceleb" / "pytorch" / "default" / "1"
    shutil.copytree(directory, nested)
    model = initial_model(tiny_config(tmp_path / "input"), "small", LABELS, lambda _: None)
    assert torch.equal(model.embedding_model.state_dict()["fc.conv.weight"], state["fc.conv.weight"])


def test_freeze_encoder_trains_only_the_classifier_and_keeps_batchnorm_statistics(pretrained_dir):
    """Real train steps (train.py's train_step, its model.train() call, an Adam over trainable params)."""
    from pipeline.core.objectives import make_loss
    from pipeline.devices.strategy import SingleDevice
    from pipeline.training.train import train_step

    directory, state = pretrained_dir
    model = initial_model(tiny_config(directory, freeze_encoder=True), "small", LABELS, lambda _: None)
    assert not any(p.requires_grad for p in model.embedding_model.parameters())
    assert all(p.requires_grad for p in model.classifier.parameters())
    classifier_before = model.classifier.weight.detach().clone()
    strategy = SingleDevice(torch.device("cpu"))
    optimizer = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    generator = torch.Generator().manual_seed(0)
    for _ in range(3):
        model.train()  # what train.py does every epoch
        assert not model.embedding_model.training and model.classifier.training
        batch = {"inputs": 0.1 * torch.randn(8, 8000, generator=generator), "lens": torch.ones(8),
                 "labels": torch.randint(0, len(LABELS), (8,), generator=generator)}  # fmt: skip
        train_step(model, strategy, make_loss("aam", 0.2, 30.0), optimizer, [batch])
    after = encoder_state(model)
    for key, value in state.items():
        assert torch.equal(after[key], value), f"frozen encoder entry {key} changed"
    assert not torch.equal(model.classifier.weight, classifier_before)


@pytest.mark.timeout(300)
def test_fine_tuning_starts_from_the_pretrained_encoder(
    pretrained_dir, synthetic_data, tmp_path, network_attempts
):
    """A tiny learning rate moves the weights only a little: training must have started at the pretrained
    encoder, far from a fresh initialisation, and it did train it (not frozen)."""
    from pipeline.training.train import train

    directory, state = pretrained_dir
    out = tmp_path / "model"
    train(tiny_config(directory, data_dir=str(synthetic_data), artifact_dir=str(out), epochs=1, base_lr=1e-5))
    weights = load_file(str(out / "model.safetensors"))
    fresh = initial_model(TrainConfig(**TINY_TRAIN), "tiny", LABELS, lambda _: None).embedding_model
    params = [name for name, _ in fresh.named_parameters()]
    to_pretrained = max((weights[f"embedding_model.{k}"] - state[k]).abs().max().item() for k in params)
    to_fresh = max(
        (weights[f"embedding_model.{k}"] - fresh.state_dict()[k]).abs().max().item() for k in params
    )
    assert 0 < to_pretrained < 1e-3 < 0.05 < to_fresh
    assert network_attempts == []


@pytest.mark.timeout(300)
def test_frozen_fine_tune_end_to_end_leaves_the_encoder_exactly_as_pretrained(
    pretrained_dir, synthetic_data, tmp_path
):
    from pipeline.core.artifact import load_artifact
    from pipeline.training.train import train

    directory, state = pretrained_dir
    out = tmp_path / "model"
    result = train(
        tiny_config(directory, data_dir=str(synthetic_data), artifact_dir=str(out), freeze_encoder=True)
    )
    artifact = load_artifact(out)  # a plain SpeakerClassifier: freezing leaves no trace in the format
    after = encoder_state(artifact.model)
    for key, value in state.items():  # parameters and BatchNorm statistics alike
        assert torch.equal(after[key], value), f"frozen encoder entry {key} changed during training"
    losses = [record["train_loss"] for record in result.history]
    assert losses[-1] < losses[0], losses  # the classifier learned
    assert artifact.manifest["provenance"]["config"]["init_from"] == directory.name  # no absolute path


def test_one_of_our_artifacts_can_be_the_starting_point(artifact_copy):
    weights = load_file(str(artifact_copy / "model.safetensors"))
    n_mels = json.loads((artifact_copy / "manifest.json").read_text())["model_config"]["n_mels"]
    model = initial_model(TrainConfig(**{**TINY_TRAIN, "n_mels": n_mels, "init_from": str(artifact_copy)}),
                          "small", LABELS, lambda _: None)  # fmt: skip
    for key, value in model.embedding_model.state_dict().items():
        assert torch.equal(value, weights[f"embedding_model.{key}"]), key
    data = bytearray((artifact_copy / "model.safetensors").read_bytes())
    data[-5] ^= 0xFF
    (artifact_copy / "model.safetensors").write_bytes(bytes(data))
    with pytest.raises(PretrainedError, match="model.safetensors"):
        initial_model(TrainConfig(**{**TINY_TRAIN, "n_mels": n_mels, "init_from": str(artifact_copy)}),
                      "small", LABELS, lambda _: None)  # fmt: skip


def test_the_front_end_follows_the_pretrained_model_and_auto_picks_pcen_for_noisy_field_audio(
    pretrained_dir, artifact_copy
):
    directory, _ = pretrained_dir
    # From scratch: auto is pcen when noise_dir names background recordings (soundscapes), logmel otherwise;
    # the plan decides (training/plan.py), the model is built with what it decided.
    assert choose_frontend(TrainConfig(**TINY_TRAIN)) == "logmel"
    noisy = TrainConfig(**{**TINY_TRAIN, "noise_dir": "train_soundscapes"})
    assert choose_frontend(noisy) == "pcen"
    assert initial_model(noisy, "tiny", LABELS, print, frontend="pcen").config.frontend == "pcen"
    assert (
        choose_frontend(TrainConfig(**{**TINY_TRAIN, "noise_dir": "train_soundscapes", "frontend": "logmel"}))
        == "logmel"
    )
    # A fine-tune keeps the features its encoder learned on, whatever noise_dir says; asking for others is refused.
    hub = TrainConfig(**{**tiny_config(directory).__dict__, "noise_dir": "train_soundscapes"})
    assert choose_frontend(hub) == "logmel"
    assert initial_model(hub, "small", LABELS, lambda _: None, frontend="pcen").config.frontend == "logmel"
    with pytest.raises(PretrainedError, match="frontend='pcen'.*'logmel'"):
        initial_model(TrainConfig(**{**tiny_config(directory).__dict__, "frontend": "pcen"}), "small", LABELS,
                      lambda _: None)  # fmt: skip
    manifest = json.loads((artifact_copy / "manifest.json").read_text())
    assert manifest["model_config"]["frontend"] == "logmel"
    n_mels = manifest["model_config"]["n_mels"]
    with pytest.raises(PretrainedError, match="frontend='pcen'"):
        initial_model(TrainConfig(**{**TINY_TRAIN, "n_mels": n_mels, "init_from": str(artifact_copy),
                                     "frontend": "pcen"}), "small", LABELS, lambda _: None)  # fmt: skip


class NotATensor:
    pass


def _damage(directory: Path, how: str) -> TrainConfig:
    config = tiny_config(directory)
    if how == "no directory":
        return tiny_config(directory / "nope")
    if how == "no yaml":
        (directory / "hyperparams.yaml").unlink()
    elif how == "broken yaml":
        (directory / "hyperparams.yaml").write_text("n_mels: [40\nembedding_model: !new:x\n")
    elif how == "no encoder key":
        text = (directory / "hyperparams.yaml").read_text()
        (directory / "hyperparams.yaml").write_text(text.replace("embedding_model", "encoder"))
    elif how == "not ECAPA":
        text = (directory / "hyperparams.yaml").read_text()
        (directory / "hyperparams.yaml").write_text(
            text.replace("ECAPA_TDNN.ECAPA_TDNN", "Xvector.Xvector", 1)
        )
    elif how == "other kernel sizes":
        write_hyperparams(directory, kernel_sizes=[3, 3, 3, 3, 1])
    elif how == "no weights":
        (directory / "embedding_model.ckpt").unlink()
    elif how == "other widths":
        write_hyperparams(directory, channels=[48, 48, 48, 48, 144])
    elif how == "pickled object":
        torch.save({"blocks.0.conv.conv.weight": NotATensor()}, directory / "embedding_model.ckpt")
    elif how == "other n_mels":
        config = tiny_config(directory, n_mels=80)
    return config


@pytest.mark.parametrize(
    ("how", "message"),
    [
        ("no directory", r"init_from=.*nope.*no such file"),
        ("no yaml", r"no hyperparams.yaml in it"),
        ("broken yaml", r"hyperparams.yaml: not a readable HyperPyYAML"),
        ("no encoder key", r"hyperparams.yaml: no `embedding_model` key"),
        ("not ECAPA", r"hyperparams.yaml: `embedding_model` is !new:speechbrain.lobes.models.Xvector"),
        ("other kernel sizes", r"`embedding_model.kernel_sizes` is \[3, 3, 3, 3, 1\]"),
        (
            "no weights",
            r"embedding_model.ckpt: not found. .*'speechbrain/spkrec-ecapa-voxceleb/embedding_model",
        ),
        ("other widths", r"embedding_model.ckpt: does not fit .*shape mismatch \['blocks.0.conv.conv.weight"),
        ("pickled object", r"embedding_model.ckpt: cannot be read as a weights-only checkpoint"),
        ("other n_mels", r"n_mels=80 but .* takes 40 mel bands .*set n_mels=40"),
    ],
)
def test_a_directory_that_is_not_a_speechbrain_ecapa_model_is_refused_clearly(
    pretrained_dir, network_attempts, how, message
):
    directory, _ = pretrained_dir
    config = _damage(directory, how)
    with pytest.raises(PretrainedError, match=message):
        initial_model(config, "small", LABELS, lambda _: None)
    assert network_attempts == []


def test_ensemble_members_auto_is_three_for_small_soundscape_models_one_otherwise_and_fine_tunes_get_one(
    pretrained_dir,
):
    directory, _ = pretrained_dir
    members = {}
    for name, extra in {"plain": {}, "noisy": {"noise_dir": "train_soundscapes"},
                        "noisy, asked 1": {"noise_dir": "train_soundscapes", "ensemble_members": 1},
                        "asked 2": {"ensemble_members": 2}}.items():  # fmt: skip
        members[name] = choose_members(TrainConfig(**{**TINY_TRAIN, **extra}), "tiny")
    assert members == {"plain": 1, "noisy": 3, "noisy, asked 1": 1, "asked 2": 2}
    assert initial_model(TrainConfig(**TINY_TRAIN), "tiny", LABELS, print, members=3).config.members == 3
    # The size whose one model already takes a third of a CPU submission's time gets one unless asked for more.
    noisy = {**TINY_TRAIN, "noise_dir": "train_soundscapes"}
    assert choose_members(TrainConfig(**noisy), "voxceleb") == 1
    assert choose_members(TrainConfig(**{**noisy, "ensemble_members": 2}), "voxceleb") == 2
    hub = TrainConfig(**{**tiny_config(directory).__dict__, "noise_dir": "train_soundscapes"})
    assert choose_members(hub, "small") == 1
    assert initial_model(hub, "small", LABELS, lambda _: None, members=3).config.members == 1
    with pytest.raises(ConfigError, match="ensemble_members=2 with init_from"):
        TrainConfig(**{**tiny_config(directory).__dict__, "ensemble_members": 2})
