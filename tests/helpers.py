"""Helpers shared by tests (imported as `helpers`; pytest puts tests/ on sys.path)."""

from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
from pathlib import Path

import nbformat
import numpy as np
import soundfile as sf

from matrix.run import XLA_QUICK_COMPILE
from pipeline.core.config import SAMPLE_RATE

ROOT = Path(__file__).resolve().parents[1]


def venv_env(**extra: str) -> dict[str, str]:
    """Environment for subprocesses (papermill kernels, workers): this interpreter's bin dir first on PATH."""
    env = dict(os.environ)
    env["PATH"] = str(Path(sys.executable).parent) + os.pathsep + env.get("PATH", "")
    env.update(extra)
    return env


# torch_xla's CPU backend standing in for a TPU's 8 devices, compiling as the handoff does (matrix/run.py says why).
XLA_STAND_IN = {"PJRT_DEVICE": "CPU", "CPU_NUM_DEVICES": "8", "XLA_FLAGS": XLA_QUICK_COMPILE}


def run_papermill(notebook: str, output: Path, params: dict, env: dict | None = None, timeout: float = 600):
    """Run a notebook as users do: the papermill CLI from the repo root. Returns the CompletedProcess."""
    argv = [str(Path(sys.executable).parent / "papermill"), str(ROOT / notebook), str(output), "--log-output"]
    for name, value in params.items():
        argv += ["-p", name, str(value)]
    return subprocess.run(
        argv, cwd=ROOT, env=env or venv_env(), capture_output=True, text=True, timeout=timeout
    )


def bootstrap_source(notebook: str) -> str:
    nb = nbformat.read(ROOT / notebook, as_version=4)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert "parameters" in code[0].metadata.get("tags", [])  # the bootstrap must not displace it
    assert code[1].source.startswith("# Kaggle bootstrap")
    return code[1].source


def fresh_python(tmp_path: Path, hide: tuple[str, ...]) -> Path:
    """A new venv seeing this venv's packages (pip, torch, speechbrain...) except `pipeline` itself and the
    distributions named in `hide`: what a Kaggle image looks like before the bootstrap runs."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(tmp_path / "venv")], check=True)
    python = tmp_path / "venv" / "bin" / "python"
    site = Path(subprocess.check_output([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                                        text=True).strip())  # fmt: skip
    mirror = tmp_path / "image-site-packages"
    mirror.mkdir()
    hidden = ("kaggle_ecapa_pipeline", "__editable__", "pipeline", *hide)
    for entry in Path(sysconfig.get_paths()["purelib"]).iterdir():
        if not entry.name.lower().startswith(tuple(h.lower() for h in hidden)):
            (mirror / entry.name).symlink_to(entry)
    (site / "image.pth").write_text(f"{mirror}\n")  # a plain path entry: the mirror's .pth files are inert
    return python


def run_bootstrap(python: Path, kaggle_root: Path, cwd: Path) -> subprocess.CompletedProcess:
    code = (
        bootstrap_source("notebooks/infer.ipynb")
        + "\nimport pipeline\nprint('pipeline from', pipeline.__file__)\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PIP_", "PYTHON"))}
    # Only the code dataset may serve packages: no index, no find-links or config from this machine.
    env.update(KAGGLE_KERNEL_RUN_TYPE="Batch", KAGGLE_ROOT=str(kaggle_root), PIP_CONFIG_FILE=os.devnull)
    return subprocess.run([python, "-c", code], cwd=cwd, env=env, capture_output=True, text=True, timeout=300)


def run_in_group(argv: list[str], timeout: float, **kwargs) -> subprocess.CompletedProcess:
    """subprocess.run for commands that start processes of their own (torchrun): on timeout the whole process
    group is killed, so no rank is left running after the test."""
    import signal

    with subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
                          **kwargs) as process:  # fmt: skip
        try:
            out, err = process.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            out, err = process.communicate()
            raise AssertionError(
                f"timed out after {timeout} s: {argv}\n{out[-2000:]}\n{err[-3000:]}"
            ) from None
    return subprocess.CompletedProcess(argv, process.returncode, out, err)


def write_folder(root, rows, files):
    root.mkdir(parents=True, exist_ok=True)
    (root / "train.csv").write_text("path,label\n" + "".join(f"{p},{lab}\n" for p, lab in rows))
    for name, samples in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        sf.write(root / name, samples, SAMPLE_RATE)
    return root


def tone(seconds=0.3, freq=220.0, rate=SAMPLE_RATE):
    t = np.arange(int(seconds * rate)) / rate
    return (0.3 * np.sin(2 * np.pi * freq * t)).astype(np.float32)


# ------------------------------------------------------------------------- inference without tables


def classify_clips(
    model, clips, window, batch_windows=64, max_windows=None, device=None, length_buckets=1, centre=None,
    energy_weighted=True, speeds=(1.0,),
):  # fmt: skip
    """Whole-file predictions (SpanPredictions) for clips already in memory, one span per clip, through the
    infer stage's windows and batches (scored minus `centre`, an artifact's embedding_centre, when given; each
    file's windows weighted by their energy, as the infer stage's default, unless `energy_weighted` is False;
    each file also read at `speeds`)."""
    import torch

    from pipeline.core.config import MAX_WINDOWS_PER_FILE
    from pipeline.core.windows import WindowPlan, run_windows

    device = device or torch.device("cpu")
    plan = WindowPlan(window, model.config.sample_rate, batch_windows, max_windows or MAX_WINDOWS_PER_FILE, None,
                      length_buckets, energy_weighted=energy_weighted, speeds=tuple(speeds))  # fmt: skip
    return run_windows(model, clip_items(clips, plan), len(clips), plan, device, centre=centre)


def clip_items(clips, plan):
    """The windows of decoded clips (FileWindows), one whole-file span each (span k is clip k)."""
    from pipeline.core.windows import FileWindows, span_windows

    for i, clip in enumerate(clips):
        yield FileWindows(i, *span_windows(clip, [(i, 0.0, None)], plan))


def span_plan(root, files, spans=None, seconds=None):
    """A RowPlan of one row per span (default: each file whole), for calling inference.predict directly."""
    from pipeline.core.windows import Span
    from pipeline.inference.rows import RowPlan

    spans = spans if spans is not None else [Span(k) for k in range(len(files))]
    ids = [f"row{k}" for k in range(len(spans))]
    return RowPlan(Path(root), ids, list(range(len(spans))), list(spans), list(files),
                   list(seconds) if seconds is not None else [None] * len(files), "test rows",
                   [f"item{k}" for k in range(len(files))])  # fmt: skip


def cpu_runtime(model, batch_windows=16, max_windows=64, num_workers=0, engine=None, **windows):
    """A Runtime on the CPU with torch (or `engine`, an EngineChoice), for calling inference.predict."""
    import torch

    from pipeline.core.windows import WindowPlan
    from pipeline.inference.runtime import EngineChoice, Runtime

    config = model.config
    plan = WindowPlan(config.window_samples, config.sample_rate, batch_windows, max_windows, **windows)
    return Runtime(
        torch.device("cpu"), plan, num_workers, None, engine or EngineChoice("torch", "fp32", "test")
    )


def read_rows(path):
    """A CSV's rows as dicts (submissions, sample submissions, test tables)."""
    import csv

    with open(path, newline="") as handle:
        return list(csv.DictReader(handle))
