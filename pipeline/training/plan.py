"""The training plan: every parameter a run leaves to auto, decided here, once, and printed once.

`plan_training(session)` turns the notebook's parameters into a frozen `TrainPlan` and the training data:

    the session   data_dir, artifact_dir, checkpoint_dir, the time budget and the audio cache's folder: on
                  Kaggle found under /kaggle/input and written to /kaggle/working (/kaggle/tmp for the cache),
                  the session limit minus a margin, and the caches attached as inputs; elsewhere the local
                  defaults. `open_session` resolves them and reads, once, what the data is made of (the
                  table's rows, the labelled soundscape chunks, noise_dir's files: `dataset.Sources`) and
                  taxonomy.csv: a bad row or a wrong folder stops there, before anything slow. The rounds open
                  it before they name each round's artifact and train every round on it
    the table     the objective (bce when files have several labels), the metric it selects by, and whether it
                  holds bird recordings (taxonomy.csv, or species a bird model knows): the sample rate that
                  keeps what birds sing above 8 kHz, and no pitch-changing augmentation
    the hardware  devices/policy.decide: topology, strategy, precision, batch and lr, loader workers
    the audio     decoded once into the cache (dataset.py); what it holds decides the recipe (`DataKind`):
                  epochs, blending, speed perturbation, the validation split, the embedding centre; and the
                  model: its size (the hardware's, or more on a CPU for a small table of sound events), its
                  front end and its members

What each kind of data gets, and why (docs/measurements.md):

    sound events   one label per clip (aam), no noise_dir, a median clip of at least EVENT_MIN_SECONDS, an
                   epoch of at most EVENT_MAX_CROPS crops, from scratch (ESC-10 and ESC-50's 5 s clips):
                   EnvNet-v2's long training with between-class blending and speed perturbation, on every clip
                   (no validation split: the last epoch is kept), the training files' mean embedding sealed for
                   inference to take out, and on a CPU the 'medium' ECAPA. ESC-10's 5 folds, 3 seeds: 0.873
                   -> 0.89-0.91; each part alone on the 'small' model was within the seeds' spread.
    bird recordings  the same table shape of bird species: the same recipe without speed perturbation, which
                   moves pitch, and pitch names a species; audio at BIRD_SAMPLE_RATE
    anything else  12 epochs, no blending, no speed change, no centre, the hardware's model: what was measured
                   on speech (FSDD's digits and speakers) and soundscapes

The plan is what every rank of the run follows; nothing changes it after it is printed.
"""

from __future__ import annotations

import dataclasses
import os
import re
import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..core import kaggle
from ..core.config import DEFAULT_EPOCHS, DEFAULT_VAL_FRACTION, SAMPLE_RATE, ConfigError, TrainConfig
from ..core.progress import plural
from ..core.tables import (
    TrainRow,
    TrainTable,
    audio_in_folder,
    label_list,
    read_labelled_chunks,
    read_taxonomy,
    read_train_table,
)
from ..devices import policy
from ..devices.policy import HardwarePlan
from ..devices.probe import Topology
from ..teachers.species import bird_signal
from .dataset import Sources, TrainingData, load_training_data

# ESC's clips are 5 s, UrbanSound8K's 4 s; the scale benchmark's speech clips are 3 s and the demo's utterances
# 1.5 s (median): the recipe starts between them.
EVENT_MIN_SECONDS = 3.5
# The bigger model's CPU cost bounds the recipe: 36 epochs of ESC-10's 1,600 crops are 10 min on 2 cores here
# ('medium'); past this many crops an epoch nothing was measured, so the defaults stay.
EVENT_MAX_CROPS = 10_000
EVENT_CPU_MODEL_SIZE = "medium"
# What each parameter left to auto becomes: (for anything else, for sound events, for bird recordings).
AUTO_VALUES = {
    "epochs": (DEFAULT_EPOCHS, 36, 36),
    "blend_probability": (0.0, 0.5, 0.5),
    "speed_probability": (0.0, 0.5, 0.0),
    "val_fraction": (DEFAULT_VAL_FRACTION, 0.0, 0.0),
    "centre_embeddings": (False, True, True),
}
KINDS = ("other", "sound events", "bird recordings")
# What birds sing reaches 10-12 kHz: 16 kHz audio keeps only what lies below 8 kHz. BirdCLEF's audio is 32 kHz.
BIRD_SAMPLE_RATE = 32_000
# The share of files with several labels from which objective "auto" learns several labels per clip (bce):
# BirdCLEF's focal recordings have secondary labels on a fifth to a third of the files.
MULTI_LABEL_SHARE = 0.05
SOUNDSCAPE_MEMBERS = 3  # ensemble_members auto with noise_dir, for the sizes below
# Sizes whose three members still predict BirdCLEF's hidden set (700 x 60 s) on a 4-core CPU in minutes: 3x
# the one model's time was measured (README). voxceleb's one model took 14.6 min there (int8, the H100 host's
# CPU) and ~30 min on this project's 2-core machine on a slow day: three would not leave the 90-minute
# submission its margin, and their gain at that size is unmeasured.
ENSEMBLE_SIZES = ("tiny", "small")


