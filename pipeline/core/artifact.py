"""The artifact: the only thing that crosses from the training notebook to the submission notebook.

A directory, relocatable, referring to nothing outside itself:

    manifest.json          format version, sha256 + size of every other file, model config, labels, provenance
    model.safetensors      all weights (CPU tensors): what this project loads, with nothing unpickled
    hyperparams.yaml       SpeechBrain's recipe: `EncoderClassifier.from_hparams(source=<this dir>)` loads
    embedding_model.ckpt   \\ plain tensor state dicts for SpeechBrain's Pretrainer (torch.load with
    classifier.ckpt        /  weights_only=True, torch's default since 2.6)
    label_encoder.ckpt     SpeechBrain's CategoricalEncoder text format

It is written into a temporary sibling directory and renamed into place, manifest last, so a crash mid-save
never leaves a directory that looks valid. Loading checks every file against the manifest first.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from .buckets import DEFAULT_COUNT
from .config import (
    ENERGY_WEIGHTED_WINDOWS,
    MAX_WINDOWS_PER_FILE,
    QUIET_WINDOW_DB,
    SPEED_LIMITS,
    TrainConfig,
)
from .model import ModelConfig, SpeakerClassifier, WindowedEncoder
from .staging import check_output_dir, file_sha256, read_record, staged_directory

# 2: labels/config sealed in model.safetensors; hyperparams.yaml runs the windowed encoder (1: neither).
FORMAT_VERSION = 2
MANIFEST = "manifest.json"
WEIGHTS = "model.safetensors"
# Files every artifact has; the manifest must list (and so hash) each of them.
REQUIRED_FILES = (
    WEIGHTS,
    "hyperparams.yaml",
    "embedding_model.ckpt",
    "classifier.ckpt",
    "label_encoder.ckpt",
)
# What the manifest says about the weights is also sealed inside model.safetensors (its header metadata),
# which the manifest hashes: editing the labels in manifest.json cannot silently rename the classes.
SEALED_FIELDS = ("model_config", "labels", "fallback_label")
# Sealed too when present: the training clips' mean embedding (aam artifacts of this version on; see
# pipeline/training/validation.embedding_centre), which inference subtracts before cosine scoring.
# And the speeds a whole file is read at (a model trained with speed perturbation: core/data.file_windows).
OPTIONAL_SEALED_FIELDS = ("embedding_centre", "test_time_speeds")
# A pretrained teacher sealed beside the model (pipeline/rounds/pretrained.py): its facts, class map and blend
# weight; the model and labels files it names are listed (and so hashed) like every other file.
TEACHER_RECORD = "teacher.json"


class ArtifactError(RuntimeError):
    """The artifact is missing, incomplete, tampered with or of an unknown format. Names the file."""


@dataclass
class Artifact:
    model: SpeakerClassifier
    labels: list[str]
    manifest: dict[str, Any]
    path: Path

    @property
    def window_samples(self) -> int:
        return int(self.manifest["model_config"]["window_samples"])

    @property
    def embedding_centre(self) -> torch.Tensor | None:
        """The training clips' mean embedding [embedding_size] (None: an artifact written without one)."""
        centre = self.manifest.get("embedding_centre")
        return None if centre is None else torch.tensor(centre, dtype=torch.float32)

    @property
    def test_time_speeds(self) -> tuple[float, ...] | None:
        """The speeds training asks a whole file to be read at (None: as it is; older artifacts have none)."""
        speeds = self.manifest.get("test_time_speeds")
        return None if not speeds else tuple(float(v) for v in speeds)

    @property
    def teacher(self) -> dict[str, Any] | None:
        """What a pretrained teacher sealed here says (TEACHER_RECORD: its files, class map, blend weight), or
        None: the artifact carries no teacher."""
        path = self.listed_file(TEACHER_RECORD)
        return None if path is None else json.loads(path.read_text())

    def listed_file(self, name: str) -> Path | None:
        """The path of an optional file (e.g. the ONNX engine's) if the manifest lists it -- and so verified
        it at load -- else None."""
        return self.path / name if name in self.manifest.get("files", {}) else None


def is_artifact(folder: Path) -> bool:
    """True if `folder` holds an artifact of this project (of any format version) and nothing else, each file as
    its manifest records it: one a new one may replace, with nobody's file lost (`not_the_artifact`)."""
    return not not_the_artifact(folder)


