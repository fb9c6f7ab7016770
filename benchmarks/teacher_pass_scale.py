"""A round's teacher pass at two sizes: scoring every window of N and 10N soundscapes into a targets file
(pipeline/inference/targets.write_window_targets, what rounds/self_training.score_soundscapes runs) must cost
time in proportion to the windows and memory that does not grow with them.

    python -m benchmarks.teacher_pass_scale [--quick] [--files N] [--classes C] [--repo DIR] [--out FILE]

The teacher is an untrained 'tiny' model with C classes (its weights do not change what is computed, only what
comes out), sealed as an artifact; the soundscapes are 10 s of low noise each, scored in 0.5 s windows 0.05 s
apart (191 windows a file: many windows from little audio on disk). The smaller size is two whole passes of the
infer stage's calls (2 x targets.FILES_PER_PASS files), so both sizes score whole passes, each after another
pass: below one pass a pass holds fewer files, and a single pass has no pass before it, so either would measure
a step that does not grow with the data as growth. Each size runs in a fresh interpreter whose
peak private memory (RssAnon of the process tree) and wall time are measured. `--repo` scores with another
checkout's code (e.g. an older commit's worktree), for a before/after in one run.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks import print_result
from benchmarks.scale import run_measured

ROOT = Path(__file__).resolve().parents[1]
RATE, SECONDS, WINDOW, HOP = 16_000, 10.0, 0.5, 0.05
SCORE = """
import sys, time
from pathlib import Path
from pipeline.inference.targets import write_window_targets
root, artifact, files = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3])
names = [f"soundscape_{k:05d}.wav" for k in range(files)]
started = time.perf_counter()
write_window_targets(artifact, root, names, names, root / f"targets_{files}.csv", hop_seconds=float(sys.argv[4]),
                     independent=True, log=lambda _: None)
print(time.perf_counter() - started)
"""


def make_teacher(folder: Path, classes: int) -> Path:
    import torch

    from pipeline.core.artifact import save_artifact
    from pipeline.core.model import ModelConfig, SpeakerClassifier

    torch.manual_seed(0)
    config = ModelConfig.from_preset("tiny", n_classes=classes, n_mels=40, window_samples=int(WINDOW * RATE))
    model = SpeakerClassifier(config).eval()
    labels = [f"class_{c:03d}" for c in range(classes)]
    return save_artifact(folder / "teacher", model, labels, {"note": "benchmarks.teacher_pass_scale"})


def make_soundscapes(folder: Path, count: int) -> None:
    import soundfile as sf

    rng = np.random.default_rng(0)
    folder.mkdir(parents=True, exist_ok=True)
    for k in range(count):
        path = folder / f"soundscape_{k:05d}.wav"
        if not path.exists():
            sf.write(path, (0.01 * rng.standard_normal(int(SECONDS * RATE))).astype(np.float32), RATE)


def run(
    quick: bool = False, files: int | None = None, classes: int = 200, repo: Path = ROOT
) -> dict[str, Any]:
    from pipeline.inference.targets import FILES_PER_PASS

    small = files or (20 if quick else 2 * FILES_PER_PASS)
    env = {**os.environ, "PYTHONPATH": str(repo), "OMP_NUM_THREADS": "2"}
    results: dict[str, Any] = {
        "classes": classes,
        "repo": str(repo),
        "hop_seconds": HOP,
        "files_per_pass": FILES_PER_PASS,
        "sizes": [],
    }
    with tempfile.TemporaryDirectory(prefix="bench-teacher-pass-") as tmp:
        artifact = make_teacher(Path(tmp), classes)
        root = Path(tmp) / "soundscapes"
        for count in (small, small * 10):
            make_soundscapes(root, count)
            args = [str(root), str(artifact), str(count), str(HOP)]
            done = run_measured([sys.executable, "-c", SCORE, *args], env, repo)
            if done["returncode"] != 0:
                raise RuntimeError(f"scoring {count} soundscapes failed: {done['output'][-2000:]}")
            targets = root / f"targets_{count}.csv"
            windows = sum(1 for _ in targets.open()) - 1
            seconds = round(float(done["output"].split()[-1]), 2)
            peak_mb = round(done["peak_private_gb"] * 1000)
            results["sizes"].append(
                {"files": count, "windows": windows, "score_s": seconds, "peak_private_mb": peak_mb}
            )
    one, ten = results["sizes"]
    results["time_ratio"] = round(ten["score_s"] / one["score_s"], 2)
    results["memory_ratio"] = round(ten["peak_private_mb"] / one["peak_private_mb"], 2)
    results["headline"] = (
        f"{one['windows']:,} / {ten['windows']:,} windows of {classes} classes scored in {one['score_s']} / "
        f"{ten['score_s']} s (x{results['time_ratio']} for x10 the windows), peak private memory "
        f"{one['peak_private_mb']} / {ten['peak_private_mb']} MB (x{results['memory_ratio']})"
    )
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--files", type=int, help="the smaller size (the larger is 10x)")
    parser.add_argument("--classes", type=int, default=200)
    parser.add_argument("--repo", type=Path, default=ROOT, help="score with this checkout's pipeline")
    parser.add_argument("--out", type=Path, help="also write the result here (JSON)")
    args = parser.parse_args(argv)
    print_result(run(args.quick, args.files, args.classes, args.repo.resolve()), args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
