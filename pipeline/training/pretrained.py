"""The model training starts from: a fresh ECAPA-TDNN of a preset size, or a SpeechBrain pretrained one.

`init_from` names a SpeechBrain pretrained directory, e.g. an attached copy of `speechbrain/spkrec-ecapa-voxceleb`:

    hyperparams.yaml        the recipe: the ECAPA-TDNN architecture is read from its `embedding_model` node
    embedding_model.ckpt    the encoder's state dict (read with torch.load(weights_only=True))
    classifier.ckpt, label_encoder.*, mean_var_norm_emb.ckpt   ignored: the classifier is new (our labels)

The encoder weights are loaded into this project's SpeakerClassifier and a new classifier is built for the
competition's labels. One of this project's own artifacts works too (its weights are then read from
model.safetensors after the manifest check). Nothing is ever fetched: hub yaml files name the hub in
`pretrained_path` and the Pretrainer's `paths`, so the yaml is read as data (hyperpyyaml resolves its `!ref`s,
no object is instantiated) and the weights come from files in the directory, or a clear error says which file
is missing. `freeze_encoder` trains the classifier alone on the pretrained embeddings (FrozenECAPA).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import yaml
from speechbrain.lobes.models.ECAPA_TDNN import ECAPA_TDNN

from ..core.artifact import MANIFEST, WEIGHTS, ArtifactError, verify_artifact
from ..core.config import SAMPLE_RATE, ConfigError, TrainConfig
from ..core.model import ModelConfig, SpeakerClassifier
from ..core.progress import first_line

HYPERPARAMS = "hyperparams.yaml"
ENCODER = "embedding_model"
ECAPA_TAG = "!new:speechbrain.lobes.models.ECAPA_TDNN.ECAPA_TDNN"
FBANK_TAG = "!new:speechbrain.lobes.features.Fbank"
NORM_TAG = "!new:speechbrain.processing.features.InputNormalization"
# ECAPA_TDNN arguments our ModelConfig carries, by ModelConfig field name.
_MAPPED = {
    "input_size": "n_mels",
    "channels": "channels",
    "lin_neurons": "lin_neurons",
    "attention_channels": "attention_channels",
    "se_channels": "se_channels",
}
_IGNORED = {"device"}  # placement, not architecture


class PretrainedError(ConfigError):
    """`init_from` is not a usable SpeechBrain ECAPA-TDNN directory. The message names the file and key."""


def initial_model(
    config: TrainConfig,
    model_size: str,
    labels: list[str],
    log: Callable[[str], Any] = print,
    objective: str = "aam",
    *,
    frontend: str = "logmel",
    members: int = 1,
) -> SpeakerClassifier:
    """A fresh model of `model_size` (`members` ECAPA-TDNNs on `frontend` features: the plan decides them,
    plan.py), or the encoder of `config.init_from` with a new classifier for `labels` (frozen when
    `config.freeze_encoder`; its own front end, one member), trained for `objective`."""
    # A pretrained encoder brings its own architecture; its n_mels and sample rate equal these (checked below).
    common = {
        "n_classes": len(labels),
        "n_mels": config.n_mels,
        "window_samples": config.window_samples,
        "sample_rate": config.sample_rate,
        "score_scale": config.aam_scale,
        "objective": objective,
    }
    if not config.init_from:
        model_config = ModelConfig.from_preset(model_size, frontend=frontend, members=members, **common)
        return SpeakerClassifier(model_config)

    pretrained = read_pretrained(config.init_from)
    if config.sample_rate != SAMPLE_RATE:  # read_pretrained accepts only SpeechBrain's default Fbank (16 kHz)
        raise PretrainedError(
            f"sample_rate={config.sample_rate} but the pretrained model {pretrained.hyperparams} "
            f"was trained on {SAMPLE_RATE} Hz features: set sample_rate={SAMPLE_RATE} to "
            "fine-tune it, or train from scratch without init_from"
        )
    if pretrained.model_args["n_mels"] != config.n_mels:
        raise PretrainedError(
            f"n_mels={config.n_mels} but the pretrained model {pretrained.hyperparams} takes "
            f"{pretrained.model_args['n_mels']} mel bands (embedding_model input_size): set "
            f"n_mels={pretrained.model_args['n_mels']}"
        )
    if config.frontend not in ("auto", pretrained.frontend):
        raise PretrainedError(
            f"frontend={config.frontend!r} but the pretrained model {pretrained.hyperparams} "
            f"was trained on {pretrained.frontend!r} features: set frontend={pretrained.frontend!r} "
            "(or auto) to fine-tune it, or train from scratch without init_from"
        )
    model_config = ModelConfig(**{**common, **pretrained.model_args, "frontend": pretrained.frontend})
    model = SpeakerClassifier(model_config)
    load_encoder_weights(model, pretrained.weights)
    if config.freeze_encoder:
        freeze_encoder(model)
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    log(
        f"init_from {pretrained.root}: ECAPA-TDNN channels {model_config.channels}, "
        f"{model_config.lin_neurons}-d embeddings, {model_config.n_mels} mels (model_size={model_size!r} is "
        f"not used); encoder weights from {pretrained.weights.name}, new classifier for {len(labels)} classes; "
        f"{'encoder frozen, ' if config.freeze_encoder else ''}{trainable:,} trainable parameters"
    )
    return model


@dataclass
class Pretrained:
    root: Path
    hyperparams: Path
    weights: Path  # the file the encoder weights are read from
    model_args: dict[str, Any]  # ModelConfig fields: n_mels, channels, lin_neurons, attention/se_channels
    frontend: str = "logmel"  # the features it was trained on (SpeechBrain's own models: log-mel)


def read_pretrained(init_from: str | Path) -> Pretrained:
    """Locate the directory, read the architecture from its hyperparams.yaml and find the encoder weights.
    One of this project's artifacts describes itself in its (verified) manifest instead."""
    hyperparams = find_hyperparams(Path(init_from))
    root = hyperparams.parent
    if (root / MANIFEST).is_file():
        try:
            model_config = verify_artifact(root)["model_config"]
        except ArtifactError as error:
            raise PretrainedError(str(error)) from error
        return Pretrained(
            root,
            hyperparams,
            root / WEIGHTS,
            {k: model_config[k] for k in _MAPPED.values()},
            model_config.get("frontend", "logmel"),
        )
    tree = read_hyperparams(hyperparams)
    model_args = ecapa_args(tree, hyperparams)
    check_front_end(tree, hyperparams, model_args["n_mels"])
    return Pretrained(root, hyperparams, encoder_weights_file(root, tree), model_args)


