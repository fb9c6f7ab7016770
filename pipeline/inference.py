"""Inference: every test id gets a prediction, fast, on whatever the submission session has.

How a file becomes a prediction: decode (DataLoader workers, overlapped with compute) -> 16 kHz mono ->
fixed-length windows exactly like the training crops -> batches of `batch_windows` windows (every batch the
same shape, so no padding is wasted and GPU kernels are reused) -> window embeddings -> their
length-weighted mean per file -> cosine scores -> label. Feeding whole variable-length files instead cost a measured 40 accuracy
points on FSDD digits (../shared/NOTES.md): the model only knows windows.

A file that cannot be read gets the fallback label and a line in the report; the run fails only when the
artifact itself is invalid. This module never imports torch_xla.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
import types
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

from .artifact import Artifact
from .config import MAX_WINDOWS_PER_FILE, InferConfig
from .data import AudioError, load_audio, windows
from .devices.launch import heartbeat
from .model import SpeakerClassifier, add_windows
from .progress import progress_bar
from .tables import DataError, TestRow, resolve_inside

# Files longer than this are only decoded up to it: max_windows_per_file windows cover it anyway.
MAX_DECODE_SECONDS = 600.0


@dataclass
class FileWindows:
    index: int
    windows: np.ndarray | None  # [n, window] float32, None when the file could not be used
    lens: np.ndarray | None  # [n] relative lengths
    problem: str | None = None  # reason for the fallback
    repairs: list[str] = field(default_factory=list)


@dataclass
class Predictions:
    scores: np.ndarray  # [n_files, n_classes] cosine scores of the mean embedding (NaN rows for fallbacks)
    embeddings: np.ndarray  # [n_files, emb_dim]
    ok: np.ndarray  # [n_files] bool: a real prediction was made
    problems: dict[int, str]  # file index -> why it fell back
    repairs: dict[int, list[str]]  # file index -> what was repaired
    device_counts: dict[str, int]  # files processed per device
    seconds: float = 0.0


@torch.inference_mode()
def embed_windows(
    model: SpeakerClassifier, wavs: torch.Tensor, lens: torch.Tensor, device: torch.device
) -> torch.Tensor:
    """Embeddings [n, D] of one batch of windows, returned on CPU in fp32."""
    wavs, lens = wavs.to(device, non_blocking=True), lens.to(device, non_blocking=True)
    use_fp16 = device.type == "cuda"  # T4 tensor cores; the Fbank front end stays in fp32 (see model.py)
    with torch.autocast(device_type=device.type, dtype=torch.float16, enabled=use_fp16):
        embeddings = model.embed(model.features(wavs, lens), lens)
    return embeddings.float().cpu()


def run_windows(
    model: SpeakerClassifier,
    items: Iterator[FileWindows],
    n_files: int,
    batch_windows: int,
    device: torch.device,
    progress: bool = False,
    embed: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None,
) -> Predictions:
    """Consume per-file windows, batch them densely, and reduce window embeddings back to files.

    A file's embedding is the valid-length-weighted mean of its unit-length window embeddings (the reduction
    model.WindowedEncoder applies for SpeechBrain); its scores are the cosine classifier on that mean.
    `embed(wavs, lens)` computes a batch's window embeddings on the host (default: `embed_windows` on
    `device`; training's validation passes its strategy's, which pads batches to one shape on XLA)."""
    embed = embed or (lambda wavs, lens: embed_windows(model, wavs, lens, device))
    # CUDA: every batch is staged in one page-locked buffer, so the copy to the GPU is a DMA that needs no
    # pageable bounce (batches are assembled here from several files' windows, so pinning each file's
    # windows in the DataLoader would not help). The embeddings' copy back to the host ends each batch:
    # the buffer is free again before the next one is staged.
    staging = None
    emb_dim = model.config.lin_neurons
    emb_sum = torch.zeros(n_files, emb_dim)
    weight = torch.zeros(n_files)
    problems: dict[int, str] = {}
    repairs: dict[int, list[str]] = {}
    pending_wavs: list[np.ndarray] = []
    pending_lens: list[np.ndarray] = []
    pending_owner: list[np.ndarray] = []
    started = time.perf_counter()

    def flush(limit: int | None) -> None:
        """Run full batches (or everything when limit is None) from the pending windows."""
        nonlocal pending_wavs, pending_lens, pending_owner, staging
        if not pending_wavs:
            return
        wavs = np.concatenate(pending_wavs)
        lens = np.concatenate(pending_lens)
        owner = np.concatenate(pending_owner)
        stop = len(wavs) if limit is None else (len(wavs) // limit) * limit
        for start in range(0, stop, batch_windows):
            end = min(start + batch_windows, stop)
            batch_lens, batch = torch.from_numpy(lens[start:end]), torch.from_numpy(wavs[start:end])
            if device.type == "cuda":
                if staging is None:
                    staging = torch.empty((batch_windows, wavs.shape[1]), pin_memory=True)
                batch = staging[: end - start].copy_(batch)
            embeddings = embed(batch, batch_lens)
            add_windows(emb_sum, weight, embeddings, batch_lens, torch.from_numpy(owner[start:end]))
            heartbeat()  # progress, for the launcher's stall check when this runs in a device worker
        pending_wavs, pending_lens, pending_owner = [wavs[stop:]], [lens[stop:]], [owner[stop:]]

    bar = progress_bar(n_files, "infer", "file", progress)
    buffered = 0
    for item in items:
        if item.windows is None:
            problems[item.index] = item.problem or "unusable"
        else:
            if item.repairs:
                repairs[item.index] = item.repairs
            pending_wavs.append(np.asarray(item.windows))
            pending_lens.append(np.asarray(item.lens))
            pending_owner.append(np.full(len(item.windows), item.index, dtype=np.int64))
            buffered += len(item.windows)
            if buffered >= batch_windows:
                flush(batch_windows)
                buffered = len(pending_wavs[0])
        if bar is not None:
            bar.update(1)
    flush(None)
    if bar is not None:
        bar.close()
    ok = (weight > 0).numpy()
    embeddings = np.full((n_files, emb_dim), np.nan, dtype=np.float32)
    embeddings[ok] = (emb_sum[ok] / weight[ok][:, None]).numpy()
    scores = np.full((n_files, model.config.n_classes), np.nan, dtype=np.float32)
    if ok.any():
        scores[ok] = host_scores(model, embeddings[ok])
    for index in np.flatnonzero(~ok):
        problems.setdefault(int(index), "no audio windows")
    return Predictions(
        scores=scores,
        embeddings=embeddings,
        ok=ok,
        problems=problems,
        repairs=repairs,
        device_counts={str(device): int(ok.sum())},
        seconds=time.perf_counter() - started,
    )


@torch.inference_mode()
def host_scores(model: SpeakerClassifier, embeddings: np.ndarray) -> np.ndarray:
    """Cosine scores [n_files, n_classes] of per-file embeddings, computed on the host in fp32 with the
    model's classifier weights (what SpeechBrain's classify_batch returns), wherever the model lives."""
    weight = model.classifier.weight.detach().float().cpu()
    unit = torch.nn.functional.normalize(torch.from_numpy(embeddings).float(), dim=1)
    return torch.nn.functional.linear(unit, torch.nn.functional.normalize(weight, dim=1)).numpy()


def classify_clips(
    model: SpeakerClassifier,
    clips: Sequence[np.ndarray],
    window: int,
    batch_windows: int = 64,
    max_windows: int = MAX_WINDOWS_PER_FILE,
    device: torch.device | None = None,
) -> Predictions:
    """Predictions for clips already in memory (validation during training uses this)."""
    device = device or next(model.parameters()).device
    items = (FileWindows(i, *windows(clip, window, max_windows)) for i, clip in enumerate(clips))
    return run_windows(model, items, len(clips), batch_windows, device)


class TestFileWindows(Dataset):
    """Decodes test files into windows in DataLoader workers; never raises for a bad file."""

    def __init__(self, data_dir: Path, rows: Sequence[TestRow], window: int, max_windows: int) -> None:
        self.data_dir, self.rows, self.window, self.max_windows = data_dir, rows, window, max_windows

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, index: int) -> FileWindows:
        row = self.rows[index]
        try:
            path = resolve_inside(self.data_dir, row.rel_path)
            samples, repairs = load_audio(path, max_seconds=MAX_DECODE_SECONDS)
        except AudioError as error:  # the report names the file as test.csv does
            return FileWindows(index, None, None, problem=f"{row.rel_path}: {error.detail}")
        except DataError as error:
            return FileWindows(index, None, None, problem=str(error))
        except Exception as error:  # noqa: BLE001 - a bad file must cost one row, never the run
            return FileWindows(index, None, None, problem=f"{row.rel_path}: {type(error).__name__}: {error}")
        wavs, lens = windows(samples, self.window, self.max_windows)
        return FileWindows(index, wavs, lens, repairs=repairs)


def _first(batch: list[FileWindows]) -> FileWindows:
    return batch[0]


def file_order(data_dir: Path, rows: Sequence[TestRow]) -> list[int]:
    """Longest files first (by size on disk, a cheap proxy for duration): big windows counts early keep
    batches full and let the progress bar's rate settle."""

    def size(row: TestRow) -> int:
        try:
            return (data_dir / row.rel_path).stat().st_size
        except (OSError, ValueError):  # missing, or a name the OS refuses (NUL byte): it will fall back
            return -1

    return sorted(range(len(rows)), key=lambda i: -size(rows[i]))


