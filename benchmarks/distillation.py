"""Distillation on the field soundscapes: a 3-member ensemble's accuracy at one model's CPU speed (issue 32).

    python -m benchmarks.distillation [--seeds 0 1] [--folder DIR] [--quick] [--set NAME=VALUE ...] [--out FILE]
                                      [--work DIR] [--only teacher focal soundscapes scratch]

The soundscape default is an ensemble of three 'small' ECAPA-TDNNs (training/pretrained.py): three times the
CPU time of one model at submission, where BirdCLEF's 90 minutes are the limit. Per training seed, on the field
folder of benchmarks/soundscape_field.py (built once, or `--folder`):

- teacher: the 3-member ensemble on the focal recordings (the default recipe);
- student, scratch: one member on the focal recordings alone;
- student, soundscapes: one member taught the unlabelled soundscapes by the teacher (`train_rounds` with
  `teacher`, one round: the product's own path);
- student, soundscapes + focal: the same with `distill_focal`, the teacher's scores of the training
  recordings in each crop's target (TrainConfig.focal_targets).

Reported: macro ROC-AUC of the hidden 5 s chunks (max pooling, without and with the README's post-processing)
and each model's CPU inference rate on the hidden soundscapes (seconds of audio per second on this machine,
the models timed in turns after all of them trained, 3 rounds, the median: compare as ratios). The issue's target: a student within 0.005 of its teacher at its own speed.
"""

from __future__ import annotations

import contextlib
import json
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.soundscape import LAYOUT, _parse_sets, predict_chunks
from benchmarks.soundscape_field import build, field_arguments, report

POST = {"none": (None, 0.0), "smooth 0.1/0.8/0.1 + file max 0.2": ([0.1, 0.8, 0.1], 0.2)}
TARGET_GAP = 0.005


def evaluate(folder: Path, artifact: Path) -> dict[str, Any]:
    from pipeline.core import metrics

    predicted = predict_chunks(folder, artifact, post=POST)
    scores = {
        name: round(metrics.score("macro_roc_auc", predicted.truth, s), 4)
        for name, s in predicted.post.items()
    }
    return {"macro_roc_auc": scores, "audio_s_per_s": round(predicted.audio_s_per_s, 1)}


# --only's short names of the four models.
MODELS = {"teacher": "teacher (3 members)", "focal": "student, soundscapes + focal",
          "soundscapes": "student, soundscapes", "scratch": "student, scratch"}  # fmt: skip


def run_seed(data: Path, work: Path, seed: int, train_set: dict[str, Any], quick: bool,
             only: list[str] | None = None) -> dict[str, Any]:  # fmt: skip
    """Train and score the models (`only`: these of MODELS; the students' teacher must then be in `work`)."""
    from pipeline.core.config import TrainConfig
    from pipeline.rounds.self_training import train_rounds
    from pipeline.training.train import train

    base = TrainConfig(data_dir=str(data), cache_dir=str(work / "cache"), progress=False, seed=seed, **LAYOUT,
                       **({"epochs": 3} if quick else {}), **train_set)  # fmt: skip
    teacher = work / f"teacher_{seed}"
    runs = {
        "teacher (3 members)": lambda: train(replace(base, artifact_dir=str(teacher), ensemble_members=3)),
        "student, soundscapes + focal": lambda: train_rounds(replace(
            base, artifact_dir=str(work / f"focal_{seed}"), ensemble_members=1, teacher=str(teacher),
            self_training_rounds=1, distill_focal=True)),
        "student, soundscapes": lambda: train_rounds(replace(
            base, artifact_dir=str(work / f"soundscapes_{seed}"), ensemble_members=1, teacher=str(teacher),
            self_training_rounds=1)),
        "student, scratch": lambda: train(replace(base, artifact_dir=str(work / f"scratch_{seed}"), ensemble_members=1)),
    }  # fmt: skip
    if only:
        runs = {MODELS[short]: runs[MODELS[short]] for short in only}
    row: dict[str, Any] = {}
    artifacts = {}
    for name, fit in runs.items():
        started = time.perf_counter()
        with contextlib.redirect_stdout(sys.stderr):
            artifacts[name] = fit().artifact_dir
        row[name] = {"train_s": round(time.perf_counter() - started, 1), **evaluate(data, artifacts[name])}
        print(json.dumps({"seed": seed, name: row[name]}), file=sys.stderr, flush=True)
    for name, rate in paired_rates(data, artifacts).items():
        row[name]["audio_s_per_s"] = rate
    return row