def find_hyperparams(init_from: Path) -> Path:
    """`init_from` itself (a yaml file), `<dir>/hyperparams.yaml`, or the only one below `<dir>` (Kaggle
    mounts models a few folders deep, e.g. <slug>/pytorch/default/1/)."""
    if not init_from.exists():
        raise PretrainedError(f"init_from={str(init_from)!r}: no such file or directory")
    if init_from.is_file():
        if init_from.suffix not in (".yaml", ".yml"):
            raise PretrainedError(f"init_from={str(init_from)!r}: expected a directory with {HYPERPARAMS}")
        return init_from
    if (init_from / HYPERPARAMS).is_file():
        return init_from / HYPERPARAMS
    found = sorted(init_from.rglob(HYPERPARAMS))
    if len(found) == 1:
        return found[0]
    if not found:
        raise PretrainedError(
            f"init_from={str(init_from)!r}: no {HYPERPARAMS} in it or below it. A SpeechBrain pretrained "
            f"directory (e.g. a copy of speechbrain/spkrec-ecapa-voxceleb) has {HYPERPARAMS} and "
            f"{ENCODER}.ckpt"
        )
    raise PretrainedError(
        f"init_from={str(init_from)!r}: several {HYPERPARAMS} below it "
        f"({', '.join(str(p) for p in found[:5])}); point init_from at one"
    )


