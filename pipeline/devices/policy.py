"""The hardware policy: parameters + this session's hardware -> how training runs (Lightning Fabric's connector).

`decide` is the one place that turns TrainConfig's hardware fields and the detected topology into a strategy,
a precision, the batch plan and the input pipeline's worker count (the training plan, training/plan.py, calls
it among the rest of what auto leaves open); `python -m pipeline doctor`
calls it too, so what doctor prints is what training does. `run` is the launcher: it builds the strategy the
plan names and calls the function it is handed, `fn(strategy, plan, *args)`, in every process of the
topology (one process for a single device or XLA SPMD, one spawned process per device for DDP, or the
processes torchrun already started). This layer never imports the training code: it only runs what it is
given.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..core.config import ConfigError, TrainConfig
from ..core.progress import plural
from ..core.scaling import BatchPlan, plan_batch
from .launch import running_under_torchrun
from .probe import Runner, Topology, detect_topology
from .threads import available_cores

# Per-device batch when per_device_batch_size is left to the hardware. TPU: torch_xla traces every step in
# Python again, ~100-200 ms for ECAPA-TDNN whatever the batch (the graph has the same ~6,000 operations), while
# a v5e chip needs ~0.15 ms per window of the voxceleb model: at 32 windows per device the chips idle most of
# every step, and 128 moves four times as much data through the same trace (benchmarks/xla_step.py). Small
# training sets keep at least MIN_TPU_STEPS_PER_EPOCH steps per epoch instead (never below 16 per device).
AUTO_PER_DEVICE_BATCH = {"tpu": 128, "cuda": 32, "cpu": 32}
MIN_TPU_STEPS_PER_EPOCH = 50
# DataLoader workers per training process when num_workers is left to the hardware: crops are cheap (one
# worker keeps a CPU or GPU step fed), XLA's host Fbank is not (~1 ms per window and core): there every core
# but two (the training process and its transfer thread) makes features, up to a cap that bounds memory.
MAX_TPU_WORKERS = 48


@dataclass(frozen=True)
class HardwarePlan:
    """How a run uses the session's hardware: printed at the start, recorded in the artifact."""

    topology: Topology
    strategy: str  # "single" | "ddp" | "xla-spmd"
    precision: str  # "fp32" | "bf16" | "fp16"
    batch: BatchPlan
    loader_workers: int  # DataLoader worker processes per training process

    def describe(self) -> str:
        return (
            f"{describe_topology(self.topology)}. {self.batch.describe()}; {self.precision}; input pipeline: "
            f"{plural(self.loader_workers, 'worker process')}"
            + (" per rank" if self.strategy == "ddp" else "")
        )


def session_topology(
    config: TrainConfig, env: dict[str, str] | None = None, runner: Runner | None = None
) -> Topology:
    """The topology to train on. Under torchrun the processes already exist: their number is the device count
    (WORLD_SIZE, over every node), `devices` must agree with it, and only this node's share (LOCAL_WORLD_SIZE)
    is checked against this node's hardware."""
    e = os.environ if env is None else env
    if not running_under_torchrun(e):
        return detect_topology(config.accelerator, config.devices, env=env, runner=runner)
    world = int(e["WORLD_SIZE"])
    local = int(e.get("LOCAL_WORLD_SIZE") or world)
    if config.devices not in (None, world):
        raise ConfigError(
            f"parameter devices={config.devices} but torchrun started WORLD_SIZE={world} "
            "processes; leave devices unset under torchrun"
        )
    here = detect_topology(config.accelerator, None, env=env, runner=runner)
    # One visible GPU: the scheduler gave each process its own (CUDA_VISIBLE_DEVICES per process, e.g. SLURM).
    if here.accelerator == "cuda" and 1 < here.num_devices < local:
        raise ConfigError(
            f"torchrun started {local} processes on this node (LOCAL_WORLD_SIZE) but only "
            f"{here.num_devices} GPU(s) are visible ({here.detail}); use --nproc_per_node "
            f"{here.num_devices}"
        )
    return dataclasses.replace(
        here,
        num_devices=world,
        detail=f"{here.detail}; torchrun: {world} processes on {plural(max(1, world // local), 'node')}",
    )


