"""DistributedDataParallel on CPU with gloo: the T4 x2 code path, run by the real engine with 2 ranks."""

import json

import pytest
import torch
from conftest import TINY_TRAIN
from helpers import run_papermill

from pipeline.config import TrainConfig
from pipeline.data import read_train_table
from pipeline.dataset import stratified_split
from pipeline.devices.ddp import DDPStrategy, ddp_entry
from pipeline.devices.launch import launch
from pipeline.devices.policy import decide
from pipeline.train import fit


@pytest.mark.parametrize("world_size", [1, 2, 3, 8])
def test_shards_are_disjoint_and_cover_the_rows(world_size):
    rows = list(range(0, 103, 1))
    shards = [DDPStrategy(torch.device("cpu"), "fp32", r, world_size).shard(rows) for r in range(world_size)]
    assert sorted(sum(shards, [])) == rows
    assert max(map(len, shards)) - min(map(len, shards)) <= 1


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_two_gloo_ranks_end_with_identical_weights_and_split_the_data(
    synthetic_data, synthetic_training_data, tmp_path
):
    import time

    config = TrainConfig(data_dir=str(synthetic_data), artifact_dir=str(tmp_path / "model"),
                         **{**TINY_TRAIN, "epochs": 2, "devices": 2})  # fmt: skip
    plan = decide(config)
    work = (config, plan, synthetic_training_data, time.monotonic())
    results = launch(ddp_entry, nprocs=2, args=(fit, work, plan.topology, "fp32", 120.0), timeout=240)
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
    assert "global batch 16 = 8 per device x 2 devices" in run.stderr
    assert "launching 2 training processes (spawn)" in run.stderr
    provenance = json.loads((artifact / "manifest.json").read_text())["provenance"]
    # What actually ran, not what the topology promised: the DDP strategy, on two ranks.
    assert provenance["strategy"] == "ddp" and provenance["devices"] == 2


# Each rank reports into its own file: two ranks printing to one shared stdout can interleave their lines.
TORCHRUN_SCRIPT = """
import json, os, sys
from pathlib import Path
from pipeline.config import TrainConfig
from pipeline.train import train
result = train(TrainConfig(**json.loads(sys.argv[1])))
report = {"rows": result.rows_trained, "weights": result.weights_sha256}
Path(sys.argv[2], "rank" + os.environ["RANK"] + ".json").write_text(json.dumps(report))
"""


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_the_same_code_runs_under_torchrun_without_devices_set(synthetic_data, tmp_path):
    """torchrun starts the processes: their number is the topology, only rank 0 writes the artifact."""
    import subprocess
    import sys
    from pathlib import Path

    from helpers import venv_env

    script = tmp_path / "train_script.py"
    script.write_text(TORCHRUN_SCRIPT)
    params = {
        **TINY_TRAIN,
        "epochs": 1,
        "data_dir": str(synthetic_data),
        "artifact_dir": str(tmp_path / "model"),
    }
    reports_dir = tmp_path / "reports"
    reports_dir.mkdir()
    torchrun = Path(sys.executable).parent / "torchrun"
    run = subprocess.run([str(torchrun), "--standalone", "--nproc_per_node", "2", str(script), json.dumps(params),
                          str(reports_dir)], env=venv_env(), capture_output=True, text=True, timeout=240)  # fmt: skip
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-3000:]
    reports = [json.loads(path.read_text()) for path in sorted(reports_dir.glob("rank*.json"))]
    assert len(reports) == 2 and reports[0]["weights"] == reports[1]["weights"]
    labels = [r.label for r in read_train_table(synthetic_data)[0]]
    train_idx, _, _ = stratified_split(labels, 0.1, 0)
    assert sum(r["rows"] for r in reports) == len(train_idx)  # two disjoint halves, not two full copies
    assert run.stdout.count("CPU: 2 CPU processes (gloo DDP") == 1  # rank 0 speaks for the run
    provenance = json.loads((tmp_path / "model" / "manifest.json").read_text())["provenance"]
    assert provenance["strategy"] == "ddp" and provenance["devices"] == 2
