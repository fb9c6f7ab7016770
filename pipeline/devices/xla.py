"""TPU training with torch_xla SPMD: one process drives all 8 devices (v3-8: 4 chips x 2 cores; v5e-8: 8 chips).

Why SPMD and not one process per core: the multi-process collectives hang on torch_xla's CPU backend (pytorch/xla
5005, 9089), so only SPMD can be tested here with 8 devices, and on a TPU VM it is the recommended mode.
The batch is sharded along a 1-D `data` mesh; the compiler inserts the gradient all-reduce. Shapes are static
(fixed windows, full batches), so the training step compiles once (twice: the first step also creates the
optimizer's state); features are computed on the host, in the DataLoader's worker processes, because
SpeechBrain's Fbank on the XLA device under SPMD crashed the compiler (../shared/NOTES.md). Validation runs on
the devices too, at one fixed batch shape (one more graph), and so does the BatchNorm recalibration before it
(one more): a validation pass on the host CPU would leave the chips idle for minutes at real size.

The host traces the step again at every step (lazy tensors) and pays per operation and per graph output;
on a TPU the chips wait for it unless the per-device batch is large (benchmarks/xla_step.py). Three remedies
keep that trace short without changing the arithmetic: the forward, loss and backward traced once per input
shape into one XLA computation that each step calls (xla_traced.py), functionalization off
(XLASpmdStrategy.__init__), and Adam with gradient clipping on one flat vector (flat_adam.py; the weight
average does the same in ema.py).

This module and xla_traced.py (imported only from here) are the only ones that import torch_xla; inference
never imports them.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Iterator

import numpy as np
import torch

from ..core.model import Frontend
from .flat_adam import FlatAdam, add_to_grads
from .probe import Topology
from .strategy import Batch, SingleDevice
from .xla_traced import NotTraceable, TracedGradients


class XLASpmdStrategy(SingleDevice):
    # SingleDevice's setup_model and shard: parameters replicated (no sharding annotation), one process reads
    # every row; only each batch is split across the devices (device_batches).
    name = "xla-spmd"
    features_on_host = True
    # The step's trace remedies (module docstring), all on. benchmarks/xla_step.py and the tests switch them off
    # on an instance, before its first step, to compare the step without each.
    flat_adam = True  # Adam and gradient clipping on one flat vector (flat_adam.py)
    reuse_flat_vectors = True  # that vector reused by the next step and by the weight average (flat_adam.py)
    # Forward, loss and backward traced once per input shape (xla_traced.py); a step that cannot be
    # (NotTraceable) turns it off for this instance.
    trace_once = True

    def __init__(self, topology: Topology, precision: str) -> None:
        # PyTorch's functionalization pass, for which torch_xla wraps every XLA tensor, replays views and
        # mutations at each operation: about half of the host's trace of this step (benchmarks/xla_step.py).
        # This is torch_xla's own switch to turn it off (2.7-2.9 and after; upstream runs its operator tests
        # with it, its TorchBench runs default to it), read at each operation: set before the first XLA
        # tensor. A value already set (to "0" to compare) is kept.
        os.environ.setdefault("XLA_DISABLE_FUNCTIONALIZATION", "1")
        import torch_xla  # TF_CPP_MIN_LOG_LEVEL was set when pipeline.devices was imported
        import torch_xla.debug.metrics as met
        import torch_xla.distributed.spmd as xs
        import torch_xla.runtime as xr

        xr.use_spmd()
        self._xs, self._met, self._torch_xla = xs, met, torch_xla
        self.num_devices = xr.global_runtime_device_count()
        if self.num_devices != topology.num_devices:
            raise RuntimeError(
                f"torch_xla sees {self.num_devices} devices but the topology says "
                f"{topology.num_devices}; check PJRT_DEVICE / TPU_* (or CPU_NUM_DEVICES for the CPU stand-in)"
            )
        # bf16 or fp32 (policy.resolve_precision refuses fp16 on TPU): no loss scaling.
        super().__init__(torch_xla.device(), precision)
        self.devices_per_process = self.num_devices
        self.mesh = xs.Mesh(np.arange(self.num_devices), (self.num_devices,), ("data",))
        self._frontend: torch.nn.Module | None = None  # host features for validation (training's come ready)
        self._compiles_at_start = self._compile_total()
        self._stepper: tuple[torch.optim.Optimizer, FlatAdam | None] | None = None
        self._order_checked: tuple[FlatAdam, bool] | None = None
        self._traced: TracedGradients | None = None
        self._gradient: torch.Tensor | None = None  # trace_once: the step's flat gradient, for optimizer_step

    def device_batches(self, batches: Iterator[Batch]) -> Iterator[Batch]:
        """torch_xla's background loader: host->device transfer overlaps the step, each tensor split along
        its batch dimension over the `data` mesh axis as it is sent. An error in the host pipeline is raised
        here, as itself: torch_xla's loader thread would end the iteration and leave only a StopIteration."""
        import torch_xla.distributed.parallel_loader as pl

        spec = self._xs.ShardingSpec
        sharding = {
            "inputs": spec(self.mesh, ("data", None, None)),
            "lens": spec(self.mesh, ("data",)),
            "labels": spec(self.mesh, ("data",)),
        }
        source = _ErrorKeeping(batches)
        loader = pl.ParallelLoader(source, [self.device], input_sharding=sharding)
        return _device_batches(loader, self.device, source)

    def embeddings(
        self, model: torch.nn.Module, wavs: torch.Tensor, lens: torch.Tensor, pad_to: int | None = None
    ) -> torch.Tensor:
        """Features on the host, embeddings on the devices: the batch padded to `pad_to` windows (one graph for
        every batch of a validation pass) and sharded over the mesh when it divides evenly."""
        if self._frontend is None:
            self._frontend = Frontend(model.config.n_mels, model.config.sample_rate, model.config.frontend)
        count = len(wavs)
        with torch.no_grad():
            feats = self._frontend(wavs, lens)
        if pad_to is not None and count < pad_to:
            feats = torch.cat([feats, feats.new_zeros((pad_to - count, *feats.shape[1:]))])
            lens = torch.cat([lens, lens.new_ones(pad_to - count)])
        feats, lens = feats.to(self.device), lens.to(self.device)
        if len(feats) % self.num_devices == 0:
            self._xs.mark_sharding(feats, self.mesh, ("data", None, None))
            self._xs.mark_sharding(lens, self.mesh, ("data",))
        with self.autocast():
            embedded = model.embed(feats, lens).float()
        # One graph for everything pending: in train mode (BatchNorm recalibration) that includes the running
        # statistics; left pending, each buffer read later would compile a graph of its own.
        self._torch_xla.sync()
        return embedded.cpu()[:count]

    def forward_backward(
        self, model: torch.nn.Module, loss_fn: Callable, batch: Batch, micro_batches: int = 1
    ) -> torch.Tensor:
        if not self.trace_once:
            return super().forward_backward(model, loss_fn, batch, micro_batches)
        if self._traced is None or self._traced.model is not model:
            self._traced = TracedGradients(model)
        try:
            loss, gradient = self._traced(
                loss_fn, batch["inputs"], batch["lens"], batch["labels"], self.autocast
            )
        except NotTraceable as error:
            print(f"XLA: {error}: its forward and backward are traced at every step instead", flush=True)
            self.trace_once = False
            return super().forward_backward(model, loss_fn, batch, micro_batches)
        if micro_batches != 1:
            loss, gradient = loss / micro_batches, gradient / micro_batches
        self._gradient = gradient if self._gradient is None else self._gradient + gradient
        return loss

    def optimizer_step(self, optimizer: torch.optim.Optimizer, model: torch.nn.Module, clip: float) -> None:
        # Under SPMD the gradients are already global: a plain step, no xm.optimizer_step all-reduce.
        if self._stepper is None or self._stepper[0] is not optimizer:
            usable = self.flat_adam and FlatAdam.supports(optimizer)
            self._stepper = (optimizer, FlatAdam(optimizer, self.reuse_flat_vectors) if usable else None)
        flat = self._stepper[1]
        gradient, self._gradient = self._gradient, None
        if gradient is not None and (flat is None or not _same_tensors(flat.params, self._traced.params)):
            # An optimizer over other tensors than the traced ones (freeze_encoder's): gradients the usual way.
            add_to_grads(self._traced.params, gradient)
            gradient = None
        if flat is not None:
            flat.step(clip, gradient)
        else:
            torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
            optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    def flat_parameters(self, model: torch.nn.Module) -> torch.Tensor | None:
        flat = self._stepper[1] if self._stepper is not None else None
        if flat is None or not self.reuse_flat_vectors:
            return None
        # Checked once per optimizer: its vector must hold model.parameters(), in order (not with
        # freeze_encoder, whose optimizer holds the classifier alone).
        if self._order_checked is None or self._order_checked[0] is not flat:
            self._order_checked = (flat, _same_tensors(list(model.parameters()), flat.params))
        return flat.flat_parameters() if self._order_checked[1] else None

    def mark_step(self) -> None:
        self._torch_xla.sync()

    def compile_count(self) -> int:
        """XLA graph compilations since this strategy started (the whole run's, for provenance)."""
        return self._compile_total() - self._compiles_at_start

    def uncached_compiles(self) -> int:
        """torch_xla's graph-cache misses, including the trivial graphs that materialise tensors for transfer
        (weights copied to the host for validation and saving); CompileTime counts real compilations."""
        return int(self._met.counter_value("UncachedCompile") or 0)

    def _compile_total(self) -> int:
        data = self._met.metric_data("CompileTime")
        return int(data[0]) if data else 0

    def describe(self) -> str:
        trace = (
            f"functionalization {'off' if functionalization_disabled() else 'on'}, "
            + ("flat Adam" if self.flat_adam else "foreach Adam")
            + (", flat vectors reused" if self.flat_adam and self.reuse_flat_vectors else "")
            + (", forward and backward traced once" if self.trace_once else "")
        )
        return f"XLA SPMD over {self.num_devices} devices ({self.precision}; step trace: {trace})"


