"""The Makefile's set-up, pip against uv: requirements.lock into a fresh venv, each from an empty package cache.

    python -m benchmarks.setup_install --out benchmarks/raw/setup_install.json

Both venvs are made by this Python's `venv` in a temporary folder, each with a cache folder of its own that
starts empty (PIP_CACHE_DIR, UV_CACHE_DIR), so both download every wheel, as a fresh CI machine does. pip
compiles bytecode as it installs; uv is asked to (--compile-bytecode), so that neither leaves the work to the
first import. The uv leg's time includes pip installing uv itself, as the Makefile does. Each venv must then
import the stack and pass `pip check`. The temporary folder is removed at the end.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from benchmarks import ROOT, print_result
from benchmarks.fresh_clone import timed

LOCK = ROOT / "requirements.lock"
IMPORTS = "import torch, torch_xla, speechbrain, onnxruntime, papermill; print(torch.__version__)"


def uv_pin() -> str:
    return next(line.strip() for line in LOCK.read_text().splitlines() if line.startswith("uv=="))


def install(work: Path, tool: str) -> dict[str, Any]:
    venv, cache = work / f"venv-{tool}", work / f"cache-{tool}"
    python = str(venv / "bin" / "python")
    script = work / f"{tool}.sh"
    if tool == "pip":
        steps = [f'PIP_CACHE_DIR="{cache}" "{python}" -m pip install --quiet -r "{LOCK}"']
    else:
        steps = [
            f'PIP_CACHE_DIR="{cache}" "{python}" -m pip install --quiet "{uv_pin()}"',
            f'UV_CACHE_DIR="{cache}" "{venv}/bin/uv" pip install --quiet --compile-bytecode --python "{python}" '
            f'-r "{LOCK}"',
        ]
    script.write_text("set -e\n" + f'"{sys.executable}" -m venv "{venv}"\n' + "\n".join(steps) + "\n")
    result = timed(["bash", str(script)], work, work / f"{tool}.log")
    check = subprocess.run(
        [python, "-c", IMPORTS], capture_output=True, text=True, env={**os.environ, "PJRT_DEVICE": "CPU"}
    )
    pip_check = subprocess.run([python, "-m", "pip", "check"], capture_output=True, text=True)
    result["imports"] = check.stdout.strip() or check.stderr.strip().splitlines()[-1:]
    result["pip_check"] = pip_check.stdout.strip().splitlines()[-1:]
    result["ok"] = result["returncode"] == 0 and check.returncode == 0 and pip_check.returncode == 0
    shutil.rmtree(venv, ignore_errors=True)  # ours: made above
    shutil.rmtree(cache, ignore_errors=True)
    return result


def run() -> dict[str, Any]:
    work = Path(tempfile.mkdtemp(prefix="setup-install-"))
    try:
        found = {tool: install(work, tool) for tool in ("pip", "uv")}
    finally:
        shutil.rmtree(work, ignore_errors=True)  # ours: made by mkdtemp above
    pip_s, uv_s = found["pip"]["seconds"], found["uv"]["seconds"]
    headline = (
        f"requirements.lock into a fresh venv from an empty cache: pip {pip_s:.0f} s, uv {uv_s:.0f} s "
        f"(x{pip_s / uv_s:.1f})" + ("" if all(r["ok"] for r in found.values()) else "; FAILED")
    )
    return {"headline": headline, **found}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.setup_install", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--out", type=Path, help="raw file to write (stamped with the commit and machine)")
    args = parser.parse_args(argv)
    result = run()
    print_result(result, args.out)
    return 0 if "FAILED" not in result["headline"] else 1


if __name__ == "__main__":
    sys.exit(main())
