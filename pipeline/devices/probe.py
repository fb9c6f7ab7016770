"""Detect the accelerator topology without initialising CUDA or importing torch_xla.

Why it matters: a notebook that touches CUDA before launching workers poisons fork-based launchers
("Cannot re-initialize CUDA in forked subprocess"), and importing torch_xla starts the PJRT runtime machinery.
So every probe here reads environment variables, device files, NVML or ``nvidia-smi`` -- never
``torch.cuda.device_count()`` (in torch 2.9.1 it falls back to ``cudaGetDeviceCount`` when NVML cannot be
loaded, which poisons fork) and never ``torch.cuda.get_device_capability()`` (it calls ``_lazy_init``).

Expensive probes are cached (functools.lru_cache) in the style of accelerate's ``is_*_available``;
``clear_caches()`` resets them for tests. Everything that reads the outside world takes injectable
``env`` (a mapping standing in for os.environ), ``runner`` (runs ``nvidia-smi``) and ``root`` (filesystem
root for /dev and /sys), so tests can describe a Kaggle TPU VM or a T4 x2 box on a CPU machine.
"""

from __future__ import annotations

import contextlib
import csv
import dataclasses
import functools
import glob
import importlib.util
import os
import re
import subprocess
import sys
import warnings
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ACCELERATORS = ("auto", "tpu", "cuda", "cpu")

Runner = Callable[[Sequence[str]], str]
"""Runs a command and returns its stdout; raises OSError / subprocess.SubprocessError on failure."""


@dataclass(frozen=True)
class Topology:
    """What the run will use: accelerator family, data-parallel device count and a one-line provenance."""

    accelerator: str  # "tpu" | "cuda" | "cpu"
    num_devices: int  # devices used for data parallelism
    device_kind: str  # e.g. "TPU v5e", "TPU v3", "Tesla T4", "cpu"
    bf16_native: bool  # TPU, or every GPU with compute capability >= 8.0
    detail: str  # one human line on how it was detected

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


# --------------------------------------------------------------------------------------------- caches


@functools.cache
def torch_xla_importable() -> bool:
    """True if torch_xla is installed. Uses find_spec: importing torch_xla would start its runtime setup."""
    return importlib.util.find_spec("torch_xla") is not None


@functools.cache
def _torch_cuda_built() -> bool:
    """True if the installed torch has CUDA support (a CPU wheel cannot use GPUs nvidia-smi lists)."""
    if importlib.util.find_spec("torch") is None:
        return False
    import torch  # importing torch does not initialise CUDA

    return bool(torch.backends.cuda.is_built())


def clear_caches() -> None:
    """Forget cached probe results (tests change env vars, fake files and fake GPUs between cases)."""
    for fn in _CACHED:
        fn.cache_clear()


def _environ(env: Mapping[str, str] | None) -> Mapping[str, str]:
    return os.environ if env is None else env


# ------------------------------------------------------------------------------------------------ TPU

# TPU_ACCELERATOR_TYPE is "<generation>-<N>". What N counts differs by generation (Cloud TPU docs):
# v2/v3 count TensorCores (2 per chip, each its own XLA device), v4/v5p count TensorCores but run as one
# "megacore" device per chip, v5e ("v5litepod")/v6e count chips (1 core each). One host sees at most
# `per_host` devices, which is what data parallelism inside one Kaggle VM uses.
_TPU_GENERATIONS: dict[str, tuple[str, float, int]] = {
    # generation: (device_kind, devices per unit of N, devices per host)
    "v2": ("TPU v2", 1.0, 8),
    "v3": ("TPU v3", 1.0, 8),
    "v4": ("TPU v4", 0.5, 4),
    "v5p": ("TPU v5p", 0.5, 4),
    "v5litepod": ("TPU v5e", 1.0, 8),
    "v5e": ("TPU v5e", 1.0, 8),
    "v6e": ("TPU v6e", 1.0, 8),
}

# PCI ids torch_xla itself uses to count chips (torch_xla/_internal/tpu.py): vendor 0x1ae0 is Google.
_GOOGLE_PCI_VENDOR = "0x1ae0"
_TPU_PCI_DEVICES: dict[str, tuple[str, int]] = {
    # device id: (device_kind, XLA devices per chip)
    "0x0027": ("TPU v2/v3", 2),
    "0x005e": ("TPU v4", 1),
    "0x0063": ("TPU v5e", 1),
    "0x006f": ("TPU v6e", 1),
}