@dataclass
class Tagged:
    """A yaml node with a HyperPyYAML tag (`!new:module.Class`, `!name:...`), kept as data, never built."""

    tag: str
    value: Any


class _DataLoader(yaml.SafeLoader):
    """Safe yaml loading where every unknown tag becomes a `Tagged` value instead of an object."""


def _construct_tagged(loader: yaml.SafeLoader, node: yaml.Node) -> Tagged:
    if isinstance(node, yaml.MappingNode):
        return Tagged(node.tag, loader.construct_mapping(node, deep=True))
    if isinstance(node, yaml.SequenceNode):
        return Tagged(node.tag, loader.construct_sequence(node, deep=True))
    return Tagged(node.tag, loader.construct_scalar(node))


_DataLoader.add_constructor(None, _construct_tagged)


def read_hyperparams(path: Path) -> dict[str, Any]:
    """The yaml as plain data with `!ref`s resolved. hyperpyyaml's `load_hyperpyyaml` would instantiate every
    `!new:` object (a 20M-parameter model, the Pretrainer); `resolve_references` only rewrites the text."""
    from hyperpyyaml import resolve_references

    try:
        with path.open(encoding="utf-8") as handle:
            resolved = resolve_references(handle).getvalue()
        tree = yaml.load(resolved, Loader=_DataLoader)  # noqa: S506 - a SafeLoader subclass
    except Exception as error:  # noqa: BLE001 - any parse failure is reported against the file
        raise PretrainedError(
            f"{path}: not a readable HyperPyYAML file ({type(error).__name__}: {error})"
        ) from error
    if not isinstance(tree, dict):
        raise PretrainedError(f"{path}: expected a mapping of hyperparameters at the top level")
    return tree


def ecapa_args(tree: dict[str, Any], path: Path) -> dict[str, Any]:
    """ModelConfig fields from the `embedding_model` node, refusing architectures SpeakerClassifier cannot
    build (it uses ECAPA_TDNN's defaults for kernel sizes, dilations, res2net scale, groups...)."""
    node = tree.get(ENCODER)
    if node is None and isinstance(tree.get("modules"), dict):
        node = tree["modules"].get(ENCODER)
    if node is None:
        raise PretrainedError(f"{path}: no `{ENCODER}` key; not a SpeechBrain speaker-embedding recipe")
    if not isinstance(node, Tagged) or node.tag != ECAPA_TAG:
        found = node.tag if isinstance(node, Tagged) else type(node).__name__
        raise PretrainedError(
            f"{path}: `{ENCODER}` is {found}, not {ECAPA_TAG}: only ECAPA-TDNN encoders "
            "can initialise this model"
        )
    given = node.value if isinstance(node.value, dict) else {}
    defaults = _defaults(ECAPA_TDNN)
    if unknown := sorted(set(given) - set(defaults) - {"input_size"}):
        raise PretrainedError(f"{path}: `{ENCODER}` has argument(s) {unknown} that ECAPA_TDNN does not take")
    if "input_size" not in given:
        raise PretrainedError(f"{path}: `{ENCODER}` has no input_size (the number of mel bands)")
    args: dict[str, Any] = {}
    for name, value in {**defaults, **given}.items():
        if name in _MAPPED:
            args[_MAPPED[name]] = _as_ints(value, f"{path}: `{ENCODER}.{name}`")
        elif name not in _IGNORED and not _same(value, defaults[name]):
            raise PretrainedError(
                f"{path}: `{ENCODER}.{name}` is {_show(value)}; this project's model builds ECAPA_TDNN with "
                f"the default {_show(defaults[name])} (supported: {', '.join(_MAPPED)})"
            )
    if len(args["channels"]) != 5:
        raise PretrainedError(f"{path}: `{ENCODER}.channels` must list 5 widths; got {args['channels']}")
    return args