# The parameters a Session's sources were read with: a round may change any other (plan_training checks).
SOURCE_PARAMETERS = (
    "data_dir", "train_table", "path_column", "label_column", "audio_dir", "label_separator",
    "secondary_labels_column", "on_bad_row", "noise_dir", "val_soundscapes_table", "val_soundscapes_dir",
)  # fmt: skip


@dataclass(frozen=True)
class Session:
    """What a run reads before it decides anything, read once: `config` with its session resolved
    (`resolve_session`), the training data's `Sources` (the table's rows, the labelled soundscape chunks, the
    noise folder's files, the caches attached as Kaggle inputs) and the species taxonomy.csv names. They do not
    change between self-training rounds; a round changes the rest of the config (`but`)."""

    config: TrainConfig
    sources: Sources
    taxonomy: dict[str, str] = field(default_factory=dict)
    read_with: dict[str, Any] = field(default_factory=dict)  # SOURCE_PARAMETERS as the sources were read

    def but(self, **changes: Any) -> Session:
        """The same session and sources with these config parameters changed (a round's artifact, its targets)."""
        return dataclasses.replace(self, config=dataclasses.replace(self.config, **changes))


@dataclass(frozen=True)
class DataKind:
    name: str  # one of KINDS
    why: str


@dataclass(frozen=True)
class TrainPlan:
    """How this run trains: `config` with every auto of its own fields decided (paths, budget, cache, sample
    rate, the recipe), and the rest of what auto left open."""

    config: TrainConfig
    hardware: HardwarePlan
    model_size: str
    objective: str
    metric: str  # the metric validation selects by
    frontend: str
    members: int
    kind: DataKind
    decided: tuple[str, ...]  # "name value (why)" for each auto this plan decided, in order

    def describe(self) -> str:
        return (
            f"{self.hardware.describe()}; model '{self.model_size}'"
            + (f" x {self.members} members" if self.members > 1 else "")
            + f", {self.frontend} features\n"
            f"data kind: {self.kind.name} ({self.kind.why}); auto: {'; '.join(self.decided)}"
            + ("; set a parameter to choose it" if self.kind.name != "other" else "")
        )


def open_session(config: TrainConfig | Session) -> Session:
    """The session resolved and the table read (`Session`); a bad row stops here, before anything slow, unless
    on_bad_row is "skip". A session already open is returned as it is (the rounds open it once)."""
    if isinstance(config, Session):
        return config
    config = resolve_session(config)
    data_dir = Path(config.data_dir)
    rows, skipped = read_train_table(data_dir, config.on_bad_row, TrainTable.of(config))
    chunks = (
        read_labelled_chunks(data_dir, config.val_soundscapes_table, config.val_soundscapes_dir)
        if config.val_soundscapes_table
        else []
    )
    noise, noise_prefix = (
        audio_in_folder(data_dir, config.noise_dir, "noise_dir") if config.noise_dir else ([], "")
    )
    caches = kaggle.find_dirs_with(("cache.json", "index.npz")) if kaggle.on_kaggle() else []
    sources = Sources(tuple(rows), tuple(skipped), tuple(chunks), tuple(noise), noise_prefix, tuple(caches))
    taxonomy = read_taxonomy(config.data_dir)
    return Session(config, sources, taxonomy, {name: getattr(config, name) for name in SOURCE_PARAMETERS})