_DEFAULT_TPU_DEVICES = 8  # both Kaggle shapes (v3-8: 4 chips x 2 cores; v5e-8: 8 chips x 1 core)


def parse_tpu_accelerator_type(value: str) -> tuple[str, int] | None:
    """Map e.g. "v5litepod-8" -> ("TPU v5e", 8), "v3-8" -> ("TPU v3", 8); None if not recognised."""
    m = re.fullmatch(r"\s*(v\d+[a-z]*)-(\d+)\s*", value.lower())
    if not m or m.group(1) not in _TPU_GENERATIONS:
        return None
    kind, per_unit, per_host = _TPU_GENERATIONS[m.group(1)]
    return kind, max(1, min(int(int(m.group(2)) * per_unit), per_host))


@functools.cache
def _scan_tpu_files(root: str) -> Topology | None:
    """Count TPU chips from PCI ids, else /dev/accel* (v2-v4), else /dev/vfio/<n> (v5e and later)."""
    google = []  # the device ids of Google's PCI devices
    for vendor in map(Path, glob.glob(os.path.join(root, "sys/bus/pci/devices/*/vendor"))):
        with contextlib.suppress(OSError):
            if vendor.read_text().strip() == _GOOGLE_PCI_VENDOR:
                google.append(vendor.with_name("device").read_text().strip())
    if chips := Counter(device_id for device_id in google if device_id in _TPU_PCI_DEVICES):
        device_id, n = chips.most_common(1)[0]
        kind, per_chip = _TPU_PCI_DEVICES[device_id]
        return Topology("tpu", n * per_chip, kind, True, f"{n} TPU chip(s) on PCI (device id {device_id})")

    if accel := glob.glob(os.path.join(root, "dev/accel[0-9]*")):
        # /dev/accel* is the v2/v3/v4 driver; Kaggle only ever had v3-8 there: 2 cores per chip file.
        n = len(accel)
        return Topology("tpu", 2 * n, "TPU v3", True, f"{n} /dev/accel* files (2 cores each, v3 assumed)")
    if vfio := [p for p in glob.glob(os.path.join(root, "dev/vfio/*")) if os.path.basename(p).isdigit()]:
        n = len(vfio)
        return Topology("tpu", n, "TPU v5e", True, f"{n} /dev/vfio/<n> files (1 core per chip)")
    return None


def tpu_available(env: Mapping[str, str] | None = None, root: str = "/") -> bool:
    """True on a TPU VM with torch_xla installed.

    Signals: Kaggle's ``ISTPUVM=1``, ``PJRT_DEVICE=TPU``, ``TPU_ACCELERATOR_TYPE``, or TPU device files.
    ``PJRT_DEVICE=CPU`` is the CPU stand-in and only counts when the TPU path is asked for explicitly.
    """
    e = _environ(env)
    pjrt = e.get("PJRT_DEVICE", "").upper()
    if not torch_xla_importable() or pjrt == "CPU":
        return False
    signalled = e.get("ISTPUVM") == "1" or pjrt == "TPU" or bool(e.get("TPU_ACCELERATOR_TYPE"))
    return signalled or _scan_tpu_files(root) is not None


def _tpu_topology(e: Mapping[str, str], root: str) -> Topology:
    if not torch_xla_importable():
        raise RuntimeError("accelerator='tpu' but torch_xla is not installed (pip install torch_xla)")
    if e.get("PJRT_DEVICE", "").upper() == "CPU":
        raw = e.get("CPU_NUM_DEVICES")
        try:
            n = int(raw) if raw and raw.strip() else 1
        except ValueError:
            raise ValueError(f"CPU_NUM_DEVICES={raw!r} is not an integer") from None
        if n < 1:
            raise ValueError(f"CPU_NUM_DEVICES={raw!r} must be >= 1")
        return Topology("tpu", n, "XLA CPU (stand-in for TPU)", True, f"PJRT_DEVICE=CPU, CPU_NUM_DEVICES={n}")
    if not tpu_available(e, root):
        raise RuntimeError(
            "accelerator='tpu' but no TPU found (no ISTPUVM/PJRT_DEVICE=TPU/TPU_ACCELERATOR_TYPE, no TPU "
            "device files); set PJRT_DEVICE=CPU (and CPU_NUM_DEVICES) to use torch_xla's CPU stand-in"
        )
    acc_type = e.get("TPU_ACCELERATOR_TYPE", "")
    if parsed := parse_tpu_accelerator_type(acc_type):
        return Topology("tpu", parsed[1], parsed[0], True, f"TPU_ACCELERATOR_TYPE={acc_type}")
    if files := _scan_tpu_files(root):
        return files
    signals = ", ".join(f"{k}={e[k]}" for k in ("ISTPUVM", "PJRT_DEVICE") if e.get(k))
    detail = f"{signals}; no type or device files, assuming {_DEFAULT_TPU_DEVICES} devices"
    return Topology("tpu", _DEFAULT_TPU_DEVICES, "TPU", True, detail)


