"""Multi-GPU (and multi-process CPU) training with DistributedDataParallel.

One process per device, started by the project's spawn launcher with the worker in this importable module,
so it works from a notebook cell even after the notebook touched CUDA (the seed notes' two errors). Under
`torchrun` (RANK/LOCAL_RANK/WORLD_SIZE set) the same worker runs directly for its rank. NCCL on GPUs; gloo
on CPU, which is how this path is tested here. Each rank trains on a disjoint shard; only rank 0 writes.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
from collections.abc import Sequence

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from ..config import TrainConfig
from ..scaling import BatchPlan
from .launch import launch, running_under_torchrun
from .probe import Topology
from .strategy import SingleDevice


class DDPStrategy(SingleDevice):
    name = "ddp"

    def __init__(self, device: torch.device, precision: str, rank: int, world_size: int) -> None:
        super().__init__(device, precision)
        self.rank, self.world_size = rank, world_size

    def setup_model(self, model: torch.nn.Module) -> torch.nn.Module:
        model = model.to(self.device)
        device_ids = [self.device.index] if self.device.type == "cuda" else None
        return DistributedDataParallel(model, device_ids=device_ids)

    def shard(self, indices: Sequence[int]) -> list[int]:
        """Every world_size-th row from this rank's offset: disjoint shards that together cover the data."""
        return list(indices)[self.rank :: self.world_size]

    def no_sync(self, model: torch.nn.Module) -> contextlib.AbstractContextManager:
        return model.no_sync()

    def sum_across(self, values: torch.Tensor) -> torch.Tensor:
        values = values.to(self.device).clone()
        dist.all_reduce(values)
        return values.cpu()

    def broadcast_flag(self, flag: bool) -> bool:
        tensor = torch.tensor([1 if flag else 0], device=self.device)
        dist.broadcast(tensor, src=0)
        return bool(tensor.item())

    def barrier(self) -> None:
        dist.barrier()

    def sync_buffers(self, model: torch.nn.Module) -> None:
        for buffer in self.unwrap(model).buffers():
            dist.broadcast(buffer.data, src=0)

    def describe(self) -> str:
        return f"DDP rank {self.rank}/{self.world_size} on {self.device} ({self.precision})"


def train_ddp(config: TrainConfig, topology: Topology, plan: BatchPlan, precision: str):
    """Run `ddp_worker` on every device and return rank 0's TrainResult."""
    if running_under_torchrun():
        return ddp_worker(
            int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), config, topology, plan, precision
        )
    print(f"launching {topology.num_devices} training processes (spawn); rank 0 reports")
    results = launch(ddp_worker, nprocs=topology.num_devices, args=(config, topology, plan, precision))
    return results[0]


def ddp_worker(
    rank: int, world_size: int, config: TrainConfig, topology: Topology, plan: BatchPlan, precision: str
):
    """One rank: join the process group, train with DDPStrategy, leave the group."""
    from ..train import fit  # imported here: train.py imports this module lazily too

    local_rank = int(os.environ.get("LOCAL_RANK", rank))
    # Threads are set per rank below; a progress bar from a child would reach the notebook as raw "\r" text.
    config = dataclasses.replace(config, num_threads=None, progress=False)
    if topology.accelerator == "cuda":
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
        backend = "nccl"
    else:
        device = torch.device("cpu")
        # Share the cores instead of oversubscribing them: N ranks x all cores each thrashes.
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // world_size))
        backend = "gloo"
    dist.init_process_group(backend, rank=rank, world_size=world_size)
    try:
        strategy = DDPStrategy(device, precision, rank, world_size)
        return fit(config, strategy, plan, topology)
    finally:
        dist.destroy_process_group()