def _same_tensors(a: list[torch.Tensor], b: list[torch.Tensor]) -> bool:
    return len(a) == len(b) and all(x is y for x, y in zip(a, b, strict=True))


def functionalization_disabled() -> bool:
    """XLA_DISABLE_FUNCTIONALIZATION as torch_xla reads it: "true", "false", else C's atoi (GetEnvBool in
    its runtime/sys_util.cpp)."""
    value = os.environ.get("XLA_DISABLE_FUNCTIONALIZATION")
    if value is None or value == "false":
        return False
    number = re.match(r"\s*[+-]?\d+", value)
    return value == "true" or (number is not None and int(number.group()) != 0)


class _ErrorKeeping:
    """The host batches for torch_xla's ParallelLoader, which iterates them in a thread of its own: an exception
    there would only end the iteration (a bare StopIteration here). It is kept, and `_device_batches` raises it."""

    def __init__(self, batches: Iterator[Batch]) -> None:
        self._batches = batches
        self.error: BaseException | None = None

    def __iter__(self) -> Iterator[Batch]:
        try:
            yield from self._batches
        except BaseException as error:
            self.error = error

    def __len__(self) -> int:  # ParallelLoader asks; the count only sizes its progress, not correctness
        return 0


def _device_batches(loader, device: torch.device, source: _ErrorKeeping) -> Iterator[Batch]:
    """The loader's batches on `device`; the host pipeline's error, if it ended with one; the loader's threads
    stopped when the consumer stops (a time-budget stop leaves it mid-run)."""
    try:
        yield from loader.per_device_loader(device)
        if source.error is not None:
            raise source.error
    finally:
        loader.close()