def predict_rows(
    model: SpeakerClassifier,
    data_dir: Path,
    rows: Sequence[TestRow],
    indices: Sequence[int],
    device: torch.device,
    batch_windows: int,
    max_windows: int,
    num_workers: int,
    progress: bool = False,
) -> Predictions:
    """Predict `rows[indices]` on one device. Scores come back indexed like `rows`."""
    dataset = TestFileWindows(data_dir, rows, model.config.window_samples, max_windows)
    loader = DataLoader(
        dataset,
        batch_size=1,
        sampler=list(indices),
        collate_fn=_first,
        num_workers=num_workers,
        prefetch_factor=8 if num_workers > 0 else None,
        pin_memory=False,  # the assembled batch is what is pinned (run_windows' staging buffer)
    )
    model = model.to(device).eval()
    use_fast_reflect_padding(model)
    result = run_windows(model, iter(loader), len(rows), batch_windows, device, progress)
    # Rows of other shards are neither ok nor problems here.
    outside = set(range(len(rows))) - set(indices)
    result.problems = {i: p for i, p in result.problems.items() if i not in outside}
    # Files this device handled, including those that fell back (as the multi-device path counts them).
    result.device_counts = {str(device): len(indices)}
    return result


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


def predict_on_devices(
    artifact: Artifact, data_dir: Path, rows: Sequence[TestRow], config: InferConfig
) -> Predictions:
    from .devices.inference_devices import batching_for, choose_devices

    devices = choose_devices(config)
    order = file_order(data_dir, rows)
    if len(devices) > 1:
        from .devices.launch import LaunchError, LaunchTimeout

        try:
            return _predict_multi_gpu(artifact, data_dir, rows, config, devices, order)
        except LaunchError as error:
            # A submission must still be written: fall back to one device in this process -- the CPU if a
            # worker hung (its GPU may hang again), else the first device.
            if isinstance(error, LaunchTimeout):
                devices = [torch.device("cpu")]
            print(f"multi-device inference failed ({error}); predicting on {devices[0]} in this process")
    batch_windows, num_workers = batching_for(config, artifact.model.config, devices[0])
    return predict_rows(
        artifact.model,
        data_dir,
        rows,
        order,
        devices[0],
        batch_windows,
        config.max_windows_per_file,
        num_workers,
        config.progress,
    )


