"""Helpers shared by tests (imported as `helpers`; pytest puts tests/ on sys.path)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def venv_env(**extra: str) -> dict[str, str]:
    """Environment for subprocesses (papermill kernels, workers): this interpreter's bin dir first on PATH."""
    env = dict(os.environ)
    env["PATH"] = str(Path(sys.executable).parent) + os.pathsep + env.get("PATH", "")
    env.update(extra)
    return env


def run_papermill(notebook: str, output: Path, params: dict, env: dict | None = None, timeout: float = 600):
    """Run a notebook as users do: the papermill CLI from the repo root. Returns the CompletedProcess."""
    argv = [str(Path(sys.executable).parent / "papermill"), str(ROOT / notebook), str(output), "--log-output"]
    for name, value in params.items():
        argv += ["-p", name, str(value)]
    return subprocess.run(
        argv, cwd=ROOT, env=env or venv_env(), capture_output=True, text=True, timeout=timeout
    )
