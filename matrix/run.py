"""`python -m matrix.run` (`make matrix`): every leg of pipeline/tooling/versions.py in a fresh venv, with its checks.

    python -m matrix.run                   # every leg, in order; venvs deleted once their leg passes
    python -m matrix.run --only kaggle-tpu --only kaggle-gpu --keep
    python -m matrix.run --list            # the legs, their pins and checks
    python -m matrix.run --handoff         # CI (`make handoff`): kaggle-tpu trains, kaggle-gpu predicts offline

Each leg gets .matrix/<leg> (gitignored): `uv venv`, then one `uv pip install` of the leg's exact pins plus
this project (editable, with the extras its checks need), so the resolver also proves that pyproject's ranges
admit the pins. The legs then run their checks from the repository root with the venv's interpreter:

  floor, newest  pytest -m "not slow"; the train notebook (cpu, tiny) -> the infer notebook -> score;
                 SpeechBrain's EncoderClassifier on that artifact agrees with the torch engine (offline guard)
  floor          also pytest -m xla (torch_xla 2.7 beside torch 2.7.1)
  kaggle-tpu     pytest -m xla (less the notebook test: the next check is it, on this leg's versions); the
                 train notebook on 8 XLA CPU devices writes the handoff artifact, compiling as few graphs as the
                 test asks
                 (.matrix/handoff: artifact, with the ONNX files its training exported (torch 2.8's
                 exporter), + competition folder + the versions that trained it)
  kaggle-gpu     a kernel under the offline guard (tests/offline_guard.py: no network, no torch_xla) cannot
                 import torch_xla; the infer notebook on the handoff (copied read-only to another path, as
                 Kaggle mounts inputs) under that guard, engine='onnx' on the artifact's ONNX files, writes a
                 row for every sample_submission id, in order;
                 SpeechBrain's client on the same artifact, under the same guard, gives the labels of the
                 infer notebook's torch engine; ONNX Runtime runs the artifact's ONNX files with torch's labels
                 (matrix/onnx_check.py)

Why uv and not pip or nox: a leg is about 7 GB of CUDA wheels (PyPI's Linux torch). uv downloads in parallel
into one cache and hardlinks installed files out of it, so a venv costs seconds and almost no disk once its
wheels are cached, and deleting it frees nothing that the next run needs. pip would unpack ~7 GB per venv
(minutes on 2 cores) beside a 15 GB wheel cache. nox would only wrap the same venv + install + run steps; the
legs' handoff (kaggle-tpu -> kaggle-gpu) and the checks are plain Python here. uv comes from
requirements.lock (the Makefile's .venv). The cache is uv's own ($UV_CACHE_DIR, default ~/.cache/uv, or
--cache-dir): shared by every clone on the machine, so a second run downloads nothing.

The summary (leg, versions the venv reports, checks, result, seconds) goes to stdout, matrix/results.md and
matrix/results.json; a run with --only updates those legs' rows and keeps the others'. --handoff runs only the
legs' handoff checks (pipeline/tooling/versions.py: the artifact trained on the TPU image's versions, predicted from on
the GPU image's, offline) and writes its summary to .matrix/handoff-results.md instead: a partial run never
replaces the committed record of a whole one. Exit status 1 names
each failing leg and check, with the tail of its log (.matrix/logs/<leg>/<check>.log).
"""

from __future__ import annotations

import argparse
import csv
import importlib.util
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # `python matrix/run.py` works too

from pipeline.tooling import versions  # noqa: E402  (after the sys.path line; imports no torch)

WORK = ROOT / ".matrix"
HANDOFF = WORK / "handoff"  # kaggle-tpu's artifact and data, read by kaggle-gpu
RESULTS_MD = ROOT / "matrix" / "results.md"
RESULTS_JSON = ROOT / "matrix" / "results.json"
HANDOFF_MD, HANDOFF_JSON = WORK / "handoff-results.md", WORK / "handoff-results.json"

# The brief's tiny settings: XLA on CPU is ~50x slower than eager, and the matrix tests versions, not accuracy.
TINY = {"model_size": "tiny", "epochs": 2, "per_device_batch_size": 8, "base_batch_size": 8, "n_mels": 40,
        "window_seconds": 0.5, "progress": False}  # fmt: skip
