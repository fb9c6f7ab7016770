"""pipeline.devices.policy: parameters + hardware -> strategy, precision, model size, batch plan, workers."""

import os

import pytest
import torch
from test_probe import T4_X2, fake_smi

from pipeline.core.config import ConfigError, TrainConfig
from pipeline.devices import probe
from pipeline.devices.ddp import rank_device
from pipeline.devices.policy import (
    auto_per_device_batch,
    decide,
    loader_workers,
    resolve_precision,
    run,
    session_topology,
)
from pipeline.devices.probe import Topology
from pipeline.devices.strategy import Strategy

T4 = Topology("cuda", 2, "Tesla T4", False, "")
TPU = Topology("tpu", 8, "TPU v5e", True, "")
CPU = Topology("cpu", 1, "cpu", False, "")


@pytest.fixture(autouse=True)
def _cuda_build(monkeypatch):
    probe.clear_caches()
    monkeypatch.setattr(probe, "_torch_cuda_built", lambda: True)


def torchrun_env(world: int, local: int, rank: int = 0) -> dict[str, str]:
    return {"RANK": str(rank), "LOCAL_RANK": str(rank % local), "WORLD_SIZE": str(world),
            "LOCAL_WORLD_SIZE": str(local)}  # fmt: skip


def test_two_nodes_of_two_t4s_under_torchrun_are_four_devices():
    """Issue 13: WORLD_SIZE (4, every node) was checked against this node's 2 GPUs and refused."""
    topology = session_topology(TrainConfig(), env=torchrun_env(4, 2, rank=3), runner=fake_smi(T4_X2))
    assert (topology.accelerator, topology.num_devices) == ("cuda", 4) and "2 nodes" in topology.detail
    with pytest.raises(ConfigError, match="devices=2 but torchrun started WORLD_SIZE=4"):
        session_topology(TrainConfig(devices=2), env=torchrun_env(4, 2), runner=fake_smi(T4_X2))
    with pytest.raises(ConfigError, match="LOCAL_WORLD_SIZE.*--nproc_per_node 2"):
        session_topology(TrainConfig(), env=torchrun_env(6, 3), runner=fake_smi(T4_X2))


def test_a_scheduler_giving_each_process_its_own_gpu_is_accepted():
    """SLURM-style: CUDA_VISIBLE_DEVICES per process, so every rank sees one GPU, its own."""
    env = {**torchrun_env(4, 2, rank=1), "CUDA_VISIBLE_DEVICES": "1"}
    assert session_topology(TrainConfig(), env=env, runner=fake_smi(T4_X2)).num_devices == 4
    assert rank_device("cuda", local_rank=1, visible_gpus=1) == torch.device("cuda", 0)
    assert rank_device("cuda", local_rank=1, visible_gpus=2) == torch.device("cuda", 1)
    assert rank_device("cpu", local_rank=1, visible_gpus=0) == torch.device("cpu")
    with pytest.raises(RuntimeError, match="LOCAL_RANK=2 but this process sees 2 GPU"):
        rank_device("cuda", local_rank=2, visible_gpus=2)


def test_precision_follows_the_hardware():
    a100 = Topology("cuda", 1, "A100", True, "")
    assert [resolve_precision("auto", t) for t in (T4, a100, TPU, CPU)] == ["fp16", "bf16", "bf16", "fp32"]
    assert resolve_precision("fp32", TPU) == "fp32"
    with pytest.raises(ValueError, match="precision='fp16' is not available on TPU"):
        resolve_precision("fp16", TPU)  # would silently run fp32 on XLA otherwise


def test_tpu_batches_are_large_unless_the_data_is_small():
    assert auto_per_device_batch(TPU) == 128 and auto_per_device_batch(T4) == 32
    assert auto_per_device_batch(TPU, train_rows=1_000_000) == 128
    assert auto_per_device_batch(TPU, train_rows=8 * 50 * 40) == 40  # at least 50 steps an epoch
    assert auto_per_device_batch(TPU, train_rows=2160) == 16  # never below 16
    assert auto_per_device_batch(T4, train_rows=100) == 32  # GPUs and CPUs: as before


def test_one_plan_for_training_and_doctor():
    plan = decide(TrainConfig(), T4)
    assert (plan.strategy, plan.precision) == ("ddp", "fp16")
    assert plan.batch.global_batch == 64 and "2 GPUs (DDP, Tesla T4)" in plan.describe()
    tpu = decide(TrainConfig(base_batch_size=32), TPU, env={"PJRT_DEVICE": "TPU"})
    assert (tpu.strategy, tpu.batch.global_batch, tpu.precision) == ("xla-spmd", 1024, "bf16")
    assert (
        decide(TrainConfig(per_device_batch_size=64), TPU).batch.per_device_batch == 64
    )  # the user's choice


def _handed(strategy, plan, *args):
    return strategy, plan, args


def test_run_hands_the_function_its_strategy_and_the_plan():
    plan = decide(TrainConfig(precision="fp32"), CPU)
    strategy, handed, args = run(plan, _handed, "config", 3)
    assert handed is plan and args == ("config", 3)
    assert (strategy.name, strategy.device.type, strategy.precision) == ("single", "cpu", "fp32")
    assert isinstance(strategy, Strategy)  # every member pipeline.training uses


def test_loader_workers_respect_a_containers_cpu_quota(monkeypatch):
    from pipeline.devices import threads

    monkeypatch.setattr(os, "sched_getaffinity", lambda _: set(range(16)))
    assert loader_workers(None, CPU) == 4
    monkeypatch.setattr(threads, "cgroup_cpu_limit", lambda *_: 2.0)  # docker --cpus 2 on a 16-core host
    assert loader_workers(None, CPU) == 1


def test_loader_workers_by_hardware():
    assert loader_workers(None, CPU, cpus=2) == 1
    assert loader_workers(None, T4, cpus=4) == 1 and loader_workers(None, T4, cpus=16) == 4
    assert loader_workers(None, TPU, cpus=224) == 48 and loader_workers(None, TPU, cpus=8) == 6
    assert loader_workers(0, TPU, cpus=224) == 0  # the user's choice, even 0
