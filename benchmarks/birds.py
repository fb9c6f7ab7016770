"""Real birds: xeno-canto recordings of four Acrocephalus warblers through both notebooks, with and without a
pretrained bird model as the teacher.

    python -m benchmarks.birds [--folds 0,1,2] [--source ../shared/xc-warblers] [--out FILE] [--keep DIR]
                               [--seed-offset N] [--quick] [--no-baseline] [--no-distill] [--no-hidden]
                               [--no-defaults]

`../shared/xc-warblers/` (84 recordings, 21 per species, 114 min, mp3; per-file CC BY-NC licences): a fine-grained
task -- four reed warblers whose songs differ in rhythm more than in pitch. Three folds: within each species,
sorted by xeno-canto id, fold 0 holds out the 3rd, 6th, ... recording (the source README's split), folds 1 and 2
the other two thirds, so every recording is tested once (28 a fold). Each fold is a competition folder in
BirdCLEF's training layout (`python -m pipeline data xeno-canto`: train_audio/<species>/, train.csv,
taxonomy.csv) with a test table, trained with the README's BirdCLEF parameters and seed = the fold (plus
`--seed-offset`, for the same folds on other seeds):

    defaults        the train notebook's defaults on this table (bird recordings: `training/plan.py`), with
                    `pretrained_teacher birdnet`: the same student, scored three ways by the infer notebook --
                    `student` (teacher_blend 0), `blend` (the sealed weight, 0.5) and `teacher` (teacher_blend 1:
                    BirdNET v2.4 alone, closed-set over the four species, never trained on this split)
    hidden species  each species in turn left out of the teacher's map (its class is one the teacher lacks): the
                    same student, resealed with that map and the 'none of mine' logit fitted again on the
                    training recordings; blend and teacher+rule accuracy on the hidden species and the others
    today           (unless --no-baseline) the choice before bird recordings had a kind of their own: the
                    sound-event recipe (speed perturbation 0.8-1.25x and test-time speeds) at 16 kHz
    distilled       (unless --no-distill) the student trained with distill_focal (the teacher's window scores
                    of the training recordings in every crop's target), fold k hiding species k from the teacher

Where each choice was made: the bird recipe (no speed perturbation, 32 kHz) was set before any of these runs
from the acoustics, and measured on fold 0 first (3 seeds, in a session with no raw file); the blend weight 0.5
is the plain average, not tuned; the 'none of mine' logit is fitted on each fold's training recordings only.
Folds 1 and 2 are held out from every choice. BirdNET was trained on xeno-canto recordings, some of these perhaps among
them: its accuracy here is an upper estimate of what it knows.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import shutil
import sys
import tempfile
import time
from collections import Counter
from dataclasses import replace
from pathlib import Path
from typing import Any

from benchmarks import print_result
from benchmarks.fsdd_accuracy import CpuMeter
from benchmarks.scale import papermill

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_SOURCE = ROOT.parent / "shared" / "xc-warblers"
FOLDS = (0, 1, 2)
# The README's BirdCLEF parameters for a training table in BirdCLEF's layout, and the teacher.
BIRDCLEF_TABLE = {"train_table": "train.csv", "path_column": "filename", "label_column": "primary_label",
                  "audio_dir": "train_audio", "secondary_labels_column": "secondary_labels"}  # fmt: skip
TODAY = {"sample_rate": 16000, "speed_probability": 0.5}  # the sound-event recipe, before the bird kind


def _read(path: Path) -> dict[str, str]:
    with open(path, newline="") as handle:
        return {row["id"]: row["label"] for row in csv.DictReader(handle)}


def score(truth: dict[str, str], submission: Path, hidden: str | None = None) -> dict[str, Any]:
    """Accuracy, per species, and (with `hidden`) on the hidden species and on the others."""
    found = _read(submission)
    right = {key: found.get(key) == label for key, label in truth.items()}
    species = sorted(set(truth.values()))
    per_species = {s: round(sum(right[k] for k, v in truth.items() if v == s) / sum(v == s for v in truth.values()), 4)
                   for s in species}  # fmt: skip
    result = {"accuracy": round(sum(right.values()) / len(truth), 4), "per_species": per_species,
              "confusions": [f"{t} -> {p}: {n}" for (t, p), n in Counter(
                  (v, found.get(k)) for k, v in truth.items() if not right[k]).most_common(4)]}  # fmt: skip
    if hidden:
        mine = [k for k, v in truth.items() if v == hidden]
        others = [k for k in truth if k not in mine]
        result.update(hidden=round(sum(right[k] for k in mine) / len(mine), 4),
                      known=round(sum(right[k] for k in others) / len(others), 4))  # fmt: skip
    return result


def infer(data: Path, artifact: Path, work: Path, name: str, **params: Any) -> tuple[Path, dict[str, Any]]:
    submission = work / f"{name}.csv"
    run = papermill(ROOT, "infer.ipynb", work, {"data_dir": data, "artifact_dir": artifact,
                                                "submission_path": submission, "progress": False, **params})  # fmt: skip
    report = json.loads(submission.with_name(f"{name}_report.json").read_text())
    return submission, {"seconds": round(run["seconds"], 1), "teacher": report.get("teacher"),
                        "rate": report["speed"]}  # fmt: skip


def reseal_hiding(artifact: Path, data: Path, species: str, out: Path) -> Path:
    """A copy of `artifact` whose sealed teacher leaves `species` out of its map, the 'none of mine' logit
    fitted again on the training recordings' scores (kept beside the artifact by the train notebook)."""
    from pipeline.core.config import TrainConfig
    from pipeline.core.tables import TrainTable, label_list, read_taxonomy, read_train_table
    from pipeline.rounds.pretrained import Taught, fit_unknown, seal
    from pipeline.teachers.model import find_teacher
    from pipeline.teachers.species import match_classes

    config = TrainConfig(data_dir=str(data), **BIRDCLEF_TABLE)
    rows, _ = read_train_table(data, "skip", TrainTable.of(config))
    classes = label_list(row.label for row in rows)
    teacher = find_teacher(artifact)
    class_map = match_classes(classes, teacher.labels, read_taxonomy(data), [species])
    recordings = artifact.with_name(f"{artifact.name}.teacher_recordings.csv")
    taught = Taught(
        teacher, class_map, recordings, None, fit_unknown(recordings, rows, classes, class_map), 0.0
    )
    shutil.copytree(artifact, out)
    # find_teacher(artifact) read the sealed copy: seal() copies it again under the same names.
    seal(out, replace(taught, teacher=find_teacher(artifact)), 0.5, log=lambda _: None)
    return out


