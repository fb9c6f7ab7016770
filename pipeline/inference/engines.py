"""The CPU inference engines: which computes the embeddings of a run's batches, torch or ONNX Runtime (the
files and sessions of pipeline/core/onnx.py), with windows.run_windows' `embed(wavs, lens) -> [n, D] CPU fp32`
signature.

Which engine runs (`make_embedder`): forced, or with engine='auto' raced on the run's own first batches
(RacingEmbedder): ONNX Runtime fp32 is not always faster than torch eager (0.85x on this machine's CPU), so it
is measured where the submission runs, not assumed. `make_embedder` never raises for an engine problem:
onnxruntime missing, an export that fails, a corrupt or foreign .onnx file, ONNX output that disagrees with
torch, or a batch that fails mid-run all fall back to torch with one printed line. Imports of onnxruntime /
onnxscript happen inside the functions that need them, so this module imports where they are not installed.
"""

from __future__ import annotations

import contextlib
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

from ..core.model import SpeakerClassifier
from ..core.onnx import (
    EXPORT_TOLERANCE,
    ONNX_FP32,
    ExportError,
    OnnxEmbedder,
    export_embedding_model,
    onnxruntime_missing,
)
from ..core.progress import first_line
from ..devices.threads import available_cores

ENGINES = ("auto", "torch", "onnx")
# int8 embeddings against fp32 ones on the probe batch: a mean cosine below this is a file of other weights
# or a broken quantisation, not quantisation noise (measured on FSDD: 0.99+ for trained and random weights).
INT8_MIN_COSINE = 0.95
# Windows of a run's first batch that ONNX Runtime computes too, to check it against torch (engine auto): a
# file of other weights shows on any window, and the rest of the batch would be computed twice for nothing.
CHECK_WINDOWS = 2


Embed = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


class TorchEmbedder:
    """PyTorch eager on the CPU: what windows.embed_windows computes there."""

    engine = "torch"

    def __init__(self, model: SpeakerClassifier) -> None:
        self.model = model

    @torch.inference_mode()
    def __call__(self, wavs: torch.Tensor, lens: torch.Tensor) -> torch.Tensor:
        return self.model.embed(self.model.features(wavs, lens), lens).float().cpu()


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

    def __init__(
        self, primary: Embed, fallback: Embed, dim: int, reason: str, log: Callable[[str], None]
    ) -> None:
        self.primary, self.fallback, self.dim, self.reason, self.log = primary, fallback, dim, reason, log
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
                self.log(f"inference engine: {self.name} failed on a batch of {wavs.shape[0]} windows "
                         f"({self.failure}); torch computes this batch and the rest")  # fmt: skip
        return self.fallback(wavs, lens)


