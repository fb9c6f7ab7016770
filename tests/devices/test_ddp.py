"""DistributedDataParallel on CPU with gloo: the T4 x2 code path, run by the real engine with 2 ranks."""

import dataclasses
import json
import sys
from pathlib import Path

import pytest
import torch
from conftest import TINY_TRAIN
from helpers import run_papermill

from pipeline.core.config import TrainConfig
from pipeline.core.tables import read_train_table
from pipeline.devices.ddp import DDPStrategy, ddp_entry
from pipeline.devices.launch import launch
from pipeline.devices.strategy import Strategy
from pipeline.training.dataset import stratified_split
from pipeline.training.plan import plan_training
from pipeline.training.train import fit


@pytest.mark.parametrize("world_size", [1, 2, 3, 8])
def test_shards_are_disjoint_and_cover_the_rows(world_size):
    rows = list(range(0, 103, 1))
    shards = [DDPStrategy(torch.device("cpu"), "fp32", r, world_size).shard(rows) for r in range(world_size)]
    assert sorted(sum(shards, [])) == rows
    assert max(map(len, shards)) - min(map(len, shards)) <= 1


def test_ddp_is_a_strategy():
    assert isinstance(DDPStrategy(torch.device("cpu"), "fp32", 0, 2), Strategy)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_two_gloo_ranks_end_with_identical_weights_and_split_the_data(
    synthetic_data, synthetic_training_data, tmp_path
):
    import time

    config = TrainConfig(data_dir=str(synthetic_data), artifact_dir=str(tmp_path / "model"),
                         **{**TINY_TRAIN, "epochs": 2, "devices": 2})  # fmt: skip
    plan, data = plan_training(config, log=lambda *_: None)
    work = (plan.hardware, plan, data, time.monotonic())
    results = launch(
        ddp_entry, nprocs=2, args=(fit, work, plan.hardware.topology, "fp32", 120.0), timeout=240
    )
    assert results[0].weights_sha256 == results[1].weights_sha256
    assert results[0].rows_trained + results[1].rows_trained == len(synthetic_training_data.train_idx)
    manifest = json.loads((tmp_path / "model" / "manifest.json").read_text())
    assert manifest["provenance"]["strategy"] == "ddp" and manifest["provenance"]["devices"] == 2
    assert manifest["provenance"]["batch_plan"]["global_batch"] == 2 * TINY_TRAIN["per_device_batch_size"]


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_train_notebook_with_two_cpu_processes(synthetic_data, tmp_path):
    artifact = tmp_path / "model"
    run = run_papermill("notebooks/train.ipynb", tmp_path / "out.ipynb", {
        "data_dir": synthetic_data, "artifact_dir": artifact, "accelerator": "cpu", "devices": 2,
        "model_size": "tiny", "epochs": 2, "per_device_batch_size": 8, "base_batch_size": 8, "n_mels": 40,
        "window_seconds": 0.5,
    })  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    assert "CPU: 2 CPU processes (gloo DDP" in run.stderr
    assert "[Gloo]" not in run.stderr + run.stdout  # issue 14: gloo's per-rank connection lines, interleaved
    assert "global batch 16 = 8 per device x 2 devices" in run.stderr
    assert "launching 2 training processes (spawn)" in run.stderr
    provenance = json.loads((artifact / "manifest.json").read_text())["provenance"]
    # What actually ran, not what the topology promised: the DDP strategy, on two ranks.
    assert provenance["strategy"] == "ddp" and provenance["devices"] == 2