def paired_rates(data: Path, artifacts: dict[str, Path], rounds: int = 3) -> dict[str, float]:
    """Each model's CPU inference rate on the hidden soundscapes (seconds of audio per second), the models in
    turns for `rounds` rounds, the median kept: a single timing varies with what else the machine does."""
    rates: dict[str, list[float]] = {name: [] for name in artifacts}
    for index in range(rounds):
        for name in list(artifacts)[:: 1 if index % 2 == 0 else -1]:
            rates[name].append(predict_chunks(data, artifacts[name]).audio_s_per_s)
    return {name: round(float(np.median(values)), 1) for name, values in rates.items()}


def summarise(seeds: dict[str, dict[str, Any]]) -> dict[str, Any]:
    models = list(next(iter(seeds.values())))
    mean = {model: {post: round(float(np.mean([s[model]["macro_roc_auc"][post] for s in seeds.values()])), 4)
                    for post in POST} for model in models}  # fmt: skip
    rate = {
        model: round(float(np.mean([s[model]["audio_s_per_s"] for s in seeds.values()])), 1)
        for model in models
    }
    teacher = models[0]
    gap = {model: round(mean[model]["none"] - mean[teacher]["none"], 4) for model in models[1:]}
    best = max(models[1:], key=lambda m: mean[m]["none"])
    return {
        "macro_roc_auc": mean, "audio_s_per_s": rate, "student_minus_teacher": gap,
        "headline": (
            f"field soundscapes, {len(seeds)} seed(s), macro ROC-AUC: " + ", ".join(
                f"{m} {mean[m]['none']:.4f} ({rate[m]:.0f} audio s/s)" for m in models)
            + f"; best student {best} {gap[best]:+.4f} vs the teacher (target >= -{TARGET_GAP}) at "
            f"{rate[best] / rate[teacher]:.1f}x its CPU speed"
        ),
    }  # fmt: skip


def run(source: Path, seeds: tuple[int, ...] = (0,), quick: bool = False) -> dict[str, Any]:
    """`make bench`'s section: the four models per seed on a field folder built here."""
    with tempfile.TemporaryDirectory(prefix="distillation-") as tmp:
        data = build(source, Path(tmp) / "data", quick)
        found = {str(seed): run_seed(data, Path(tmp), seed, {}, quick) for seed in seeds}
    return {"seeds": found, **summarise(found)}


def main(argv: list[str] | None = None) -> int:
    parser = field_arguments(__doc__)
    parser.add_argument("--work", type=Path, help="keep the models here (default: a temporary folder)")
    parser.add_argument("--only", nargs="+", choices=list(MODELS),
                        help="train these models only (a student's teacher must be in --work already)")  # fmt: skip
    parser.add_argument("--rates", nargs="+", type=Path, metavar="ARTIFACT",
                        help="only time these artifacts' inference on --folder, in turns")  # fmt: skip
    args = parser.parse_args(argv)
    if args.rates:
        print(json.dumps(paired_rates(args.folder, {str(p): p for p in args.rates}), indent=2))
        return 0
    with tempfile.TemporaryDirectory(prefix="distillation-") as tmp:
        work = args.work or Path(tmp)
        data = args.folder or build(args.source, work / "data", args.quick)
        seeds = {str(seed): run_seed(data, work, seed, _parse_sets(args.set), args.quick, args.only)
                 for seed in args.seeds}  # fmt: skip
    whole = not args.only or set(args.only) == set(MODELS)
    result = {
        "seeds": seeds,
        "train_set": args.set,
        **(summarise(seeds) if whole else {"headline": "--only: see seeds"}),
    }
    return report(result, args.out)


if __name__ == "__main__":
    sys.exit(main())
