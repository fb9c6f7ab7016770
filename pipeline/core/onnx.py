"""ONNX for the ECAPA-TDNN embedding model on CPU: export, optional static int8, and an ONNX Runtime embedder
(`OnnxEmbedder`) with windows.run_windows' `embed(wavs, lens) -> [n, D] CPU fp32` signature.

The split: Fbank and sentence mean normalisation (`model.features`) stay in torch: the TorchScript exporter
cannot export the STFT, they are parameter-free and a few percent of the compute. The encoder
(`model.embedding_model`: feats [B, T, n_mels] + relative lengths [B] -> [B, 1, D]) runs in ONNX Runtime.

Export is `torch.export.export(strict=False)` with a dynamic batch and time, then `torch.onnx.export` of that
ExportedProgram. SpeechBrain's `length_to_mask` takes the batch from `len(lengths)`, a Python int, which
non-strict tracing fixes at the example's batch (torch.onnx.export(module, dynamo=True) then quietly applies
torch.export's "suggested fix" and writes an ONNX file that refuses any other batch). During the trace ECAPA's
module sees the same mask computed with `lengths.shape[0]`, which stays symbolic (`_symbolic_batch_masks`).
Strict tracing (Dynamo) also keeps `len()` symbolic, and was used before, but the whole export takes longer:
52.5 s against 38.4 s for a 3-member tiny ensemble, 25.4 against 20.9 s for one 'voxceleb' model, the files
identical (benchmarks/onnx_export.py, raw file benchmarks/raw/onnx_export.json). Every export is checked
before it is written: symbolic batch and time in the ONNX inputs, and ONNX Runtime equal to torch within
EXPORT_TOLERANCE at a batch and time other than the example's.

Static int8 (`quantize_embedding_model`): QDQ, per-channel int8 weights and uint8 activations (the fast
combination on x86), calibrated on real windows. The weights use 7 bits of range (`reduce_range`): x86 CPUs
without VNNI (AVX2 or AVX-512 alone) multiply uint8 by int8 with VPMADDUBSW, whose 16-bit pair sums saturate
for full-range weights (255 x 127 x 2 > 32,767), and the int8 file is written on one machine (training's) and
run on another (the submission's), whose CPU nobody chooses. ECAPA's squeeze-excitation blocks are known to be
quantisation-sensitive, so int8 is used only when held-out accuracy stays within INT8_MAX_ACCURACY_DROP of
fp32 (`int8_acceptable`); only training has labelled held-out data to decide that.

Which engine runs at inference (torch or ONNX Runtime, raced or forced, with fallbacks) is
pipeline/inference/engines.py's business; this module is what training and inference both need: the files and a
session to run them. Imports of onnxruntime / onnxscript happen inside the functions that need them, so this
module imports where they are not installed.
"""

from __future__ import annotations

import contextlib
import copy
import importlib.util
import logging
import sys
import tempfile
import time
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from speechbrain.lobes.models.ECAPA_TDNN import ECAPA_TDNN

from .model import SpeakerClassifier, host_model
from .progress import first_line
from .staging import staged_file

# Artifact file names (phase 2 writes them beside embedding_model.ckpt; SpeechBrain's loader ignores them).
ONNX_FP32 = "embedding_model.onnx"
ONNX_INT8 = "embedding_model.int8.onnx"
INPUTS = ("feats", "wav_lens")
OUTPUT = "embeddings"
OPSET = 18  # torch's dynamo exporter's default in 2.8-2.10; ONNX Runtime has run opset 18 since 1.14
# ONNX Runtime against torch, fp32: max |difference| of embeddings, relative to their largest magnitude
# (measured: <= 3e-7 relative at every preset; anything near 1e-4 is a wrong graph or wrong weights).
EXPORT_TOLERANCE = 1e-4
INT8_MAX_ACCURACY_DROP = 0.005  # 0.5 points of held-out accuracy
# Only the matrix products are quantised: they are the compute. ECAPA's BatchNorms follow a ReLU, so they are
# not folded into a convolution, and quantising them per channel breaks them (rank-1 weights).
INT8_OPERATORS = ("Conv", "MatMul", "Gemm")
# Left in fp32 by default: the squeeze-excitation convolutions and the final linear layer. They run on one
# pooled vector per window (a negligible share of the FLOPs) and scale or make the embedding directly, which
# is where quantisation error is known to hurt ECAPA most. Matched against each operator's weight name.
INT8_KEEP_FP32 = (".se_block.", "fc.")
# The frame range the export admits: 8 frames (80 ms) keeps every reflect padding of ECAPA valid; 2^15
# (5.5 minutes per window, inference's windows are seconds) keeps frames x channels within int32, which
# torch 2.10 asserts (2^20 failed there at the voxceleb size: "frames <= 2147483647/9216").
MIN_FRAMES, MAX_FRAMES, MAX_BATCH = 8, 1 << 15, 1 << 16