# Extras of pyproject.toml each leg installs (the project itself is installed editable).
EXTRAS = {"floor": "dev,tpu", "kaggle-tpu": "dev,tpu", "kaggle-gpu": "notebooks", "newest": "dev"}
# Tests that need torch_xla installed (the dev venv's premise; fake TPU VMs resolve their topology with it):
# deselected where a leg has none (newest: there is no torch_xla for torch 2.11).
# Environment that must not leak into a leg from the shell that started the matrix.
SCRUBBED = ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "PJRT_DEVICE", "CPU_NUM_DEVICES", "ISTPUVM",
            "TPU_ACCELERATOR_TYPE", "XLA_FLAGS", "OFFLINE_GUARD_LOG")  # fmt: skip
REPORTED = (*versions.KEY_PACKAGES, "scipy", "soundfile", "safetensors", "pyyaml", "torchcodec", "packaging")


class CheckFailed(Exception):
    """A check's assertion or command failed; the message says what, the log holds the rest."""


@dataclass
class CheckResult:
    name: str
    ok: bool
    seconds: float
    detail: str = ""


@dataclass
class LegResult:
    leg: str
    ok: bool = False
    installed: dict[str, str | None] = field(default_factory=dict)
    install_seconds: float = 0.0
    seconds: float = 0.0
    checks: list[CheckResult] = field(default_factory=list)
    error: str = ""
    finished: str = ""
    load: float = 0.0  # the machine's 5-minute load average when the leg ended: 2 cores, shared


class Leg:
    """One leg's venv, folders and environment, and the commands its checks run."""

    def __init__(self, spec: versions.Leg):
        self.spec = spec
        self.venv = WORK / spec.name
        self.work = WORK / "work" / spec.name
        self.logs = WORK / "logs" / spec.name
        self.python = self.venv / "bin" / "python"

    def env(self, **extra: str) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if k not in SCRUBBED and not k.startswith("KAGGLE_")}
        env.update(PATH=f"{self.venv / 'bin'}{os.pathsep}{env.get('PATH', '')}", VIRTUAL_ENV=str(self.venv),
                   MPLBACKEND="Agg", PYTHONDONTWRITEBYTECODE="1")  # fmt: skip
        env.update(extra)
        return env

    def run(self, log: str, argv: list[str], env: dict[str, str] | None = None, timeout: float = 900):
        """Run argv from the repository root, output to logs/<log>.log; CheckFailed with its tail on failure."""
        self.logs.mkdir(parents=True, exist_ok=True)
        path = self.logs / f"{log}.log"
        started = time.monotonic()
        with open(path, "w") as handle:
            handle.write(f"$ {' '.join(map(str, argv))}\n")
            handle.flush()
            try:
                run = subprocess.run(list(map(str, argv)), cwd=ROOT, env=env or self.env(), stdout=handle,
                                     stderr=subprocess.STDOUT, text=True, timeout=timeout)  # fmt: skip
            except subprocess.TimeoutExpired as error:
                raise CheckFailed(f"timed out after {timeout:.0f} s: {path}") from error
        output = path.read_text()
        if run.returncode != 0:
            raise CheckFailed(f"exit status {run.returncode} after {time.monotonic() - started:.0f} s; "
                              f"log {path.relative_to(ROOT)}:\n{tail(output)}")  # fmt: skip
        return output

    def papermill(self, log: str, notebook: str, params: dict, env: dict[str, str] | None = None) -> str:
        out = self.work / f"{log}.out.ipynb"
        argv = [self.venv / "bin" / "papermill", ROOT / "notebooks" / notebook, out, "--log-output"]
        for name, value in params.items():
            argv += ["-p", name, str(value)]
        return self.run(log, argv, env=env, timeout=900)

    def guarded_env(self, log: Path, **extra: str) -> dict[str, str]:
        """The offline guard of tests/end_to_end/test_offline_infer.py first on PYTHONPATH, logging to `log`."""
        guard_dir = self.work / "guard"
        guard_dir.mkdir(parents=True, exist_ok=True)
        (guard_dir / "sitecustomize.py").write_text(offline_guard_source())
        return self.env(PYTHONPATH=str(guard_dir), OFFLINE_GUARD_LOG=str(log), HF_HUB_OFFLINE="1", **extra)


def remove(path: Path) -> None:
    """rmtree that also removes read-only copies (the kaggle-gpu leg's input folder)."""
    if not path.exists():
        return
    for folder, _, _ in os.walk(path):
        os.chmod(folder, 0o755)
    shutil.rmtree(path)


def read_only_copy(source: Path, target: Path) -> Path:
    """Copy a folder and make it read-only, as Kaggle mounts inputs under /kaggle/input."""
    remove(target)
    shutil.copytree(source, target)
    for folder, _, files in os.walk(target):
        for name in files:
            os.chmod(Path(folder) / name, 0o444)
    for folder, _, _ in sorted(os.walk(target), reverse=True):
        os.chmod(folder, 0o555)
    return target


