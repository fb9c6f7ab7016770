"""A teacher's scores file at two sizes: writing it (pipeline.core.tables.write_targets_file) and reading it
(read_chunk_targets) must cost in proportion to its rows, in memory close to the float32 array it becomes.

    python -m benchmarks.targets_scale [--quick] [--rows N] [--classes C] [--repo DIR] [--out FILE]

Each size is written by the product's own writer from rows generated as a round's teacher pass yields them
(filename,start,end and one probability column per class, 4 decimals; 12 windows per 60 s soundscape), then
read and hashed as the student's provenance records it; each step in a fresh interpreter whose peak private memory (RssAnon) and wall time are measured. `--repo`
writes and reads with another checkout's code (e.g. an older commit's worktree), for a before/after in one run.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

from benchmarks import print_result
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
if not getattr(found, "sha256", ""):  # older checkouts: the student hashed the file in a second pass
    from pipeline.core.staging import file_sha256
    file_sha256(Path(sys.argv[1]))
print(time.perf_counter() - started, probs.shape[0], probs.nbytes)
"""


WRITE = """
import sys, time
from pathlib import Path
import numpy as np
from pipeline.core.tables import write_targets_file
rows, classes = int(sys.argv[2]), int(sys.argv[3])
rng = np.random.default_rng(0)
def generated():  # blocks of 10,000 windows' probabilities, as a teacher pass scores them
    for first in range(0, rows, 10_000):
        block = rng.random((min(10_000, rows - first), classes))
        for k, values in enumerate(block, start=first):
            soundscape, window = divmod(k, 12)
            yield [f"soundscape_{soundscape:06d}.ogg", window * 5, window * 5 + 5, *(f"{v:.4f}" for v in values)]
header = ["filename", "start", "end", *(f"class_{c:03d}" for c in range(classes))]
lineage = lambda: {"teacher": "benchmark", "windows": rows, "files": -(-rows // 12)}
started = time.perf_counter()
write_targets_file(Path(sys.argv[1]), header, generated(), lineage, why="benchmarks.targets_scale")
print(time.perf_counter() - started)
"""


def measured(script: str, args: list[str], repo: Path) -> tuple[list[str], int]:
    """`script`'s output, split into words, and its peak private memory in MB (a fresh interpreter)."""
    env = {**os.environ, "PYTHONPATH": str(repo), "OMP_NUM_THREADS": "1"}
    done = run_measured([sys.executable, "-c", script, *args], env, repo)
    if done["returncode"] != 0:
        raise RuntimeError(f"{args[0]}: {done['output'][-2000:]}")
    return done["output"].split("\n")[-1].split() or done["output"].split(), round(
        done["peak_private_gb"] * 1000
    )


def measure(path: Path, rows: int, classes: int, repo: Path) -> dict[str, Any]:
    written, write_mb = measured(WRITE, [str(path), str(rows), str(classes)], repo)
    read, read_mb = measured(READ, [str(path), str(classes)], repo)
    read_s, read_rows, nbytes = read[-3:]
    return {"rows": int(read_rows), "write_s": round(float(written[-1]), 3), "write_peak_private_mb": write_mb,
            "read_s": round(float(read_s), 3), "peak_private_mb": read_mb, "probs_mb": round(int(nbytes) / 1e6)}  # fmt: skip


def run(quick: bool = False, rows: int | None = None, classes: int = 10, repo: Path = ROOT) -> dict[str, Any]:
    small = rows or (5_000 if quick else 50_000)
    results: dict[str, Any] = {"classes": classes, "repo": str(repo), "sizes": []}
    with tempfile.TemporaryDirectory(prefix="bench-targets-") as tmp:
        for count in (small, small * 10):
            path = Path(tmp) / f"targets_{count}.csv"
            results["sizes"].append(
                {**measure(path, count, classes, repo), "file_mb": round(path.stat().st_size / 1e6)}
            )
            path.unlink()
    one, ten = results["sizes"]
    results["time_ratio"] = round(ten["read_s"] / one["read_s"], 2)
    results["memory_ratio"] = round(ten["peak_private_mb"] / one["peak_private_mb"], 2)
    results["write_time_ratio"] = round(ten["write_s"] / one["write_s"], 2)
    results["write_memory_ratio"] = round(ten["write_peak_private_mb"] / one["write_peak_private_mb"], 2)
    results["headline"] = (
        f"{one['rows']:,} / {ten['rows']:,} windows of {classes} classes: read in {one['read_s']} / {ten['read_s']} s "
        f"(x{results['time_ratio']} for x10 the rows), peak private memory {one['peak_private_mb']} / "
        f"{ten['peak_private_mb']} MB (x{results['memory_ratio']}; the float32 targets are {ten['probs_mb']} MB); "
        f"written in {one['write_s']} / {ten['write_s']} s (x{results['write_time_ratio']}), peak private memory "
        f"{one['write_peak_private_mb']} / {ten['write_peak_private_mb']} MB (x{results['write_memory_ratio']}; "
        f"the file is {ten['file_mb']} MB)"
    )
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--rows", type=int, help="the smaller size (the larger is 10x)")
    parser.add_argument("--classes", type=int, default=10)
    parser.add_argument(
        "--repo", type=Path, default=ROOT, help="write and read with this checkout's pipeline"
    )
    parser.add_argument("--out", type=Path, help="also write the result here (JSON)")
    args = parser.parse_args(argv)
    print_result(run(args.quick, args.rows, args.classes, args.repo.resolve()), args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
