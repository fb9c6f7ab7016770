"""TPU training with torch_xla SPMD: one process drives all 8 devices (v3-8: 4 chips x 2 cores; v5e-8: 8 chips).

Why SPMD and not one process per core: the multi-process collectives hang on torch_xla's CPU backend (pytorch/xla
5005, 9089), so only SPMD can be tested here with 8 devices, and on a TPU VM it is the recommended mode.
The batch is sharded along a 1-D `data` mesh; the compiler inserts the gradient all-reduce. Shapes are static
(fixed windows, full batches), so the training step compiles once; features are computed on the host because
SpeechBrain's Fbank on the XLA device under SPMD crashed the compiler (../shared/NOTES.md).

This is the only module that imports torch_xla; inference never imports it.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Sequence

import numpy as np
import torch

from ..model import Frontend, SpeakerClassifier, host_model
from .probe import Topology
from .strategy import SingleDevice


class XLASpmdStrategy(SingleDevice):
    name = "xla-spmd"
    features_on_host = True

    def __init__(self, topology: Topology, precision: str) -> None:
        # XLA's C++ logging prints a GSPMD deprecation warning per compiled graph; keep notebook logs readable.
        os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
        import torch_xla
        import torch_xla.debug.metrics as met
        import torch_xla.distributed.spmd as xs
        import torch_xla.runtime as xr

        xr.use_spmd()
        self._xs, self._met, self._torch_xla = xs, met, torch_xla
        self.num_devices = xr.global_runtime_device_count()
        if self.num_devices != topology.num_devices:
            raise RuntimeError(f"torch_xla sees {self.num_devices} devices but the topology says "
                               f"{topology.num_devices}; check PJRT_DEVICE / TPU_* (or CPU_NUM_DEVICES for the CPU stand-in)")  # fmt: skip
        super().__init__(torch_xla.device(), precision)
        self.scaler = None  # bf16 needs no loss scaling
        self.devices_per_process = self.num_devices
        self.mesh = xs.Mesh(np.arange(self.num_devices), (self.num_devices,), ("data",))
        self._frontend: torch.nn.Module | None = None
        self._compiles_at_start = self._compile_total()

    def setup_model(self, model: SpeakerClassifier) -> torch.nn.Module:
        # Parameters are replicated (no sharding annotation); only the batch is split across devices.
        self._frontend = Frontend(model.config.n_mels)
        return model.to(self.device)

    def shard(self, indices: Sequence[int]) -> list[int]:
        return list(indices)  # one process sees every row; the devices split each global batch

    def host_features(self, wavs: torch.Tensor, lens: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            return self._frontend(wavs, lens)

    def device_batches(self, batches: Iterator[dict[str, torch.Tensor]]) -> Iterator[dict[str, torch.Tensor]]:
        """torch_xla's background loader: host->device transfer overlaps the step, each tensor split along
        its batch dimension over the `data` mesh axis as it is sent."""
        import torch_xla.distributed.parallel_loader as pl

        spec = self._xs.ShardingSpec
        sharding = {
            "inputs": spec(self.mesh, ("data", None, None)),
            "lens": spec(self.mesh, ("data",)),
            "labels": spec(self.mesh, ("data",)),
        }
        return iter(pl.MpDeviceLoader(_Replayable(batches), self.device, input_sharding=sharding))

    def autocast(self) -> contextlib.AbstractContextManager:
        # torch.autocast("xla") works on the CPU backend too; torch_xla.amp.autocast breaks there in 2.9.
        if self.precision == "bf16":
            return torch.autocast("xla", dtype=torch.bfloat16)
        return contextlib.nullcontext()

    def optimizer_step(self, optimizer: torch.optim.Optimizer, model: torch.nn.Module, clip: float) -> None:
        # Under SPMD the gradients are already global: a plain step, no xm.optimizer_step all-reduce.
        torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    def mark_step(self) -> None:
        self._torch_xla.sync()

    def eval_model(self, model: torch.nn.Module) -> tuple[torch.nn.Module, torch.device]:
        """Validate on a CPU copy: a validation pass on XLA would compile one more graph per batch shape."""
        source = self.unwrap(model)
        weights = {k: v.detach().to("cpu") for k, v in source.state_dict().items()}
        return host_model(source, weights), torch.device("cpu")

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
        return f"XLA SPMD over {self.num_devices} devices ({self.precision})"


class _Replayable:
    """MpDeviceLoader iterates its loader once per `iter()`; wrap a generator so that works."""

    def __init__(self, batches: Iterator[dict[str, torch.Tensor]]) -> None:
        self._batches = batches

    def __iter__(self) -> Iterator[dict[str, torch.Tensor]]:
        return self._batches

    def __len__(self) -> int:  # ParallelLoader asks; the count only sizes its progress, not correctness
        return 0
