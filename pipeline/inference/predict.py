"""Inference: the scores of time spans of audio files, fast, on whatever the submission session has.

This module knows files and spans, nothing of tables or submissions (rows.py plans which span every row of
the submission needs; submission.py writes it). A span is a whole file or a part of one (a 5 s chunk of a
soundscape). How a span becomes scores: decode its file (DataLoader workers, overlapped with compute) -> mono
at the model's rate -> fixed-length windows exactly like the training crops -> batches of `batch_windows`
windows from any files (every batch the same shape, so GPU kernels are reused) -> window embeddings -> pooled
per span (the windows, batches and pooling are pipeline/core/windows.py's, which training's validation shares):

    mean      the valid-length-weighted mean of the windows' unit embeddings, scored by the cosine classifier
              (a file's prediction: it is what SpeechBrain's EncoderClassifier computes from an artifact)
    max       the highest cosine score of each class over the span's windows (a call anywhere in the chunk)
    mean_max  the average of the windows' mean cosine score and their maximum, per class

Feeding whole variable-length files instead of windows cost a measured 40 accuracy points on FSDD digits
(../shared/NOTES.md): the model only knows windows. A file that cannot be read leaves its spans without scores
(`ok` False) and says why; the run fails only when the artifact itself is invalid. With a deadline, prediction
stops before the measured rate says the next file would overrun it. This module never imports torch_xla.
"""

from __future__ import annotations

import dataclasses
import json
import tempfile
import types
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

from ..core.config import MAX_WINDOWS_PER_FILE
from ..core.data import AudioError, load_audio
from ..core.model import SpeakerClassifier
from ..core.tables import DataError, resolve_inside
from ..core.windows import (
    POOLINGS,
    FileWindows,
    Span,
    SpanPredictions,
    WindowPlan,
    embed_windows,
    run_windows,
    span_windows,
)
from ..devices.threads import available_cores, plan_threads

# A whole file (a span with no end) is decoded only up to this: max_windows_per_file windows cover it anyway.
MAX_DECODE_SECONDS = 600.0


def classify_clips(
    model: SpeakerClassifier,
    clips: Sequence[np.ndarray],
    window: int,
    batch_windows: int = 64,
    max_windows: int = MAX_WINDOWS_PER_FILE,
    device: torch.device | None = None,
    length_buckets: int = 1,
) -> SpanPredictions:
    """Whole-file predictions for clips already in memory (one span per clip)."""
    device = device or next(model.parameters()).device
    plan = WindowPlan(window, model.config.sample_rate, batch_windows, max_windows, None, length_buckets)
    items = clip_items(clips, plan)
    return run_windows(model, items, len(clips), batch_windows, device, buckets=plan.buckets())


def clip_items(clips: Sequence[np.ndarray], plan: WindowPlan) -> Iterator[FileWindows]:
    """The windows of decoded clips, one whole-file span each (span k is clip k)."""
    for i, clip in enumerate(clips):
        yield FileWindows(i, *span_windows(clip, [(i, 0.0, None)], plan))


class SpanWindows(Dataset):
    """Decodes test files into their spans' windows in DataLoader workers; never raises for a bad file."""

    def __init__(
        self, data_dir: Path, files: Sequence[str], spans_of: Sequence[list[tuple]], plan: WindowPlan
    ) -> None:
        self.data_dir, self.files, self.spans_of, self.plan = data_dir, files, spans_of, plan

    def __len__(self) -> int:
        return len(self.files)

    def __getitem__(self, index: int) -> FileWindows:
        rel_path, spans = self.files[index], self.spans_of[index]
        ends = [end for _, _, end in spans]
        # Decode what the spans need: a whole file up to the cap, chunks up to the last one's end.
        max_seconds = MAX_DECODE_SECONDS if None in ends else max(ends)
        try:
            path = resolve_inside(self.data_dir, rel_path)
            samples, repairs = load_audio(path, sample_rate=self.plan.sample_rate, max_seconds=max_seconds)
        except AudioError as error:  # the report names the file as the test table does
            return FileWindows(index, None, None, None, problem=f"{rel_path}: {error.detail}")
        except DataError as error:
            return FileWindows(index, None, None, None, problem=str(error))
        except Exception as error:  # noqa: BLE001 - a bad file must cost its rows' scores, never the run
            return FileWindows(
                index, None, None, None, problem=f"{rel_path}: {type(error).__name__}: {error}"
            )
        wavs, lens, owner = span_windows(samples, spans, self.plan)
        return FileWindows(
            index, wavs, lens, owner, repairs=repairs, seconds=len(samples) / self.plan.sample_rate
        )


