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
# Parameters (papermill: -p NAME VALUE). Every field of pipeline.config.InferConfig is accepted;
# an unknown name stops the run. None means "find it" (Kaggle inputs) or the local default.
data_dir = None  # competition folder with test.csv and sample_submission.csv
artifact_dir = None  # the artifact written by train.ipynb
submission_path = None  # default: submission.csv in the working directory
device = "auto"  # auto | cuda | cpu  (never TPU: code competitions do not accept TPU notebooks)
batch_windows = None  # windows per forward pass (None: sized for the device)

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
# # Predict the test set from the trained artifact and write submission.csv
# Runs offline on GPU or CPU, without torch_xla. Every test id gets a row: unreadable files get the
# fallback label and are listed in the report.

# %%
from pipeline.config import InferConfig, from_params
from pipeline.notebook import resolve_infer_paths
from pipeline.submission import run_inference

config = resolve_infer_paths(from_params(InferConfig, globals()))
result = run_inference(config)

# %%
from pipeline.report import show_inference_report

print(result.summary())
show_inference_report(result)  # predicted-label distribution, fallback report, run summary