def plan_training(
    session: Session | TrainConfig, log: Callable[[str], Any] = print
) -> tuple[TrainPlan, TrainingData]:
    """The plan (module docstring) and the training data it was decided on; the plan is printed once. A
    TrainConfig is opened first (`open_session`)."""
    session = open_session(session)
    config, rows = session.config, list(session.sources.rows)
    if changed := sorted(name for name, value in session.read_with.items() if getattr(config, name) != value):
        raise ValueError(f"{changed}: the session's sources were read with other values; open a new session")
    decided: list[str] = []
    objective, why = choose_objective(config, rows)
    metric = choose_metric(config.metric, objective)
    birds = bird_signal(label_list(row.label for row in rows), session.taxonomy)
    if config.sample_rate is None:
        rate = BIRD_SAMPLE_RATE if birds else SAMPLE_RATE
        session = session.but(sample_rate=rate)
        config = session.config
        decided.append(
            f"sample_rate {rate} ({birds or 'no bird recordings: 16 kHz keeps what speech needs'})"
        )
    decided.append(f"objective {objective} ({why})")
    hardware = policy.decide(config, train_rows=round(len(rows) * (1 - config.split_fraction)))
    data = load_training_data(config, log, session.sources, objective=objective)
    clip_seconds = data.store.lengths[data.items[data.train_idx]] / config.sample_rate
    epoch_crops = len(data.epoch_rows(config.window_samples, config.crops_per_file))
    kind = kind_of_data(clip_seconds, config, objective, epoch_crops, birds)
    chosen = recipe_for(kind, config)
    config = dataclasses.replace(config, **chosen)
    decided += [
        f"{name} {value}" if isinstance(value, bool) else f"{name} {value:g}"
        for name, value in chosen.items()
    ]
    size, why = model_size(config, hardware.topology, kind)
    if why:
        decided.append(f"model_size '{size}' ({why})")
    frontend, members = choose_frontend(config), choose_members(config, size)
    if config.val_fraction == 0 and data.val_idx:
        decided.append(
            f"validation: none, its {plural(len(data.val_idx), 'file')} train too, the last epoch is kept"
        )
        data = dataclasses.replace(data, train_idx=sorted(data.train_idx + data.val_idx), val_idx=[])
    plan = TrainPlan(config, hardware, size, objective, metric, frontend, members, kind, tuple(decided))
    log(plan.describe())
    return plan, data


# ------------------------------------------------------------------------------------------- session


def resolve_session(config: TrainConfig) -> TrainConfig:
    """data_dir, artifact_dir, checkpoint_dir, time_budget_minutes and cache_dir where left to auto: on Kaggle
    the inputs are searched for and outputs go to /kaggle/working (checkpoints there whatever artifact_dir
    is: the only folder a version keeps; an earlier version's checkpoints among the inputs are copied in);
    elsewhere the local `artifacts/` folder the Makefile's demo uses, and no budget. Explicit values are
    kept, so resolving twice changes nothing."""
    data_dir = config.data_dir or kaggle.input_or_local(
        lambda: kaggle.find_competition_dir(config.train_table),
        kaggle.LOCAL_DATA,
        "data_dir",
        f"a folder with {config.train_table} and sample_submission.csv",
    )
    cache_dir = config.cache_dir or str(default_cache_dir())
    if not kaggle.on_kaggle():
        return dataclasses.replace(
            config,
            data_dir=str(data_dir),
            cache_dir=cache_dir,
            artifact_dir=config.artifact_dir or str(kaggle.LOCAL_ARTIFACT),
        )
    artifact_dir = config.artifact_dir or str(kaggle.working_dir() / "model")
    checkpoint_dir = Path(config.checkpoint_dir or kaggle.working_dir() / "checkpoints")
    seed_checkpoint(checkpoint_dir)
    budget = config.time_budget_minutes
    if budget is None:
        budget = kaggle.default_time_budget_minutes()
        print(
            f"time_budget_minutes: {budget:.0f} (Kaggle's {kaggle.session_limit_hours():g} h session limit "
            f"minus {kaggle.SESSION_MARGIN_MINUTES:g} min margin and the time already used)"
        )
    return dataclasses.replace(
        config,
        data_dir=str(data_dir),
        artifact_dir=str(artifact_dir),
        cache_dir=cache_dir,
        checkpoint_dir=str(checkpoint_dir),
        time_budget_minutes=budget,
    )


