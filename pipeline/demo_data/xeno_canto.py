"""xeno-canto recordings -> a bird competition folder in BirdCLEF's training layout: real birds for the benchmark.

The source is a folder of `<genus_species>/XC<id>.mp3` with a `metadata.csv` (filename, species,
scientific_name, common_name, xc_id, recordist, license, url), as `../shared/xc-warblers/` is. Written:

    train_audio/<label>/XC<id>.mp3   the training recordings, unmodified (hard links, or copies)
    train.csv                        BirdCLEF's columns: primary_label, secondary_labels ("[]"), filename
                                     (relative to train_audio/), scientific_name, common_name, author,
                                     license, url
    taxonomy.csv                     primary_label, scientific_name, common_name (BirdCLEF ships one)
    test_audio/<id>.mp3, test.csv    the held-out recordings under opaque ids (the name carries the species)
    sample_submission.csv            id,label;  solution.csv: the truth, one species per recording
    ATTRIBUTION.txt                  every recording's recordist, licence and page

The split is the source README's: within each species, sorted by xeno-canto id, every third recording is held
out (`holdout_every`), so a recording and all its windows are on one side only; `fold` 1 and 2 hold out the
other two thirds (the README's split is fold 0). Labels are the species folder
names (`acrocephalus_palustris`); `--codes` writes short codes instead (`acrpal`), as BirdCLEF's eBird codes
are, so that only taxonomy.csv says which species a label is.
"""

from __future__ import annotations

import csv
import os
from collections import Counter
from pathlib import Path

import numpy as np

from ..core.tables import new_competition_folder, write_csv
from .fsdd import link_or_copy

METADATA_COLUMNS = (
    "filename",
    "species",
    "scientific_name",
    "common_name",
    "xc_id",
    "recordist",
    "license",
    "url",
)
TRAIN_COLUMNS = [
    "primary_label",
    "secondary_labels",
    "filename",
    "scientific_name",
    "common_name",
    "author",
    "license",
    "url",
]


def read_metadata(source: str | os.PathLike) -> list[dict[str, str]]:
    """The rows of `source`/metadata.csv whose audio is there; a ValueError naming what is missing."""
    root = Path(source)
    table = root / "metadata.csv"
    if not table.is_file():
        raise ValueError(
            f"{table}: not found. Pass --source a folder of <species>/XC<id>.mp3 with a metadata.csv "
            f"(columns {', '.join(METADATA_COLUMNS)}), such as ../shared/xc-warblers"
        )
    with table.open(newline="", encoding="utf-8") as handle:
        rows = list(csv.DictReader(handle))
    if missing := [c for c in METADATA_COLUMNS if rows and c not in rows[0]]:
        raise ValueError(f"{table}: missing column(s) {missing}")
    if absent := [r["filename"] for r in rows if not (root / r["filename"]).is_file()]:
        raise ValueError(
            f"{table}: {len(absent)} recording(s) it lists are not in {root}, e.g. {absent[0]!r}"
        )
    if not rows:
        raise ValueError(f"{table}: no recordings")
    return rows


def split_by_recording(
    rows: list[dict[str, str]], holdout_every: int = 3, fold: int = 0
) -> tuple[list[dict], list[dict]]:
    """(train, test): within each species, sorted by xeno-canto id, every `holdout_every`-th recording is held
    out -- fold 0: the 3rd, 6th, ... (the source README's protocol); fold 1: the 1st, 4th, ...; fold 2: the 2nd,
    5th, ...: the folds hold out every recording once."""
    if not 0 <= fold < holdout_every:
        raise ValueError(f"fold={fold!r}: use 0 to {holdout_every - 1}")
    train, test = [], []
    for species in sorted({r["species"] for r in rows}):
        ordered = sorted((r for r in rows if r["species"] == species), key=lambda r: int(r["xc_id"]))
        for k, row in enumerate(ordered, start=1):
            (test if k % holdout_every == fold else train).append(row)
    return train, test


def species_code(scientific_name: str) -> str:
    """A short code in the style of eBird's (`Acrocephalus palustris` -> `acrpal`)."""
    genus, species = scientific_name.lower().split()[:2]
    return genus[:3] + species[:3]


def make_xeno_canto_competition(
    source: str | os.PathLike,
    out_dir: str | os.PathLike,
    holdout_every: int = 3,
    fold: int = 0,
    codes: bool = False,
    seed: int = 0,
    overwrite: bool = False,
) -> Path:
    """Write the competition folder (module docstring) from `source`. Refuses a non-empty `out_dir` unless it is
    one this command wrote and `overwrite` is set."""
    if holdout_every < 2:
        raise ValueError(f"holdout_every={holdout_every!r}: need at least 2 (one recording in three: 3)")
    rows = read_metadata(source)
    train, test = split_by_recording(rows, holdout_every, fold)
    out = Path(out_dir)
    with new_competition_folder(out, overwrite) as staging:
        _build(staging, Path(source), train, test, codes, seed)
    return out


def _build(root: Path, source: Path, train: list[dict], test: list[dict], codes: bool, seed: int) -> None:
    label = {
        r["species"]: species_code(r["scientific_name"]) if codes else r["species"] for r in train + test
    }
    train_rows = []
    for row in train:
        rel = f"{label[row['species']]}/{Path(row['filename']).name}"
        link_or_copy(source / row["filename"], root / "train_audio" / rel)
        train_rows.append(
            [
                label[row["species"]],
                "[]",
                rel,
                row["scientific_name"],
                row["common_name"],
                row["recordist"],
                row["license"],
                row["url"],
            ]
        )
    # Opaque ids, in a seeded random order: neither the id nor the row order says which species it is.
    order = np.random.default_rng([seed, 0xB1D]).permutation(len(test))
    test_rows, solution_rows = [], []
    for k, index in enumerate(order):
        row = test[int(index)]
        test_id = f"rec{k:04d}"
        rel = f"test_audio/{test_id}{Path(row['filename']).suffix}"
        link_or_copy(source / row["filename"], root / rel)
        test_rows.append([test_id, rel])
        solution_rows.append([test_id, label[row["species"]]])
    counts = Counter(r[0] for r in train_rows)
    commonest = max(sorted(counts), key=lambda c: counts[c])
    species = sorted({(label[r["species"]], r["scientific_name"], r["common_name"]) for r in train + test})
    write_csv(root / "train.csv", TRAIN_COLUMNS, train_rows)
    write_csv(root / "taxonomy.csv", ["primary_label", "scientific_name", "common_name"], species)
    write_csv(root / "test.csv", ["id", "path"], test_rows)
    write_csv(root / "sample_submission.csv", ["id", "label"], [[r[0], commonest] for r in test_rows])
    write_csv(root / "solution.csv", ["id", "label"], solution_rows)
    credits = "".join(
        f"{r['filename']}: {r['recordist']}, {r['license']}, {r['url']}\n" for r in train + test
    )
    (root / "ATTRIBUTION.txt").write_text(
        "Recordings from xeno-canto (https://www.xeno-canto.org), each under its own Creative Commons licence "
        "(non-commercial): credit the recordist and xeno-canto.\n\n" + credits,
        encoding="utf-8",
    )


__all__ = ["make_xeno_canto_competition", "read_metadata", "species_code", "split_by_recording"]
