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
# Parameters (papermill: -p NAME VALUE). Every field of pipeline.config.TrainConfig is accepted;
# an unknown name stops the run. None means "find it" (Kaggle inputs) or "the default for this hardware".
data_dir = None  # competition folder: train.csv, test.csv, sample_submission.csv
artifact_dir = None  # where the model artifact is written
accelerator = "auto"  # auto | tpu | cuda | cpu
devices = None  # data-parallel devices/processes (auto: all)
model_size = "auto"  # auto | tiny | small | base | voxceleb (auto: by hardware)
epochs = 12
per_device_batch_size = 32
base_batch_size = 32  # the batch size base_lr was tuned for
base_lr = 2e-3
lr_scaling = "sqrt"  # linear | sqrt | none
grad_accum = 1  # micro-batches per optimizer step (global batch = per device x devices x grad_accum)
precision = "auto"  # auto | fp32 | bf16 | fp16
time_budget_minutes = None  # stop in time to save (auto on Kaggle)

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
    importlib.invalidate_caches()
    print(f"installed {os.path.basename(_wheels[-1])} (and what the image lacked) from {_code}")

# %% [markdown]
# # Train an ECAPA-TDNN speaker classifier and save the artifact
# Uses every device of the session: TPU v5e-8 / v3-8 (torch_xla SPMD), GPU T4 x2 (DDP) or CPU, with the
# batch size and learning rate scaled to it. The artifact is what `infer.ipynb` loads for the submission.

# %%
from pipeline.config import TrainConfig, from_params
from pipeline.notebook import resolve_train_defaults
from pipeline.train import train

config = resolve_train_defaults(from_params(TrainConfig, globals()))
result = train(config)

# %%
from pipeline.report import show_training_report

show_training_report(result)  # summary table, training curves and confusion matrix (saved in the artifact)
