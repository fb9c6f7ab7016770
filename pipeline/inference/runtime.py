"""What the infer stage runs on, decided once (`resolve_runtime`): the device, its batches and decode workers,
the compute threads, the engine and the windows. Every `auto` of InferConfig's hardware fields is settled
here, into one frozen Runtime that the run prints as one line; predict.py follows it and decides nothing.

One device. Kaggle's submission sessions are CPU or "GPU T4 x2", and a second T4 would shorten a run that
takes ~1-2 minutes of GPU time for BirdCLEF's hidden set (700 x 60 s, ../shared/NOTES.md) while decoding the
audio on 4 CPU cores bounds it: no measurement showed a gain worth a process per GPU, so there is none.

The engine (`choose_engine`): GPUs run torch in fp16. On the CPU, torch, or ONNX Runtime on a file the
artifact brought from training: its int8 file when it passed its accuracy rule there (then, with
engine='auto', raced against torch on the first batch, pipeline/inference/engines.py); fp32 ONNX Runtime
measured 0.8-1.1x torch here, so `auto` does not run it. Nothing is exported at inference: an artifact
without ONNX files runs torch, and the submission's environment needs no onnxscript.

The teacher (`choose_teacher`): an artifact trained with a pretrained teacher (BirdNET) carries its model, and
its probabilities are blended with the model's at the weight training sealed (teachers/blend.py); its runtime
(ai-edge-litert) is imported only then.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..core.artifact import Artifact
from ..core.config import ConfigError, InferConfig
from ..core.model import ModelConfig
from ..core.onnx import ONNX_FP32, ONNX_INT8, onnxruntime_missing
from ..core.progress import plural
from ..core.windows import WindowPlan
from ..devices.probe import cuda_device_count
from ..devices.threads import available_cores, plan_threads
from ..teachers.model import Teacher, TeacherError, find_teacher, runtime_missing

# Windows x channels x frames of ECAPA's widest activation (the multi-layer aggregation) per CPU batch: ~5 MB,
# so the elementwise ops between convolutions work in cache. Measured on 2 cores (benchmarks/inference.py,
# 300 FSDD files): C=512 fastest at 8-16 one-second windows, C=128 at 32; 64 windows cost 25-40%.
CPU_BATCH_BUDGET = 8 * 1536 * 101
# GPU batches: on an H100 (benchmarks/cuda.py, fp16) 64 windows ran the voxceleb size at 0.44x its rate at
# 1024 windows and 256 at 0.90x (the small size: 0.12x and 0.44x); a T4, with a tenth of the fp16 compute,
# fills sooner. 256 one-second windows of the voxceleb size take well under 2 GB: a T4 has 15.
GPU_BATCH_WINDOWS = 256
# One worker decodes ~700 s of 32 kHz Ogg/Vorbis per second (benchmarks/soundscape.py) where an H100 embeds
# ~6,000 s of audio (voxceleb size, windows half a window apart): decoding needs every core that is spare.
GPU_DECODE_WORKERS = 8


@dataclass(frozen=True)
class Hardware:
    """What the session has: visible GPUs and usable CPU cores (devices/threads.available_cores)."""

    gpus: int
    cores: int


@dataclass(frozen=True)
class EngineChoice:
    """What computes the window embeddings: `mode` "torch", "onnx" (on `onnx_path`) or "race", as engines.py
    describes them."""

    mode: str
    precision: str  # fp32 | fp16 | int8
    why: str
    onnx_path: str | None = None

    @property
    def label(self) -> str:
        return "torch" if self.mode == "torch" else f"onnx-{self.precision}"


@dataclass(frozen=True)
class TeacherChoice:
    """Whether a pretrained teacher the artifact carries is blended in (TrainConfig.pretrained_teacher):
    `teacher` None means the model alone, and `why` says why either way."""

    why: str
    teacher: Teacher | None = None
    weight: float = 0.0
    outputs: tuple[int, ...] = ()  # per class of the model, the teacher's output (-1: it lacks the class)
    unknown_logit: float | None = None

    def describe(self) -> str:
        if self.teacher is None:
            return f"teacher: none ({self.why})"
        known = sum(output >= 0 for output in self.outputs)
        return (
            f"teacher: {self.teacher.name} blended at {self.weight:g} on {known} of {len(self.outputs)} "
            f"classes ({self.why})"
        )


@dataclass(frozen=True)
class Runtime:
    device: torch.device
    windows: WindowPlan  # how spans are cut into windows, with the batch size decided
    num_workers: int  # DataLoader decode workers
    threads: int | None  # compute threads of this process (torch's and ONNX Runtime's); None: torch's own
    engine: EngineChoice
    progress: bool = False
    centre: torch.Tensor | None = None  # subtracted from unit embeddings before scoring (core/windows.py)
    teacher: TeacherChoice = TeacherChoice("the artifact carries no teacher")

    def describe(self) -> str:
        threads = f", {plural(self.threads, 'compute thread')}" if self.threads else ""
        engine = f"torch {self.engine.precision}" if self.engine.mode == "torch" else self.engine.label
        if self.engine.mode == "race":
            engine += " unless torch is clearly faster on the first batch"
        speeds = self.windows.speeds
        views = f"; whole files read at {', '.join(f'{v:g}' for v in speeds)}x" if speeds != (1.0,) else ""
        return (
            f"runtime: {self.device}{threads}, {plural(self.num_workers, 'decode worker')}, batches of "
            f"{self.windows.batch_windows} windows ({plural(self.windows.length_buckets, 'length')}); engine: "
            f"{engine} ({self.engine.why}){views}; {self.teacher.describe()}"
        )


def resolve_runtime(config: InferConfig, artifact: Artifact, hardware: Hardware | None = None) -> Runtime:
    """Every hardware choice of the run, from `config` (None / auto: decided here for `hardware`, default
    the session's)."""
    hardware = hardware or Hardware(cuda_device_count(), available_cores())
    device = choose_device(config.device, hardware)
    model = artifact.model.config
    batch, workers = batching_for(config.batch_windows, config.num_workers, model, device, hardware.cores)
    threads = None
    if device.type == "cpu" or config.num_threads:
        threads = plan_threads(hardware.cores, workers, config.num_threads).compute_threads
    centre = artifact.embedding_centre if config.centre_embeddings else None
    plan = window_plan(config, model, batch, choose_speeds(config, artifact))
    return Runtime(
        device,
        plan,
        workers,
        threads,
        choose_engine(config, artifact, device),
        config.progress,
        centre,
        choose_teacher(config, artifact),
    )


def choose_teacher(config: InferConfig, artifact: Artifact) -> TeacherChoice:
    """The artifact's teacher at InferConfig's `teacher_blend` weight ("auto": the weight training sealed).
    A teacher that cannot run here is left out under auto (said), and stops the run when a weight was asked."""
    record, asked = artifact.teacher, config.teacher_blend
    if record is None:
        if asked not in ("auto", 0, 0.0):
            raise ConfigError(
                f"teacher_blend={asked!r}, but {artifact.path} carries no teacher: train with "
                "pretrained_teacher (and teacher_blend > 0) to seal one"
            )
        return TeacherChoice("the artifact carries no teacher")
    weight = float(record.get("blend_weight", 0.0)) if asked == "auto" else float(asked)
    if weight == 0:
        return TeacherChoice(f"teacher_blend={asked!r}: the model alone")
    why = "auto: the weight training sealed" if asked == "auto" else f"teacher_blend={asked!r}"
    try:
        teacher = find_teacher(artifact.path)
        if missing := runtime_missing(teacher):
            raise TeacherError(missing)
    except TeacherError as error:
        if asked != "auto":
            raise
        return TeacherChoice(
            f"its {record.get('name', 'teacher')} cannot run here ({error}); the model alone"
        )
    classes = record.get("classes") or {}
    outputs = tuple(
        teacher.labels.index(classes[c]) if classes.get(c) in teacher.labels else -1 for c in artifact.labels
    )
    return TeacherChoice(why, teacher, weight, outputs, record.get("unknown_logit"))


def choose_speeds(config: InferConfig, artifact: Artifact) -> tuple[float, ...]:
    """The speeds a whole file is read at: InferConfig's `test_time_speeds`, for auto the artifact's own
    (training records them when it perturbed speeds); (1.0,): the file as it is."""
    speeds = artifact.test_time_speeds if config.test_time_speeds == "auto" else config.test_time_speeds
    return tuple(float(v) for v in speeds) if speeds else (1.0,)


def choose_device(device: str, hardware: Hardware) -> torch.device:
    """InferConfig's `device`: auto is the first GPU when there is one, else the CPU."""
    if device == "cuda" and hardware.gpus == 0:
        raise RuntimeError("device='cuda' but no GPU is visible; use device='auto' or 'cpu'")
    return torch.device("cpu") if device == "cpu" or hardware.gpus == 0 else torch.device("cuda", 0)


def batching_for(
    batch_windows: int | None, num_workers: int | None, model: ModelConfig, device: torch.device, cores: int
) -> tuple[int, int]:
    """(windows per batch, DataLoader workers) for `device`, where the parameters leave them to us (None).

    CPU: batches sized to the cache (CPU_BATCH_BUDGET) and decoding workers as devices/threads.plan_threads
    shares `cores` (why none below 4 cores: its docstring). GPU: GPU_BATCH_WINDOWS windows per batch, and every
    core but one decoding (at least one, at most GPU_DECODE_WORKERS) while the GPU computes.
    """
    if device.type == "cpu":
        frames = model.window_samples * 100 // model.sample_rate + 1  # Fbank: 10 ms hop
        widest = model.channels[-1]  # the multi-layer feature aggregation: ECAPA's widest activation
        auto_batch = max(4, min(64, CPU_BATCH_BUDGET // (widest * frames)))
        auto_workers = plan_threads(cores).decode_workers
    else:
        auto_batch, auto_workers = GPU_BATCH_WINDOWS, max(1, min(GPU_DECODE_WORKERS, cores - 1))
    return (
        batch_windows if batch_windows is not None else auto_batch,
        num_workers if num_workers is not None else auto_workers,
    )


def window_plan(
    config: InferConfig, model: ModelConfig, batch_windows: int, speeds: tuple[float, ...] = (1.0,)
) -> WindowPlan:
    """The artifact's windows; a chunk's windows `window_hop_seconds` apart (default: half a window), a whole
    file's `clip_hop_seconds` apart (default: tiling the file for the mean embedding, half a window for the
    other poolings), a whole file read at each of `speeds`."""
    return WindowPlan.for_model(
        model,
        batch_windows,
        max_windows_per_file=config.max_windows_per_file,
        window_hop_seconds=config.window_hop_seconds,
        tiled=config.clip_pooling == "mean" and config.clip_hop_seconds is None,
        clip_hop_seconds=config.clip_hop_seconds,
        length_buckets=config.length_buckets,
        quiet_window_db=config.quiet_window_db,
        energy_weighted_windows=config.energy_weighted_windows,
        speeds=speeds,
    )


def choose_engine(config: InferConfig, artifact: Artifact, device: torch.device) -> EngineChoice:
    """The engine the config and the artifact's ONNX files (written and gated at training, verified at load)
    allow: see the module docstring."""
    if device.type != "cpu":
        aside = f"; engine={config.engine!r} chooses the CPU engine" if config.engine != "auto" else ""
        return EngineChoice("torch", "fp16" if device.type == "cuda" else "fp32", f"a GPU runs torch{aside}")
    if config.engine == "torch":
        return EngineChoice("torch", "fp32", "engine='torch'")
    record = artifact.manifest.get("provenance", {}).get("onnx") or {}
    int8_passed = bool((record.get("int8") or {}).get("passed"))
    fp32, int8 = artifact.listed_file(ONNX_FP32), artifact.listed_file(ONNX_INT8)
    asked = config.onnx_precision
    if int8 and (asked == "int8" or (asked == "auto" and int8_passed)):
        path, precision, why = int8, "int8", "onnx_precision='int8'"
        if asked == "auto":
            why = "auto: its int8 passed its accuracy rule at training"
    elif asked == "fp32" or config.engine == "onnx":
        path, precision, why = fp32, "fp32", f"engine={config.engine!r}, onnx_precision={asked!r}"
        if asked == "int8":
            why += ": no int8 file"
    elif asked == "int8":
        return EngineChoice("torch", "fp32", "onnx_precision='int8', but the artifact has no int8 file")
    elif int8:  # auto without a passing int8 file: fp32 ONNX Runtime is no faster than torch here
        return EngineChoice("torch", "fp32", "auto: the artifact's int8 did not pass its accuracy rule")
    else:
        return EngineChoice("torch", "fp32", "auto: the artifact has no int8 file")
    if path is None:
        return EngineChoice(
            "torch",
            "fp32",
            f"{why}, but the artifact has no {precision} ONNX file (training writes them: export_onnx)",
        )
    if missing := onnxruntime_missing():
        return EngineChoice("torch", "fp32", f"{why}, but ONNX Runtime is unavailable: {missing}")
    return EngineChoice("onnx" if config.engine == "onnx" else "race", precision, why, str(path))
