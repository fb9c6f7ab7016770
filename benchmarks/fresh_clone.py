"""What a new user and CI run, timed on a fresh clone: `make setup`, `make demo`, then `.ci/run`.

    python -m benchmarks.fresh_clone --out benchmarks/raw/fresh_clone.json [--no-ci] [--serial] [--keep]

The clone is made from this checkout's HEAD into a temporary folder, with `../shared` linked beside it as CI has
it, and nothing of this checkout's state (no .venv, no artifacts, no caches of the project's own). pip's and uv's
caches are the machine's, so the set-up time is the figure for a warm package cache: a machine that downloads
the CUDA build of torch for the first time takes longer. The README's set-up, demo and CI figures come from
this file. With --serial, `make test` runs once more in the same clone with one pytest process
(PYTEST_WORKERS=0), so that its two workers are compared with the serial suite within one run. The temporary
folder is removed at the end unless --keep.
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks import ROOT, print_result
from benchmarks.fsdd_accuracy import CpuMeter

TAIL_LINES = 8  # of each step's output, kept in the raw file


def timed(command: list[str], cwd: Path, log: Path) -> dict[str, Any]:
    """Run `command` in `cwd`, its output into `log`; its seconds, exit code, last lines, and the share of the
    CPU other processes took meanwhile (a time measured beside another job is not the machine's)."""
    started = time.perf_counter()
    with log.open("w") as out, CpuMeter() as meter:
        code = subprocess.run(command, cwd=cwd, stdout=out, stderr=subprocess.STDOUT).returncode
    lines = log.read_text(errors="replace").splitlines()
    return {"command": " ".join(command), "seconds": round(time.perf_counter() - started, 1), "returncode": code,
            "contention": meter.result, "tail": lines[-TAIL_LINES:]}  # fmt: skip


def folder_gb(folder: Path) -> float:
    """Bytes on disk under `folder` (links not followed), in GB."""
    return round(sum(p.lstat().st_size for p in folder.rglob("*") if not p.is_symlink()) / 1e9, 2)


def pytest_summary(log: Path) -> dict[str, Any]:
    """The pytest summary line of a log ("847 passed, 3 skipped in 780.12s"): counts and seconds."""
    found = re.findall(r"^=*\s*((?:\d+ \w+,? ?)+) in ([\d.]+)s", log.read_text(errors="replace"), re.M)
    if not found:
        return {}
    counts, seconds = found[-1]
    return {"counts": counts.strip().rstrip(","), "seconds": float(seconds)}


def run(keep: bool = False, ci: bool = True, serial: bool = False) -> dict[str, Any]:
    work = Path(tempfile.mkdtemp(prefix="fresh-clone-"))
    clone = work / "main"
    try:
        subprocess.run(["git", "clone", "--quiet", "--no-hardlinks", str(ROOT), str(clone)], check=True)
        # What was cloned: the stamp's `commit` is this checkout's HEAD when the run ends, which may have moved.
        head = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=clone, capture_output=True, text=True
        )
        if (ROOT.parent / "shared").is_dir():
            (work / "shared").symlink_to(ROOT.parent / "shared")
        steps = {"setup": timed(["make", "setup"], clone, work / "setup.log")}
        steps["venv_gb"] = folder_gb(clone / ".venv")
        steps["demo"] = timed(["make", "demo"], clone, work / "demo.log")
        accuracy = re.findall(r"accuracy=([\d.]+)", (work / "demo.log").read_text(errors="replace"))
        steps["demo"]["accuracy"] = float(accuracy[-1]) if accuracy else None
        if ci:
            steps["ci"] = timed([".ci/run"], clone, work / "ci.log")
            steps["ci"]["pytest"] = pytest_summary(work / "ci.log")
        if serial:
            steps["serial_test"] = timed(["make", "test", "PYTEST_WORKERS=0"], clone, work / "serial.log")
            steps["serial_test"]["pytest"] = pytest_summary(work / "serial.log")
        failed = [name for name, step in steps.items() if isinstance(step, dict) and step["returncode"] != 0]
        headline = (
            f"set-up {steps['setup']['seconds'] / 60:.1f} min (warm package cache), make demo "
            f"{steps['demo']['seconds']:.0f} s (accuracy {steps['demo']['accuracy']})"
            + (f", .ci/run {steps['ci']['seconds'] / 60:.1f} min" if ci else "")
            + (_workers_against_serial(steps) if ci and serial else "")
            + (f"; FAILED: {', '.join(failed)}" if failed else "")
        )
        return {"headline": headline, "clone": str(clone), "clone_commit": head.stdout.strip(), **steps}
    finally:
        if keep:
            print(f"kept {work}", file=sys.stderr)
        else:
            shutil.rmtree(work, ignore_errors=True)  # ours: made by mkdtemp above


def _workers_against_serial(steps: dict[str, Any]) -> str:
    workers, alone = steps["ci"]["pytest"].get("seconds"), steps["serial_test"]["pytest"].get("seconds")
    if not (workers and alone):
        return ""
    return f"; pytest {workers / 60:.1f} min on make test's workers, {alone / 60:.1f} serial (x{workers / alone:.2f})"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.fresh_clone", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--out", type=Path, help="raw file to write (stamped with the commit and machine)")
    parser.add_argument("--no-ci", action="store_true", help="set-up and make demo only")
    parser.add_argument(
        "--serial", action="store_true", help="then make test again, serial (PYTEST_WORKERS=0)"
    )
    parser.add_argument("--keep", action="store_true", help="keep the temporary clone and its logs")
    args = parser.parse_args(argv)
    result = run(keep=args.keep, ci=not args.no_ci, serial=args.serial)
    print_result(result, args.out)
    return 0 if "FAILED" not in result["headline"] else 1


if __name__ == "__main__":
    sys.exit(main())