def _predict_multi_gpu(artifact, data_dir, rows, config, devices, order) -> Predictions:
    from .devices.inference_devices import shard_indices
    from .devices.launch import launch

    shards = shard_indices(order, len(devices))
    with tempfile.TemporaryDirectory(prefix="infer-shards-") as tmp:
        launch(
            gpu_inference_worker,
            nprocs=len(devices),
            args=(
                artifact.model,  # verified CPU weights, read once here: workers never re-read the artifact
                str(data_dir),
                list(rows),
                shards,
                [str(d) for d in devices],
                config,
                tmp,
            ),
            stall_timeout=STALL_MINUTES * 60,  # a hung GPU must not cost the submission
        )
        parts = [np.load(Path(tmp) / f"rank{rank}.npz", allow_pickle=False) for rank in range(len(devices))]
        problems: dict[int, str] = {}
        repairs: dict[int, list[str]] = {}
        for rank in range(len(devices)):
            notes = json.loads((Path(tmp) / f"rank{rank}.json").read_text())
            problems.update({int(i): text for i, text in notes["problems"].items()})
            repairs.update({int(i): done for i, done in notes["repairs"].items()})
    scores = parts[0]["scores"].copy()
    embeddings = parts[0]["embeddings"].copy()
    ok = np.zeros(len(rows), dtype=bool)
    counts = {}
    for rank, (part, shard) in enumerate(zip(parts, shards, strict=True)):
        scores[shard] = part["scores"][shard]
        embeddings[shard] = part["embeddings"][shard]
        ok[shard] = part["ok"][shard]
        counts[f"{devices[rank]}#{rank}"] = len(shard)
    return Predictions(scores, embeddings, ok, problems, dict(sorted(repairs.items())), counts)


def gpu_inference_worker(
    rank: int, world_size: int, model, data_dir, rows, shards, devices, config, out_dir
) -> int:
    """One process per device (spawned, so CUDA initialises fresh in each): predict this rank's shard with
    the weights the parent read from the artifact."""
    from .devices.inference_devices import batching_for

    device = torch.device(devices[rank])
    if device.type == "cuda":
        torch.cuda.set_device(device)  # allocations, streams and kernels of this process go to its own GPU
    else:
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // world_size))
    batch_windows, num_workers = batching_for(config, model.config, device)
    result = predict_rows(
        model.eval(),
        Path(data_dir),
        rows,
        shards[rank],
        device,
        batch_windows,
        config.max_windows_per_file,
        num_workers,
        progress=config.progress and rank == 0,
    )
    target = Path(out_dir) / f"rank{rank}.npz"
    np.savez(target, scores=result.scores, embeddings=result.embeddings, ok=result.ok)
    # Why files fell back and what was repaired travel with the scores: the report needs both.
    notes = {"problems": result.problems, "repairs": result.repairs}
    (Path(out_dir) / f"rank{rank}.json").write_text(json.dumps(notes))
    return int(result.ok.sum())
