"""Module-level workers: `launch` calls each as worker(rank, world_size, *args) in a spawned process."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any


def square_shard(rank: int, world_size: int, xs: list[int]) -> list[int]:
    """The notebook's `x*x` map, sharded: rank r squares xs[r::world_size]. Imports nothing heavy."""
    return [x * x for x in xs[rank::world_size]]


def allreduce_rank(rank: int, world_size: int) -> dict[str, Any]:
    """Join a gloo process group through the env vars `launch` set, all_reduce the ranks, report both."""
    env = {k: os.environ.get(k) for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")}
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method="env://")  # reads MASTER_ADDR/PORT, RANK, WORLD_SIZE
    try:
        t = torch.tensor([float(rank)])
        dist.all_reduce(t)
        return {"rank": rank, "dist_rank": dist.get_rank(), "sum": int(t.item()), "env": env}
    finally:
        dist.destroy_process_group()


def fail_on_rank(rank: int, world_size: int, bad_rank: int) -> int:
    if rank == bad_rank:
        raise ValueError(f"boom from rank {rank}")
    return rank


def hang(rank: int, world_size: int, pid_dir: str) -> None:
    """Record the pid, then never return (the launcher's timeout must kill it)."""
    Path(pid_dir, f"rank{rank}.pid").write_text(str(os.getpid()))
    while True:
        time.sleep(0.5)


def env_and_pid(rank: int, world_size: int) -> tuple[int, int, str | None, int]:
    return rank, world_size, os.environ.get("LAUNCH_TEST_VAR"), os.getpid()


def broken_inference_worker(rank: int, world_size: int, *args: Any) -> None:
    """Stands in for a GPU inference worker that dies (out of memory, driver error)."""
    raise RuntimeError(f"simulated device failure on rank {rank}")