def tail(text: str, lines: int = 40) -> str:
    return "\n".join(text.rstrip().splitlines()[-lines:])


def offline_guard_source() -> str:
    path = ROOT / "tests" / "offline_guard.py"
    spec = importlib.util.spec_from_file_location("offline_guard", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.GUARD


# ---------------------------------------------------------------------------------------------- set-up


def find_uv() -> str:
    uv = shutil.which("uv", path=f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}")
    if not uv:
        sys.exit(
            "matrix: uv not found. `make setup` installs it into .venv (requirements.lock); or pip install uv"
        )
    return uv


def uv_env(cache_dir: str | None) -> dict[str, str]:
    env = dict(os.environ, UV_PYTHON_DOWNLOADS="never", UV_NO_PROGRESS="1")
    env.pop("VIRTUAL_ENV", None)
    if cache_dir:
        env["UV_CACHE_DIR"] = cache_dir
    return env


VERSIONS_SCRIPT = """\
import importlib.metadata as m, json
found = {}
for name in NAMES:
    try:
        found[name] = m.version(name)
    except m.PackageNotFoundError:
        found[name] = None
print(json.dumps(found))
"""


def install(leg: Leg, uv: str, base_python: str, cache_dir: str | None) -> dict[str, str | None]:
    """Fresh venv + the leg's pins + the project; returns the versions the venv reports (and checks them)."""
    for folder in (leg.venv, leg.work, leg.logs):
        remove(folder)
    for folder in (leg.work, leg.logs):
        folder.mkdir(parents=True)
    env = uv_env(cache_dir)
    pins = [f"{name}=={version}" for name, version in leg.spec.pins().items()]
    extras = EXTRAS[leg.spec.name]
    # --seed: pip in the venv, as on Kaggle (`kaggle package` and the notebooks' bootstrap call pip).
    leg.run(
        "venv", [uv, "venv", "--quiet", "--seed", "--python", base_python, leg.venv], env=env, timeout=300
    )
    leg.run("install", [uv, "pip", "install", "--python", leg.python, *pins, "-e", f"{ROOT}[{extras}]"],
            env=env, timeout=1800)  # fmt: skip
    freeze = leg.run("freeze", [uv, "pip", "freeze", "--python", leg.python], env=env, timeout=120)
    names = (*REPORTED, *(n for n in leg.spec.pins() if n not in REPORTED))
    code = VERSIONS_SCRIPT.replace("NAMES", repr(names))
    installed = json.loads(leg.run("versions", [leg.python, "-c", code]).strip().splitlines()[-1])
    wrong = [f"{n} {installed.get(n)} (pinned {v})" for n, v in leg.spec.pins().items()
             if (installed.get(n) or "").split("+")[0] != v]  # fmt: skip
    if wrong:
        raise CheckFailed(f"the venv has {', '.join(wrong)}; see {leg.logs / 'freeze.log'}:\n{tail(freeze)}")
    if not leg.spec.torch_xla and installed.get("torch_xla"):
        raise CheckFailed(f"torch_xla {installed['torch_xla']} got installed, but this leg must have none")
    return installed


# ---------------------------------------------------------------------------------------------- checks


def pytest_check(markers: str, deselect: tuple[str, ...] = ()) -> Callable[[Leg], str]:
    def check(leg: Leg) -> str:
        # Its own --basetemp: no other pytest run on the machine (a developer's, CI's) cleans it up under it.
        # -rs: each skipped test's reason, so a leg's skips are read, not just counted.
        argv = [leg.python, "-m", "pytest", "-q", "-rs", "-m", markers, "-p", "no:cacheprovider",
                "--basetemp", leg.work / "pytest", *(f"--deselect={test}" for test in deselect)]  # fmt: skip
        output = leg.run(f"pytest-{re.sub(r'[^a-z]+', '-', markers).strip('-')}", argv, timeout=1500)
        return pytest_summary(output)

    return check


def pytest_summary(output: str) -> str:
    """pytest's count line, then each skipped test (`-rs` lines: `SKIPPED [n] file:line: reason`)."""
    lines = output.splitlines()
    counts = [line for line in lines if re.search(r"\d+ (passed|failed|error)", line)]
    summary = counts[-1].strip("= ") if counts else ""
    skipped = [line.removeprefix("SKIPPED ") for line in lines if line.startswith("SKIPPED [")]
    return "; ".join([summary, *(f"skipped {s}" for s in skipped)])


def read_ids(path: Path) -> list[str]:
    with open(path, newline="") as handle:
        return [row["id"] for row in csv.DictReader(handle)]


def make_data(leg: Leg, out: Path) -> Path:
    leg.run("data", [leg.python, "-m", "pipeline", "data", "synthetic", "--out", out, "--overwrite"])
    return out


def assert_submission(data: Path, submission: Path) -> None:
    expected, written = read_ids(data / "sample_submission.csv"), read_ids(submission)
    if written != expected:
        missing = sorted(set(expected) - set(written))[:5]
        raise CheckFailed(f"{submission} has {len(written)} rows for {len(expected)} sample_submission ids "
                          f"(missing e.g. {missing}, or out of order)")  # fmt: skip


def score(leg: Leg, data: Path, submission: Path) -> str:
    output = leg.run("score", [leg.python, "-m", "pipeline", "score", "--submission", submission,
                               "--solution", data / "solution.csv"])  # fmt: skip
    return output.strip().splitlines()[-1]


def notebooks_cpu(leg: Leg) -> str:
    """Train (cpu, tiny) -> infer -> score, on synthetic data."""
    data = make_data(leg, leg.work / "data")
    artifact, submission = leg.work / "model", leg.work / "out" / "submission.csv"
    leg.papermill("train", "train.ipynb", {"data_dir": data, "artifact_dir": artifact, "accelerator": "cpu",
                                           **TINY})  # fmt: skip
    leg.papermill("infer", "infer.ipynb", {"data_dir": data, "artifact_dir": artifact,
                                           "submission_path": submission, "progress": False})  # fmt: skip
    assert_submission(data, submission)
    return score(leg, data, submission)


def speechbrain_client(leg: Leg, artifact: Path, data: Path, submission: Path) -> str:
    """SpeechBrain's EncoderClassifier on `artifact`, offline, against the infer notebook's torch engine on the
    same files: the artifact's hyperparams.yaml computes what that engine does (tests/core/test_artifact.py),
    so every label must agree. `submission`, the leg's own run with whatever engine it chose, is compared too
    and only reported: an int8 engine may flip a near tie (its rule is accuracy, checked at training), as
    the floor leg's default run did on 2026-11-30 (89 of 90)."""
    torch_submission = leg.work / "out-torch" / "submission.csv"
    leg.papermill("infer-torch", "infer.ipynb", {"data_dir": data, "artifact_dir": artifact,
                  "submission_path": torch_submission, "progress": False, "engine": "torch"})  # fmt: skip
    guard_log = leg.work / "guard-sb.log"
    env = leg.guarded_env(guard_log)
    output = leg.run("speechbrain", [leg.python, "-m", "matrix.sb_client", artifact, data, torch_submission,
                                     leg.work / "sb-savedir", submission], env=env)  # fmt: skip
    found = json.loads(output.strip().splitlines()[-1])
    blocked = [line for line in read_text(guard_log).splitlines() if " blocked " in line]
    if blocked:
        raise CheckFailed(f"SpeechBrain's client tried the network: {blocked[:3]}")
    engine = json.loads(read_text(submission.parent / "submission_report.json") or "{}").get("engine", {})
    also = found["also"]
    return (
        f"{found['agree']}/{found['files']} labels agree with the torch engine's submission; "
        f"{also['agree']}/{also['files']} with the run's own ({engine.get('ran', '?')})"
    )


def speechbrain_own(leg: Leg) -> str:
    """EncoderClassifier on the artifact notebooks_cpu wrote, against its submission."""
    return speechbrain_client(leg, leg.work / "model", leg.work / "data", leg.work / "out" / "submission.csv")


def read_text(path: Path) -> str:
    return path.read_text() if path.exists() else ""


# torch_xla's CPU stand-in without LLVM's optimisation of the code it compiles: the graphs, their count and the
# values they compute are what the handoff and the tests check, and LLVM is most of a compile (the tiny model's
# SPMD step: 12 s against 46; one way of test_xla_traced's script alone 47 s against 145 s, 2026-11-29).
XLA_QUICK_COMPILE = "--xla_backend_optimization_level=0 --xla_llvm_disable_expensive_passes=true"


def train_xla_handoff(leg: Leg) -> str:
    """The train notebook on torch_xla's CPU backend with 8 devices: SPMD, bf16; writes .matrix/handoff."""
    remove(HANDOFF)
    HANDOFF.mkdir(parents=True)
    data = make_data(leg, HANDOFF / "data")
    artifact = HANDOFF / "model"
    env = leg.env(
        PJRT_DEVICE="CPU", CPU_NUM_DEVICES="8", TF_CPP_MIN_LOG_LEVEL="2", XLA_FLAGS=XLA_QUICK_COMPILE
    )
    log = leg.papermill("train-xla", "train.ipynb", {"data_dir": data, "artifact_dir": artifact,
                                                     "accelerator": "tpu", **TINY}, env=env)  # fmt: skip
    if "TPU: 8 XLA devices (XLA SPMD" not in log:
        raise CheckFailed("the train notebook did not report 'TPU: 8 XLA devices (XLA SPMD'")
    manifest = json.loads((artifact / "manifest.json").read_text())
    provenance = manifest["provenance"]
    if not {"embedding_model.onnx", "embedding_model.int8.onnx"} <= set(manifest["files"]):
        raise CheckFailed(f"the artifact has no ONNX files (training's export: {provenance.get('onnx')})")
    found = (provenance.get("devices"), provenance.get("strategy"), provenance["versions"].get("torch_xla"))
    if found != (8, "xla-spmd", leg.spec.torch_xla):
        raise CheckFailed(f"artifact provenance (devices, strategy, torch_xla) = {found}, expected "
                          f"(8, 'xla-spmd', {leg.spec.torch_xla!r})")  # fmt: skip
    # As tests/devices/test_xla.py's notebook test (which this leg deselects), with more steps an epoch (10 here): the
    # first epoch compiles every graph of the run, the step's 1-2 and validation's 2, and no later step or
    # validation compiles one (the first step after a validation once did: devices/xla_traced.py).
    history = provenance["history"]
    compiles = [(r["xla_compiles_before_validation"], r["xla_compiles"]) for r in history]
    if not (all(before == after == compiles[0][1] for before, after in compiles[1:])
            and provenance["xla_compile_count"] == compiles[-1][1] <= 4):  # fmt: skip
        raise CheckFailed(f"XLA compilations per epoch (before validation, after) = {compiles}, total "
                          f"{provenance['xla_compile_count']}: expected at most 4, all in the first epoch")  # fmt: skip
    (HANDOFF / "trained-by.json").write_text(
        json.dumps({"leg": leg.spec.name, **provenance["versions"]}) + "\n"
    )
    return (f"8 XLA devices, {provenance.get('xla_compile_count')} compilation(s), torch_xla {found[2]}; ONNX files "
            f"in {provenance['onnx'].get('seconds')} s, int8 passed: {provenance['onnx'].get('int8', {}).get('passed')}")  # fmt: skip


NO_XLA_PROBE = """\
import importlib.metadata, importlib.util, json, os, sys
result = {"find_spec": importlib.util.find_spec("torch_xla") is None}
try:
    import torch_xla
    result["import"] = "IMPORTED"
except ImportError as error:
    result["import"] = f"{type(error).__name__}: {error}"
try:
    result["installed"] = importlib.metadata.version("torch_xla")
except importlib.metadata.PackageNotFoundError:
    result["installed"] = None
import torch, pipeline.inference.submission
result.update(torch=torch.__version__, executable=sys.executable, xla_loaded=sys.modules.get("torch_xla") is not None)
open(os.environ["PROBE_OUT"], "w").write(json.dumps(result))
"""


def no_torch_xla_in_kernel(leg: Leg) -> str:
    """A papermill kernel of this venv, under the offline guard: torch_xla is neither installed nor importable."""
    import nbformat  # the matrix's own interpreter (.venv) has it: papermill's dependency

    notebook = leg.work / "probe.ipynb"
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(NO_XLA_PROBE)])
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(nb, notebook)
    out = leg.work / "probe.json"
    guard_log = leg.work / "guard-probe.log"
    env = leg.guarded_env(guard_log, PROBE_OUT=str(out))
    leg.run("probe", [leg.venv / "bin" / "papermill", notebook, leg.work / "probe.out.ipynb"], env=env)
    found = json.loads(out.read_text())
    problems = [text for bad, text in (
        (not found["find_spec"], "find_spec('torch_xla') is not None"),
        (found["import"] == "IMPORTED", "import torch_xla succeeded"),
        (found["installed"] is not None, f"torch_xla {found['installed']} is installed"),
        (found["xla_loaded"], "torch_xla is in sys.modules"),
        (not found["executable"].startswith(str(leg.venv)), f"the kernel ran {found['executable']}"),
        ("ipykernel" not in read_text(guard_log), "the guard log shows no kernel"),
    ) if bad]  # fmt: skip
    if problems:
        raise CheckFailed("; ".join(problems))
    return f"torch {found['torch']} kernel: {found['import'][:60]}"


