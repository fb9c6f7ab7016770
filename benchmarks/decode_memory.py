"""Private memory that decoding keeps, at two sizes: files of distinct lengths at 44.1 kHz read to 16 kHz.

    python -m benchmarks.decode_memory [--sizes 150 600] [--out FILE]

Every file is read by `load_audio` (what the audio cache's build and the infer stage's reads do), in a fresh
interpreter per run, and the process's RssAnon is compared before and after (and the reading timed). Two
resamplers:

  padded        today's `core.data.resample`: inputs zero-padded to one of a few dozen lengths
  per_length    the same call with the padding off (`padded_blocks` = identity): a convolution input shape per
                distinct file length, as before 2026-11-30

oneDNN keeps a primitive per convolution shape (up to 1,024, never freed), so `per_length` grows with the
number of distinct lengths, which is the number of files here; `padded` should not. The ratio of growth
between the two sizes is the headline.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks import print_result

RATE = 44_100
CHILD = """
import json, sys, time
from pathlib import Path
import pipeline.core.data as data

def anon_mb():
    for line in open('/proc/self/status'):
        if line.startswith('RssAnon'):
            return int(line.split()[1]) / 1024

folder, count, variant = Path(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
if variant == 'per_length':
    data.padded_blocks = lambda blocks: blocks
files = sorted(folder.glob('*.wav'))[:count]
data.load_audio(files[0])  # torch's and the decoder's first-call allocations are not what is measured
before, started = anon_mb(), time.perf_counter()
for path in files[1:]:
    data.load_audio(path)
seconds = time.perf_counter() - started
growth = anon_mb() - before
print(json.dumps({'files': len(files), 'before_mb': before, 'growth_mb': growth, 'seconds': seconds}))
"""


def write_files(folder: Path, count: int, seed: int = 0) -> None:
    """`count` WAV files of noise, 0.5-10 s, every one a different length."""
    import soundfile

    rng = np.random.default_rng(seed)
    lengths = rng.choice(np.arange(int(0.5 * RATE), 10 * RATE), size=count, replace=False)
    for k, n in enumerate(lengths):
        soundfile.write(folder / f"f{k:05d}.wav", (0.1 * rng.standard_normal(n)).astype(np.float32), RATE)


def run(sizes: tuple[int, ...] = (150, 600)) -> dict[str, Any]:
    result: dict[str, Any] = {"rate": RATE, "sizes": list(sizes), "runs": []}
    with tempfile.TemporaryDirectory(prefix="decode-memory-") as tmp:
        write_files(Path(tmp), max(sizes))
        for variant in ("padded", "per_length"):
            for size in sizes:
                done = subprocess.run(
                    [sys.executable, "-c", CHILD, tmp, str(size), variant],
                    capture_output=True,
                    text=True,
                    check=True,
                )
                record = json.loads(done.stdout.strip().splitlines()[-1])
                result["runs"].append({"variant": variant, **record})
    small, large = min(sizes), max(sizes)
    growth = {(r["variant"], r["files"]): r["growth_mb"] for r in result["runs"]}
    seconds = {(r["variant"], r["files"]): r["seconds"] for r in result["runs"]}
    for variant in ("padded", "per_length"):
        result[variant] = {
            "growth_mb": {
                str(small): round(growth[variant, small], 1),
                str(large): round(growth[variant, large], 1),
            },
            "files_ratio": large / small,
            "growth_ratio": round(growth[variant, large] / max(growth[variant, small], 0.1), 2),
            "seconds": {
                str(small): round(seconds[variant, small], 2),
                str(large): round(seconds[variant, large], 2),
            },
        }
    result["headline"] = (
        f"private memory kept after reading {small} / {large} files of distinct lengths: padded "
        f"+{growth['padded', small]:.0f} / +{growth['padded', large]:.0f} MB, one shape per length "
        f"+{growth['per_length', small]:.0f} / +{growth['per_length', large]:.0f} MB; reading them took "
        f"{seconds['padded', large] / seconds['per_length', large]:.2f}x the time padded"
    )
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.decode_memory", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--sizes", type=int, nargs=2, default=(150, 600))
    parser.add_argument("--out", help="write the raw file here (default: print it)")
    args = parser.parse_args(argv)
    result = run(tuple(args.sizes))
    command = "python -m benchmarks.decode_memory " + " ".join(argv or sys.argv[1:])
    print_result({"command": command, **result}, Path(args.out) if args.out else None)
    return 0


if __name__ == "__main__":
    sys.exit(main())