def default_cache_dir() -> Path:
    """Where decoded audio is cached when cache_dir is not given. On Kaggle: /kaggle/tmp (not saved with the
    notebook's output, and not counted against /kaggle/working's 20 GB: 100 hours of audio are 11.5 GB), else
    /tmp. Elsewhere: the user's cache folder ($XDG_CACHE_HOME, ~/.cache), shared by every run on the machine."""
    if kaggle.on_kaggle():
        tmp = kaggle.kaggle_root() / "tmp"
        return (tmp if tmp.is_dir() else Path("/tmp")) / "ecapa-audio-cache"
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "kaggle-ecapa-pipeline" / "audio"


def seed_checkpoint(checkpoint_dir: Path) -> list[Path]:
    """Copy the checkpoints found among the inputs into `checkpoint_dir`, each into its run's folder
    (`<fingerprint>/latest.pt`) unless that folder already holds one; returns the copies made.

    A Save Version run starts with an empty /kaggle/working: the checkpoint of an earlier version (attached
    as an input) is how it continues instead of starting over. Whether one belongs to this run is decided
    at resume time by its fingerprint; the others are kept as they are.
    """
    copied = []
    for found in kaggle.find_input_checkpoints():
        if not re.fullmatch(r"[0-9a-f]{16}", found.name):  # `checkpoints/latest.pt`, before a folder per run
            print(
                f"checkpoint: {found / kaggle.CHECKPOINT_FILE} is from an older version of this project "
                "and cannot be resumed by this one; training starts over"
            )
            continue
        target = checkpoint_dir / found.name / kaggle.CHECKPOINT_FILE
        if target.exists():
            continue
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(found / kaggle.CHECKPOINT_FILE, target)  # inputs are read-only: resume writes here
        print(f"checkpoint: copied {found / kaggle.CHECKPOINT_FILE} from the inputs to {target}")
        copied.append(target)
    return copied


# --------------------------------------------------------------------------------------------- table


def choose_objective(config: TrainConfig, rows: list[TrainRow]) -> tuple[str, str]:
    """The objective and why: "auto" is bce when at least MULTI_LABEL_SHARE of the files have several labels (a
    separated label cell, a secondary label that is a class, or one file in rows of two labels), or when
    soundscape_targets teaches stretches of soundscape (any number of classes each), else aam."""
    multi = ("bce", "focal")
    if config.soundscape_targets and config.objective not in ("auto", *multi):
        raise ConfigError(
            f"soundscape_targets needs a multi-label objective (bce or focal), not objective="
            f"{config.objective!r}: a stretch of soundscape holds any number of classes"
        )
    if config.objective != "auto":
        return config.objective, "the objective parameter"
    if config.soundscape_targets:
        return "bce", "soundscape_targets: a stretch of soundscape holds any number of classes"
    classes = {row.label for row in rows}
    labels_of: dict[str, set[str]] = {}
    for row in rows:
        labels_of.setdefault(row.rel_path, set()).update({row.label}, classes.intersection(row.secondary))
    several = sum(len(found) > 1 for found in labels_of.values())
    if several >= MULTI_LABEL_SHARE * len(labels_of):
        return "bce", f"auto: {several} of {plural(len(labels_of), 'file')} have several labels"
    if several:  # a few double-labelled files in a single-label task: each label trains on the file
        return "aam", (
            f"auto: only {several} of {plural(len(labels_of), 'file')} have several labels (less than "
            f"{MULTI_LABEL_SHARE:.0%}); each of their labels is trained on as a clip of its own"
        )
    return "aam", "auto: every file has one label"


def choose_metric(metric: str, objective: str) -> str:
    """The metric validation selects by: `metric`, or for "auto" accuracy (aam) or macro_roc_auc (multi-label)."""
    if metric != "auto":
        return metric
    return "accuracy" if objective == "aam" else "macro_roc_auc"


# --------------------------------------------------------------------------------------- what it holds


