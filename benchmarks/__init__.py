"""Benchmarks: each module runs as `python -m benchmarks.NAME`; `make bench` runs the sections (run.py)."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import IO, Any

ROOT = Path(__file__).resolve().parents[1]


def machine() -> dict[str, Any]:
    """What the figures were measured on (times compare only within one machine and day)."""
    import torch

    return {"cpu_count": os.cpu_count(), "python": platform.python_version(), "torch": torch.__version__,
            "platform": platform.platform(), "started": time.strftime("%Y-%m-%dT%H:%M:%S"),
            "loadavg_1m": round(os.getloadavg()[0], 2), **cpu_model()}  # fmt: skip


# The instruction sets int8 speed and accuracy depend on (VNNI: int8 products without 16-bit saturation).
ISA_FLAGS = ("avx2", "avx512f", "avx512_vnni", "avx_vnni", "amx_int8")


def cpu_model() -> dict[str, Any]:
    """The CPU's name and which of ISA_FLAGS it has (Linux's /proc/cpuinfo; empty elsewhere): the machines
    this project is measured on change between days, and int8 figures depend on the instruction set."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return {}
    fields = dict(line.split(":", 1) for line in text.split("\n\n")[0].splitlines() if ":" in line)
    name = next((v.strip() for k, v in fields.items() if k.strip() == "model name"), None)
    flags = set(next((v for k, v in fields.items() if k.strip() == "flags"), "").split())
    return {"cpu": name, "cpu_flags": [flag for flag in ISA_FLAGS if flag in flags]}


# What benchmark runs write inside benchmarks/ (`make bench`, scripts' --out files kept by hand).
OUTPUTS = ("results.json", "results.md", "raw", "out", "cpu", "gpu")


def commit_state(root: Path = ROOT) -> dict[str, Any]:
    """The commit a result was measured at, and whether the code it ran had uncommitted changes: what lets a
    reader of docs/measurements.md trace a figure to the code that produced it."""
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=root, capture_output=True, text=True)
    # The benchmarks' own outputs (results.json, raw files) are not code: a run that wrote them earlier in the
    # same checkout still ran committed code.
    outputs = [f":(exclude)benchmarks/{name}" for name in OUTPUTS]
    paths = ["pipeline", "benchmarks", "notebooks", *outputs]
    changed = subprocess.run(
        ["git", "status", "--porcelain", "--", *paths], cwd=root, capture_output=True, text=True
    )
    return {"finished": time.strftime("%Y-%m-%dT%H:%M:%S"), "commit": commit.stdout.strip() or None,
            "uncommitted_changes": bool(changed.stdout.strip())}  # fmt: skip


def print_result(result: dict[str, Any], out: Path | None = None) -> None:
    """A benchmark's result as JSON on stdout, and at `out` when given (its --out, a raw file: stamped with the
    commit, the time and the machine)."""
    print(json.dumps(result, indent=1, default=str))
    if out is not None:
        stamped = {**commit_state(), "machine": machine(), **result}
        Path(out).write_text(json.dumps(stamped, indent=1, default=str) + "\n")


def in_fresh_process(module: str, args: list[str], log: IO[str] | None = None) -> str:
    """`python -m MODULE ARGS` in a process of its own, from the repository root; its stdout. A timed run that
    stands for a user's notebook should start cold, as the notebook's kernel does, and so should what it is
    held against. `log` (a text stream) gets the process's stdout and stderr line by line as they come (a
    3-minute training run is not silent until it ends); a failure raises with the end of its stderr."""
    process = subprocess.Popen(
        [sys.executable, "-m", module, *args],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    kept: dict[str, list[str]] = {"stdout": [], "stderr": []}

    # One thread a pipe: neither pipe fills up and stalls the process while the other is being read.
    def follow(stream: IO[str], name: str) -> None:
        for line in stream:
            kept[name].append(line)
            if log is not None:
                log.write(line)

    readers = [threading.Thread(target=follow, args=(getattr(process, name), name)) for name in kept]
    for reader in readers:
        reader.start()
    for reader in readers:
        reader.join()
    if process.wait() != 0:
        tail = "".join(kept["stderr"][-5:]).strip()
        raise RuntimeError(f"python -m {module} {' '.join(args)} failed ({process.returncode}): {tail}")
    return "".join(kept["stdout"])