def handoff_input(leg: Leg) -> tuple[Path, Path]:
    """kaggle-tpu's artifact and data, copied read-only to another path: moved and mounted, as on Kaggle."""
    if not (HANDOFF / "model" / "manifest.json").is_file():
        raise CheckFailed(f"no handoff artifact at {HANDOFF / 'model'}: run leg kaggle-tpu first "
                          "(python -m matrix.run --only kaggle-tpu --only kaggle-gpu)")  # fmt: skip
    inputs = leg.work / "input"
    if not inputs.exists():
        read_only_copy(HANDOFF, inputs)
    return inputs / "model", inputs / "data"


def infer_offline_handoff(leg: Leg) -> str:
    """The infer notebook on kaggle-tpu's artifact, with the network and torch_xla blocked."""
    artifact, data = handoff_input(leg)
    guard_log = leg.work / "guard-infer.log"
    submission = leg.work / "out" / "submission.csv"
    # engine='onnx': the ONNX files kaggle-tpu's training wrote into the artifact (torch 2.8 + torch_xla's
    # exporter), run by this leg's ONNX Runtime; auto could pick torch for a tiny model on a busy machine.
    leg.papermill("infer-offline", "infer.ipynb", {"data_dir": data, "artifact_dir": artifact,
                  "submission_path": submission, "progress": False, "engine": "onnx"},
                  env=leg.guarded_env(guard_log))  # fmt: skip
    assert_submission(data, submission)
    engine = json.loads((submission.parent / "submission_report.json").read_text())["engine"]
    if not str(engine["ran"]).startswith("onnx-"):
        raise CheckFailed(
            f"the infer notebook ran {engine['ran']!r}, not the artifact's ONNX files: {engine['lines']}"
        )
    lines = read_text(guard_log).splitlines()
    if not any(" loaded " in line and "ipykernel" in line for line in lines):
        raise CheckFailed(f"the guard log {guard_log} shows no kernel loading it: the notebook ran unguarded")
    blocked = [line for line in lines if " blocked " in line]
    if blocked:
        raise CheckFailed(f"the submission path tried the network or torch_xla: {blocked[:3]}")
    trained = json.loads(read_text(HANDOFF / "trained-by.json") or "{}")
    return (f"{score(leg, data, submission)}; artifact trained with torch {trained.get('torch')}; engine "
            f"{engine['ran']}")  # fmt: skip


