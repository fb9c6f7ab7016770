"""benchmarks/same_model.py's comparison of two artifacts (the notebooks themselves run when it is invoked)."""

import json

import torch
from safetensors.torch import save_file

from benchmarks.same_model import compare


def artifact(folder, weight: torch.Tensor, config: dict):
    folder.mkdir()
    save_file({"w": weight, "b": torch.zeros(2)}, folder / "model.safetensors")
    provenance = {"config": config, "data_kind": {"name": "other"}}
    (folder / "manifest.json").write_text(json.dumps({"provenance": provenance}))
    return folder


def test_identical_tensors_and_a_changed_auto_are_both_reported(tmp_path):
    weight = torch.arange(6, dtype=torch.float32).reshape(2, 3)
    before = artifact(tmp_path / "a", weight, {"epochs": 2, "sample_rate": 16000, "artifact_dir": "/x"})
    after = artifact(
        tmp_path / "b", weight.clone(), {"epochs": 2, "sample_rate": 32000, "artifact_dir": "/y"}
    )
    result = compare(before, after)
    assert result["bit_identical"] and result["largest_difference"] == 0.0 and result["tensors"] == 2
    assert result["config_changed"] == {"sample_rate": [16000, 32000]}  # places are not training


def test_one_changed_weight_is_not_identical(tmp_path):
    weight = torch.ones(2, 3)
    changed = weight.clone()
    changed[1, 2] += 1e-6
    result = compare(artifact(tmp_path / "a", weight, {}), artifact(tmp_path / "b", changed, {}))
    assert not result["bit_identical"] and 0 < result["largest_difference"] < 1e-5
