"""Benchmarks: each module runs as `python -m benchmarks.NAME`; `make bench` runs the sections (run.py)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def print_result(result: dict[str, Any], out: Path | None = None) -> None:
    """A benchmark's result as JSON on stdout, and at `out` when given (its --out)."""
    text = json.dumps(result, indent=1)
    if out is not None:
        out.write_text(text + "\n")
    print(text)