def _first(batch: list[FileWindows]) -> FileWindows:
    return batch[0]


def file_order(
    data_dir: Path, files: Sequence[str], seconds: Sequence[float | None] | None = None
) -> list[int]:
    """Longest files first (by the duration their headers state, else by size on disk): big windows counts
    early keep batches full, let the progress bar's rate settle, and leave the cheapest files to the end, where
    a deadline may stop prediction."""

    def size(index: int) -> float:
        if seconds is not None and seconds[index] is not None:
            return float(seconds[index])
        try:
            return (data_dir / files[index]).stat().st_size / 1e12  # below every duration: unknown ones last
        except (OSError, ValueError):  # missing, or a name the OS refuses (NUL byte): it will fall back
            return -1.0

    return sorted(range(len(files)), key=lambda i: -size(i))


def spans_by_file(spans: Sequence[Span], n_files: int) -> list[list[tuple[int, float, float | None]]]:
    """For each file, its spans as (span index, start, end)."""
    grouped: list[list[tuple[int, float, float | None]]] = [[] for _ in range(n_files)]
    for index, span in enumerate(spans):
        grouped[span.file].append((index, span.start, span.end))
    return grouped


def predict_spans(
    model: SpeakerClassifier,
    data_dir: Path,
    files: Sequence[str],
    spans: Sequence[Span],
    order: Sequence[int],
    device: torch.device,
    plan: WindowPlan,
    num_workers: int,
    progress: bool = False,
    deadline: float | None = None,
    engine: EngineSettings | None = None,
    threads: int | None = None,
    log: Callable[[str], None] = print,
) -> SpanPredictions:
    """Predict the spans of `files[order]` (paths relative to `data_dir`) on one device; the spans of other
    files are neither ok nor problems here. `engine`: what computes CPU batches (default torch); `threads`:
    the CPU compute threads of this process (torch's and ONNX Runtime's; None: leave torch's setting)."""
    dataset = SpanWindows(data_dir, files, spans_by_file(spans, len(files)), plan)
    wanted = [i for i in order if dataset.spans_of[i]]  # a file with no span to predict is not decoded
    loader = DataLoader(
        dataset,
        batch_size=1,
        sampler=wanted,
        collate_fn=_first,
        num_workers=num_workers,
        prefetch_factor=8 if num_workers > 0 else None,
        pin_memory=False,  # the assembled batch is what is pinned (run_windows' staging buffer)
    )
    model = model.to(device).eval()
    use_fast_reflect_padding(model)
    if threads and device.type == "cpu":
        torch.set_num_threads(threads)
    notes: list[str] = []

    def note(line: str) -> None:
        notes.append(line)
        log(line)

    embed = make_engine(model, device, engine or EngineSettings(), threads or torch.get_num_threads(),
                        plan.batch_windows, note)  # fmt: skip
    result = run_windows(model, iter(loader), len(spans), plan.batch_windows, device, progress, embed=embed,
                         n_files=len(wanted), deadline=deadline, buckets=plan.buckets())  # fmt: skip
    if result.stopped:  # the files the deadline left: every one is named in the report
        result.problems.update({i: "time limit: not predicted" for i in wanted if i not in result.seen})
    result.device_counts = {str(device): len(wanted)}
    result.engines, result.engine_notes, result.embedder = {str(device): engine_label(embed)}, notes, embed
    if device.type == "cpu":
        result.threads = {str(device): torch.get_num_threads()}
    return result


# ----------------------------------------------------------------------- engines

Embed = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
ENGINES = ("auto", "torch", "onnx")
ONNX_PRECISIONS = ("auto", "fp32", "int8")