class RacingEmbedder:
    """engine='auto': torch and ONNX Runtime race on the run's first batches, and the faster computes the rest.

    Why on the run's own batches and not on a probe batch before it: a probe is compute spent on nothing (it
    cost a 300-file FSDD run a fifth of its time), it is timed on one full-window shape while length buckets
    run several shorter ones, and two timings of one small batch are noise (it picked each engine in turn on
    this machine). The first batch is torch's, and ONNX Runtime computes its first CHECK_WINDOWS windows too,
    checked against torch's (_agreement: fp32 within EXPORT_TOLERANCE, int8 by cosine); both are warm-ups,
    untimed. Then, timed in seconds per input sample (batches of different lengths compare; ECAPA's cost is
    linear in frames), until each engine has `race_batches` timings (2 when they are clearly apart), the lower
    median wins, and one line says which and by how much:

    - fp32 (live race): the engines alternate on the run's next batches, so no batch is computed twice. Their
      embeddings agree within EXPORT_TOLERANCE, so which engine computed a batch does not show in the rows.
      A run shorter than the race ends with both engines having computed part of it (`engine` says so).
    - int8: its embeddings differ from torch's by quantisation noise (~1e-2), so the rows of one run must come
      from one engine: identical audio gets identical scores. (Several CPU processes race each on its own:
      where the engines are close in speed, 1.06x was measured, two shards can pick different ones.)
      The race is run on the first batch alone, computed again by each engine in turn, and the winner's result
      is returned: a few batches' compute, once per run.

    A failure or a disagreement ends the race for torch, with one line; no batch is lost. `clock` times the
    batches (tests pass one that only the engines move, so the race's course does not depend on the load)."""

    def __init__(
        self, candidate: Embed, torch_embed: Embed, dim: int, precision: str, log: Callable[[str], None],
        race_batches: int = 3, clock: Callable[[], float] = time.perf_counter,
    ) -> None:  # fmt: skip
        self.candidate, self.torch_embed, self.dim, self.precision = candidate, torch_embed, dim, precision
        self.log, self.race_batches, self.clock = log, race_batches, clock
        self.live = precision == "fp32"
        self.name = str(getattr(candidate, "engine", "onnx"))
        self.per_sample: dict[str, list[float]] = {self.name: [], "torch": []}
        self.winner: Embed | None = None
        self.calls = 0

    @property
    def engine(self) -> str:
        if self.winner is None:
            return f"torch and {self.name} in turn (the run ended during the race)"
        return str(getattr(self.winner, "engine", "torch"))

    def __call__(self, wavs: torch.Tensor, lens: torch.Tensor) -> torch.Tensor:
        if self.winner is not None:
            return self.winner(wavs, lens)
        self.calls += 1
        if self.calls == 1:  # torch's batch, the candidate's check on a few of its windows: untimed warm-ups
            expected = self.torch_embed(wavs, lens)
            few = slice(0, CHECK_WINDOWS)
            found = self._candidate(wavs[few], lens[few])
            disagreement = None if found is None else _agreement(self.precision, found, expected[few])
            if disagreement:
                self._decide_torch(f"{disagreement} on the first batch")
            if self.live or self.winner is not None:
                return expected
            return self._race_on(wavs, lens, expected)
        racer = self.name if self.calls % 2 == 0 else "torch"
        out = self._timed(racer, wavs, lens)
        if out is None:  # the candidate failed: torch computes this batch and the rest
            return self.torch_embed(wavs, lens)
        if self._raced_enough():
            self._decide()
        return out

    def _timed(self, racer: str, wavs: torch.Tensor, lens: torch.Tensor) -> torch.Tensor | None:
        started = self.clock()
        out = self._candidate(wavs, lens) if racer == self.name else self.torch_embed(wavs, lens)
        if out is not None:
            self.per_sample[racer].append((self.clock() - started) / max(1, wavs.numel()))
        return out

    def _race_on(self, wavs: torch.Tensor, lens: torch.Tensor, expected: torch.Tensor) -> torch.Tensor:
        """The int8 race: the first batch again and again, each engine in turn; the winner's embeddings."""
        results = {"torch": expected}
        while not self._raced_enough():
            for racer in (self.name, "torch"):
                out = self._timed(racer, wavs, lens)
                if out is None:  # the candidate failed (one line said so): torch's result stands
                    return expected
                results[racer] = out
        self._decide()
        return results["torch"] if self.winner is self.torch_embed else results[self.name]

    def _raced_enough(self) -> bool:
        """`race_batches` timed batches each; or 2 each when every batch of one engine was faster than every
        batch of the other (a clear gap: each batch raced costs the run the gap, ~2x with int8)."""
        onnx_s, torch_s = self.per_sample[self.name], self.per_sample["torch"]
        if min(len(onnx_s), len(torch_s)) >= self.race_batches:
            return True
        return min(len(onnx_s), len(torch_s)) >= 2 and (
            max(onnx_s) < min(torch_s) or max(torch_s) < min(onnx_s)
        )

    def _candidate(self, wavs: torch.Tensor, lens: torch.Tensor) -> torch.Tensor | None:
        try:
            return checked_output(self.candidate(wavs, lens), wavs, self.dim)
        except Exception as error:  # noqa: BLE001 - any engine failure: torch takes over, rows are kept
            self._decide_torch(f"failed on a batch of {wavs.shape[0]} windows: {type(error).__name__}: "
                               f"{first_line(error)}")  # fmt: skip
            return None

    def _decide_torch(self, why: str) -> None:
        self.winner = self.torch_embed
        self.log(f"inference engine: torch ({self.name} {why})")

    def _decide(self) -> None:
        onnx_s, torch_s = (float(np.median(self.per_sample[name])) for name in (self.name, "torch"))
        raced = len(self.per_sample["torch"])
        where = "of the run's batches each" if self.live else "runs each on the run's first batch"
        timing = (
            f"{onnx_s * 1e9:.0f} vs torch {torch_s * 1e9:.0f} ns per input sample, median of {raced} {where}"
        )
        if onnx_s < torch_s:
            reason = f"{self.name}, {torch_s / onnx_s:.2f}x torch ({timing})"
            self.winner = GuardedEmbedder(self.candidate, self.torch_embed, self.dim, reason, self.log)
            self.log(f"inference engine: {reason}")
        else:
            self.winner = self.torch_embed
            self.log(f"inference engine: torch, {onnx_s / torch_s:.2f}x faster than {self.name} ({timing})")


