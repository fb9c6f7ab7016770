"""Multi-GPU (and multi-process CPU) training with DistributedDataParallel.

One process per device, started by the project's spawn launcher with the entry point in this importable
module, so it works from a notebook cell even after the notebook touched CUDA (the seed notes' two errors).
Under `torchrun` (RANK/LOCAL_RANK/WORLD_SIZE set) the same entry point runs directly for its rank, on one node
or several. NCCL on GPUs; gloo on CPU, which is how this path is tested here. Each rank trains on a disjoint
shard; only rank 0 writes. The training function is handed in (`launch_ddp(fn, ...)`): this module runs it,
it never imports it.

Collectives wait at most `collective_timeout_s` (NCCL's default is 10 min, gloo's 30): long enough for every
wait the training loop has (a checkpoint save on rank 0, validation shards of unequal length), short enough
that a rank that died or hangs stops the run instead of burning the session. Nothing after the last
collective makes the other ranks wait: rank 0 saves the artifact while they leave.
"""

from __future__ import annotations

import contextlib
import datetime
import os
import sys
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from .launch import check_worker_importable, launch, running_under_torchrun
from .probe import Topology
from .strategy import SingleDevice


class DDPStrategy(SingleDevice):
    name = "ddp"

    def __init__(self, device: torch.device, precision: str, rank: int, world_size: int) -> None:
        super().__init__(device, precision)
        self.rank, self.world_size = rank, world_size

    def setup_model(self, model: torch.nn.Module) -> torch.nn.Module:
        device_ids = [self.device.index] if self.device.type == "cuda" else None
        return DistributedDataParallel(model.to(self.device), device_ids=device_ids)

    def shard(self, indices: Sequence[int]) -> list[int]:
        """Every world_size-th row from this rank's offset: disjoint shards that together cover the data."""
        return list(indices)[self.rank :: self.world_size]

    def no_sync(self, model: torch.nn.Module) -> contextlib.AbstractContextManager:
        return model.no_sync()

    def sum_across(self, values: torch.Tensor) -> torch.Tensor:
        values = values.to(self.device).clone()
        dist.all_reduce(values)
        return values.cpu()

    def broadcast_flags(self, *flags: bool) -> tuple[bool, ...]:
        """Rank 0's flags, in one broadcast (and one device-to-host copy) for all of them."""
        tensor = torch.tensor([1 if flag else 0 for flag in flags], device=self.device)
        dist.broadcast(tensor, src=0)
        return tuple(bool(v) for v in tensor.tolist())

    def broadcast_object(self, value: Any) -> Any:
        """Rank 0's `value` on every rank (pickled; e.g. the checkpoint only rank 0 could read)."""
        box = [value if self.rank == 0 else None]
        dist.broadcast_object_list(box, src=0, device=self.device if self.device.type == "cuda" else None)
        return box[0]

    def barrier(self) -> None:
        dist.barrier()

    def sync_buffers(self, model: torch.nn.Module) -> None:
        for buffer in self.unwrap(model).buffers():
            dist.broadcast(buffer.data, src=0)

    def describe(self) -> str:
        return f"DDP rank {self.rank}/{self.world_size} on {self.device} ({self.precision})"


def launch_ddp(
    fn: Callable[..., Any], args: tuple, topology: Topology, precision: str, collective_timeout_s: float
) -> Any:
    """Run `fn(strategy, *args)` on every device and return rank 0's result."""
    check_worker_importable(fn)  # it is pickled by reference for the spawned ranks
    entry_args = (fn, args, topology, precision, collective_timeout_s)
    if running_under_torchrun():
        return ddp_entry(int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), *entry_args)
    print(f"launching {topology.num_devices} training processes (spawn); rank 0 reports")
    return launch(ddp_entry, nprocs=topology.num_devices, args=entry_args)[0]


def rank_device(accelerator: str, local_rank: int, visible_gpus: int) -> torch.device:
    """This rank's device: its own GPU (LOCAL_RANK among the visible ones; GPU 0 when the scheduler shows each
    process only its own, as SLURM's per-task CUDA_VISIBLE_DEVICES does), or the CPU."""
    if accelerator != "cuda":
        return torch.device("cpu")
    if visible_gpus == 1:
        return torch.device("cuda", 0)
    if local_rank >= visible_gpus:
        raise RuntimeError(
            f"LOCAL_RANK={local_rank} but this process sees {visible_gpus} GPU(s); start at most "
            f"{visible_gpus} processes per node"
        )
    return torch.device("cuda", local_rank)


def ddp_entry(
    rank: int,
    world_size: int,
    fn: Callable[..., Any],
    args: tuple,
    topology: Topology,
    precision: str,
    collective_timeout_s: float,
) -> Any:
    """One rank: join the process group, run `fn` with a DDPStrategy, leave the group."""
    local_rank = int(os.environ.get("LOCAL_RANK", rank))
    visible = torch.cuda.device_count() if topology.accelerator == "cuda" else 0
    device = rank_device(topology.accelerator, local_rank, visible)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    else:
        # Share this node's cores instead of oversubscribing them: N ranks x all cores each thrashes.
        local_world = int(os.environ.get("LOCAL_WORLD_SIZE") or world_size)
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // local_world))
    backend = "nccl" if device.type == "cuda" else "gloo"
    timeout = datetime.timedelta(seconds=collective_timeout_s)
    # gloo prints "[Gloo] Rank N is connected ..." from C++, interleaved per rank
    with _native_stdout_silenced():
        dist.init_process_group(backend, rank=rank, world_size=world_size, timeout=timeout)
    try:
        return fn(DDPStrategy(device, precision, rank, world_size), *args)
    finally:
        with contextlib.suppress(Exception):  # leaving: a peer that already left must not fail this rank
            dist.destroy_process_group()


@contextlib.contextmanager
def _native_stdout_silenced():
    """File descriptor 1 pointed at /dev/null for the duration (native code writes there, past sys.stdout);
    errors still arrive as exceptions and on stderr."""
    sys.stdout.flush()
    saved = os.dup(1)
    try:
        with open(os.devnull, "w") as null:
            os.dup2(null.fileno(), 1)
        yield
    finally:
        os.dup2(saved, 1)
        os.close(saved)