def not_the_artifact(folder: Path) -> list[str]:
    """What in `folder` is not the artifact its manifest describes: a file the manifest does not list (a
    notebook or notes put there), or one whose size or sha256 differ from its record (edited since). [] for
    an artifact as training left it; every entry where there is no manifest of this project's."""
    manifest = read_record(folder / MANIFEST, ("format_version", "files"))
    listed = manifest["files"] if manifest else None
    if not isinstance(listed, dict):
        return sorted(p.name for p in folder.iterdir()) or [f"no {MANIFEST}"]
    changes = []
    for path in sorted(folder.iterdir()):
        if path.name == MANIFEST:
            continue
        if path.name not in listed:
            changes.append(path.name)
        elif not path.is_file() or listed[path.name] != _file_record(path):
            changes.append(f"{path.name} (changed since)")
    return changes


def check_artifact_dir(artifact_dir: str | Path, **keep_apart: str | Path | None) -> Path:
    """Refuse an artifact_dir that would replace anything but an earlier artifact or an empty folder, or that
    overlaps a folder of `keep_apart` (e.g. data_dir=...). Training calls this before it starts."""
    return check_output_dir(
        artifact_dir,
        name="artifact_dir",
        what="an artifact of this project as training left it",
        not_ours=not_the_artifact,
        keep_apart=keep_apart,
    )


def check_training_outputs(config: TrainConfig) -> None:
    """What a training run will write, checked before it starts (never train for hours, then refuse to save):
    the artifact may replace only an earlier artifact or an empty folder; checkpoints go to a folder of their
    own (`checkpoint_folder`); neither may overlap the data or each other (core/staging's rule)."""
    checkpoints = config.checkpoint_folder
    check_artifact_dir(config.artifact_dir, data_dir=config.data_dir, checkpoint_dir=checkpoints)
    check_output_dir(
        checkpoints,
        name="checkpoint_dir",
        is_ours=lambda _: True,
        what="a checkpoint folder",
        keep_apart={"data_dir": config.data_dir},
    )


def save_artifact(
    artifact_dir: str | Path,
    model: SpeakerClassifier,
    labels: list[str],
    provenance: dict[str, Any],
    extra_files: dict[str, Path] | None = None,
    fallback_label: str | None = None,
    embedding_centre: list[float] | None = None,
    test_time_speeds: list[float] | None = None,
) -> Path:
    """Write the artifact atomically to `artifact_dir` and return its path. It replaces only an earlier
    artifact or an empty folder (see check_artifact_dir). `embedding_centre`: the training clips' mean
    embedding, sealed with the weights (inference subtracts it before scoring); `test_time_speeds`: the speeds
    the infer stage reads a whole file at by default (sealed too; None: as it is)."""
    target = check_artifact_dir(artifact_dir)
    with staged_directory(target, is_artifact) as staging:
        fallback = fallback_label if fallback_label is not None else labels[0]
        sealed = {"model_config": model.config.to_dict(), "labels": list(labels), "fallback_label": fallback}
        if embedding_centre is not None:
            sealed["embedding_centre"] = [float(v) for v in embedding_centre]
        if test_time_speeds:
            sealed["test_time_speeds"] = [float(v) for v in test_time_speeds]
        state = {k: v.detach().to("cpu").contiguous() for k, v in model.state_dict().items()}
        save_file(state, str(staging / WEIGHTS), metadata={k: json.dumps(v) for k, v in sealed.items()})
        # SpeechBrain's Pretrainer loads these into the yaml's modules: plain tensor dicts (weights_only).
        windowed = WindowedEncoder(
            model.embedding_model,
            model.config.n_mels,
            model.config.window_samples,
            sample_rate=model.config.sample_rate,
            frontend=model.config.frontend,
        )
        parts = {
            "embedding_model": windowed.state_dict(),
            # SpeechBrain's Classifier takes the cosine with its weight's rows: the centres that give the
            # model's own scores (an ensemble's: the mean of its members'; see model.class_centres).
            "classifier": {"weight": model.class_centres()},
        }
        for part, state_dict in parts.items():
            tensors = {k: v.detach().to("cpu").contiguous() for k, v in state_dict.items()}
            torch.save(tensors, staging / f"{part}.ckpt")
        # SpeechBrain's CategoricalEncoder format, written by its own class so the two never drift apart.
        from speechbrain.dataio.encoder import CategoricalEncoder

        encoder = CategoricalEncoder()
        for label in labels:
            encoder.add_label(label)
        encoder.save(str(staging / "label_encoder.ckpt"))
        (staging / "hyperparams.yaml").write_text(
            _speechbrain_yaml(model.config, sealed.get("embedding_centre"), sealed.get("test_time_speeds"))
        )
        for name, source in (extra_files or {}).items():
            shutil.copyfile(source, staging / name)
        manifest = {
            "format_version": FORMAT_VERSION,
            "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            # fallback_label: predicted for unreadable test files (default: the most frequent training label)
            **sealed,
            "provenance": provenance,
        }
        _write_manifest(staging, manifest)
    return target