@dataclass(frozen=True)
class EngineSettings:
    """What computes CPU batches (InferConfig's `engine`, `onnx_precision`) and the artifact's ONNX files (None
    where it has none: they are then exported here, see engines.make_embedder). GPUs run torch in fp16."""

    engine: str = "torch"  # auto | torch | onnx
    precision: str = "auto"  # auto | fp32 | int8
    fp32_path: str | None = None
    int8_path: str | None = None
    int8_passed: bool = False  # the int8 file kept the validation metric within the rule at training

    def files(self) -> tuple[str | None, str | None, str]:
        """(fp32 file, int8 file to run or None, why) -- make_embedder runs the int8 file when given one."""
        if self.precision == "int8" and self.int8_path:
            return self.fp32_path, self.int8_path, "onnx_precision='int8'"
        if self.precision == "int8":
            return self.fp32_path, None, "onnx_precision='int8', but the artifact has no int8 file: fp32"
        if self.precision == "fp32" or not self.int8_path:
            return self.fp32_path, None, f"onnx_precision={self.precision!r}"
        if self.int8_passed:
            return self.fp32_path, self.int8_path, "auto: int8 passed its accuracy rule at training"
        return self.fp32_path, None, "auto: fp32, the artifact's int8 did not pass its accuracy rule"


class DeviceEmbedder:
    """PyTorch on `device` (embed_windows: fp16 autocast on CUDA, fp32 on the CPU)."""

    def __init__(self, model: SpeakerClassifier, device: torch.device) -> None:
        self.model, self.device = model, device
        self.engine = "torch-fp16" if device.type == "cuda" else "torch"

    def __call__(self, wavs: torch.Tensor, lens: torch.Tensor) -> torch.Tensor:
        return embed_windows(self.model, wavs, lens, self.device)


def make_engine(
    model: SpeakerClassifier, device: torch.device, settings: EngineSettings, threads: int, batch_windows: int,
    log: Callable[[str], None] = print,
) -> Embed:  # fmt: skip
    """The `embed(wavs, lens)` of this process, announced in one printed line. On a GPU: torch fp16 (ONNX
    Runtime here is its CPU build). On the CPU: `settings.engine` through engines.make_embedder (imported
    only then: the torch path needs no onnxruntime), which falls back to torch on any ONNX problem."""
    torch_embed = DeviceEmbedder(model, device)
    if device.type != "cpu":
        aside = f" (engine={settings.engine!r} chooses the CPU engine)" if settings.engine != "auto" else ""
        log(f"inference engine: torch fp16 on {device}{aside}")
        return torch_embed
    if settings.engine == "torch":
        log("inference engine: torch (engine='torch')")
        return torch_embed
    from .engines import make_embedder

    fp32, int8, why = settings.files()
    return make_embedder(model, settings.engine, onnx_path=fp32, int8_path=int8, threads=threads,
                         batch_windows=batch_windows, torch_embed=torch_embed,
                         log=lambda line: log(f"{line} [{why}]"))  # fmt: skip


def engine_label(embed: Embed) -> str:
    """What computed the batches: the engine's name (engines' embedders also say when torch took over)."""
    return str(getattr(embed, "engine", "torch"))


def use_fast_reflect_padding(model: torch.nn.Module) -> int:
    """Make SpeechBrain's "same" reflect padding build the padded tensor from copies (cat of flipped edges)
    instead of torch's reflection_pad1d, which on CPU took 13-18% of ECAPA's forward time (5x slower than
    the copies it amounts to). Bit-identical results; returns how many convolutions were switched."""
    from speechbrain.nnet.CNN import Conv1d

    switched = 0
    for module in model.modules():
        if (
            isinstance(module, Conv1d) and hasattr(module, "_manage_padding") and module.padding == "same"
            and module.padding_mode == "reflect" and module.stride == 1
        ):  # fmt: skip
            module._manage_padding = types.MethodType(_reflect_pad_by_copies, module)
            switched += 1
    return switched


