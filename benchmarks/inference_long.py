"""The voxceleb-size artifact on a longer run: where the engine race's once-per-run cost no longer shows.

    python -m benchmarks.inference_long [--files 240] [--join 4] [--threads 2] [--rounds 2] [--out FILE]

benchmarks/inference.py times 2-4 s runs, in which `engine auto`'s race (the first batch computed again by
each engine, and an ONNX Runtime session opened) is a visible share. A submission runs minutes. This times
today's path (torch eager, full windows), the default on an artifact whose int8 file passed its rule at
training, and int8 forced, on FSDD clips joined `--join` at a time (untrained voxceleb weights: speed only),
each setting warmed up once, then `--rounds` interleaved rounds; the best round of each is reported.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import sys
import tempfile
import time
from pathlib import Path

import soundfile as sf

from benchmarks import print_result
from benchmarks.inference import make_artifact, make_subset, make_test_folder
from pipeline.core.config import InferConfig
from pipeline.inference.submission import run_inference

SETTINGS = {
    "today: torch, full windows": {"engine": "torch", "length_buckets": 1},
    "default, int8 passed at training": {"onnx_precision": "int8"},
    "onnx int8 (forced)": {"engine": "onnx", "onnx_precision": "int8"},
}


def run(files: int = 240, join: int = 4, threads: int = 2, rounds: int = 2) -> dict:
    with tempfile.TemporaryDirectory(prefix="bench-long-") as tmp:
        work = Path(tmp)
        data, _ = make_test_folder(work / "data", files, join)
        audio = sum(sf.info(str(p)).duration for p in (data / "audio").iterdir())
        labels = ["george", "jackson", "lucas", "nicolas", "theo", "yweweler"]
        artifact = make_artifact(work / "model", "voxceleb", labels, data)
        warm = make_subset(data, work / "warm", 8)

        def timed(name: str, folder: Path, tag: str) -> tuple[float, list[str]]:
            config = InferConfig(data_dir=str(folder), artifact_dir=str(artifact), progress=False,
                                 submission_path=str(work / f"{tag}.csv"), num_threads=threads, **SETTINGS[name])  # fmt: skip
            printed = io.StringIO()
            started = time.perf_counter()
            with contextlib.redirect_stdout(printed):
                run_inference(config)
            return time.perf_counter() - started, [
                x for x in printed.getvalue().splitlines() if "engine" in x
            ]

        for index, name in enumerate(SETTINGS):
            timed(name, warm, f"warm{index}")
        seconds: dict[str, list[float]] = {name: [] for name in SETTINGS}
        engines: dict[str, list[str]] = {}
        for round_index in range(rounds):
            for index, name in enumerate(SETTINGS):
                spent, engines[name] = timed(name, data, f"r{round_index}s{index}")
                seconds[name].append(spent)
    today = min(seconds["today: torch, full windows"])
    result = {"files": files, "audio_seconds": round(audio, 1), "threads": threads, "rounds": rounds,
              "settings": {name: {"seconds": round(min(s), 2), "audio_s_per_s": round(audio / min(s), 1),
                                  "vs_today": round(today / min(s), 2), "engine_lines": engines[name]}
                           for name, s in seconds.items()}}  # fmt: skip
    default = result["settings"]["default, int8 passed at training"]
    result["headline"] = (f"voxceleb, {audio:.0f} s of audio, {threads} threads: default with int8 passed "
                          f"{default['audio_s_per_s']} audio s/s = {default['vs_today']}x today's torch path")  # fmt: skip
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", type=int, default=240)
    parser.add_argument("--join", type=int, default=4)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument(
        "--out", type=Path, default=None, help="also write the result here, stamped (a raw file)"
    )
    args = parser.parse_args(argv)
    print_result(run(args.files, args.join, args.threads, args.rounds), args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