class ExportError(RuntimeError):
    """The embedding model could not be exported, or the export does not match torch. Says which."""


def onnxruntime_missing() -> str | None:
    """Why ONNX Runtime cannot run here, or None when it can be imported."""
    return "onnxruntime is not installed" if importlib.util.find_spec("onnxruntime") is None else None


def exporter_missing() -> str | None:
    """Why the dynamo ONNX exporter cannot run here (it needs onnxscript and onnx), or None."""
    missing = [name for name in ("onnxscript", "onnx") if importlib.util.find_spec(name) is None]
    return f"{' and '.join(missing)} not installed (torch's ONNX exporter needs them)" if missing else None


# --------------------------------------------------------------------------------------------- export


@dataclass(frozen=True)
class ExportReport:
    path: Path
    seconds: float  # tracing + conversion + check
    max_abs_diff: float  # ONNX Runtime vs torch at the check's batch and time
    torch_version: str
    opset: int


def example_inputs(
    model: SpeakerClassifier, batch: int, frames: int, seed: int = 0
) -> tuple[torch.Tensor, ...]:
    """Normalised-feature-like inputs [batch, frames, n_mels] and relative lengths (one row shorter)."""
    feats = torch.randn(batch, frames, model.config.n_mels, generator=torch.Generator().manual_seed(seed))
    lens = torch.ones(batch)
    if batch > 1:
        lens[-1] = 0.6
    return feats, lens


def export_embedding_model(model: SpeakerClassifier, path: str | Path, strict: bool = False) -> ExportReport:
    """Write `model.embedding_model` as ONNX to `path` (atomically), dynamic in batch and time, checked
    against torch at another batch and time. `model` itself is not touched (see pristine_encoder). `strict`
    traces with Dynamo instead (the slower way, kept for benchmarks.onnx_export's comparison).
    ExportError when the exporter is missing, tracing or conversion fails, or the check fails."""
    if missing := exporter_missing() or onnxruntime_missing():
        raise ExportError(f"cannot export the embedding model: {missing}")
    started = time.perf_counter()
    encoder = pristine_encoder(model)
    frames = model.config.window_samples // 160 + 1  # Fbank's 10 ms hop: the frames of one window
    example = example_inputs(model, 2, frames)
    batch = torch.export.Dim("batch", min=1, max=MAX_BATCH)
    time_dim = torch.export.Dim("frames", min=MIN_FRAMES, max=MAX_FRAMES)
    try:
        with _quiet_exporter(), contextlib.nullcontext() if strict else _symbolic_batch_masks():
            program = torch.export.export(
                encoder, example, dynamic_shapes=({0: batch, 1: time_dim}, {0: batch}), strict=strict
            )
            onnx_program = torch.onnx.export(
                program,
                example,
                dynamo=True,
                input_names=list(INPUTS),
                output_names=[OUTPUT],
                opset_version=OPSET,
                optimize=True,
            )
    except Exception as error:  # noqa: BLE001 - the exporter raises many types; all mean "no ONNX file"
        raise ExportError(
            f"torch {torch.__version__} could not export the embedding model: "
            f"{type(error).__name__}: {first_line(error)}"
        ) from error
    target = Path(path)
    with staged_file(target) as staging:
        onnx_program.save(str(staging))
        diff = check_export(encoder, model, staging)
    return ExportReport(target, time.perf_counter() - started, diff, torch.__version__, OPSET)


def pristine_encoder(model: SpeakerClassifier) -> torch.nn.Module:
    """What to export, on the CPU in fp32 and eval mode, `model` untouched. SpeechBrain's ECAPA_TDNN is rebuilt
    from `model`'s config with its weights: SpeechBrain's own forward, free of any patch on `model`
    (inference's fast reflect padding is slices and concats that ONNX Runtime's symbolic shape inference,
    run before quantisation, cannot follow; ONNX's Pad is the native op). Any other module is copied as is."""
    encoder = model.embedding_model
    if type(encoder) is not ECAPA_TDNN:
        return copy.deepcopy(encoder).cpu().float().eval()
    state = {
        k: v.detach().cpu().float() if v.is_floating_point() else v.detach().cpu()
        for k, v in model.state_dict().items()
    }
    return host_model(model, state).embedding_model


