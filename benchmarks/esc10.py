"""Real sound events: ESC-10's official 5-fold cross-validation through both notebooks, with the defaults.

    python -m benchmarks.esc10 [--folds 1,2,3,4,5] [--seeds 0,1,2] [--set NAME=VALUE ...] [--infer-set NAME=VALUE ...]
                               [--variant NAME:PARAM=VALUE,PARAM=VALUE ...] [--source DIR] [--out FILE] [--keep DIR]
    python -m benchmarks.esc10 --rescore KEPT [--infer-set NAME=VALUE ...] [--variant ...] [--out FILE]

ESC-10 (Piczak, ACM MM 2015; ../shared/esc10, CC BY 3.0): 400 clips of 5 s, 44.1 kHz Ogg/Vorbis, 10 classes of
40, five official folds (the first digit of a file name; clips cut from one recording share a fold). Protocol:
train on four folds, test on the fifth, report the mean over the five. Each fold here is what a user gets: a
competition folder in this project's layout (train.csv, test.csv, sample_submission.csv), `papermill
notebooks/train.ipynb` then `papermill notebooks/infer.ipynb` with no parameter but the folders, and
`pipeline score`. `--set` / `--infer-set` change one notebook parameter, for experiments against the defaults
(the result records them). `--variant` runs the infer notebook again on each fold's artifact with other
parameters (e.g. `max:clip_pooling=max`): inference choices measured on the same trained models; `--keep DIR`
keeps each fold's folder and artifact (DIR/run<seed>-<fold>) to try more of them later: `--rescore DIR` runs
the infer notebook alone on them. One fold is 80 clips: its accuracy has a standard error of ~4.5 points, so compare
5-fold means, and more than one seed where a difference is small.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import os
import shutil
import sys
import tempfile
from collections import Counter
from pathlib import Path
from typing import Any

from benchmarks import print_result
from benchmarks.fsdd_accuracy import CpuMeter
from benchmarks.scale import papermill
from benchmarks.soundscape import _parse_sets

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_SOURCE = ROOT.parent / "shared" / "esc10"
FOLDS = (1, 2, 3, 4, 5)
TARGET = 0.92  # issue 31: ahead of EnvNet-v2 + strong augmentation + BC learning
MINUTES_PER_FOLD_LIMIT = 15.0
# Where a variant is chosen and where it is confirmed: the sound-event defaults of 2026-11-28 were chosen and
# reported on all five folds; a change from here on is chosen on folds 1-3 and must hold on folds 4-5
# (`variants_paired`), which its choice did not look at.
CHOICE_FOLDS, CONFIRM_FOLDS = (1, 2, 3), (4, 5)
# Published accuracies on ESC-10's official folds, no external training data (../shared/NOTES.md).
PUBLISHED = {
    "random forest on MFCC + ZCR (Piczak 2015)": 0.727,
    "Piczak's CNN (2015)": 0.802,
    "EnvNet (Tokozume & Harada 2017)": 0.872,
    "EnvNet + BC learning (Tokozume et al. 2018)": 0.887,
    "EnvNet-v2 (2018)": 0.858,
    "EnvNet-v2 + BC learning": 0.894,
    "EnvNet-v2 + strong augmentation": 0.891,
    "EnvNet-v2 + strong augmentation + BC learning": 0.914,
    "human listeners (Piczak 2015)": 0.957,
}


def scan(source: Path) -> list[tuple[int, str, Path]]:
    """(fold, label, path) of every clip: folders are '<NNN> - <label>', files '<fold>-<freesound id>-<take>.ogg'."""
    clips = []
    for folder in sorted(p for p in source.iterdir() if p.is_dir() and " - " in p.name):
        label = folder.name.split(" - ", 1)[1]
        for path in sorted(folder.glob("*.ogg")):
            fold = path.name.split("-", 1)[0]
            if not fold.isdigit() or int(fold) not in FOLDS:
                raise ValueError(f"{path}: expected '<fold 1-5>-<id>-<take>.ogg'")
            clips.append((int(fold), label, path))
    if not clips:
        raise FileNotFoundError(
            f"no ESC-10 clips under {source} (folders '001 - Dog bark', ... of .ogg files)"
        )
    return clips


def make_fold_folder(clips: list[tuple[int, str, Path]], test_fold: int, out: Path) -> Path:
    """A competition folder: the other folds to train on, `test_fold` hidden behind test.csv, and solution.csv.
    Files are hard-linked (or copied): the data module refuses paths that lead outside the folder."""
    audio = out / "audio"
    audio.mkdir(parents=True)
    train_rows, test_rows = [], []
    for fold, label, path in clips:
        target = audio / path.name  # file names are unique across classes (freesound id + take)
        try:
            os.link(path, target)
        except OSError:
            shutil.copyfile(path, target)
        rel = f"audio/{path.name}"
        if fold == test_fold:
            test_rows.append((path.stem, rel, label))
        else:
            train_rows.append((rel, label))
    _write(out / "train.csv", ["path", "label"], train_rows)
    _write(out / "test.csv", ["id", "path"], [(i, p) for i, p, _ in test_rows])
    _write(out / "sample_submission.csv", ["id", "label"], [(i, "?") for i, _, _ in test_rows])
    _write(out / "solution.csv", ["id", "label"], [(i, label) for i, _, label in test_rows])
    return out


def _write(path: Path, header: list[str], rows: list[tuple]) -> None:
    with open(path, "w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(header)
        writer.writerows(rows)


def _read(path: Path) -> dict[str, str]:
    with open(path, newline="") as handle:
        return {row["id"]: row["label"] for row in csv.DictReader(handle)}


def run_fold(
    clips: list[tuple[int, str, Path]],
    test_fold: int,
    work: Path,
    train_overrides: dict[str, Any],
    infer_overrides: dict[str, Any],
    variants: dict[str, dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """Both notebooks on one fold; accuracy, per-class hits and the minutes each notebook took; the accuracy of
    each infer `variant` on the same artifact."""
    data = make_fold_folder(clips, test_fold, work / f"fold{test_fold}")
    artifact = work / f"model{test_fold}"
    trained = papermill(ROOT, "train.ipynb", work, {"data_dir": data, "artifact_dir": artifact, "progress": False,
                                                    **train_overrides})  # fmt: skip
    scored = score_fold(data, artifact, test_fold, work, infer_overrides, variants)
    return {**scored, "train_min": round(trained["seconds"] / 60, 2),
            "minutes": round(trained["seconds"] / 60 + scored["infer_min"], 2)}  # fmt: skip


def score_fold(
    data: Path,
    artifact: Path,
    test_fold: int,
    work: Path,
    infer_overrides: dict[str, Any],
    variants: dict[str, dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """The infer notebook on one fold's folder and artifact (its submissions and notebooks written in `work`):
    accuracy, per-class hits, its minutes, and the accuracy of each infer `variant` on the same artifact."""
    submission = work / f"submission{test_fold}.csv"
    inferred = papermill(ROOT, "infer.ipynb", work, {"data_dir": data, "artifact_dir": artifact,
                                                     "submission_path": submission, "progress": False,
                                                     **infer_overrides})  # fmt: skip
    truth, predicted = _read(data / "solution.csv"), _read(submission)
    hits = Counter(label for key, label in truth.items() if predicted.get(key) == label)
    confusions = Counter(
        (label, predicted.get(key)) for key, label in truth.items() if predicted.get(key) != label
    )
    by_variant = {}
    for name, params in (variants or {}).items():
        other = work / f"submission{test_fold}-{name}.csv"
        papermill(ROOT, "infer.ipynb", work, {"data_dir": data, "artifact_dir": artifact, "submission_path": other,
                                              "progress": False, **infer_overrides, **params})  # fmt: skip
        found = _read(other)
        by_variant[name] = round(sum(found.get(k) == v for k, v in truth.items()) / len(truth), 4)
    manifest = json.loads((artifact / "manifest.json").read_text())
    provenance = manifest["provenance"]
    return {
        "fold": test_fold,
        "accuracy": round(sum(hits.values()) / len(truth), 4),
        "test_clips": len(truth),
        "per_class_hits": dict(sorted(hits.items())),
        "per_class_total": dict(sorted(Counter(truth.values()).items())),
        "confusions": [f"{t} -> {p}: {n}" for (t, p), n in confusions.most_common(5)],
        "infer_min": round(inferred["seconds"] / 60, 2),
        "epochs": len(provenance.get("history", [])),
        "best_epoch": provenance.get("best_epoch"),
        "variants": by_variant,
    }


def _std(values: list[float]) -> float:
    mean = sum(values) / len(values)
    return math.sqrt(sum((v - mean) ** 2 for v in values) / max(1, len(values) - 1))


def paired_difference(folds: list[dict[str, Any]], name: str) -> dict[str, Any]:
    """Variant `name` minus the defaults on the same artifacts, on the folds a choice is made on (CHOICE_FOLDS) and
    on those held out to confirm it (CONFIRM_FOLDS): the mean difference and the (seed, fold) runs up / down."""
    halves = {}
    for half, numbers in (("choice", CHOICE_FOLDS), ("confirm", CONFIRM_FOLDS)):
        diffs = [f["variants"][name] - f["accuracy"] for f in folds if f["fold"] in numbers]
        if diffs:
            halves[half] = {"folds": list(numbers), "runs": len(diffs), "difference": round(sum(diffs) / len(diffs), 4),
                            "up": sum(d > 0 for d in diffs), "down": sum(d < 0 for d in diffs)}  # fmt: skip
    return halves


def summarise(folds: list[dict[str, Any]], meta: dict[str, Any]) -> dict[str, Any]:
    """Means over every (seed, fold) run; with several seeds, each seed's 5-fold mean and their spread, which
    is what a change of the defaults must beat."""
    accuracies = [f["accuracy"] for f in folds]
    mean = sum(accuracies) / len(accuracies)
    by_seed: dict[int, list[float]] = {}
    for fold in folds:
        by_seed.setdefault(fold["seed"], []).append(fold["accuracy"])
    seed_means = {seed: round(sum(a) / len(a), 4) for seed, a in by_seed.items()}
    by_fold: dict[int, list[float]] = {}
    for fold in folds:
        by_fold.setdefault(fold["fold"], []).append(fold["accuracy"])
    spread = _std([sum(a) / len(a) for a in by_fold.values()])  # of the folds' means over seeds
    hits, totals = Counter(), Counter()
    for fold in folds:
        hits.update(fold["per_class_hits"])
        totals.update(fold["per_class_total"])
    per_class = {label: round(hits[label] / totals[label], 3) for label in sorted(totals)}
    minutes = [f["minutes"] for f in folds]
    variants = {
        name: round(sum(f["variants"][name] for f in folds) / len(folds), 4) for name in folds[0]["variants"]
    }
    paired = {name: paired_difference(folds, name) for name in folds[0]["variants"]}
    whole = {f["fold"] for f in folds} == set(FOLDS)
    seeds = (f", {len(by_seed)} seeds: {' / '.join(f'{m:.3f}' for m in seed_means.values())} "
             f"(+-{_std(list(seed_means.values())):.3f} over seeds)" if len(by_seed) > 1 else "")  # fmt: skip
    # Accuracies are multiples of 1/80: 0.92 must not fall short of itself by a float sum's last bit.
    short = [f"mean {mean:.4f} < {TARGET:.2f}"] if round(mean, 4) < TARGET else []
    if max(minutes) > MINUTES_PER_FOLD_LIMIT:  # a fold run beside other jobs can miss on time alone
        short.append(f"a fold took {max(minutes):.1f} min > {MINUTES_PER_FOLD_LIMIT:g}")
    met = not short
    rescored = "rescored" in meta  # the infer notebook alone: no training time, so no verdict on the target
    missed = f"MISSED ({'; '.join(short)})"
    verdict = ("" if not whole else "; the infer notebook alone on kept models" if rescored else
               f"; target {TARGET:.2f} {'met' if met else missed}")  # fmt: skip
    return {
        "headline": (
            f"ESC-10 {'5-fold' if whole else f'{len(by_fold)}-fold'} mean accuracy {mean:.3f} "
            f"(+-{spread:.3f} over folds{seeds}), {max(minutes):.1f} min per fold at most{verdict}"
        ),  # fmt: skip
        "mean_accuracy": round(mean, 4),
        "fold_std": round(spread, 4),
        "per_fold": accuracies,
        "seed_means": seed_means,
        "seed_std": round(_std(list(seed_means.values())), 4),
        "per_class": per_class,
        "variants_mean_accuracy": variants,
        "variants_paired": paired,
        "minutes_per_fold": minutes,
        "target": TARGET,
        "minutes_per_fold_limit": MINUTES_PER_FOLD_LIMIT,
        "meets_target": bool(whole and met and not rescored),
        "published": PUBLISHED,
        "folds": folds,
        **meta,
    }


def run(
    source: Path = DEFAULT_SOURCE,
    folds: tuple[int, ...] = FOLDS,
    train_overrides: dict[str, Any] | None = None,
    infer_overrides: dict[str, Any] | None = None,
    quick: bool = False,
    variants: dict[str, dict[str, Any]] | None = None,
    seeds: tuple[int, ...] | None = None,
    keep: Path | None = None,
) -> dict[str, Any]:
    """The cross-validation, once per training seed in `seeds` (None: the train notebook's seed);
    `quick` runs one fold for 2 epochs (the path, not the accuracy); `keep`: where each fold's work folder
    (its competition folder, artifact and submissions) is moved instead of deleted."""
    if keep is not None and keep.exists() and any(keep.iterdir()):
        raise FileExistsError(f"--keep {keep}: not empty; name a new folder (nothing is overwritten)")
    clips = scan(Path(source))
    train_overrides = dict(train_overrides or {})
    if quick:
        folds, train_overrides = folds[:1], {"epochs": 2, **train_overrides}
    results = []
    with tempfile.TemporaryDirectory(prefix="bench-esc10-") as tmp, CpuMeter() as meter:
        for seed in seeds or (train_overrides.get("seed", 0),):
            overrides = {**train_overrides, "seed": seed} if seeds else train_overrides
            for fold in folds:
                work = Path(tmp) / f"run{seed}-{fold}"
                work.mkdir()
                done = run_fold(clips, fold, work, overrides, infer_overrides or {}, variants)
                results.append({"seed": seed, **done})
                print(
                    f"seed {seed} fold {fold}: {done['accuracy']:.4f} in {done['minutes']:.1f} min",
                    file=sys.stderr,
                )
                if keep is not None:
                    keep.mkdir(parents=True, exist_ok=True)
                    shutil.move(work, keep / work.name)
                else:
                    shutil.rmtree(work, ignore_errors=True)
    return summarise(results, {"quick": quick, "train_overrides": train_overrides,
                               "infer_overrides": infer_overrides or {}, **meter.result})  # fmt: skip


def rescore(
    kept: Path,
    infer_overrides: dict[str, Any] | None = None,
    variants: dict[str, dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """The infer notebook again on every fold `--keep` kept in `kept` (run<seed>-<fold>: its folder and
    artifact, read only; the new submissions are written in a temporary folder): inference choices measured
    through the notebook on models already trained. `minutes` per fold are the infer notebook's alone."""
    runs = sorted(kept.glob("run*-*"), key=lambda p: tuple(int(v) for v in p.name[3:].split("-")))
    if not runs:
        raise FileNotFoundError(f"--rescore {kept}: no run<seed>-<fold> folders (kept by --keep) in it")
    results = []
    with tempfile.TemporaryDirectory(prefix="bench-esc10-") as tmp, CpuMeter() as meter:
        for run_dir in runs:
            seed, fold = (int(v) for v in run_dir.name[3:].split("-"))
            work = Path(tmp) / run_dir.name
            work.mkdir()
            done = score_fold(run_dir / f"fold{fold}", run_dir / f"model{fold}", fold, work, infer_overrides or {},
                              variants)  # fmt: skip
            results.append({"seed": seed, **done, "minutes": done["infer_min"]})
            print(f"seed {seed} fold {fold}: {done['accuracy']:.4f} ({run_dir})", file=sys.stderr)
    return summarise(
        results, {"rescored": str(kept), "infer_overrides": infer_overrides or {}, **meter.result}
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.esc10", description=__doc__.split("\n")[0])
    parser.add_argument("--source", type=Path, default=DEFAULT_SOURCE)
    parser.add_argument("--folds", default=",".join(map(str, FOLDS)))
    parser.add_argument("--set", action="append", default=[], metavar="NAME=VALUE", help="train notebook")
    parser.add_argument(
        "--infer-set", action="append", default=[], metavar="NAME=VALUE", help="infer notebook"
    )
    parser.add_argument("--variant", action="append", default=[], metavar="NAME:PARAM=VALUE,...",
                        help="infer again with these parameters")  # fmt: skip
    parser.add_argument(
        "--seeds", help="train every fold once per seed, e.g. 0,1,2 (the spread a change must beat)"
    )
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--out", type=Path, help="also write the result here (JSON)")
    parser.add_argument("--keep", type=Path, help="keep each fold's folder and artifact here (a new folder)")
    parser.add_argument("--rescore", type=Path, metavar="KEPT",
                        help="train nothing: the infer notebook again on the folds --keep kept in KEPT")  # fmt: skip
    args = parser.parse_args(argv)
    folds = tuple(int(f) for f in args.folds.split(","))
    variants = {}
    for text in args.variant:
        name, _, params = text.partition(":")
        variants[name] = _parse_sets(params.split(",") if params else [])
    if args.rescore:
        result = rescore(args.rescore, _parse_sets(args.infer_set), variants)
    else:
        result = run(args.source, folds, _parse_sets(args.set), _parse_sets(args.infer_set), quick=args.quick,
                     variants=variants, seeds=tuple(int(s) for s in args.seeds.split(",")) if args.seeds else None,
                     keep=args.keep)  # fmt: skip
    print_result(result, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
