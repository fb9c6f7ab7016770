"""The inference engines: what computes the window embeddings of a run's batches, with windows.run_windows'
`embed(wavs, lens) -> [n, D] CPU fp32` signature (`make_embedder`, as runtime.choose_engine decided).

    torch     PyTorch on the runtime's device (fp16 autocast on CUDA)
    onnx      ONNX Runtime on the artifact's ONNX file, checked against torch on a probe batch
    race      ONNX Runtime against torch on the run's first batch; ONNX computes the rest unless torch is
              clearly faster (by TORCH_MUST_WIN_BY)

Whatever fails on the ONNX side -- a session that does not load, output that disagrees with torch, a batch
that fails mid-run -- falls back to torch with one printed line, and no row is lost. onnxruntime is imported
by core/onnx.py's session loader only, so this module imports where it is not installed.
"""

from __future__ import annotations

import time
import types
from collections.abc import Callable

import numpy as np
import torch

from ..core.model import SpeakerClassifier
from ..core.onnx import EXPORT_TOLERANCE, ExportError, OnnxEmbedder
from ..core.progress import first_line
from ..core.windows import embed_windows
from ..devices.threads import available_cores
from .runtime import Runtime

# int8 embeddings against fp32 ones on the probe batch: a mean cosine below this is a file of other weights
# or a broken quantisation, not quantisation noise (measured on FSDD: 0.99+ for trained and random weights).
INT8_MIN_COSINE = 0.95
# Windows of a run's first batch that ONNX Runtime computes too, to check it against torch (mode race): a
# file of other weights shows on any window, and the rest of the batch would be computed twice for nothing.
CHECK_WINDOWS = 2
# The race goes to torch only when torch is this many times faster than ONNX Runtime. Engines closer than that
# swap places from run to run with the machine's load, and int8's scores differ from torch's by quantisation
# noise: on FSDD speakers the same artifact and notebook wrote submissions 1-3 files apart in 540 by which engine
# won (one artifact: int8 1.21-1.41x faster in eight fresh runs, torch 1.12x and 1.26x faster in two runs after
# training; docs/measurements.md). An ONNX file in the artifact passed its accuracy rule at training; a machine
# where it is much slower (ONNX Runtime without fast int8 kernels) still gets torch.
TORCH_MUST_WIN_BY = 1.5


Embed = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


class TorchEmbedder:
    """PyTorch on `device` (windows.embed_windows: fp16 autocast on CUDA, fp32 on the CPU)."""

    def __init__(self, model: SpeakerClassifier, device: torch.device | None = None) -> None:
        self.model, self.device = model, device or torch.device("cpu")
        self.engine = "torch-fp16" if self.device.type == "cuda" else "torch"

    def __call__(self, wavs: torch.Tensor, lens: torch.Tensor) -> torch.Tensor:
        return embed_windows(self.model, wavs, lens, self.device)


def checked_output(out: torch.Tensor, wavs: torch.Tensor, dim: int) -> torch.Tensor:
    """`out` when it is one finite `dim`-wide embedding per window of `wavs`; RuntimeError otherwise."""
    if tuple(out.shape) != (wavs.shape[0], dim) or not bool(torch.isfinite(out).all()):
        raise RuntimeError(
            f"returned {tuple(out.shape)} embeddings (expected {(wavs.shape[0], dim)}, finite)"
        )
    return out


class GuardedEmbedder:
    """`primary` until a batch fails (an exception, a wrong shape, a non-finite value); then `fallback`
    computes that batch and every later one, after one printed line. No batch, so no row, is lost."""

    def __init__(self, primary: Embed, fallback: Embed, dim: int, log: Callable[[str], None]) -> None:
        self.primary, self.fallback, self.dim, self.log = primary, fallback, dim, log
        self.name = str(getattr(primary, "engine", "primary"))
        self.failure: str | None = None

    @property
    def engine(self) -> str:
        """What computed the batches, for the report: the primary's name, and the fallback if a batch failed."""
        return f"{self.name}, then torch (a batch failed)" if self.failure else self.name

    def __call__(self, wavs: torch.Tensor, lens: torch.Tensor) -> torch.Tensor:
        if self.failure is None:
            try:
                return checked_output(self.primary(wavs, lens), wavs, self.dim)
            except Exception as error:  # noqa: BLE001 - any engine failure: torch takes over, rows are kept
                self.failure = f"{type(error).__name__}: {first_line(error)}"
                self.log(
                    f"inference engine: {self.name} failed on a batch of {wavs.shape[0]} windows "
                    f"({self.failure}); torch computes this batch and the rest"
                )
        return self.fallback(wavs, lens)