def check_export(encoder: torch.nn.Module, model: SpeakerClassifier, path: str | Path) -> float:
    """Max |ONNX - torch| of embeddings at a batch and time unlike the export's example (3 x 57 frames);
    ExportError if an input dimension came out fixed or the difference exceeds EXPORT_TOLERANCE."""
    session = load_session(path, threads=1)
    for node in session.get_inputs():
        fixed = [str(d) for d in node.shape[: 2 if node.name == INPUTS[0] else 1] if not isinstance(d, str)]
        if fixed:
            raise ExportError(
                f"{path}: input {node.name} has fixed size(s) {fixed}, not a dynamic batch and time"
            )
    feats, lens = example_inputs(model, 3, 57, seed=1)
    with torch.inference_mode():
        expected = encoder(feats, lens).reshape(3, -1)
    found = torch.from_numpy(run_session(session, feats, lens))
    diff = float((found - expected).abs().max())
    if not diff <= EXPORT_TOLERANCE * max(1.0, float(expected.abs().max())):
        raise ExportError(
            f"{path}: ONNX Runtime differs from torch by {diff:.3g} (tolerance {EXPORT_TOLERANCE})"
        )
    return diff


def _length_to_mask(
    length: torch.Tensor,
    max_len: int,
    dtype: torch.dtype | None = None,
    device: torch.device | None = None,
) -> torch.Tensor:
    """speechbrain.dataio.dataio.length_to_mask with the batch read as `length.shape[0]`, which a non-strict
    trace keeps symbolic, instead of `len(length)`, an int it fixes. Same values. ECAPA always passes
    `max_len` (the frames), so SpeechBrain's default from the data is not copied."""
    steps = torch.arange(max_len, device=length.device, dtype=length.dtype)
    mask = steps.expand(length.shape[0], max_len) < length.unsqueeze(1)
    return torch.as_tensor(mask, dtype=dtype or length.dtype, device=device or length.device)


@contextlib.contextmanager
def _symbolic_batch_masks() -> Iterator[None]:
    """ECAPA_TDNN's module calls `_length_to_mask` for the duration (its two poolings are the only callers of
    length_to_mask in the encoder). A module global, swapped back however the export ends."""
    module = sys.modules[ECAPA_TDNN.__module__]
    original = module.length_to_mask
    module.length_to_mask = _length_to_mask
    try:
        yield
    finally:
        module.length_to_mask = original


@contextlib.contextmanager
def _quiet_exporter() -> Iterator[None]:
    """The exporter warns about torchvision operators it skips and prints its progress, the quantizer about
    every tensor it leaves alone: not the user's business. Errors still raise."""
    names = ("torch.onnx", "torch.export", "torch._dynamo", "onnxscript", "")  # "": root, the quantizer's
    loggers = [logging.getLogger(name) for name in names]
    levels = [logger.level for logger in loggers]
    try:
        for logger in loggers:
            logger.setLevel(logging.ERROR)
        with warnings.catch_warnings(), contextlib.redirect_stdout(None):
            warnings.simplefilter("ignore")
            yield
    finally:
        for logger, level in zip(loggers, levels, strict=True):
            logger.setLevel(level)


# --------------------------------------------------------------------------------------------- int8


def quantize_embedding_model(
    model: SpeakerClassifier,
    fp32_path: str | Path,
    int8_path: str | Path,
    wavs: torch.Tensor,
    lens: torch.Tensor,
    batch: int = 16,
    keep_fp32: tuple[str, ...] = INT8_KEEP_FP32,
    reduce_range: bool = True,
) -> Path:
    """Static int8 (QDQ, per-channel) of the exported fp32 model at `fp32_path`, written to `int8_path`,
    calibrated on the windows `wavs` [N, window_samples] with relative lengths `lens` [N] (real audio: the
    activation ranges are what matter). Operators whose weight name contains a `keep_fp32` string (one
    starting with it, for a string ending in ".") stay fp32. `reduce_range` False writes full-range weights, as
    artifacts before 7-bit weights had (for comparisons). Needs onnxruntime and onnx."""
    import onnx
    from onnxruntime.quantization import CalibrationMethod, QuantFormat, QuantType, quantize_static
    from onnxruntime.quantization.shape_inference import quant_pre_process

    if len(wavs) == 0:
        raise ValueError("quantize_embedding_model: no calibration windows (wavs is empty)")
    with torch.inference_mode():
        batches = [
            {
                INPUTS[0]: np.ascontiguousarray(
                    model.features(wavs[i : i + batch].float(), lens[i : i + batch].float()).cpu().numpy()
                ),
                INPUTS[1]: lens[i : i + batch].float().cpu().numpy(),
            }
            for i in range(0, len(wavs), batch)
        ]
    reader = _Calibration(batches)
    target, source = Path(int8_path).resolve(), Path(fp32_path).resolve()
    # In a folder of its own: when its symbolic shape inference fails, onnxruntime saves a debugging copy of
    # the model into the working directory.
    with tempfile.TemporaryDirectory(prefix="onnx-quant-") as tmp, contextlib.chdir(tmp), _quiet_exporter():
        prepared = Path(tmp) / "prepared.onnx"
        # Shape inference and ONNX Runtime's basic fusions first, as onnxruntime.quantization recommends.
        quant_pre_process(str(source), str(prepared))
        kept = [
            node.name
            for node in onnx.load(str(prepared), load_external_data=False).graph.node
            if node.op_type in INT8_OPERATORS and len(node.input) > 1 and _matches(node.input[1], keep_fp32)
        ]
        with staged_file(target) as staging:
            quantize_static(
                str(prepared),
                str(staging),
                reader,
                quant_format=QuantFormat.QDQ,
                per_channel=True,
                # Weights in [-64, 64]: no saturation on any x86 CPU, at the speed of full range. On a
                # 2-core AVX2-only EPYC, full range gave cosine 0.90 to fp32 on FSDD speech, this 0.997
                # (tests/inference/test_onnx_engine.py; speed: benchmarks/int8_range.py).
                reduce_range=reduce_range,
                activation_type=QuantType.QUInt8,
                weight_type=QuantType.QInt8,
                calibrate_method=CalibrationMethod.MinMax,
                op_types_to_quantize=list(INT8_OPERATORS),
                nodes_to_exclude=kept,
            )
    return target


