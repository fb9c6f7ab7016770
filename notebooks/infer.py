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
batch_windows = 64

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
print(result.summary())