def speechbrain_handoff(leg: Leg) -> str:
    artifact, data = handoff_input(leg)
    return speechbrain_client(leg, artifact, data, leg.work / "out" / "submission.csv")


def onnx_engine_handoff(leg: Leg) -> str:
    """kaggle-gpu, under the offline guard: ONNX Runtime runs the fp32 and int8 files kaggle-tpu's training wrote
    into the artifact, each through make_embedder (engine 'onnx'), and the fp32 one gives torch's labels and
    scores."""
    artifact, data = handoff_input(leg)
    guard_log = leg.work / "guard-onnx.log"
    output = leg.run("onnx-engine", [leg.python, "-m", "matrix.onnx_check", "compare", artifact, data],
                     env=leg.guarded_env(guard_log))  # fmt: skip
    blocked = [line for line in read_text(guard_log).splitlines() if " blocked " in line]
    if blocked:
        raise CheckFailed(f"the ONNX engine tried the network or torch_xla: {blocked[:3]}")
    found = json.loads(output.strip().splitlines()[-1])
    return "; ".join(f"{name}: {r['engine']}, {r['labels_agree']}/{found['files']} labels as torch, scores "
                     f"within {r['max_abs_score_diff']:.0e}" for name, r in found["engines"].items())  # fmt: skip


CHECKS: dict[str, Callable[[Leg], str]] = {
    "pytest -m 'not slow'": pytest_check("not slow"),
    "pytest -m xla": pytest_check("xla"),
    # The notebook test trains on 8 XLA devices and predicts without torch_xla: the kaggle-tpu leg's own
    # handoff check (same notebook, same compile-count rules) and kaggle-gpu's offline infer do that, on the
    # two images' versions. Running it as well cost the leg ~90 s (~3 min on a slow day).
    "pytest -m xla, less the notebook test the handoff repeats": pytest_check(
        "xla",
        deselect=(
            "tests/devices/test_xla.py::test_tpu_notebook_on_8_xla_cpu_devices_then_infer_without_torch_xla",
        ),
    ),
    "train -> infer notebooks (cpu)": notebooks_cpu,
    "SpeechBrain client": speechbrain_own,
    "train notebook on 8 XLA CPU devices -> artifact": train_xla_handoff,
    "no torch_xla in the kernel": no_torch_xla_in_kernel,
    "infer notebook offline on the kaggle-tpu artifact": infer_offline_handoff,
    "SpeechBrain client agrees with the torch engine": speechbrain_handoff,
    "ONNX Runtime on the artifact's ONNX files agrees with torch": onnx_engine_handoff,
}


