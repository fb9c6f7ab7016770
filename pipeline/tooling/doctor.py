"""`python -m pipeline doctor`: what this session has, and what training will do with it.

Hardware (TPU kind and devices, GPUs with memory and bf16 support, CPU), the installed torch, torchaudio,
torch_xla, speechbrain and numpy against the tested version matrix (pipeline/tooling/versions.py), the precision,
model size and batch plan the train notebook would use with its default parameters, and the Kaggle facts
that apply.
It is safe to run first in a notebook: every probe reads environment variables, device files or
`nvidia-smi` (pipeline.devices.probe), and versions come from importlib.metadata -- CUDA is never
initialised and torch_xla never imported, so a launcher started afterwards still works.
"""

from __future__ import annotations

import os
import platform
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ..core import kaggle
from ..devices import probe
from . import versions

KAGGLE_NOTES = (
    (
        "p100",
        "GPU P100 is retired: a push asking for it runs on GPU T4 x2, and current images have no sm_60 "
        "kernels. Ask for machine_shape NvidiaTeslaT4 (T4 x2) or TpuV5E8.",
    ),
    (
        "v3",
        "TPU v3-8 (4 chips x 2 cores) was replaced by TPU v5e-8 (8 chips x 1 core, 16 GB each, bf16); "
        "both are 8 XLA devices to this pipeline.",
    ),
    (
        "t4",
        "T4 (Turing, sm_75) has no native bf16: torch.cuda.is_bf16_supported() says True through "
        "emulation. Training uses fp16 autocast with a GradScaler there.",
    ),
    ("quota", "Weekly quotas (about 30 GPU hours, 20 TPU hours) and what is left: run `kaggle quota`."),
)


@dataclass
class Report:
    cpu: dict[str, Any]
    tpu: dict[str, Any]
    gpus: list[dict[str, Any]]
    training: dict[str, Any]
    kaggle: dict[str, Any]
    versions: versions.Comparison
    notes: list[str] = field(default_factory=list)


def collect(
    env: Mapping[str, str] | None = None,
    runner: probe.Runner | None = None,
    root: str = "/",
    version_of: Callable[[str], str | None] = versions.installed_version,
) -> Report:
    """Gather the report. `env`, `runner` (nvidia-smi) and `root` (/dev, /sys) are for tests, as in probe;
    so is `version_of` (distribution name -> installed version or None; default importlib.metadata)."""
    e = os.environ if env is None else env
    cpu = {"count": os.cpu_count(), "machine": platform.machine(), "python": platform.python_version()}

    signals = {k: e[k] for k in ("ISTPUVM", "TPU_ACCELERATOR_TYPE", "PJRT_DEVICE") if e.get(k)}
    tpu: dict[str, Any] = {"signals": signals, "torch_xla_installed": probe.torch_xla_importable()}
    if probe.tpu_available(e, root):
        tpu.update(_topology_or_error("tpu", env, runner, root))

    gpus = [
        {**gpu, "bf16_native": tuple(gpu.get("compute_capability") or ()) >= (8, 0)}
        for gpu in probe.gpu_info(env, runner)
    ]

    training = _topology_or_error("auto", env, runner, root)
    if "error" not in training:
        training.update(_training_plan(training["topology"]))

    report = Report(cpu, tpu, gpus, training, _kaggle_facts(e), versions.compare(version_of))
    report.notes = _notes(report)
    return report


def _topology_or_error(accelerator: str, env, runner, root) -> dict[str, Any]:
    try:
        topology = probe.detect_topology(accelerator, env=env, runner=runner, root=root)
    except (RuntimeError, ValueError) as error:
        return {"error": str(error)}
    return {
        "topology": topology,
        "kind": topology.device_kind,
        "devices": topology.num_devices,
        "detail": topology.detail,
    }


def _training_plan(topology: probe.Topology) -> dict[str, Any]:
    # The training code's own policy (pipeline/devices/policy.py, training/plan.py), so doctor says what
    # training will do.
    from ..core.config import DEFAULT_EPOCHS, TrainConfig
    from ..devices.policy import decide, describe_topology
    from ..training.plan import hardware_model_size

    defaults = TrainConfig()
    plan = decide(defaults, topology)
    batch = plan.batch
    return {
        "strategy": describe_topology(topology),
        "precision": plan.precision,
        "model_size": hardware_model_size(topology),
        "per_device_batch_size": batch.per_device_batch,
        "global_batch": batch.global_batch,
        "loader_workers": plan.loader_workers,
        "plan": f"lr {batch.base_lr:.1e} -> {batch.lr:.1e} ({batch.rule} rule, base batch {batch.base_batch}); "
        f"warmup {defaults.warmup_epochs:g} epoch(s); {DEFAULT_EPOCHS} epochs (more for sound events); "
        f"{plan.loader_workers} DataLoader worker process(es) per training process",
    }


