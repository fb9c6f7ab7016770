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


# ----------------------------------------------------------------------------------- training fixtures
# Functions handed to pipeline.devices.ddp.ddp_entry in place of pipeline.training.train.fit: each changes one thing
# in its own (spawned) process, then runs the real fit.


def fit_with_slow_save(strategy, *args: Any) -> Any:
    """Rank 0's artifact save takes longer than the collective timeout (a slow disk, a big model)."""
    import pipeline.core.artifact
    import pipeline.training.train

    real_save = pipeline.training.train.save_artifact

    def slow_save(*save_args: Any, **kwargs: Any) -> Any:
        time.sleep(float(os.environ.get("SLOW_SAVE_SECONDS", "8")))
        return real_save(*save_args, **kwargs)

    pipeline.training.train.save_artifact = slow_save
    _ = pipeline.core.artifact
    return pipeline.training.train.fit(strategy, *args)


def fit_where_only_rank_0_sees_the_checkpoint(strategy, *args: Any) -> Any:
    """No shared filesystem: any rank but 0 that tried to read a checkpoint would fail the run."""
    import pipeline.training.checkpoint
    import pipeline.training.train

    if strategy.rank != 0:

        def blind(*_: Any, **__: Any) -> None:
            raise AssertionError(f"rank {strategy.rank} read the checkpoint itself")

        pipeline.training.checkpoint.read = blind
    return pipeline.training.train.fit(strategy, *args)


def fit_counting_broadcasts(strategy, *args: Any) -> dict[str, Any]:
    """The real fit, counting torch.distributed.broadcast calls made while steps run (each is a GPU sync
    under NCCL); BatchNorm buffers broadcast at validation are not step costs and are not counted."""
    import torch.distributed as dist

    import pipeline.training.train

    real_broadcast, real_steps = dist.broadcast, pipeline.training.train.run_steps
    counts = {"broadcasts": 0, "steps": 0, "in_steps": False}

    def counted(*b_args: Any, **kwargs: Any) -> Any:
        counts["broadcasts"] += counts["in_steps"]
        return real_broadcast(*b_args, **kwargs)

    def steps(*s_args: Any, **kwargs: Any) -> dict[str, float]:
        counts["in_steps"] = True
        try:
            timing = real_steps(*s_args, **kwargs)
        finally:
            counts["in_steps"] = False
        counts["steps"] += timing["steps"]
        return timing

    dist.broadcast, pipeline.training.train.run_steps = counted, steps
    pipeline.training.train.fit(strategy, *args)
    return {"broadcasts": counts["broadcasts"], "steps": counts["steps"]}


def evaluate_artifact(
    strategy, artifact_dir: str, data: Any, config: Any
) -> tuple[dict[str, float], list[int]]:
    """Validation of a saved model on this process's share of the validation split (summed across ranks)."""
    from pipeline.core.artifact import load_artifact
    from pipeline.training.validation import evaluate

    model = load_artifact(artifact_dir).model.to(strategy.device).eval()
    result = evaluate(model, strategy, data, config, "accuracy")
    return result.metrics, result.predictions.tolist()
