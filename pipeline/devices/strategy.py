"""How one training step reaches the hardware (Lightning Fabric's "strategy"), so train.py stays device-agnostic.

`Strategy` is what the training code asks of one; `SingleDevice` implements all of it, and `DDPStrategy`
(ddp.py) and `XLASpmdStrategy` (xla.py) override the parts that differ: how the model is wrapped, which rows a
process reads, precision and how metrics are reduced.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from typing import Protocol, runtime_checkable

import torch

from ..core.model import embed_waveforms

Batch = dict[str, torch.Tensor]  # "inputs", "lens", "labels": a batch as training feeds it


@runtime_checkable
class Strategy(Protocol):
    """What pipeline.training uses of a strategy (SingleDevice documents each member)."""

    name: str
    device: torch.device
    precision: str
    rank: int
    devices_per_process: int
    features_on_host: bool
    scaler: torch.amp.GradScaler | None

    @property
    def is_main(self) -> bool: ...
    def setup_model(self, model: torch.nn.Module) -> torch.nn.Module: ...
    def unwrap(self, model: torch.nn.Module) -> torch.nn.Module: ...
    def shard(self, indices: Sequence[int]) -> list[int]: ...
    def device_batches(self, batches: Iterator[Batch]) -> Iterator[Batch]: ...
    def forward_backward(
        self, model: torch.nn.Module, loss_fn: Callable, batch: Batch, micro_batches: int = 1
    ) -> torch.Tensor: ...
    def no_sync(self, model: torch.nn.Module) -> contextlib.AbstractContextManager: ...
    def optimizer_step(
        self, optimizer: torch.optim.Optimizer, model: torch.nn.Module, clip: float
    ) -> None: ...
    def flat_parameters(self, model: torch.nn.Module) -> torch.Tensor | None: ...
    def mark_step(self) -> None: ...
    def embeddings(
        self, model: torch.nn.Module, wavs: torch.Tensor, lens: torch.Tensor, pad_to: int | None = None
    ) -> torch.Tensor: ...
    def sync_buffers(self, model: torch.nn.Module) -> None: ...
    def sum_across(self, values: torch.Tensor) -> torch.Tensor: ...
    def broadcast_flags(self, *flags: bool) -> tuple[bool, ...]: ...
    def broadcast_object(self, value: object) -> object: ...
    def compile_count(self) -> int | None: ...
    def uncached_compiles(self) -> int | None: ...
    def describe(self) -> str: ...


class SingleDevice:
    """One process, one device: CPU, or one GPU."""

    name = "single"
    world_size = 1
    rank = 0
    features_on_host = False  # XLA computes Fbank on the host (it crashed the XLA compiler under SPMD)
    devices_per_process = 1  # SPMD drives all devices from one process, so it feeds the global batch

    def __init__(self, device: torch.device, precision: str = "fp32") -> None:
        self.device = device
        self.precision = precision
        # fp16 needs loss scaling (T4 has no native bf16); bf16 and fp32 do not.
        self.scaler = torch.amp.GradScaler(device.type) if precision == "fp16" else None

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def setup_model(self, model: torch.nn.Module) -> torch.nn.Module:
        return model.to(self.device)

    def unwrap(self, model: torch.nn.Module) -> torch.nn.Module:
        return getattr(model, "module", model)

    def shard(self, indices: Sequence[int]) -> list[int]:
        """The rows this process trains on; every process gets a disjoint part."""
        return list(indices)

    def autocast(self) -> contextlib.AbstractContextManager:
        # On XLA this is torch.autocast("xla"), which works on the CPU backend too; torch_xla.amp.autocast
        # breaks there in 2.9.
        dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(self.precision)
        return torch.autocast(self.device.type, dtype=dtype) if dtype else contextlib.nullcontext()

    def device_batches(self, batches: Iterator[Batch]) -> Iterator[Batch]:
        """Move host batches to the device (XLA overrides this with a sharding-aware background loader)."""
        for batch in batches:
            yield {k: v.to(self.device, non_blocking=True) for k, v in batch.items()}

    def forward_backward(
        self, model: torch.nn.Module, loss_fn: Callable, batch: Batch, micro_batches: int = 1
    ) -> torch.Tensor:
        """Forward, loss (divided by the step's `micro_batches`) and backward of one micro-batch on this device;
        returns the loss, detached. XLA traces all three once instead of at every step (xla_traced.py)."""
        with self.autocast():
            scores = model(batch["inputs"], batch["lens"], features_ready=self.features_on_host)
        loss = loss_fn(scores, batch["labels"]) / micro_batches
        self.backward(loss)
        return loss.detach()

    def backward(self, loss: torch.Tensor) -> None:
        (self.scaler.scale(loss) if self.scaler else loss).backward()

    def optimizer_step(self, optimizer: torch.optim.Optimizer, model: torch.nn.Module, clip: float) -> None:
        if self.scaler:
            self.scaler.unscale_(optimizer)
        torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
        if self.scaler:
            self.scaler.step(optimizer)
            self.scaler.update()
        else:
            optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    def flat_parameters(self, model: torch.nn.Module) -> torch.Tensor | None:
        """`model.parameters()` as one vector, when the last optimizer_step left one (XLA's flat Adam): the
        weight average takes it instead of flattening the parameters again."""
        return None

    def no_sync(self, model: torch.nn.Module) -> contextlib.AbstractContextManager:
        """Skip gradient all-reduce on accumulation micro-steps (DDP); nothing to skip here."""
        return contextlib.nullcontext()

    def embeddings(
        self, model: torch.nn.Module, wavs: torch.Tensor, lens: torch.Tensor, pad_to: int | None = None
    ) -> torch.Tensor:
        """Window embeddings of `model` (an unwrapped SpeakerClassifier on this device, in the mode the caller
        set) for host waveforms [n, samples], returned on the host in fp32. `pad_to`: the caller allows the
        batch to be padded to that many windows (rows are independent in eval mode; XLA uses it to run every
        batch with one shape)."""
        return embed_waveforms(model, wavs, lens, self.device, self.autocast())

    def sum_across(self, values: torch.Tensor) -> torch.Tensor:
        """Sum a small tensor of metrics over processes (identity for one process)."""
        return values

    def broadcast_flags(self, *flags: bool) -> tuple[bool, ...]:
        """Rank 0's decisions (e.g. "time budget reached", "checkpoint due"), so every process acts at the
        same step."""
        return flags

    def broadcast_object(self, value: object) -> object:
        """Rank 0's `value` on every process (resume: only rank 0 reads the checkpoint)."""
        return value

    def barrier(self) -> None:
        pass

    def sync_buffers(self, model: torch.nn.Module) -> None:
        """Make BatchNorm running statistics equal on every process (DDP only broadcasts them before each
        forward, so each rank's last forward leaves its own)."""

    def mark_step(self) -> None:
        """Cut the lazy graph (XLA); nothing to do for eager devices."""

    def compile_count(self) -> int | None:
        return None

    def uncached_compiles(self) -> int | None:
        return None

    def describe(self) -> str:
        return f"{self.device} ({self.precision})"