def run_fold(
    source: Path,
    fold: int,
    work: Path,
    quick: bool,
    baseline: bool,
    distill: bool,
    hidden_species: bool = True,
    defaults: bool = True,
    seed_offset: int = 0,
) -> dict[str, Any]:
    from pipeline.demo_data.xeno_canto import make_xeno_canto_competition

    data = make_xeno_canto_competition(source, work / "data", fold=fold)
    truth = _read(data / "solution.csv")
    species = sorted(set(truth.values()))
    base = {
        "data_dir": data,
        "progress": False,
        "seed": fold + seed_offset,
        **BIRDCLEF_TABLE,
        **({"epochs": 2} if quick else {}),
    }
    out: dict[str, Any] = {"fold": fold, "seed": base["seed"], "test_recordings": len(truth)}
    if defaults:
        out.update(run_defaults(data, work, base, truth, species if hidden_species else []))
    if baseline:
        today = work / "model-today"
        ran = papermill(ROOT, "train.ipynb", work, {**base, "artifact_dir": today, **TODAY})
        submission, _ = infer(data, today, work, "today")
        out["today"] = {**score(truth, submission), "train_min": round(ran["seconds"] / 60, 2)}
    if distill:
        hidden = species[fold % len(species)]
        distilled = work / "model-distilled"
        ran = papermill(ROOT, "train.ipynb", work, {**base, "artifact_dir": distilled, "pretrained_teacher": "birdnet",
                                                    "distill_focal": True, "teacher_exclude": hidden})  # fmt: skip
        out["distilled"] = {"hidden": hidden, "train_min": round(ran["seconds"] / 60, 2)}
        for name, weight in (("student", 0), ("blend", "auto")):
            submission, _ = infer(data, distilled, work, f"distilled-{name}", teacher_blend=weight)
            out["distilled"][name] = score(truth, submission, hidden)
    return out


