"""A teacher's scores file at two sizes: reading it (pipeline.core.tables.read_chunk_targets) must cost in
proportion to its rows, in memory close to the float32 array it becomes.

    python -m benchmarks.targets_scale [--quick] [--rows N] [--classes C] [--repo DIR]

Each size is written as a self-training round writes it (filename,start,end and one probability column per
class; 12 windows per 60 s soundscape), then read in a fresh interpreter whose peak private memory (RssAnon)
and wall time are measured. `--repo` reads with another checkout's code (e.g. an older commit's worktree), for
a before/after in one run.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.scale import run_measured

ROOT = Path(__file__).resolve().parents[1]
READ = """
import sys, time
from pathlib import Path
import numpy as np
from pipeline.core.tables import read_chunk_targets
labels = [f"class_{c:03d}" for c in range(int(sys.argv[2]))]
started = time.perf_counter()
found = read_chunk_targets(Path(sys.argv[1]), labels)
probs = np.asarray(found.probs, dtype=np.float32)
print(time.perf_counter() - started, probs.shape[0], probs.nbytes)
"""


def write_targets(path: Path, rows: int, classes: int, seed: int = 0) -> None:
    """`rows` windows of 5 s, 12 per soundscape, with random probabilities written to 4 decimals."""
    rng = np.random.default_rng(seed)
    with path.open("w") as handle:
        handle.write("filename,start,end," + ",".join(f"class_{c:03d}" for c in range(classes)) + "\n")
        for first in range(0, rows, 10_000):
            block = rng.random((min(10_000, rows - first), classes))
            lines = []
            for k, values in enumerate(block, start=first):
                soundscape, window = divmod(k, 12)
                lines.append(f"soundscape_{soundscape:06d}.ogg,{window * 5},{window * 5 + 5},"
                             + ",".join(f"{v:.4f}" for v in values))  # fmt: skip
            handle.write("\n".join(lines) + "\n")


def measure(path: Path, classes: int, repo: Path) -> dict[str, Any]:
    env = {**os.environ, "PYTHONPATH": str(repo), "OMP_NUM_THREADS": "1"}
    done = run_measured([sys.executable, "-c", READ, str(path), str(classes)], env, repo)
    if done["returncode"] != 0:
        raise RuntimeError(f"reading {path} failed: {done['output'][-2000:]}")
    seconds, rows, nbytes = done["output"].split()[-3:]
    return {"rows": int(rows), "read_s": round(float(seconds), 2), "peak_private_mb": round(done["peak_private_gb"] * 1000),
            "probs_mb": round(int(nbytes) / 1e6)}  # fmt: skip


def run(quick: bool = False, rows: int | None = None, classes: int = 10, repo: Path = ROOT) -> dict[str, Any]:
    small = rows or (5_000 if quick else 50_000)
    results: dict[str, Any] = {"classes": classes, "repo": str(repo), "sizes": []}
    with tempfile.TemporaryDirectory(prefix="bench-targets-") as tmp:
        for count in (small, small * 10):
            path = Path(tmp) / f"targets_{count}.csv"
            write_targets(path, count, classes)
            results["sizes"].append(
                {**measure(path, classes, repo), "file_mb": round(path.stat().st_size / 1e6)}
            )
            path.unlink()
    one, ten = results["sizes"]
    results["time_ratio"] = round(ten["read_s"] / one["read_s"], 2)
    results["memory_ratio"] = round(ten["peak_private_mb"] / one["peak_private_mb"], 2)
    results["headline"] = (
        f"{one['rows']:,} / {ten['rows']:,} windows of {classes} classes: read in {one['read_s']} / {ten['read_s']} s "
        f"(x{results['time_ratio']} for x10 the rows), peak private memory {one['peak_private_mb']} / "
        f"{ten['peak_private_mb']} MB (x{results['memory_ratio']}; the float32 targets are {ten['probs_mb']} MB)"
    )
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--rows", type=int, help="the smaller size (the larger is 10x)")
    parser.add_argument("--classes", type=int, default=10)
    parser.add_argument("--repo", type=Path, default=ROOT, help="read with this checkout's pipeline")
    args = parser.parse_args(argv)
    print(json.dumps(run(args.quick, args.rows, args.classes, args.repo.resolve()), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