# Each rank reports into its own file: two ranks printing to one shared stdout can interleave their lines.
TORCHRUN_SCRIPT = """
import json, os, sys
from pathlib import Path
from pipeline.core.config import TrainConfig
from pipeline.training.train import train
result = train(TrainConfig(**json.loads(sys.argv[1])))
report = {"rows": result.rows_trained, "weights": result.weights_sha256}
Path(sys.argv[2], "rank" + os.environ["RANK"] + ".json").write_text(json.dumps(report))
"""


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_the_same_code_runs_under_torchrun_without_devices_set(synthetic_data, tmp_path):
    """torchrun starts the processes: their number is the topology, only rank 0 writes the artifact."""
    from helpers import run_in_group, venv_env

    script_and_args, reports_dir = _torchrun_training(synthetic_data, tmp_path)
    run = run_in_group([TORCHRUN, "--standalone", "--nproc_per_node", "2", *script_and_args], env=venv_env(),
                       timeout=240)  # fmt: skip
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-3000:]
    reports = [json.loads(path.read_text()) for path in sorted(reports_dir.glob("rank*.json"))]
    assert len(reports) == 2 and reports[0]["weights"] == reports[1]["weights"]
    labels = [r.label for r in read_train_table(synthetic_data)[0]]
    train_idx, _, _ = stratified_split(labels, 0.1, 0)
    assert sum(r["rows"] for r in reports) == len(train_idx)  # two disjoint halves, not two full copies
    assert run.stdout.count("CPU: 2 CPU processes (gloo DDP") == 1  # rank 0 speaks for the run
    assert "[Gloo]" not in run.stdout
    provenance = json.loads((tmp_path / "model" / "manifest.json").read_text())["provenance"]
    assert provenance["strategy"] == "ddp" and provenance["devices"] == 2


TORCHRUN = str(Path(sys.executable).parent / "torchrun")


def _torchrun_training(synthetic_data, tmp_path) -> tuple[list[str], Path]:
    """The training script torchrun starts, its arguments (one epoch of the tiny model on the synthetic
    folder), and the folder where each rank writes its report."""
    script = tmp_path / "train_script.py"
    script.write_text(TORCHRUN_SCRIPT)
    params = {
        **TINY_TRAIN,
        "epochs": 1,
        "data_dir": str(synthetic_data),
        "artifact_dir": str(tmp_path / "model"),
    }
    reports = tmp_path / "reports"
    reports.mkdir()
    return [str(script), json.dumps(params), str(reports)], reports


def _ddp_work(config):
    """What train() hands every rank after its strategy: the hardware plan, the training plan, the training
    data, the start time (and the hardware plan, for the launcher's topology)."""
    import time

    plan, data = plan_training(config, log=lambda *_: None)
    return plan.hardware, (plan.hardware, plan, data, time.monotonic())


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_slow_rank_0_save_with_short_collective_timeouts_keeps_the_artifact(synthetic_data, tmp_path):
    """Issue 13: after the last epoch the other ranks waited at a barrier while rank 0 re-predicted the
    validation split on the CPU and saved; past NCCL's timeout the launcher killed rank 0 mid-save and the
    artifact was lost. Now nothing after the last collective waits for rank 0: a save longer than the
    collective timeout (here 25 s against 15 s) leaves a complete artifact."""
    from launch_fixtures.workers import fit_with_slow_save

    from pipeline.core.artifact import load_artifact

    config = TrainConfig(data_dir=str(synthetic_data), artifact_dir=str(tmp_path / "model"),
                         **{**TINY_TRAIN, "epochs": 1, "devices": 2, "collective_timeout_minutes": 0.25})  # fmt: skip
    plan, work = _ddp_work(config)
    results = launch(ddp_entry, nprocs=2, args=(fit_with_slow_save, work, plan.topology, "fp32", 15.0),
                     env={"SLOW_SAVE_SECONDS": "25"}, timeout=240)  # fmt: skip
    assert results[0].weights_sha256 == results[1].weights_sha256
    assert load_artifact(tmp_path / "model").manifest["provenance"]["devices"] == 2


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_ranks_resume_from_what_rank_0_read(synthetic_data, tmp_path):
    """Issue 13: without a shared filesystem only rank 0 has the checkpoint; every rank must still resume at
    its step (rank 1 reading on its own would start over, and the collectives would hang)."""
    from launch_fixtures.workers import fit_where_only_rank_0_sees_the_checkpoint

    config = TrainConfig(data_dir=str(synthetic_data), artifact_dir=str(tmp_path / "model"),
                         **{**TINY_TRAIN, "epochs": 2, "devices": 2, "time_budget_minutes": 0.01})  # fmt: skip
    plan, work = _ddp_work(config)
    stopped = launch(ddp_entry, nprocs=2, args=(fit, work, plan.topology, "fp32", 120.0), timeout=240)
    assert stopped[0].stopped_early
    again = dataclasses.replace(config, time_budget_minutes=None)
    plan, work = _ddp_work(again)
    results = launch(ddp_entry, nprocs=2, args=(fit_where_only_rank_0_sees_the_checkpoint, work, plan.topology,
                                                  "fp32", 120.0), timeout=240)  # fmt: skip
    assert (
        results[0].resumed_from == results[1].resumed_from == "checkpoint at epoch 1, step 1 (global step 1)"
    )
    assert results[0].weights_sha256 == results[1].weights_sha256 and not results[0].stopped_early


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_ranks_agree_on_stopping_without_a_broadcast_every_step(synthetic_data, tmp_path):
    """Issue 13: "stop?" and "checkpoint?" were two broadcasts (and two GPU syncs) per step."""
    from launch_fixtures.workers import fit_counting_broadcasts

    config = TrainConfig(data_dir=str(synthetic_data), artifact_dir=str(tmp_path / "model"),
                         **{**TINY_TRAIN, "epochs": 2, "devices": 2, "per_device_batch_size": 2,
                            "crops_per_file": 1})  # fmt: skip
    plan, work = _ddp_work(config)
    counts = launch(ddp_entry, nprocs=2, args=(fit_counting_broadcasts, work, plan.topology, "fp32", 120.0),
                    timeout=240)  # fmt: skip
    assert counts[0]["steps"] == 20  # 43 training files, one crop each / 4 per step, 2 epochs
    # The first step of the session and the last of each epoch (and every 25th): 3 here, not 2 x 20.
    assert counts[0]["broadcasts"] == counts[1]["broadcasts"] == 3


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_ddp_fp16_with_gradient_accumulation(synthetic_data, tmp_path):
    """The T4 x2 recipe (fp16 autocast + GradScaler, DDP) with 2 micro-batches per step, on gloo."""
    import numpy as np

    from pipeline.training.train import train

    config = TrainConfig(data_dir=str(synthetic_data), artifact_dir=str(tmp_path / "model"), precision="fp16",
                         **{**TINY_TRAIN, "epochs": 1, "devices": 2, "grad_accum": 2, "per_device_batch_size": 4})  # fmt: skip
    result = train(config)
    assert result.plan["global_batch"] == 16 and all(np.isfinite(r["train_loss"]) for r in result.history)
    provenance = json.loads((tmp_path / "model" / "manifest.json").read_text())["provenance"]
    assert (provenance["precision"], provenance["strategy"], provenance["batch_plan"]["grad_accum"]) == (
        "fp16",
        "ddp",
        2,
    )