def run_defaults(
    data: Path, work: Path, base: dict[str, Any], truth: dict[str, str], hide: list[str]
) -> dict[str, Any]:
    """The defaults with the teacher: student, blend and teacher alone, and each species of `hide` in turn
    hidden from the teacher."""
    out: dict[str, Any] = {}
    artifact = work / "model"
    trained = papermill(
        ROOT, "train.ipynb", work, {**base, "artifact_dir": artifact, "pretrained_teacher": "birdnet"}
    )
    manifest = json.loads((artifact / "manifest.json").read_text())
    lineage = json.loads(artifact.with_name("model.teacher_recordings.json").read_text())
    out["train_min"] = round(trained["seconds"] / 60, 2)
    out["data_kind"] = manifest["provenance"].get("data_kind")
    out["auto"] = manifest["provenance"].get("auto")
    out["teacher_pass"] = {"audio_seconds_per_second": lineage["audio_seconds_per_second"],
                           "threads": lineage["threads"], "seconds": lineage["seconds"]}  # fmt: skip
    for name, weight in (("student", 0), ("blend", "auto"), ("teacher", 1.0)):
        submission, ran = infer(data, artifact, work, name, teacher_blend=weight)
        out[name] = {**score(truth, submission), "infer_seconds": ran["seconds"], "rate": ran["rate"]}
    out["hidden"] = {}
    for hidden in hide:
        resealed = reseal_hiding(artifact, data, hidden, work / f"model-hiding-{hidden}")
        unknown = json.loads((resealed / "teacher.json").read_text())["unknown_logit"]
        found = {"unknown_logit": unknown}
        for name, weight in (("blend", "auto"), ("teacher", 1.0)):
            submission, _ = infer(data, resealed, work, f"hiding-{hidden}-{name}", teacher_blend=weight)
            found[name] = score(truth, submission, hidden)
        out["hidden"][hidden] = found
        shutil.rmtree(resealed, ignore_errors=True)
    return out


def _mean(values: list[float]) -> float:
    return round(sum(values) / len(values), 4) if values else float("nan")


def summarise(folds: list[dict[str, Any]], meta: dict[str, Any]) -> dict[str, Any]:
    """Means over the folds (each recording tested once when all three ran), per species, and the targets."""
    summary: dict[str, Any] = {"accuracy": {}, "distilled": {}}
    if all("distilled" in f for f in folds):
        summary["distilled"] = {f"{name}_{part}": _mean([f["distilled"][name][part] for f in folds])
                                for name in ("student", "blend") for part in ("accuracy", "hidden", "known")}  # fmt: skip
    lines = [f"xeno-canto warblers, {len(folds)} fold(s) x 28 recordings"]
    if all("student" in f for f in folds):
        summary.update(_summarise_defaults(folds))
        table, hidden, rate = (
            summary["accuracy"],
            summary["hidden_species"],
            summary["teacher_pass_audio_seconds_per_second"],
        )
        lines.append(
            f"student {table['student']:.3f}, BirdNET alone {table['teacher']:.3f}, blend {table['blend']:.3f}"
        )
        if not math.isnan(hidden["blend_on_hidden"]):  # nan: --no-hidden
            lines.append(f"a species hidden from the teacher: blend {hidden['blend_on_hidden']:.3f} on it, "
                         f"{hidden['blend_on_known']:.3f} on the others")  # fmt: skip
        lines.append(f"teacher pass {rate:.0f} s of audio/s")
    if all("today" in f for f in folds):  # after the defaults' figures, in the same table
        summary["accuracy"]["today"] = _mean([f["today"]["accuracy"] for f in folds])
        lines.append(f"today's recipe {summary['accuracy']['today']:.3f}")
    if summary["distilled"]:
        d = summary["distilled"]
        lines.append(f"distilled (a species hidden from the teacher): student {d['student_accuracy']:.3f}, "
                     f"blend {d['blend_accuracy']:.3f} ({d['blend_hidden']:.3f} on the hidden species)")  # fmt: skip
    return {"headline": "; ".join(lines), **summary, "folds": folds, **meta}