# ----------------------------------------------------------------------------------------------- CUDA

# Fallback when the driver is too old for nvidia-smi's compute_cap field (added in driver 510).
_CAPABILITY_BY_NAME: tuple[tuple[str, tuple[int, int]], ...] = (
    ("H100", (9, 0)),
    ("L40", (8, 9)),
    ("L4", (8, 9)),
    ("A100", (8, 0)),
    ("A10G", (8, 6)),
    ("A10", (8, 6)),
    ("A40", (8, 6)),
    ("V100", (7, 0)),
    ("T4", (7, 5)),
    ("P100", (6, 0)),
    ("P4", (6, 1)),
    ("K80", (3, 7)),
)


def _capability_from_name(name: str) -> tuple[int, int] | None:
    return next((cc for key, cc in _CAPABILITY_BY_NAME if re.search(rf"\b{key}\b", name, re.I)), None)


def run_command(argv: Sequence[str]) -> str:
    """Default runner: run argv, return stdout (FileNotFoundError if the binary is missing)."""
    return subprocess.run(list(argv), capture_output=True, text=True, check=True, timeout=20).stdout


def _int_or_none(text: str) -> int | None:
    try:
        return int(float(text))
    except ValueError:
        return None  # "[N/A]" on some virtualised GPUs


def _gpu(
    index: int, uuid: str, name: str, memory_mib: int | None, cc: tuple[int, int] | None
) -> dict[str, Any]:
    return {"index": index, "uuid": uuid, "name": name, "memory_mib": memory_mib, "compute_capability": cc}


def _query_nvidia_smi(runner: Runner) -> list[dict[str, Any]] | None:
    """Physical GPUs from nvidia-smi (which ignores CUDA_VISIBLE_DEVICES), or None if it is unavailable."""
    for fields in ("index,uuid,name,memory.total,compute_cap", "index,uuid,name,memory.total"):
        try:
            out = runner(["nvidia-smi", f"--query-gpu={fields}", "--format=csv,noheader,nounits"])
        except FileNotFoundError:
            return None
        except (OSError, subprocess.SubprocessError):
            continue  # old drivers reject compute_cap: retry without it
        gpus = []
        for row in csv.reader(out.strip().splitlines(), skipinitialspace=True):
            if not row or not row[0].strip().isdigit():
                continue
            name = row[2].strip()
            m = re.fullmatch(r"\s*(\d+)\.(\d+)\s*", row[4]) if len(row) > 4 else None
            cc = (int(m.group(1)), int(m.group(2))) if m else _capability_from_name(name)
            gpus.append(_gpu(int(row[0]), row[1].strip(), name, _int_or_none(row[3]), cc))
        return gpus
    return None


def _query_pynvml() -> list[dict[str, Any]] | None:
    """Physical GPUs through NVML's Python binding. NVML does not touch the CUDA runtime."""
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception:  # no pynvml; or pynvml.NVMLError and friends: no driver here
        return None
    try:
        gpus = []
        for i in range(pynvml.nvmlDeviceGetCount()):
            h = pynvml.nvmlDeviceGetHandleByIndex(i)
            texts = pynvml.nvmlDeviceGetName(h), pynvml.nvmlDeviceGetUUID(h)
            name, uuid = (t.decode() if isinstance(t, bytes) else t for t in texts)  # older pynvml: bytes
            major, minor = pynvml.nvmlDeviceGetCudaComputeCapability(h)
            memory_mib = int(pynvml.nvmlDeviceGetMemoryInfo(h).total) // 2**20
            gpus.append(_gpu(i, uuid, name, memory_mib, (int(major), int(minor))))
        return gpus
    except Exception:
        return None
    finally:
        with contextlib.suppress(Exception):
            pynvml.nvmlShutdown()