# One node under torchrun (make test) takes the same environment path with one node's ranks.
@pytest.mark.slow
@pytest.mark.extended
@pytest.mark.timeout(400)
def test_two_nodes_under_torchrun_on_localhost(synthetic_data, tmp_path):
    """Issue 13: multi-node torchrun (here 2 "nodes" of one process each, c10d rendezvous on 127.0.0.1, gloo):
    WORLD_SIZE counts every node, each node checks only its own processes against its own hardware."""
    import os
    import signal
    import subprocess

    from helpers import venv_env

    from pipeline.devices.launch import find_free_port

    script_and_args, reports = _torchrun_training(synthetic_data, tmp_path)
    argv = [TORCHRUN, "--nnodes", "2", "--nproc_per_node", "1", "--rdzv-backend", "c10d", "--rdzv-endpoint",
            f"127.0.0.1:{find_free_port()}", "--rdzv-id", "two-nodes", *script_and_args]  # fmt: skip
    nodes = [subprocess.Popen(argv, env=venv_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                              start_new_session=True) for _ in range(2)]  # fmt: skip
    try:
        outputs = [node.communicate(timeout=300)[0] for node in nodes]
    finally:
        for node in nodes:
            if node.poll() is None:
                os.killpg(node.pid, signal.SIGKILL)
    assert all(node.returncode == 0 for node in nodes), "\n".join(out[-3000:] for out in outputs)
    found = [json.loads(path.read_text()) for path in sorted(reports.glob("rank*.json"))]
    assert len(found) == 2 and found[0]["weights"] == found[1]["weights"]
    provenance = json.loads((tmp_path / "model" / "manifest.json").read_text())["provenance"]
    assert provenance["strategy"] == "ddp" and provenance["devices"] == 2
    assert "torchrun: 2 processes on 2 nodes" in provenance["topology_detail"]
    assert sum("CPU: 2 CPU processes (gloo DDP" in out for out in outputs) == 1  # rank 0 speaks
