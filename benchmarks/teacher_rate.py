"""How fast the pretrained teacher scores audio, at each thread count this machine has, and what that projects for
a Kaggle session (rounds/pretrained.py's pass over the training recordings).

    python -m benchmarks.teacher_rate [--source ../shared/xc-warblers] [--files 16] [--repeats 2] [--out FILE]

The first `--files` recordings of the set (by xeno-canto id) are decoded once, then scored by BirdNET v2.4 (3 s
windows, 48 kHz, batches of 32: teachers/scoring.py) with 1, 2, ... threads; each count runs `--repeats` times and
keeps its fastest. Decoding is timed apart (one decoding thread runs beside the model in the real pass), so the
result says which of the two bounds the pass. The projection for other core counts is a line through the
measured per-thread rate at the measured scaling efficiency, capped by the one decoding thread's rate: an
extrapolation, labelled so; Kaggle's cores were not measured here.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks import print_result

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_SOURCE = ROOT.parent / "shared" / "xc-warblers"
# vCPUs of the sessions a Kaggler trains in (what `nproc` reports there).
KAGGLE_CPUS = {"GPU T4 x2 session": 4, "TPU v3-8 / v5e-8 VM host": 96}


def recordings(source: Path, count: int) -> list[Path]:
    found = sorted((p for p in source.rglob("*") if p.suffix.lower() in (".mp3", ".ogg", ".wav", ".flac")),
                   key=lambda p: p.name)  # fmt: skip
    if not found:
        raise FileNotFoundError(f"no recordings under {source}: pass --source, the xc-warblers folder")
    return found[:count]


def run(source: Path = DEFAULT_SOURCE, files: int = 16, repeats: int = 2) -> dict[str, Any]:
    import numpy as np

    from pipeline.core.data import load_audio
    from pipeline.teachers.model import find_teacher
    from pipeline.teachers.scoring import teacher_windows, window_logits

    teacher = find_teacher("birdnet")
    paths = recordings(source, files)
    started = time.perf_counter()
    audio = [load_audio(p, sample_rate=teacher.sample_rate)[0] for p in paths]
    decode_s = time.perf_counter() - started
    seconds = sum(len(a) for a in audio) / teacher.sample_rate
    windows = [teacher_windows(a, teacher.window_samples, teacher.window_samples)[0] for a in audio]
    rates = {}
    for threads in range(1, (os.cpu_count() or 1) + 1):
        runtime = teacher.runtime(threads)
        window_logits(runtime, windows[0][:1])  # the interpreter's first call allocates
        best = float("inf")
        for _ in range(repeats):
            started = time.perf_counter()
            for w in windows:
                window_logits(runtime, w)
            best = min(best, time.perf_counter() - started)
        rates[threads] = round(seconds / best, 1)
        print(f"{threads} thread(s): {rates[threads]} s of audio per second", file=sys.stderr)
    most = max(rates)
    efficiency = round(rates[most] / (rates[1] * most), 3)
    decode_rate = seconds / decode_s
    # The real pass decodes on one thread beside the model: whichever is slower bounds it.
    projected = {
        name: round(min(rates[1] * cpus * efficiency, decode_rate), 0) for name, cpus in KAGGLE_CPUS.items()
    }
    return {
        "headline": (
            f"BirdNET v2.4 on {len(paths)} recordings ({seconds / 60:.1f} min): "
            + ", ".join(f"{t} thread(s) {r:.0f}" for t, r in rates.items())
            + f" s of audio/s (scaling efficiency {efficiency:.2f} at {most}); decoding alone "
            f"{decode_rate:.0f} s of audio/s on one thread"
        ),
        "files": len(paths),
        "audio_seconds": round(seconds, 1),
        "windows": int(sum(len(w) for w in windows)),
        "audio_seconds_per_second": rates,
        "scaling_efficiency": efficiency,
        "decode_audio_seconds_per_second": round(decode_rate, 1),
        "projected_audio_seconds_per_second_extrapolated": projected,
        "projected_hours_per_100_hours_extrapolated": {
            name: round(100 / rate, 2) for name, rate in projected.items()
        },
        "threads_decoding_in_the_real_pass": 1,
        "numpy": np.__version__,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.teacher_rate", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--source", type=Path, default=DEFAULT_SOURCE)
    parser.add_argument("--files", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--out", type=Path, help="also write the result here (JSON)")
    args = parser.parse_args(argv)
    result = run(args.source, args.files, args.repeats)
    print_result(result, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