@functools.cache
def _physical_gpus_default() -> tuple[dict[str, Any], ...]:
    gpus = _query_pynvml()
    return tuple((_query_nvidia_smi(run_command) if gpus is None else gpus) or ())


# Captured here, not looked up by name, so clear_caches() still works while a test monkeypatches a probe.
_CACHED = (torch_xla_importable, _torch_cuda_built, _scan_tpu_files, _physical_gpus_default)


def _visible(gpus: Sequence[dict[str, Any]], cvd: str | None) -> list[dict[str, Any]]:
    """Apply CUDA_VISIBLE_DEVICES the way the CUDA runtime does: ordinals or GPU-uuid prefixes, in the
    given order; parsing stops at the first invalid entry; a repeated entry hides every GPU."""
    if cvd is None:
        return list(gpus)
    chosen: list[dict[str, Any]] = []
    for raw in cvd.split(","):
        item = raw.strip()
        if item.isdigit():
            match = [g for g in gpus if g["index"] == int(item)]
        elif item.startswith("GPU-"):
            match = [g for g in gpus if str(g.get("uuid", "")).startswith(item)]
        else:
            break  # "", "-1", MIG ids, garbage: CUDA stops here
        if len(match) != 1:
            break
        if match[0] in chosen:
            return []
        chosen.append(match[0])
    return chosen


def cuda_initialized() -> bool:
    """True if this process already initialised CUDA (then asking torch costs nothing more). Torch is only
    asked if already imported: importing it to answer "no" would cost seconds."""
    torch = sys.modules.get("torch")
    return bool(torch is not None and torch.cuda.is_initialized())