class FirstBatchRace:
    """engine='auto' with an ONNX file: torch and ONNX Runtime race on the run's first batch, and ONNX computes
    the rest unless torch was clearly faster.

    Why on the run's own batch and not on a probe batch before it: a probe is compute spent on nothing (it
    cost a 300-file FSDD run a fifth of its time) and it is shaped unlike the run's windows. Torch computes the
    first batch, and ONNX Runtime its first CHECK_WINDOWS windows, checked against torch's (_agreement: fp32
    within EXPORT_TOLERANCE, int8 by cosine); both are warm-ups, untimed. Then each engine computes the first
    batch again in turn, timed, until each has `race_batches` timings (2 when every timing of one is below
    every timing of the other); ONNX wins unless torch's median is TORCH_MUST_WIN_BY times lower (engines close
    together would otherwise swap from run to run), one line says which and by how much, and the winner's
    embeddings of the first batch are returned: every row of a run comes from one engine, so identical audio
    gets identical scores (int8 differs from torch by quantisation noise, ~1e-2).

    A failure or a disagreement ends the race for torch, with one line; no batch is lost. `clock` times the
    batches (tests pass one that only the engines move, so the race's course does not depend on the load)."""

    def __init__(
        self,
        candidate: Embed,
        torch_embed: Embed,
        dim: int,
        precision: str,
        log: Callable[[str], None],
        *,
        race_batches: int = 3,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        self.candidate, self.torch_embed, self.dim, self.precision = candidate, torch_embed, dim, precision
        self.log, self.race_batches, self.clock = log, race_batches, clock
        self.name = str(getattr(candidate, "engine", "onnx"))
        self.per_sample: dict[str, list[float]] = {self.name: [], "torch": []}
        self.winner: Embed | None = None

    @property
    def engine(self) -> str:
        return str(getattr(self.winner, "engine", "torch"))  # torch until the race is decided

    def __call__(self, wavs: torch.Tensor, lens: torch.Tensor) -> torch.Tensor:
        if self.winner is not None:
            return self.winner(wavs, lens)
        expected = self.torch_embed(wavs, lens)
        few = slice(0, CHECK_WINDOWS)
        found = self._candidate(wavs[few], lens[few])
        if found is None:
            return expected
        if disagreement := _agreement(self.precision, found, expected[few]):
            self._decide_torch(f"{disagreement} on the first batch")
            return expected
        results = {"torch": expected}
        while not self._raced_enough():
            for racer in (self.name, "torch"):
                started = self.clock()
                out = self._candidate(wavs, lens) if racer == self.name else self.torch_embed(wavs, lens)
                if out is None:  # the candidate failed (one line said so): torch's result stands
                    return expected
                self.per_sample[racer].append((self.clock() - started) / max(1, wavs.numel()))
                results[racer] = out
        self._decide()
        return results["torch"] if self.winner is self.torch_embed else results[self.name]

    def _raced_enough(self) -> bool:
        onnx_s, torch_s = self.per_sample[self.name], self.per_sample["torch"]
        raced = min(len(onnx_s), len(torch_s))
        separated = raced >= 2 and (max(onnx_s) < min(torch_s) or max(torch_s) < min(onnx_s))
        return raced >= self.race_batches or separated

    def _candidate(self, wavs: torch.Tensor, lens: torch.Tensor) -> torch.Tensor | None:
        try:
            return checked_output(self.candidate(wavs, lens), wavs, self.dim)
        except Exception as error:  # noqa: BLE001 - any engine failure: torch takes over, rows are kept
            self._decide_torch(
                f"failed on a batch of {wavs.shape[0]} windows: {type(error).__name__}: {first_line(error)}"
            )
            return None

    def _decide_torch(self, why: str) -> None:
        self.winner = self.torch_embed
        self.log(f"inference engine: torch ({self.name} {why})")

    def _decide(self) -> None:
        onnx_s, torch_s = (float(np.median(self.per_sample[name])) for name in (self.name, "torch"))
        raced = len(self.per_sample["torch"])
        timing = f"{onnx_s * 1e9:.0f} vs torch {torch_s * 1e9:.0f} ns per input sample, median of {raced} runs each"
        if onnx_s <= torch_s * TORCH_MUST_WIN_BY:
            self.winner = GuardedEmbedder(self.candidate, self.torch_embed, self.dim, self.log)
            margin = "" if onnx_s < torch_s else f"; torch wins only at {TORCH_MUST_WIN_BY:g}x"
            self.log(f"inference engine: {self.name}, {torch_s / onnx_s:.2f}x torch ({timing}{margin})")
        else:
            self.winner = self.torch_embed
            self.log(f"inference engine: torch, {onnx_s / torch_s:.2f}x faster than {self.name} ({timing})")


def _agreement(precision: str, found: torch.Tensor, expected: torch.Tensor) -> str | None:
    """Why `found` (ONNX) disagrees with torch's `expected`, or None."""
    if tuple(found.shape) != tuple(expected.shape) or not bool(torch.isfinite(found).all()):
        return f"returned {tuple(found.shape)} embeddings for {tuple(expected.shape)}"
    if precision == "int8":
        cosine = float(torch.nn.functional.cosine_similarity(found, expected, dim=1).mean())
        return (
            None if cosine >= INT8_MIN_COSINE else f"cosine {cosine:.3f} to torch (minimum {INT8_MIN_COSINE})"
        )
    diff = float((found - expected).abs().max())
    scale = max(1.0, float(expected.abs().max()))
    return None if diff <= EXPORT_TOLERANCE * scale else f"differs from torch by {diff:.3g}"


def make_embedder(model: SpeakerClassifier, runtime: Runtime, log: Callable[[str], None] = print) -> Embed:
    """The `embed(wavs, lens)` of the run, as `runtime.engine` says, announced in a printed line; never raises
    for an engine problem (torch takes over: see the module docstring). Prepares `model` for inference: on the
    runtime's device, in eval mode, with the fast reflect padding."""
    model = model.to(runtime.device).eval()
    use_fast_reflect_padding(model)
    choice = runtime.engine
    torch_embed = TorchEmbedder(model, runtime.device)
    if choice.mode == "torch":
        log(f"inference engine: {torch_embed.engine} on {runtime.device} ({choice.why})")
        return torch_embed
    try:
        candidate = OnnxEmbedder(
            model, choice.onnx_path, runtime.threads or available_cores(), choice.precision
        )
        if choice.mode == "onnx":
            # a probe batch: full windows of quiet noise, shaped as inference shapes it
            count, generator = runtime.windows.batch_windows, torch.Generator().manual_seed(0)
            wavs = 0.05 * torch.randn(count, model.config.window_samples, generator=generator)
            lens = torch.ones(count)
            if disagreement := _agreement(choice.precision, candidate(wavs, lens), torch_embed(wavs, lens)):
                raise ExportError(f"{candidate.path.name}: {disagreement} on the probe batch")
    except Exception as error:  # noqa: BLE001 - never raise: torch is always there
        log(
            f"inference engine: torch ({choice.label} unavailable: {type(error).__name__}: {first_line(error)})"
        )
        return torch_embed
    dim = model.config.embedding_size
    if choice.mode == "race":
        log(f"inference engine: torch and {candidate.engine} race on the first batch [{choice.why}]")
        return FirstBatchRace(candidate, torch_embed, dim, choice.precision, log)
    log(f"inference engine: {candidate.engine}, agrees with torch on a probe batch [{choice.why}]")
    return GuardedEmbedder(candidate, torch_embed, dim, log)


def use_fast_reflect_padding(model: torch.nn.Module) -> int:
    """Make SpeechBrain's "same" reflect padding build the padded tensor from copies (cat of flipped edges)
    instead of torch's reflection_pad1d, which on CPU took 13-18% of ECAPA's forward time (5x slower than
    the copies it amounts to). Bit-identical results; returns how many convolutions were switched."""
    from speechbrain.nnet.CNN import Conv1d

    switched = 0
    for module in model.modules():
        if (
            isinstance(module, Conv1d)
            and hasattr(module, "_manage_padding")
            and module.padding == "same"
            and module.padding_mode == "reflect"
            and module.stride == 1
        ):
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
    if not left and not right:  # 1x1 convolutions: no copy
        return x
    return torch.cat(
        [x[..., 1 : left + 1].flip(-1), x, x[..., x.shape[-1] - right - 1 : -1].flip(-1)], dim=-1
    )