def check_front_end(tree: dict[str, Any], path: Path, n_mels: int) -> None:
    """The encoder only works on the features it was trained on: SpeakerClassifier computes Fbank with
    default settings and sentence mean normalisation, so the recipe must too."""
    fbank = tree.get("compute_features")
    if not isinstance(fbank, Tagged) or fbank.tag != FBANK_TAG:
        raise PretrainedError(f"{path}: `compute_features` must be {FBANK_TAG} (found {_describe(fbank)})")
    fbank_args = fbank.value if isinstance(fbank.value, dict) else {}
    if fbank_args.get("n_mels") != n_mels:
        raise PretrainedError(
            f"{path}: `compute_features.n_mels` is {fbank_args.get('n_mels')!r} but "
            f"`{ENCODER}.input_size` is {n_mels}"
        )
    from speechbrain.lobes.features import Fbank

    fbank_defaults = _defaults(Fbank)
    for name, value in fbank_args.items():
        if name in ("n_mels", "requires_grad"):
            continue
        if name not in fbank_defaults or not _same(value, fbank_defaults[name]):
            raise PretrainedError(
                f"{path}: `compute_features.{name}: {_show(value)}` differs from the Fbank "
                "settings this project's model computes (SpeechBrain's defaults)"
            )
    if fbank_args.get("sample_rate", SAMPLE_RATE) != SAMPLE_RATE:
        raise PretrainedError(
            f"{path}: the model expects {fbank_args['sample_rate']} Hz audio, not {SAMPLE_RATE}"
        )
    norm = tree.get("mean_var_norm")
    norm_args = norm.value if isinstance(norm, Tagged) and isinstance(norm.value, dict) else None
    if (  # norm_args is None for anything but a tagged mapping
        norm_args is None
        or norm.tag != NORM_TAG
        or norm_args.get("norm_type") != "sentence"
        or norm_args.get("std_norm", True) is not False
        or norm_args.get("mean_norm", True) is not True
    ):
        raise PretrainedError(
            f"{path}: `mean_var_norm` must be {NORM_TAG} with norm_type: sentence and "
            f"std_norm: False, as this project's model (found {_describe(norm)})"
        )


def encoder_weights_file(root: Path, tree: dict[str, Any]) -> Path:
    """Where a SpeechBrain directory's encoder weights are: embedding_model.safetensors or embedding_model.ckpt
    (this project's artifacts are found by read_pretrained). The Pretrainer's `paths` are never followed (they
    name the hub)."""
    for name in (f"{ENCODER}.safetensors", f"{ENCODER}.ckpt"):
        if (root / name).is_file():
            return root / name
    hint, pretrainer = "", tree.get("pretrainer")
    paths = (pretrainer.value or {}).get("paths") if isinstance(pretrainer, Tagged) else None
    if isinstance(paths, dict) and paths.get(ENCODER):
        hint = (
            f" hyperparams.yaml's pretrainer names {paths[ENCODER]!r}, which is never downloaded "
            "(submission sessions are offline):"
        )
    raise PretrainedError(
        f"{root / (ENCODER + '.ckpt')}: not found.{hint} copy the pretrained model's "
        f"{ENCODER}.ckpt into {root}"
    )


def read_encoder_state(weights: Path) -> dict[str, torch.Tensor]:
    """The encoder's state dict from `weights`, without unpickling anything but tensors."""
    from safetensors.torch import load_file

    if weights.suffix == ".safetensors":  # an artifact's weights: already verified by read_pretrained
        try:
            state = load_file(str(weights), device="cpu")
        except Exception as error:  # noqa: BLE001 - report any decoding failure against the file
            raise PretrainedError(f"{weights}: not a readable safetensors file ({error})") from error
        prefix = f"{ENCODER}."
        if any(k.startswith(prefix) for k in state):  # a whole-model file: keep the encoder's entries
            state = {k[len(prefix) :]: v for k, v in state.items() if k.startswith(prefix)}
        return state
    try:
        state = torch.load(weights, map_location="cpu", weights_only=True)
    except Exception as error:  # noqa: BLE001 - weights_only refusals, truncated zips, not a checkpoint...
        raise PretrainedError(
            f"{weights}: cannot be read as a weights-only checkpoint "
            f"({type(error).__name__}: {first_line(error)})"
        ) from error
    if not isinstance(state, dict) or not all(
        isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in state.items()
    ):
        raise PretrainedError(f"{weights}: expected a state dict of tensors, got {type(state).__name__}")
    return state