def _kaggle_facts(e: Mapping[str, str]) -> dict[str, Any]:
    facts: dict[str, Any] = {
        "on_kaggle": kaggle.on_kaggle(e),
        "run_type": kaggle.run_type(e),
        "competition_rerun": kaggle.is_competition_rerun(e),
    }
    if facts["on_kaggle"]:
        elapsed = kaggle.session_elapsed_seconds(env=e)
        facts.update(
            session_limit_hours=kaggle.session_limit_hours(e),
            elapsed_minutes=None if elapsed is None else round(elapsed / 60, 1),
            time_budget_minutes=round(kaggle.default_time_budget_minutes(e, elapsed), 1),
            competition_dir=kaggle.find_competition_dir(),
            artifact_dir=kaggle.find_artifact_dir(),
        )
    return facts


def _notes(report: Report) -> list[str]:
    """Every Kaggle note, the ones this session's hardware makes relevant first and marked."""
    names = " ".join(g["name"] for g in report.gpus)
    kinds = f"{report.tpu.get('kind', '')} {report.tpu.get('signals', {}).get('TPU_ACCELERATOR_TYPE', '')}"
    relevant = {
        "p100": "P100" in names,
        "v3": "v3" in kinds,
        "t4": "T4" in names,
        "quota": report.kaggle["on_kaggle"],
    }
    ordered = sorted(KAGGLE_NOTES, key=lambda note: not relevant[note[0]])
    return [("(this session) " if relevant[key] else "") + text for key, text in ordered]


def render(report: Report) -> str:
    lines = [
        "== hardware",
        f"CPU: {report.cpu['count']} cores ({report.cpu['machine']}), Python {report.cpu['python']}",
    ]
    tpu = report.tpu
    if "kind" in tpu:
        lines.append(f"TPU: {tpu['kind']}, {tpu['devices']} XLA devices ({tpu['detail']})")
    elif "error" in tpu:
        lines.append(f"TPU: signals present but unusable: {tpu['error']}")
    elif tpu["signals"]:
        lines.append(f"TPU: signals {tpu['signals']} but torch_xla is not installed")
    else:
        lines.append("TPU: none")
    for gpu in report.gpus:
        cc = gpu.get("compute_capability")
        capability = f"{cc[0]}.{cc[1]}" if cc else "?"
        memory = f"{gpu['memory_mib'] / 1024:.1f} GiB" if gpu.get("memory_mib") else "memory unknown"
        bf16 = "native" if gpu["bf16_native"] else "NOT native (fp16 + loss scaling)"
        lines.append(
            f"GPU {gpu['index']}: {gpu['name']}, {memory}, compute capability {capability}, bf16 {bf16}"
        )
    if not report.gpus:
        lines.append("GPU: none visible")

    lines += ["== versions", *report.versions.lines()]

    lines.append("== training with the default parameters")
    training = report.training
    if "error" in training:
        lines.append(f"cannot pick a topology: {training['error']}")
    else:
        lines += [
            f"{training['strategy']}",
            f"precision {training['precision']}; model size '{training['model_size']}'; "
            f"per-device batch {training['per_device_batch_size']}, global batch {training['global_batch']}",
            training["plan"],
        ]

    lines.append("== Kaggle")
    facts = report.kaggle
    if facts["on_kaggle"]:
        lines.append(
            f"run type {facts['run_type']}"
            + (" (competition scoring rerun)" if facts["competition_rerun"] else "")
        )
        elapsed = "unknown" if facts["elapsed_minutes"] is None else f"{facts['elapsed_minutes']} min"
        lines.append(
            f"session limit {facts['session_limit_hours']:g} h, used {elapsed}; training budget "
            f"{facts['time_budget_minutes']} min"
        )
        lines.append(
            f"competition folder: {facts['competition_dir'] or 'not found'}; "
            f"artifact: {facts['artifact_dir'] or 'not found'}"
        )
    else:
        lines.append("not a Kaggle session (KAGGLE_KERNEL_RUN_TYPE unset)")
    lines += [f"- {note}" for note in report.notes]
    return "\n".join(lines)


def main() -> int:
    print(render(collect()))
    return 0