# ---------------------------------------------------------------------------------------------- driver


def run_leg(
    spec: versions.Leg, uv: str, base_python: str, cache_dir: str | None, keep: bool, handoff: bool = False
) -> LegResult:
    leg, result = Leg(spec), LegResult(spec.name)
    started = time.monotonic()
    print(f"== {spec.name}: {', '.join(f'{n} {v}' for n, v in spec.pins().items())}", flush=True)
    try:
        result.installed = install(leg, uv, base_python, cache_dir)
        result.install_seconds = round(time.monotonic() - started, 1)
        print(f"   installed in {result.install_seconds:.0f} s", flush=True)
        for name in spec.handoff_checks if handoff else spec.checks:
            check_started = time.monotonic()
            try:
                detail = CHECKS[name](leg)
            except CheckFailed as error:
                result.checks.append(CheckResult(name, False, round(time.monotonic() - check_started, 1)))
                raise CheckFailed(f"check '{name}': {error}") from error
            result.checks.append(CheckResult(name, True, round(time.monotonic() - check_started, 1), detail))
            print(f"   ok  {name} ({time.monotonic() - check_started:.0f} s) {detail}", flush=True)
        result.ok = True
    except CheckFailed as error:
        where = str(error) if str(error).startswith("check '") else f"set-up: {error}"
        result.error = f"leg {spec.name} failed at {where}"
        print(f"   FAILED {result.error}", flush=True)
    result.seconds = round(time.monotonic() - started, 1)
    result.load = round(os.getloadavg()[1], 1)
    result.finished = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    if result.ok and not keep:
        remove(leg.venv)
        remove(leg.work)
    return result