def kind_of_data(
    clip_seconds: np.ndarray, config: TrainConfig, objective: str, epoch_crops: int, birds: str | None = None
) -> DataKind:
    """What the training table holds, from its clips' lengths, the objective its labels chose, noise_dir and
    the bird signal (species.bird_signal)."""
    median = float(np.median(clip_seconds)) if len(clip_seconds) else 0.0
    if config.noise_dir:
        return DataKind("other", f"soundscapes: noise_dir={config.noise_dir!r}")
    if objective != "aam":
        return DataKind("other", f"objective {objective}: several labels per clip")
    if median < EVENT_MIN_SECONDS:
        return DataKind("other", f"one label per clip, median clip {median:.2f} s < {EVENT_MIN_SECONDS:g} s")
    if epoch_crops > EVENT_MAX_CROPS:
        return DataKind("other", f"{epoch_crops} crops an epoch > {EVENT_MAX_CROPS}: a large table")
    if config.init_from:
        return DataKind("other", "fine-tuning init_from (the recipe was measured from scratch)")
    shape = f"one label per clip, median clip {median:.1f} s, {epoch_crops} crops an epoch"
    if birds:
        return DataKind("bird recordings", f"{birds}; {shape}; no speed perturbation: pitch names a species")
    return DataKind("sound events", shape)


def recipe_for(kind: DataKind, config: TrainConfig) -> dict[str, Any]:
    """What `kind` gets (AUTO_VALUES) for each recipe parameter `config` leaves to auto (None)."""
    return {
        name: values[KINDS.index(kind.name)]
        for name, values in AUTO_VALUES.items()
        if getattr(config, name) is None
    }


def model_size(config: TrainConfig, topology: Topology, kind: DataKind) -> tuple[str, str | None]:
    """`model_size`, or for auto the hardware's (`hardware_model_size`), and 'medium' on a CPU for a small
    table of sound events or bird recordings, which the long schedule needs; with why (None: as set)."""
    if config.model_size != "auto":
        return config.model_size, None
    size = hardware_model_size(topology)
    if kind.name != "other" and topology.accelerator == "cpu":
        return EVENT_CPU_MODEL_SIZE, f"the CPU default is '{size}'; a small table's long schedule needs more"
    return size, f"the {topology.accelerator.upper()} default"


def hardware_model_size(topology: Topology, env: dict[str, str] | None = None) -> str:
    """The VoxCeleb-size model on real accelerators, the small one on CPUs, and the tiny one on torch_xla's CPU
    stand-in for a TPU, which exists to exercise the TPU code path (it runs ~50x slower than eager CPU,
    ../shared/NOTES.md)."""
    if topology.accelerator == "tpu":
        stand_in = (os.environ if env is None else env).get("PJRT_DEVICE", "TPU").upper() == "CPU"
        return "tiny" if stand_in else "voxceleb"
    return "voxceleb" if topology.accelerator == "cuda" else "small"


def choose_frontend(config: TrainConfig) -> str:
    """The front end of a model trained from scratch: `frontend`, or for auto pcen when `noise_dir` names
    background recordings (the test audio is field recordings in noise) and logmel otherwise. A fine-tuned
    model keeps its own (pretrained.py)."""
    if config.frontend != "auto":
        return config.frontend
    return "pcen" if config.noise_dir and not config.init_from else "logmel"


def choose_members(config: TrainConfig, size: str) -> int:
    """How many ECAPA-TDNNs the model holds: `ensemble_members`, or for auto 3 when `noise_dir` names
    background recordings (soundscapes: see TrainConfig) and the size is one of ENSEMBLE_SIZES, 1 otherwise.
    A fine-tuned model has one (TrainConfig refuses more)."""
    if config.ensemble_members is not None:
        return config.ensemble_members
    soundscapes = config.noise_dir and not config.init_from
    return SOUNDSCAPE_MEMBERS if soundscapes and size in ENSEMBLE_SIZES else 1


def auto_could_choose(name: str, value: object) -> bool:
    """Whether `value` of parameter `name` is one this module decides when the parameter is left to auto (an
    artifact trained with epochs None records the 12 or 36 the data chose)."""
    if name == "sample_rate":
        return value in (SAMPLE_RATE, BIRD_SAMPLE_RATE)
    return value in AUTO_VALUES.get(name, ())


__all__ = [
    "AUTO_VALUES",
    "DataKind",
    "TrainPlan",
    "auto_could_choose",
    "choose_metric",
    "choose_objective",
    "Session",
    "hardware_model_size",
    "kind_of_data",
    "model_size",
    "open_session",
    "plan_training",
    "recipe_for",
    "resolve_session",
]