def _summarise_defaults(folds: list[dict[str, Any]]) -> dict[str, Any]:
    table = {name: _mean([f[name]["accuracy"] for f in folds]) for name in ("student", "blend", "teacher")}
    hidden = {key: _mean([h[name][part] for f in folds for h in f["hidden"].values()])  # nan when not run
              for key, (name, part) in {"blend_on_hidden": ("blend", "hidden"), "blend_on_known": ("blend", "known"),
                                        "teacher_rule_on_hidden": ("teacher", "hidden"),
                                        "teacher_rule_on_known": ("teacher", "known")}.items()}  # fmt: skip
    # The student alone on each species, for the "at or above the defaults on the species it lacks" target.
    student_per_species = {
        s: _mean([f["student"]["per_species"][s] for f in folds]) for s in folds[0]["student"]["per_species"]
    }
    rate = _mean([f["teacher_pass"]["audio_seconds_per_second"] for f in folds])
    per_species = {name: {s: _mean([f[name]["per_species"][s] for f in folds]) for s in student_per_species}
                   for name in ("student", "blend", "teacher")}  # fmt: skip
    targets = {
        "blend >= teacher on the species it knows": table["blend"] >= table["teacher"],
        "blend on a hidden species >= the student alone on it": (
            hidden["blend_on_hidden"] >= _mean(list(student_per_species.values()))
            if not math.isnan(hidden["blend_on_hidden"]) else None  # None: --no-hidden
        ),
    }  # fmt: skip
    return {
        "accuracy": table,
        "per_species": per_species,
        "hidden_species": hidden,
        "teacher_pass_audio_seconds_per_second": rate,
        "teacher_pass_hours_per_100_hours_of_audio": round(100 / rate, 2) if rate else None,
        "train_minutes": [f["train_min"] for f in folds],
        "targets": targets,
    }


def run(source: Path = DEFAULT_SOURCE, folds: tuple[int, ...] = FOLDS, quick: bool = False, baseline: bool = True,
        distill: bool = True, keep: Path | None = None, hidden_species: bool = True,
        defaults: bool = True, seed_offset: int = 0) -> dict[str, Any]:  # fmt: skip
    if keep is not None and keep.exists() and any(keep.iterdir()):
        raise FileExistsError(f"--keep {keep}: not empty; name a new folder (nothing is overwritten)")
    if quick:
        folds, baseline, distill = folds[:1], False, False
    results = []
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="bench-birds-") as tmp, CpuMeter() as meter:
        for fold in folds:
            work = Path(tmp) / f"fold{fold}"
            work.mkdir()
            done = run_fold(
                Path(source), fold, work, quick, baseline, distill, hidden_species, defaults, seed_offset
            )
            results.append(done)
            found = {k: done[k]["accuracy"] for k in ("student", "blend", "teacher", "today") if k in done}
            found.update({f"distilled {k}": done["distilled"][k]["accuracy"] for k in ("student", "blend")
                          if k in done.get("distilled", {})})  # fmt: skip
            print(f"fold {fold}: " + ", ".join(f"{k} {v:.3f}" for k, v in found.items()), file=sys.stderr)
            if keep is not None:
                keep.mkdir(parents=True, exist_ok=True)
                shutil.move(work, keep / work.name)
    meta = {
        "quick": quick,
        "seed_offset": seed_offset,
        "minutes": round((time.monotonic() - started) / 60, 1),
        **meter.result,
    }
    return summarise(results, meta)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.birds", description=__doc__.split("\n")[0])
    parser.add_argument("--source", type=Path, default=DEFAULT_SOURCE)
    parser.add_argument("--folds", default=",".join(map(str, FOLDS)))
    parser.add_argument("--quick", action="store_true")
    parser.add_argument(
        "--no-baseline", action="store_true", help="skip today's recipe (the sound-event one)"
    )
    parser.add_argument("--no-distill", action="store_true", help="skip the distilled student")
    parser.add_argument(
        "--no-hidden", action="store_true", help="skip the 'species hidden from the teacher' reseals"
    )
    parser.add_argument(
        "--no-defaults", action="store_true", help="skip the defaults' student, blend, teacher (and hidden)"
    )
    parser.add_argument(
        "--seed-offset", type=int, default=0, help="train fold k with seed k + N (default 0: seed = fold)"
    )
    parser.add_argument("--out", type=Path, help="also write the result here (JSON)")
    parser.add_argument("--keep", type=Path, help="keep each fold's folder, artifacts and submissions here")
    args = parser.parse_args(argv)
    result = run(args.source, tuple(int(f) for f in args.folds.split(",")), args.quick, not args.no_baseline,
                 not args.no_distill, args.keep, not args.no_hidden, not args.no_defaults,
                 args.seed_offset)  # fmt: skip
    print_result(result, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