def describe_topology(topology: Topology) -> str:
    many = topology.num_devices > 1
    how, unit = {
        "tpu": ("XLA SPMD" if many else "XLA", "XLA device"),
        "cuda": ("DDP" if many else "single GPU", "GPU"),
        "cpu": ("gloo DDP" if many else "eager", "CPU process"),
    }[topology.accelerator]
    count = plural(topology.num_devices, unit)
    return f"{topology.accelerator.upper()}: {count} ({how}, {topology.device_kind})"


def resolve_precision(requested: str, topology: Topology) -> str:
    """bf16 on TPU and on GPUs with native bf16; fp16 + loss scaling on T4 (no native bf16); fp32 on CPU."""
    if requested == "fp16" and topology.accelerator == "tpu":
        raise ConfigError(
            "parameter precision='fp16' is not available on TPU (its matrix units take bf16); "
            "use 'bf16' (the default there) or 'fp32'"
        )
    if requested != "auto":
        return requested
    cuda = "bf16" if topology.bf16_native else "fp16"
    return {"tpu": "bf16", "cuda": cuda}.get(topology.accelerator, "fp32")


def loader_workers(requested: int | None, topology: Topology, cpus: int | None = None) -> int:
    """DataLoader workers per training process (see MAX_TPU_WORKERS)."""
    if requested is not None:
        return requested
    cpus = cpus or available_cores()  # the affinity mask capped by a container's CPU quota
    if topology.accelerator == "tpu":
        return max(1, min(MAX_TPU_WORKERS, cpus - 2))
    return max(1, min(4, cpus // topology.num_devices - 1))


def auto_per_device_batch(topology: Topology, train_rows: int | None = None) -> int:
    """The per-device batch when the parameter is left to the hardware (see AUTO_PER_DEVICE_BATCH)."""
    batch = AUTO_PER_DEVICE_BATCH[topology.accelerator]
    if topology.accelerator == "tpu" and train_rows is not None:
        fits = train_rows // (topology.num_devices * MIN_TPU_STEPS_PER_EPOCH) // 8 * 8
        batch = max(16, min(batch, fits))
    return batch


def decide(
    config: TrainConfig,
    topology: Topology | None = None,
    env: dict[str, str] | None = None,
    train_rows: int | None = None,
) -> HardwarePlan:
    """The plan for `config` on `topology` (default: this session's), for about `train_rows` training files."""
    topology = topology or session_topology(config, env)
    strategy = {"tpu": "xla-spmd"}.get(topology.accelerator, "ddp" if topology.num_devices > 1 else "single")
    precision = resolve_precision(config.precision, topology)
    workers = loader_workers(config.num_workers, topology)
    per_device = config.per_device_batch_size or auto_per_device_batch(topology, train_rows)
    batch = plan_batch(
        per_device_batch=per_device,
        num_devices=topology.num_devices,
        grad_accum=config.grad_accum,
        base_lr=config.base_lr,
        base_batch=config.base_batch_size,
        rule=config.lr_scaling,
        accelerator=topology.accelerator,
    )
    return HardwarePlan(topology, strategy, precision, batch, workers)


def run(plan: HardwarePlan, fn: Callable[..., Any], *args: Any, collective_timeout_s: float = 1800.0) -> Any:
    """Call `fn(strategy, plan, *args)` in every process of the plan's topology, each with the strategy this
    plan names for it; return the main process's result.

    `fn` must be importable by module and name (spawned DDP processes look it up there). DDP ranks give up
    on a collective after `collective_timeout_s` (see ddp.py)."""
    if plan.strategy == "ddp":
        from .ddp import launch_ddp

        return launch_ddp(fn, (plan, *args), plan.topology, plan.precision, collective_timeout_s)
    if plan.strategy == "xla-spmd":
        from .xla import XLASpmdStrategy  # the only import path that reaches torch_xla

        return fn(XLASpmdStrategy(plan.topology, plan.precision), plan, *args)
    import torch

    from .strategy import SingleDevice

    device = torch.device("cuda" if plan.topology.accelerator == "cuda" else "cpu")
    return fn(SingleDevice(device, plan.precision), plan, *args)