class DiskPeak:
    """Samples the disk holding the repository and the cache: the most used above the start of the run."""

    def __init__(self, paths: list[Path], every: float = 2.0):
        self.paths, self.every, self.stop = paths, every, threading.Event()
        self.start = self.used()
        self.peak = self.start
        self.thread = threading.Thread(target=self.sample, daemon=True)
        self.thread.start()

    def used(self) -> int:
        devices = {}
        for path in self.paths:
            while not path.exists():
                path = path.parent
            devices.setdefault(os.stat(path).st_dev, path)
        return sum(shutil.disk_usage(p).used for p in devices.values())

    def sample(self) -> None:
        while not self.stop.wait(self.every):
            self.peak = max(self.peak, self.used())

    def close(self) -> float:
        self.stop.set()
        self.peak = max(self.peak, self.used())
        return round((self.peak - self.start) / 2**30, 1)


def uv_cache_dir(uv: str, cache_dir: str | None) -> Path:
    found = subprocess.run([uv, "cache", "dir"], env=uv_env(cache_dir), capture_output=True, text=True)
    return Path(found.stdout.strip() or cache_dir or "~/.cache/uv").expanduser()


def du_gib(path: Path) -> float | None:
    if not path.exists():
        return None
    found = subprocess.run(["du", "-sb", str(path)], capture_output=True, text=True)
    return round(int(found.stdout.split()[0]) / 2**30, 1) if found.returncode == 0 else None


# ---------------------------------------------------------------------------------------------- results

COLUMNS = ("torch", "torchaudio", "torch_xla", "speechbrain", "numpy")