def _write_manifest(staging: Path, manifest: dict[str, Any]) -> None:
    """The manifest (listing what is staged), last; then every file on disk before the rename shows it."""
    manifest["files"] = {p.name: _file_record(p) for p in sorted(staging.iterdir())}
    (staging / MANIFEST).write_text(json.dumps(manifest, indent=2))
    for child in staging.iterdir():
        with child.open("rb") as handle:
            os.fsync(handle.fileno())
        child.chmod(0o644)  # an artifact is meant to be shared, whatever modes its writers chose


def add_to_artifact(artifact_dir: str | Path, files: dict[str, Path], provenance: dict[str, Any]) -> Path:
    """The artifact with `files` added (or replaced) and `provenance` merged into its provenance: verified,
    then written again as save_artifact writes (a hidden sibling, manifest last, renamed into place), so a crash
    leaves the artifact as it was. What a later stage adds to a trained model: a teacher to blend with."""
    root = Path(artifact_dir)
    manifest = verify_artifact(root)
    target = check_artifact_dir(root)
    with staged_directory(target, is_artifact) as staging:
        for name in manifest["files"]:
            if name not in files:
                shutil.copyfile(root / name, staging / name)
        for name, source in files.items():
            if Path(name).name != name or name in (MANIFEST, *REQUIRED_FILES):
                raise ArtifactError(
                    f"{name!r}: an added file needs a plain name that is not one of the model's own"
                )
            shutil.copyfile(source, staging / name)
        manifest["provenance"] = {**manifest.get("provenance", {}), **provenance}
        _write_manifest(staging, manifest)
    return target