def _matches(weight: str, patterns: tuple[str, ...]) -> bool:
    return any(
        weight.startswith(p) if p.endswith(".") and not p.startswith(".") else p in weight for p in patterns
    )


class _Calibration:
    """onnxruntime.quantization's CalibrationDataReader protocol over prepared input batches."""

    def __init__(self, batches: list[dict[str, np.ndarray]]) -> None:
        self._batches = iter(batches)

    def get_next(self) -> dict[str, np.ndarray] | None:
        return next(self._batches, None)


def int8_acceptable(fp32_accuracy: float, int8_accuracy: float) -> bool:
    """The int8 rule: held-out accuracy (fractions, 0-1) within INT8_MAX_ACCURACY_DROP of fp32's."""
    return int8_accuracy >= fp32_accuracy - INT8_MAX_ACCURACY_DROP - 1e-12


# --------------------------------------------------------------------------------------------- runtime


def load_session(path: str | Path, threads: int) -> Any:
    """An ONNX Runtime CPU session of `path` for one inference process: `threads` intra-op threads (its
    default is one per physical core of the host, whatever the container may use), one inter-op thread (ECAPA
    is a chain of operators: nothing to run side by side), every graph optimisation, and idle pool threads
    that do not busy-wait: between two ONNX Runtime calls torch computes the features with its own threads,
    and spinning pool threads take their cores (measured on 2 busy shared cores, voxceleb preset, 2 threads,
    median of 3: spinning off faster in 5 of 6 cases of 4, 8 or 16 windows per batch, fp32 or int8, by
    9-77%; 7% slower in the sixth, within that run's spread)."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    # Int8 files written before weights were kept to 7 bits (quantize_embedding_model) saturate on x86 CPUs
    # without VNNI; this has ONNX Runtime multiply their out-of-range weights as uint8 x uint8 on such CPUs
    # (slower, exact). 7-bit weights run at the same speed with it on and off; full-range ones lose 16-45% of
    # their int8 speed with it even on a VNNI CPU, where they would not saturate (docs/measurements.md, Int8
    # weight range): a cost only artifacts from before 7-bit weights pay.
    options.add_session_config_entry("session.x64quantprecision", "1")
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.log_severity_level = 3  # errors only
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def run_session(session: Any, feats: torch.Tensor, lens: torch.Tensor) -> np.ndarray:
    """Embeddings [B, D] from normalised features [B, T, n_mels] and relative lengths [B]."""
    arrays = [np.ascontiguousarray(t.detach().float().cpu().numpy()) for t in (feats, lens)]
    out = session.run([OUTPUT], dict(zip(INPUTS, arrays, strict=True)))[0]
    return out.reshape(out.shape[0], -1)


class OnnxEmbedder:
    """Features in torch, the encoder in an ONNX Runtime session."""

    def __init__(self, model: SpeakerClassifier, path: str | Path, threads: int, precision: str) -> None:
        self.model, self.path, self.precision = model, Path(path), precision
        self.engine = f"onnx-{precision}"
        self.session = load_session(path, threads)

    @torch.inference_mode()
    def __call__(self, wavs: torch.Tensor, lens: torch.Tensor) -> torch.Tensor:
        return torch.from_numpy(run_session(self.session, self.model.features(wavs.cpu(), lens.cpu()), lens))