def load_results(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def render(results: dict, legs_shown: tuple[versions.Leg, ...] = versions.MATRIX_LEGS) -> str:
    legs = results.get("legs", {})
    header = ["leg", *COLUMNS, "checks", "result", "install s", "total s", "load", "finished"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for spec in legs_shown:
        leg = legs.get(spec.name)
        if not leg:
            cells = ["-"] * (len(COLUMNS) + 1) + ["not run"] + ["-"] * 4
            lines.append(f"| {spec.name} | " + " | ".join(cells) + " |")
            continue
        found = [leg["installed"].get(n) or "-" for n in COLUMNS]
        checks = "; ".join(f"{'ok' if c['ok'] else 'FAILED'} {c['name']} ({c['seconds']:.0f} s)"
                           for c in leg["checks"]) or "-"  # fmt: skip
        verdict = "pass" if leg["ok"] else "**FAIL**"
        lines.append(f"| {spec.name} | " + " | ".join([*found, checks, verdict, f"{leg['install_seconds']:.0f}",
                                                        f"{leg['seconds']:.0f}", f"{leg['load']:.1f}" if "load" in leg else "-",
                                                        leg["finished"]]) + " |")  # fmt: skip
    run = results.get("run", {})
    text = ["# Version matrix results", "",
            "Written by `python -m matrix.run` (`make matrix`); the legs are pipeline/tooling/versions.py's. "
            "Versions are what each leg's venv reported after the install. Timings are wall seconds on a 2-core "
            "machine shared with other work: `load` (the 5-minute load average as the leg ended) above 2 means "
            "the leg waited for CPU.", "", *lines, ""]  # fmt: skip
    details = [f"- {name}: {c['name']}: {c['detail']}" for name, leg in legs.items() for c in leg["checks"]
               if c.get("detail")]  # fmt: skip
    errors = [f"- {leg['error']}" for leg in legs.values() if leg.get("error")]
    if details:
        text += ["Check details:", "", *details, ""]
    if errors:
        text += ["Failures:", "", *(e.splitlines()[0] for e in errors), ""]
    if run:
        text.append(f"Last run: {', '.join(run.get('legs', []))} in {run.get('seconds'):.0f} s (Python {run.get('python')}); "
                    f"disk peak +{run.get('disk_peak_gib')} GiB; uv cache {run.get('cache_gib')} GiB"
                    f"{' (cold: empty at start)' if run.get('cache_cold') else ''}.")  # fmt: skip
    return "\n".join(text) + "\n"


def list_legs() -> str:
    lines = []
    for leg in versions.LEGS:
        where = "matrix" if leg.in_matrix else "make test"
        pins = ", ".join(f"{n}=={v}" for n, v in leg.pins().items())
        lines += [f"{leg.name} ({where}): {leg.about}", f"  pins: {pins}",
                  *(f"  check: {c}" for c in leg.checks)]  # fmt: skip
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m matrix.run", description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", action="append", metavar="LEG", choices=[leg.name for leg in versions.MATRIX_LEGS],
                        help="run this leg (repeatable); kaggle-gpu needs kaggle-tpu's handoff")  # fmt: skip
    parser.add_argument("--keep", action="store_true", help="keep each leg's venv and work folder")
    parser.add_argument("--list", action="store_true", help="print the legs and exit")
    parser.add_argument("--handoff", action="store_true",
                        help="only the handoff checks of kaggle-tpu and kaggle-gpu (CI); results in .matrix/")  # fmt: skip
    parser.add_argument("--cache-dir", help="uv's cache (default: $UV_CACHE_DIR or uv's own, ~/.cache/uv)")
    parser.add_argument("--python", default=sys.executable, help="interpreter the venvs are made from")
    args = parser.parse_args(argv)
    if args.list:
        print(list_legs())
        return 0

    uv = find_uv()
    candidates = versions.HANDOFF_LEGS if args.handoff else versions.MATRIX_LEGS
    chosen = [leg for leg in candidates if not args.only or leg.name in args.only]
    results_json, results_md = (HANDOFF_JSON, HANDOFF_MD) if args.handoff else (RESULTS_JSON, RESULTS_MD)
    cache = uv_cache_dir(uv, args.cache_dir)
    cold = not cache.exists() or not any(cache.iterdir())
    WORK.mkdir(exist_ok=True)
    disk = DiskPeak([WORK, cache])
    started = time.monotonic()
    print(f"matrix: {len(chosen)} leg(s), uv cache {cache}{' (empty: cold run)' if cold else ''}", flush=True)
    results = load_results(results_json)
    legs = results.setdefault("legs", {})
    for spec in chosen:
        legs[spec.name] = asdict(run_leg(spec, uv, args.python, args.cache_dir, args.keep, args.handoff))
        results_json.write_text(json.dumps(results, indent=1) + "\n")
    results["run"] = {"legs": [leg.name for leg in chosen], "seconds": round(time.monotonic() - started, 1),
                      "python": platform.python_version(), "disk_peak_gib": disk.close(),
                      "cache_gib": du_gib(cache), "cache_cold": cold}  # fmt: skip
    results_json.write_text(json.dumps(results, indent=1) + "\n")
    results_md.write_text(render(results, candidates))
    print()
    print(render(results, candidates))
    failed = [legs[spec.name]["error"] for spec in chosen if not legs[spec.name]["ok"]]
    for error in failed:
        print(f"matrix: {error}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