def gpu_info(env: Mapping[str, str] | None = None, runner: Runner | None = None) -> list[dict[str, Any]]:
    """Visible GPUs as dicts: index, uuid, name, memory_mib, compute_capability ((major, minor) or None).

    Sources, none of which initialise CUDA: torch itself if CUDA is already initialised, else pynvml,
    else ``nvidia-smi``. ``runner`` replaces the nvidia-smi call (and skips the others) for tests.
    """
    if runner is not None:
        physical = _query_nvidia_smi(runner) or []
    elif env is None and cuda_initialized():
        import torch

        props = [torch.cuda.get_device_properties(i) for i in range(torch.cuda.device_count())]
        # torch's ordinals are already the visible ones
        return [
            _gpu(i, str(getattr(p, "uuid", "")), p.name, p.total_memory // 2**20, (p.major, p.minor))
            for i, p in enumerate(props)
        ]
    else:
        physical = list(_physical_gpus_default())
    return _visible(physical, _environ(env).get("CUDA_VISIBLE_DEVICES"))


def _torch_nvml_count() -> int:
    """torch's NVML-only counter (-1 if NVML is unavailable). Unlike torch.cuda.device_count() it never
    falls back to cudaGetDeviceCount, which poisons fork even though is_initialized() stays False."""
    import torch

    try:
        return int(torch.cuda._device_count_nvml())
    except Exception:  # AttributeError too: a torch without it
        return -1


def cuda_device_count(env: Mapping[str, str] | None = None, runner: Runner | None = None) -> int:
    """Number of usable CUDA GPUs, respecting CUDA_VISIBLE_DEVICES, without initialising CUDA (torch's own
    count once CUDA is initialised: see gpu_info)."""
    if not _torch_cuda_built():
        return 0
    if gpus := gpu_info(env, runner):
        return len(gpus)
    # libnvidia-ml present but neither pynvml nor nvidia-smi (this session only: env and runner are tests)
    return max(_torch_nvml_count(), 0) if env is None and runner is None else 0


def nvidia_device_files(root: str = "/") -> list[str]:
    """/dev/nvidia<N>: the driver's GPU device files, there whether or not NVML can be loaded."""
    return sorted(glob.glob(os.path.join(root, "dev/nvidia[0-9]*")))


def _cuda_topology(e: Mapping[str, str] | None, runner: Runner | None, root: str = "/") -> Topology:
    n = cuda_device_count(e, runner)
    if n == 0 and e is None and runner is None and _torch_cuda_built() and nvidia_device_files(root):
        # GPUs the probes cannot count (no NVML): the user asked for CUDA, so ask CUDA itself (this
        # initialises it in this process; the DDP launcher spawns, which stays safe).
        import torch

        n = torch.cuda.device_count()
    if n == 0:
        raise RuntimeError("accelerator='cuda' but no CUDA GPU is visible (or torch is a CPU-only build)")
    gpus = gpu_info(e, runner)[:n]
    names = sorted({g["name"] for g in gpus}) or ["CUDA GPU"]
    caps = [g["compute_capability"] for g in gpus]
    # T4 (sm_75) reports bf16 "supported" through emulation only; native needs sm_80+.
    bf16 = bool(caps) and len(caps) == n and all(c is not None and c >= (8, 0) for c in caps)
    cap_txt = ", ".join(f"{c[0]}.{c[1]}" if c else "?" for c in caps) or "unknown"
    source = "torch" if (e is None and runner is None and cuda_initialized()) else "NVML/nvidia-smi"
    detail = f"{n} GPU(s) via {source}, compute capability {cap_txt}"
    if (cvd := _environ(e).get("CUDA_VISIBLE_DEVICES")) is not None:
        detail += f", CUDA_VISIBLE_DEVICES={cvd}"
    return Topology("cuda", n, " + ".join(names), bf16, detail)


# ------------------------------------------------------------------------------------------ topology


def detect_topology(
    accelerator: str = "auto",
    devices: int | None = None,
    *,
    env: Mapping[str, str] | None = None,
    runner: Runner | None = None,
    root: str = "/",
) -> Topology:
    """Pick the accelerator and data-parallel device count.

    ``auto``: TPU if available, else CUDA if any GPU is visible, else CPU with one device.
    ``tpu`` with ``PJRT_DEVICE=CPU`` is torch_xla's CPU backend with CPU_NUM_DEVICES devices.
    ``devices`` caps the GPU count (at most what exists); on TPU it must equal the device count (SPMD uses
    them all); on cpu it is the number of gloo processes (up to 4 x os.cpu_count()).
    ``env``/``runner``/``root`` are for tests.
    """
    acc = str(accelerator).strip().lower()
    acc = {"gpu": "cuda"}.get(acc, acc)
    if acc not in ACCELERATORS:
        raise ValueError(
            f"accelerator must be one of {', '.join(map(repr, ACCELERATORS))}; got {accelerator!r}"
        )
    if devices is not None and (isinstance(devices, bool) or not isinstance(devices, int) or devices < 1):
        raise ValueError(f"devices must be a positive integer or None; got {devices!r}")
    e = _environ(env)

    if acc == "auto":
        acc = "tpu" if tpu_available(e, root) else "cuda" if cuda_device_count(env, runner) > 0 else "cpu"
        if acc == "cpu" and _torch_cuda_built() and (files := nvidia_device_files(root)):
            warnings.warn(
                f"GPU device files exist ({', '.join(files[:2])}) but no GPU could be counted: neither "
                "pynvml, nvidia-smi nor libnvidia-ml answered, and asking CUDA itself would initialise it "
                "in this process. accelerator='auto' therefore chose the CPU. Pass accelerator='cuda' "
                "to train on the GPUs anyway, or install the NVIDIA driver's utilities.",
                RuntimeWarning,
                stacklevel=2,
            )

    if acc == "tpu":
        topo = _tpu_topology(e, root)
    elif acc == "cuda":
        topo = _cuda_topology(env, runner, root)
    else:
        topo = Topology("cpu", 1, "cpu", False, f"no accelerator used; os.cpu_count()={os.cpu_count()}")

    if devices is None or devices == topo.num_devices:
        return topo
    if acc == "cpu":
        limit = 4 * (os.cpu_count() or 1)
        if devices > limit:
            raise ValueError(f"devices={devices} CPU processes is more than 4 x os.cpu_count() = {limit}")
        return dataclasses.replace(topo, num_devices=devices, detail=f"{devices} gloo processes on CPU")
    if acc == "tpu":
        # SPMD shards every batch over all devices the runtime sees; it cannot leave some of them out.
        hint = "set CPU_NUM_DEVICES instead" if "XLA CPU" in topo.device_kind else "leave devices unset"
        raise ValueError(
            f"devices={devices} but TPU training uses all {topo.num_devices} {topo.device_kind} device(s) "
            f"({topo.detail}) through SPMD; {hint}"
        )
    if devices > topo.num_devices:
        raise ValueError(
            f"devices={devices} but only {topo.num_devices} {topo.device_kind} device(s) are available "
            f"({topo.detail}); use devices <= {topo.num_devices}, or devices=None for all"
        )
    return dataclasses.replace(
        topo, num_devices=devices, detail=f"{topo.detail}; using devices={devices} of {topo.num_devices}"
    )