def verify_artifact(artifact_dir: str | Path) -> dict[str, Any]:
    """Check the manifest and every file it lists; return the manifest or raise ArtifactError."""
    root = Path(artifact_dir)
    manifest_path = root / MANIFEST
    if not root.exists():
        raise ArtifactError(
            f"artifact_dir {root} does not exist: pass the folder train.ipynb wrote "
            "(its artifact_dir), the one holding manifest.json"
        )
    if not root.is_dir():
        raise ArtifactError(
            f"artifact_dir {root} is a file, not a folder: pass the folder holding manifest.json"
        )
    if not manifest_path.is_file():
        if any((root / name).is_file() for name in ("train.csv", "test.csv", "sample_submission.csv")):
            raise ArtifactError(
                f"artifact_dir {root} is a competition folder, not an artifact: pass the folder "
                "train.ipynb wrote (its artifact_dir), the one holding manifest.json"
            )
        raise ArtifactError(
            f"{manifest_path}: not found. {root} is not a complete artifact "
            "(was training interrupted before it saved?)"
        )
    try:
        manifest = json.loads(manifest_path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise ArtifactError(f"{manifest_path}: not valid JSON ({error})") from error
    if (version := manifest.get("format_version")) != FORMAT_VERSION:
        raise ArtifactError(
            f"{manifest_path}: format_version {version!r} is not supported "
            f"(this code reads version {FORMAT_VERSION}); retrain or update the code"
        )
    files = manifest.get("files", {})
    for name, expected in files.items():
        path = root / name
        if Path(name).name != name:
            raise ArtifactError(f"{manifest_path}: file entry {name!r} points outside the artifact")
        if not path.is_file():
            raise ArtifactError(f"{path}: listed in the manifest but missing")
        actual = _file_record(path)
        if actual["size"] != expected["size"]:
            raise ArtifactError(
                f"{path}: size {actual['size']} != {expected['size']} in the manifest (truncated or replaced)"
            )
        if actual["sha256"] != expected["sha256"]:
            raise ArtifactError(f"{path}: sha256 does not match the manifest (file modified or corrupted)")
    if unlisted := [name for name in REQUIRED_FILES if name not in files]:
        raise ArtifactError(
            f"{manifest_path}: does not list {', '.join(unlisted)}; an artifact written by "
            "this project lists every file it holds (was the manifest edited?)"
        )
    weights = root / WEIGHTS
    with safe_open(str(weights), framework="pt") as handle:
        sealed = handle.metadata() or {}
    for name in (*SEALED_FIELDS, *OPTIONAL_SEALED_FIELDS):
        if name not in sealed and name in SEALED_FIELDS:
            raise ArtifactError(f"{weights}: carries no sealed {name!r}; re-save the artifact with this code")
        if (json.loads(sealed[name]) if name in sealed else None) != manifest.get(name):
            raise ArtifactError(
                f"{manifest_path}: {name!r} differs from the value sealed in {weights.name} "
                "(manifest.json was edited); restore it or retrain"
            )
    return manifest


def load_artifact(artifact_dir: str | Path) -> Artifact:
    """Verify, then rebuild the model on CPU from safetensors (never unpickles anything)."""
    root = Path(artifact_dir)
    manifest = verify_artifact(root)
    model = SpeakerClassifier(ModelConfig(**manifest["model_config"]))
    try:
        model.load_state_dict(load_file(str(root / WEIGHTS), device="cpu"))
    except RuntimeError as error:
        raise ArtifactError(f"{root / WEIGHTS}: weights do not fit the model config ({error})") from error
    centre = manifest.get("embedding_centre")
    if centre is not None and (len(centre) != model.config.embedding_size or not np.all(np.isfinite(centre))):
        raise ArtifactError(
            f"{root / MANIFEST}: embedding_centre is not {model.config.embedding_size} finite "
            "numbers; retrain"
        )
    speeds, (low, high) = manifest.get("test_time_speeds"), SPEED_LIMITS
    if speeds is not None and (
        not isinstance(speeds, list)
        or not all(isinstance(v, (int, float)) and low <= v <= high for v in speeds)
    ):
        raise ArtifactError(
            f"{root / MANIFEST}: test_time_speeds {speeds!r} is not a list of speeds from {low:g} "
            f"to {high:g}; retrain"
        )
    return Artifact(model=model.eval(), labels=list(manifest["labels"]), manifest=manifest, path=root)


def _file_record(path: Path) -> dict[str, Any]:
    return {"sha256": file_sha256(path), "size": path.stat().st_size}


def _speechbrain_yaml(
    config: ModelConfig, centre: list[float] | None = None, speeds: list[float] | None = None
) -> str:
    """A SpeechBrain inference recipe whose Pretrainer lists loadables but no `paths`: SpeechBrain then loads
    `<name>.ckpt` from whatever `source` directory it is given, so the artifact is relocatable.

    Every learned part is SpeechBrain's own class (Fbank, ECAPA_TDNN, Classifier, CategoricalEncoder); the
    one class of this project, `WindowedEncoder`, applies the windowing the model was trained with, so
    `EncoderClassifier.classify_batch` on whole files gives the project's predictions (see model.py);
    `label_encoder` makes SpeechBrain check the label count against the classifier's. An ensemble's encoder is
    `MemberEncoders` (its members are SpeechBrain's ECAPA_TDNN)."""
    encoder, members = "speechbrain.lobes.models.ECAPA_TDNN.ECAPA_TDNN", ""
    if config.members > 1:
        encoder, members = "pipeline.core.model.MemberEncoders", f"\n        members: {config.members}"
    return f"""# Written by pipeline.core.artifact. Load offline (the `pipeline` package must be importable) with
#   EncoderClassifier.from_hparams(source=<this directory>, savedir=<writable dir>)
n_mels: {config.n_mels}
sample_rate: {config.sample_rate}

compute_features: !new:pipeline.core.model.PassThrough
mean_var_norm: !new:pipeline.core.model.PassThrough

embedding_model: !new:pipeline.core.model.WindowedEncoder
    n_mels: !ref <n_mels>
    sample_rate: !ref <sample_rate>
    window_samples: {config.window_samples}
    max_windows: {MAX_WINDOWS_PER_FILE}  # the infer notebook's max_windows_per_file default
    length_buckets: {DEFAULT_COUNT}  # its length_buckets default: short windows at shorter lengths
    quiet_db: {QUIET_WINDOW_DB}  # its quiet_window_db default: padding silence left out
    energy_weighted: {str(ENERGY_WEIGHTED_WINDOWS).lower()}  # its energy_weighted_windows default: loud windows count more
    centre: {json.dumps(centre)}  # the training files' mean embedding, taken out before scoring (null: none)
    speeds: {json.dumps(speeds)}  # its test_time_speeds default: each file also read at these (null: as it is)
    frontend: {config.frontend}
    encoder: !new:{encoder}
        input_size: !ref <n_mels>
        channels: {list(config.channels)}
        lin_neurons: {config.lin_neurons}
        attention_channels: {config.attention_channels}
        se_channels: {config.se_channels}{members}

classifier: !new:speechbrain.lobes.models.ECAPA_TDNN.Classifier
    input_size: {config.embedding_size}
    out_neurons: {config.n_classes}

modules:
    compute_features: !ref <compute_features>
    mean_var_norm: !ref <mean_var_norm>
    embedding_model: !ref <embedding_model>
    classifier: !ref <classifier>

label_encoder: !apply:pipeline.core.model.label_encoder [{config.n_classes}]

pretrainer: !new:speechbrain.utils.parameter_transfer.Pretrainer
    loadables:
        embedding_model: !ref <embedding_model>
        classifier: !ref <classifier>
        label_encoder: !ref <label_encoder>
"""
