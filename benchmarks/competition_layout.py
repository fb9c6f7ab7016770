"""Accuracy on real speech in a competition's own layout: FSDD's speaker task laid out as Freesound Audio Tagging
2019 lays out its files, through both notebooks with only the layout parameters set.

    python -m benchmarks.competition_layout [--quick] [--source RECORDINGS]

The folder: `train_curated.csv` with `fname,labels` (names without their extension), the audio in
`train_curated/`, the test audio in `test/` under anonymised names and no test table, and a probability
`sample_submission.csv` (`fname` + one column per speaker). Two inference runs of the one trained model:

- `probabilities`: sample_submission lists every test file. The submission must keep its header, ids and order,
  every row must be a distribution, and its most probable class is scored against the held-out labels;
- `hidden_test`: sample_submission holds only placeholder rows, as the public copy of a code competition
  does. The submission must have one row per test file, sorted by id (stems: the placeholders name no file
  and have no audio extension, so `test_id auto` picks stems; the log says so).
"""

from __future__ import annotations

import argparse
import csv
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_SOURCE = ROOT.parent / "shared" / "fsdd" / "recordings"
PLACEHOLDERS = 3


def freesound_layout(competition: Path, out: Path) -> dict[str, str]:
    """Rewrite a competition folder of this project's layout (train.csv, test.csv, solution.csv) into the
    Freesound one under `out`; returns the held-out label of each test file name."""
    (out / "train_curated").mkdir(parents=True)
    (out / "test").mkdir()
    with open(competition / "train.csv", newline="") as handle:
        rows = list(csv.DictReader(handle))
    with open(out / "train_curated.csv", "w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["fname", "labels"])
        for row in rows:
            name = Path(row["path"]).name
            shutil.copy(competition / row["path"], out / "train_curated" / name)
            writer.writerow([Path(name).stem, row["label"]])
    with open(competition / "solution.csv", newline="") as handle:
        truth = {row["id"]: row["label"] for row in csv.DictReader(handle)}
    with open(competition / "test.csv", newline="") as handle:
        tests = list(csv.DictReader(handle))
    labels = sorted({row["label"] for row in rows})
    solution = {}
    with open(out / "sample_submission.csv", "w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["fname", *labels])
        for row in tests:
            name = Path(row["path"]).name
            shutil.copy(competition / row["path"], out / "test" / name)
            writer.writerow([name, *(["0"] * len(labels))])
            solution[name] = truth[row["id"]]
    return solution


def placeholders_only(folder: Path) -> None:
    """sample_submission.csv reduced to its header and a few ids that name no file. Lettered, not numbered:
    `placeholder_0`, `_1`, `_2` have the form `<file>_<seconds>` on a 1 s grid, which segment_seconds auto reads
    as chunk ids (pipeline/inference/rows.py), as BirdCLEF's placeholders are; a file-row competition whose
    placeholders are numbered so sets segment_seconds None."""
    with open(folder / "sample_submission.csv", newline="") as handle:
        header = next(csv.reader(handle))
    with open(folder / "sample_submission.csv", "w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(header)
        writer.writerows(
            [f"placeholder_{chr(ord('a') + k)}", *(["0"] * (len(header) - 1))] for k in range(PLACEHOLDERS)
        )


def _read(path: Path) -> tuple[list[str], list[dict[str, str]]]:
    with open(path, newline="") as handle:
        reader = csv.DictReader(handle)
        return list(reader.fieldnames or []), list(reader)


def _argmax_accuracy(rows: list[dict[str, str]], truth: dict[str, str]) -> float:
    hits = [max((k for k in row if k != "fname"), key=lambda k: float(row[k])) == truth[row["fname"]]
            for row in rows]  # fmt: skip
    return sum(hits) / len(hits)


def run(source: Path = DEFAULT_SOURCE, quick: bool = False) -> dict[str, Any]:
    from benchmarks.scale import papermill
    from pipeline.demo_data.fsdd import make_fsdd_competition

    if not source.is_dir():
        raise FileNotFoundError(f"{source}: FSDD recordings not found (see ../shared/fsdd/README)")
    with tempfile.TemporaryDirectory(prefix="layout-") as tmp:
        work = Path(tmp)
        plain = make_fsdd_competition(
            source, work / "plain", task="speaker", max_per_cell=6 if quick else None
        )
        data = work / "data"
        truth = freesound_layout(plain, data)
        layout = {"train_table": "train_curated.csv", "path_column": "fname", "label_column": "labels",
                  "audio_dir": "train_curated", "progress": False, **({"epochs": 2} if quick else {})}  # fmt: skip
        started = time.perf_counter()
        papermill(ROOT, "train.ipynb", work, {"data_dir": data, "artifact_dir": work / "model", **layout})
        train_s = time.perf_counter() - started
        results: dict[str, Any] = {"train_files": len(list((data / "train_curated").iterdir())),
                                   "test_files": len(truth), "classes": len(set(truth.values())),
                                   "train_s": round(train_s, 1)}  # fmt: skip

        submission = work / "probabilities.csv"
        inferred = papermill(ROOT, "infer.ipynb", work, {"data_dir": data, "artifact_dir": work / "model",
                                                          "test_audio_dir": "test", "submission_path": submission})  # fmt: skip
        header, rows = _read(submission)
        sample_header, sample = _read(data / "sample_submission.csv")
        sums = [sum(float(v) for k, v in row.items() if k != "fname") for row in rows]
        results["probabilities"] = {
            "same_header": header == sample_header,
            "same_ids_in_order": [r["fname"] for r in rows] == [r["fname"] for r in sample],
            "largest_row_sum_error": max(abs(s - 1) for s in sums),
            "argmax_accuracy": round(_argmax_accuracy(rows, truth), 4),
            "infer_s": round(inferred["seconds"], 1),
        }

        placeholders_only(data)
        hidden = work / "hidden.csv"
        inferred = papermill(ROOT, "infer.ipynb", work, {"data_dir": data, "artifact_dir": work / "model",
                                                          "test_audio_dir": "test", "submission_path": hidden})  # fmt: skip
        _, rows = _read(hidden)
        by_stem = {Path(name).stem: label for name, label in truth.items()}
        ids = [r["fname"] for r in rows]
        results["hidden_test"] = {
            "rows": len(rows),
            "one_row_per_test_file_sorted": ids == sorted(by_stem),
            "rule_said": "rows: one per test file" in inferred["output"],
            "argmax_accuracy": round(_argmax_accuracy(rows, by_stem), 4),
        }
    p, h = results["probabilities"], results["hidden_test"]
    results["headline"] = (
        f"FSDD speaker task in the Freesound layout ({results['train_files']} train, {results['test_files']} test "
        f"files): probability submission argmax accuracy {p['argmax_accuracy']:.4f} (header, ids and order "
        f"{'kept' if p['same_header'] and p['same_ids_in_order'] else 'CHANGED'}, rows sum to 1 within "
        f"{p['largest_row_sum_error']:.0e}); {PLACEHOLDERS} placeholder rows -> {h['rows']} rows, one per test file "
        f"{'sorted' if h['one_row_per_test_file_sorted'] else 'NOT sorted'}, accuracy {h['argmax_accuracy']:.4f}"
    )
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--source", type=Path, default=DEFAULT_SOURCE)
    args = parser.parse_args(argv)
    print(json.dumps(run(args.source, args.quick), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