def probe_windows(model: SpeakerClassifier, count: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """`count` full windows of quiet noise: a batch shaped as inference shapes it, for a check."""
    generator = torch.Generator().manual_seed(seed)
    return 0.05 * torch.randn(count, model.config.window_samples, generator=generator), torch.ones(count)


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


def make_embedder(
    model: SpeakerClassifier,
    engine: str = "auto",
    *,
    onnx_path: str | Path | None = None,
    int8_path: str | Path | None = None,
    threads: int | None = None,
    batch_windows: int = 8,
    torch_embed: Embed | None = None,
    log: Callable[[str], None] = print,
) -> Embed:
    """The `embed(wavs, lens)` for CPU inference with `model` (in eval mode, on the CPU), announced in a
    printed line that says which engine runs and why.

    engine "torch": PyTorch eager. "onnx": ONNX Runtime, the int8 file if given, else the fp32 one, exported
    here from `model` when `onnx_path` is None (needs onnxscript), checked against torch on a probe batch of
    `batch_windows` windows. "auto": when ONNX Runtime is installed and its session loads, torch and ONNX
    Runtime race on the run's first batches and the faster computes the rest (RacingEmbedder; a second line
    says which won); else torch. `threads`: ONNX Runtime's intra-op threads (None: the available cores).
    `torch_embed`: the torch computation to fall back on (default TorchEmbedder(model)).
    Never raises for an engine problem: whatever fails falls back to torch with one printed line, at set-up
    or on the first batch that fails (GuardedEmbedder, RacingEmbedder).
    """
    if engine not in ENGINES:
        raise ValueError(f"engine={engine!r}: use one of {', '.join(ENGINES)}")
    torch_embed = torch_embed or TorchEmbedder(model)
    if engine == "torch":
        log("inference engine: torch (engine='torch')")
        return torch_embed
    threads = threads or available_cores()
    try:
        candidate = _onnx_candidate(model, onnx_path, int8_path, threads)
        if engine == "onnx":
            wavs, lens = probe_windows(model, batch_windows)
            disagreement = _agreement(candidate.precision, candidate(wavs, lens), torch_embed(wavs, lens))
            if disagreement:
                raise ExportError(f"{candidate.path.name}: {disagreement} on the probe batch")
    except Exception as error:  # noqa: BLE001 - never raise: torch is always there
        log(
            f"inference engine: torch (ONNX Runtime unavailable: {type(error).__name__}: {first_line(error)})"
        )
        return torch_embed
    where = f"{threads} thread(s), {candidate.path.name}"
    if engine == "auto":
        log(f"inference engine: auto: torch and {candidate.engine} ({where}) race on the run's first batches")
        return RacingEmbedder(candidate, torch_embed, model.config.embedding_size, candidate.precision, log)
    reason = f"{candidate.engine}, {where}; agrees with torch on a probe batch of {batch_windows} windows"
    log(f"inference engine: {reason}")
    return GuardedEmbedder(candidate, torch_embed, model.config.embedding_size, reason, log)


def _onnx_candidate(
    model: SpeakerClassifier, onnx_path: str | Path | None, int8_path: str | Path | None, threads: int
) -> OnnxEmbedder:
    """The ONNX Runtime embedder of the int8 file if given, else of the fp32 one (exported here when None);
    raises with the reason when there is none to use."""
    missing = onnxruntime_missing()
    if missing:
        raise ExportError(missing)
    with contextlib.ExitStack() as stack:
        if int8_path is not None:
            path, precision = Path(int8_path), "int8"
        elif onnx_path is not None:
            path, precision = Path(onnx_path), "fp32"
        else:  # no file: export here (the session holds the graph once loaded; the file can go)
            folder = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="onnx-engine-")))
            path, precision = export_embedding_model(model, folder / ONNX_FP32).path, "fp32"
        return OnnxEmbedder(model, path, threads, precision)