def _reflect_pad_by_copies(
    self, x: torch.Tensor, kernel_size: int, dilation: int, stride: int
) -> torch.Tensor:
    from speechbrain.nnet.CNN import get_padding_elem

    left, right = get_padding_elem(self.in_channels, stride, kernel_size, dilation)
    if x.shape[-1] <= max(left, right):  # too short to reflect: let torch raise its own error
        return torch.nn.functional.pad(x, (left, right), mode="reflect")
    parts = [x]
    if left:
        parts.insert(0, x[..., 1 : left + 1].flip(-1))
    if right:
        parts.append(x[..., -right - 1 : -1].flip(-1))
    return torch.cat(parts, dim=-1) if len(parts) > 1 else x


# ----------------------------------------------------------------------- several devices

# A device worker that reports no batch for this long is taken as hung: the run falls back to this process.
STALL_MINUTES = 10.0


@dataclass(frozen=True)
class DeviceSettings:
    """What the infer stage asks of the devices (InferConfig's hardware fields)."""

    device: str = "auto"
    devices: int | None = None
    batch_windows: int | None = None
    num_workers: int | None = None
    progress: bool = False
    num_threads: int | None = None  # CPU compute threads per process (None: the cores the workers leave)
    engine: EngineSettings = EngineSettings()


def predict_on_devices(
    model: SpeakerClassifier,
    data_dir: Path,
    files: Sequence[str],
    spans: Sequence[Span],
    settings: DeviceSettings,
    plan: WindowPlan,
    seconds: Sequence[float | None] | None = None,
    deadline: float | None = None,
) -> SpanPredictions:
    """Every span's scores, on the session's devices (several GPUs: a spawned process each)."""
    from .inference_devices import choose_devices

    devices = choose_devices(settings.device, settings.devices)
    order = file_order(data_dir, files, seconds)
    if len(devices) > 1:
        from ..devices.launch import LaunchError, LaunchTimeout

        try:
            return _predict_multi_gpu(model, data_dir, files, spans, settings, plan, devices, order, deadline)
        except LaunchError as error:
            # A submission must still be written: fall back to one device in this process -- the CPU if a
            # worker hung (its GPU may hang again), else the first device.
            if isinstance(error, LaunchTimeout):
                devices = [torch.device("cpu")]
            print(f"multi-device inference failed ({error}); predicting on {devices[0]} in this process")
    return _predict_here(
        model, data_dir, files, spans, order, devices[0], settings, plan, deadline, available_cores()
    )


def _predict_here(
    model, data_dir, files, spans, order, device, settings: DeviceSettings, plan: WindowPlan, deadline, cores: int,
    log: Callable[[str], None] = print,
) -> SpanPredictions:  # fmt: skip
    """predict_spans in this process with `cores` CPU cores: batch, decode workers and compute threads from
    them (devices/threads.plan_threads: workers and threads together never ask for more than the cores)."""
    from .inference_devices import batching_for

    batch_windows, num_workers = batching_for(settings.batch_windows, settings.num_workers, model.config, device,
                                              cores)  # fmt: skip
    threads = None
    if device.type == "cpu" or settings.num_threads:
        threads = plan_threads(cores, num_workers, settings.num_threads).compute_threads
    return predict_spans(model, data_dir, files, spans, order, device, _with_batch(plan, batch_windows),
                         num_workers, settings.progress, deadline, settings.engine, threads, log)  # fmt: skip


def _with_batch(plan: WindowPlan, batch_windows: int) -> WindowPlan:
    return dataclasses.replace(plan, batch_windows=batch_windows)