def load_encoder_weights(model: SpeakerClassifier, weights: Path) -> None:
    """Copy the pretrained encoder into `model.embedding_model`; every key and shape must match."""
    state = read_encoder_state(weights)
    expected = model.embedding_model.state_dict()
    # BatchNorm's step counter is not a weight: checkpoints saved before torch 0.4.1 lack it and SpeechBrain
    # loads them anyway (strict=False), so a missing one keeps its initial value. Every other key must match.
    for key in [k for k in expected if k.endswith("num_batches_tracked")]:
        state.setdefault(key, expected[key])
    missing = [k for k in expected if k not in state]
    unexpected = [k for k in state if k not in expected]
    wrong = [
        f"{k} {tuple(state[k].shape)} != {tuple(v.shape)}"
        for k, v in expected.items()
        if k in state and state[k].shape != v.shape
    ]
    problems = [
        f"{what} {found[:3]}{' ...' if len(found) > 3 else ''}"
        for what, found in (
            ("missing keys", missing),
            ("unexpected keys", unexpected),
            ("shape mismatch", wrong),
        )
        if found
    ]
    if problems:
        raise PretrainedError(
            f"{weights}: does not fit the ECAPA-TDNN described by hyperparams.yaml: " + "; ".join(problems)
        )
    model.embedding_model.load_state_dict(state, strict=True)


class FrozenECAPA(ECAPA_TDNN):
    """An ECAPA_TDNN that stays in eval mode. train.py calls model.train() every epoch; a frozen encoder must
    keep BatchNorm's pretrained running statistics (and dropout off), so train() is refused here, at the
    module, which also covers DDP wrappers and any other caller."""

    def train(self, mode: bool = True) -> FrozenECAPA:
        return super().train(False)


def freeze_encoder(model: SpeakerClassifier) -> None:
    """Train only the classifier: the encoder stops requiring gradients and is pinned to eval mode.
    Same class layout and state-dict keys, so checkpoints and the artifact are unchanged."""
    encoder = model.embedding_model
    if type(encoder) is not ECAPA_TDNN and not isinstance(encoder, FrozenECAPA):
        raise TypeError(f"freeze_encoder expects an ECAPA_TDNN encoder, got {type(encoder).__name__}")
    encoder.requires_grad_(False)
    encoder.__class__ = FrozenECAPA
    encoder.eval()


def _as_ints(value: Any, where: str) -> Any:
    if isinstance(value, list) and all(isinstance(v, int) and not isinstance(v, bool) for v in value):
        return list(value)
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    raise PretrainedError(f"{where} is {value!r}; expected an integer or a list of integers")


def _defaults(cls: type) -> dict[str, Any]:
    """The default of every argument of `cls`'s constructor that has one."""
    parameters = inspect.signature(cls.__init__).parameters.items()
    return {name: p.default for name, p in parameters if p.default is not inspect.Parameter.empty}


def _same(value: Any, default: Any) -> bool:
    if isinstance(value, Tagged):  # e.g. activation: !name:torch.nn.ReLU against the class itself
        target = value.tag.split(":", 1)[-1]
        return isinstance(default, type) and target in (
            f"{default.__module__}.{default.__qualname__}",
            f"torch.nn.{default.__qualname__}",
        )
    if isinstance(value, (list, tuple)) and isinstance(default, (list, tuple)):
        return list(value) == list(default)
    return value == default


def _show(value: Any) -> str:
    return value.tag if isinstance(value, Tagged) else repr(value)


def _describe(node: Any) -> str:
    return "nothing" if node is None else _show(node)
