"""What an artifact and a checkpoint record about the run that made them.

Provenance goes into the artifact's manifest (which hardware, which batch/lr plan, how many XLA compilations,
which library versions and commit); the fingerprint decides whether a checkpoint belongs to this run.
"""

from __future__ import annotations

import hashlib
import json
import platform
import subprocess
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from ..core.config import MODEL_PRESETS, TrainConfig
from ..devices.probe import Topology
from ..devices.strategy import Strategy

if TYPE_CHECKING:
    from .dataset import TrainingData
    from .plan import TrainPlan

PATH_FIELDS = {
    "data_dir",
    "artifact_dir",
    "checkpoint_dir",
    "init_from",
    "cache_dir",
    "soundscape_targets",
    "focal_targets",
    "teacher",
}


def run_fingerprint(config: TrainConfig, dataset: TrainingData, topology: Topology) -> str:
    """What a checkpoint must match to be resumed: the parameters that shape the run and the training rows,
    not where things live (Kaggle mounts the same competition under another path in a later version) or
    budgets."""
    keep = {
        k: v
        for k, v in asdict(config).items()
        if k
        not in {
            "data_dir",
            "artifact_dir",
            "checkpoint_dir",
            "time_budget_minutes",
            "progress",
            "checkpoint_every_minutes",
            "num_threads",
            "cache_dir",
            "num_workers",
            "collective_timeout_minutes",
        }
    }
    rows = [[row.rel_path, row.label] for row in dataset.rows]
    shape = {"config": keep, "rows": rows, "devices": topology.num_devices}
    for key, record in (("targets", dataset.targets_record), ("focal_targets", dataset.focal_record)):
        if record:  # a targets file's content, not only its name
            shape[key] = record["sha256"]
    return hashlib.sha256(json.dumps(shape, sort_keys=True).encode()).hexdigest()[:16]


def build_provenance(config: TrainConfig, plan: TrainPlan, strategy: Strategy, result) -> dict[str, Any]:
    hardware = plan.hardware
    topology = hardware.topology
    return {
        "accelerator": topology.accelerator,
        "device_kind": topology.device_kind,
        "devices": topology.num_devices,
        "topology_detail": topology.detail,
        "strategy": strategy.name,
        "precision": strategy.precision,
        "model_size": plan.model_size,
        "batch_plan": hardware.batch.to_dict(),
        "schedule": result.schedule,
        "loader_workers": hardware.loader_workers,
        "data_kind": {"name": plan.kind.name, "why": plan.kind.why},
        "auto": list(plan.decided),
        "epochs_run": len(result.history),
        "epochs_planned": config.epochs,
        "best_epoch": result.best_epoch,
        "history": result.history,
        "validation": result.history[result.best_epoch - 1] if result.best_epoch else {},
        "xla_compile_count": result.compile_count,
        "xla_uncached_compile_counter": strategy.uncached_compiles(),
        "resumed_from": result.resumed_from,
        "stopped_early": result.stopped_early,
        "skipped_rows": result.skipped_rows,
        "data_notes": result.data_notes,
        "label_counts": result.label_counts,
        "train_files": result.train_files,
        "objective": result.objective,
        "metric": result.metric,
        "train_seconds": round(result.seconds, 1),
        # Paths are reduced to their last component: the artifact must not point outside itself.
        "config": {k: Path(v).name if k in PATH_FIELDS and v else v for k, v in asdict(config).items()},
        "versions": package_versions(),
        "git_commit": git_commit(),
        "python": platform.python_version(),
        "presets": {plan.model_size: MODEL_PRESETS[plan.model_size]},
    }


def weights_digest(model: torch.nn.Module) -> str:
    digest = hashlib.sha256()
    for name, tensor in sorted(model.state_dict().items()):
        digest.update(name.encode())
        digest.update(tensor.detach().to("cpu").contiguous().numpy().tobytes())
    return digest.hexdigest()


def package_versions() -> dict[str, str | None]:
    from importlib import metadata

    versions = {}
    for name in ("torch", "torchaudio", "speechbrain", "torch_xla", "numpy"):
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    return versions


def git_commit() -> str | None:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5, cwd=Path(__file__).parent
        )
        return out.stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None