def _predict_multi_gpu(
    model, data_dir, files, spans, settings, plan, devices, order, deadline
) -> SpanPredictions:
    from ..devices.launch import launch
    from .inference_devices import shard_indices

    shards = shard_indices(order, len(devices))
    with tempfile.TemporaryDirectory(prefix="infer-shards-") as tmp:
        settings = _exported_once(model, settings, devices, Path(tmp))
        launch(
            gpu_inference_worker,
            nprocs=len(devices),
            # verified CPU weights, read once here: workers never re-read the artifact
            args=(
                model,
                str(data_dir),
                list(files),
                list(spans),
                shards,
                [str(d) for d in devices],
                settings,
                plan,
                deadline,
                tmp,
            ),  # fmt: skip
            stall_timeout=STALL_MINUTES * 60,  # a hung GPU must not cost the submission
        )
        parts = [np.load(Path(tmp) / f"rank{rank}.npz", allow_pickle=False) for rank in range(len(devices))]
        notes = [json.loads((Path(tmp) / f"rank{rank}.json").read_text()) for rank in range(len(devices))]
    file_of_span = np.asarray([span.file for span in spans], dtype=np.int64)
    pooled = {name: parts[0][name].copy() for name in POOLINGS}
    embeddings = parts[0]["embeddings"].copy()
    ok = np.zeros(len(spans), dtype=bool)
    problems: dict[int, str] = {}
    repairs: dict[int, list[str]] = {}
    counts, engines, threads, stopped = {}, {}, {}, None
    for rank, (part, shard) in enumerate(zip(parts, shards, strict=True)):
        mine = np.isin(file_of_span, shard)
        for name in POOLINGS:
            pooled[name][mine] = part[name][mine]
        embeddings[mine] = part["embeddings"][mine]
        ok[mine] = part["ok"][mine]
        problems.update({int(i): text for i, text in notes[rank]["problems"].items()})
        repairs.update({int(i): done for i, done in notes[rank]["repairs"].items()})
        stopped = stopped or notes[rank]["stopped"]
        counts[f"{devices[rank]}#{rank}"] = len(shard)
        engines[f"{devices[rank]}#{rank}"] = notes[rank]["engine"]
        if notes[rank]["threads"]:
            threads[f"{devices[rank]}#{rank}"] = notes[rank]["threads"]
    return SpanPredictions(pooled, embeddings, ok, problems, dict(sorted(repairs.items())), counts,
                           audio_seconds=sum(n["audio_seconds"] for n in notes),
                           seconds=max(n["seconds"] for n in notes), stopped=stopped, engines=engines,
                           engine_notes=notes[0]["engine_notes"], threads=threads)  # fmt: skip


def _exported_once(
    model: SpeakerClassifier, settings: DeviceSettings, devices: list[torch.device], folder: Path
) -> DeviceSettings:
    """Several CPU processes and an ONNX engine but no ONNX file in the artifact: export it here once, not
    in every process. If that fails, the processes run torch (the export would fail there too)."""
    engine = settings.engine
    if engine.engine == "torch" or engine.fp32_path or any(d.type != "cpu" for d in devices):
        return settings
    from ..core.onnx import ONNX_FP32, ExportError, export_embedding_model

    try:
        path = export_embedding_model(model, folder / ONNX_FP32).path
    except ExportError as error:
        print(f"inference engine: torch in every process ({error})")
        return dataclasses.replace(settings, engine=dataclasses.replace(engine, engine="torch"))
    return dataclasses.replace(settings, engine=dataclasses.replace(engine, fp32_path=str(path)))


def gpu_inference_worker(
    rank: int,
    world_size: int,
    model,
    data_dir,
    files,
    spans,
    shards,
    devices,
    settings,
    plan,
    deadline,
    out_dir,
) -> int:
    """One process per device (spawned, so CUDA initialises fresh in each): predict this rank's shard of the
    files with the weights the parent read from the artifact. CPU processes share the session's cores."""
    device = torch.device(devices[rank])
    if device.type == "cuda":
        torch.cuda.set_device(device)  # allocations, streams and kernels of this process go to its own GPU
    cores = max(1, available_cores() // world_size)
    log = print if rank == 0 else (lambda _: None)  # one set of engine lines, not one per process
    result = _predict_here(model.eval(), Path(data_dir), files, spans, shards[rank], device,
                           dataclasses.replace(settings, progress=settings.progress and rank == 0), plan,
                           deadline, cores, log)  # fmt: skip
    np.savez(Path(out_dir) / f"rank{rank}.npz", embeddings=result.embeddings, ok=result.ok, **result.pooled)
    # Why files fell back, what was repaired and how fast it went travel with the scores: the report needs them.
    notes = {"problems": result.problems, "repairs": result.repairs, "stopped": result.stopped,
             "audio_seconds": result.audio_seconds, "seconds": result.seconds,
             "engine": result.engines[str(device)], "engine_notes": result.engine_notes,
             "threads": result.threads.get(str(device))}  # fmt: skip
    (Path(out_dir) / f"rank{rank}.json").write_text(json.dumps(notes))
    return int(result.ok.sum())
