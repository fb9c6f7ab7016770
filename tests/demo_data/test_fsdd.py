"""The FSDD adapter: recordings -> a competition folder that the data module accepts, split deterministically."""

from __future__ import annotations

import csv
import functools
import hashlib
import subprocess
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
from helpers import ROOT

from pipeline.core.data import load_audio
from pipeline.core.tables import (
    TestLayout,
    read_sample_submission,
    read_test_items,
    read_train_table,
    resolve_inside,
)
from pipeline.demo_data.fsdd import (
    FSDDError,
    make_fsdd_competition,
    parse_name,
    scan_recordings,
    split_recordings,
)

SPEAKERS = ("ann", "bob", "cyd")
DIGITS = ("0", "7")
PER_CELL = 5


def fake_fsdd(root: Path) -> Path:
    """3 speakers x 2 digits x 5 indices of distinct 8 kHz noise: every file's bytes are unique."""
    root.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    for digit in DIGITS:
        for speaker in SPEAKERS:
            for index in range(PER_CELL):
                audio = (rng.standard_normal(2000 + 10 * index) * 0.1).astype(np.float32)
                sf.write(str(root / f"{digit}_{speaker}_{index}.wav"), audio, 8000, subtype="PCM_16")
    return root


def read_rows(path: Path) -> list[dict[str, str]]:
    with path.open(newline="") as handle:
        return list(csv.DictReader(handle))


@functools.cache
def _names_by_content(source: Path) -> dict[str, list[str]]:
    names: dict[str, list[str]] = {}
    for path in source.glob("*.wav"):
        names.setdefault(hashlib.sha256(path.read_bytes()).hexdigest(), []).append(path.name)
    return names


def origin_of(path: Path, source: Path) -> str:
    """The source name a file in the competition folder came from (matched by content, so copies count)."""
    matches = _names_by_content(source).get(hashlib.sha256(path.read_bytes()).hexdigest(), [])
    assert len(matches) == 1, (path, matches)
    return matches[0]


def test_parse_name_reads_the_three_fields_and_names_a_bad_file():
    rec = parse_name(Path("x/3_jackson_12.wav"))
    assert (rec.digit, rec.speaker, rec.index) == ("3", "jackson", 12)
    assert rec.label("speaker") == "jackson" and rec.label("digit") == "3"
    assert parse_name(Path("0_Theo_7.WAV")).speaker == "Theo"  # case kept for the label, extension any case
    for bad in ("jackson_3_12.wav", "3_jackson.wav", "12_jackson_1.wav", "3_jackson_1.flac"):
        with pytest.raises(FSDDError, match=bad.replace(".", r"\.")):
            parse_name(Path(bad))


def test_scan_errors_name_the_problem(tmp_path):
    with pytest.raises(FSDDError, match="not a directory"):
        scan_recordings(tmp_path / "missing")
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "README.md").write_text("no audio")
    with pytest.raises(FSDDError, match="no .wav files"):
        scan_recordings(tmp_path / "empty")
    source = fake_fsdd(tmp_path / "rec")
    (source / "notes.wav").write_bytes(b"RIFF")
    with pytest.raises(FSDDError, match="notes.wav"):
        scan_recordings(source)
    (source / "notes.wav").unlink()
    copy = source / "copies" / "0_ann_0.wav"  # the same recording twice, in a subfolder
    copy.parent.mkdir()
    copy.write_bytes((source / "0_ann_0.wav").read_bytes())
    with pytest.raises(FSDDError, match=r"copies/0_ann_0.wav: duplicate recording name \(also .*rec/0_ann_0"):
        scan_recordings(source)


@pytest.mark.parametrize("task", ["speaker", "digit"])
def test_folder_follows_the_contract_and_hides_labels(tmp_path, task):
    source = fake_fsdd(tmp_path / "rec")
    out = make_fsdd_competition(source, tmp_path / "data", task=task, seed=1, test_fraction=0.2)

    train = read_train_table(out)[0]
    test = read_test_items(out, TestLayout()).rows
    assert read_sample_submission(out / "sample_submission.csv").ids == [row.id for row in test]
    solution = {row["id"]: row["label"] for row in read_rows(out / "solution.csv")}
    assert list(solution) == [row.id for row in test]
    # Every recording lands exactly once, in train or test, with the label of its name.
    origins = [origin_of(out / row.rel_path, source) for row in train]
    origins += [origin_of(out / row.rel_path, source) for row in test]
    assert sorted(origins) == sorted(p.name for p in source.glob("*.wav"))
    field = 0 if task == "digit" else 1
    for row in train:
        assert row.label == Path(row.rel_path).name.split("_")[field]
    for row in test:
        assert solution[row.id] == origin_of(out / row.rel_path, source).split("_")[field]
        # Opaque: neither id nor path mentions a speaker or the digit-speaker name pattern.
        assert not any(s in row.id or s in row.rel_path for s in SPEAKERS)
        assert Path(row.rel_path).stem == row.id
    # Real files inside the folder (no symlinks), readable by the data module.
    for row in test[:3]:
        path = out / row.rel_path
        assert not path.is_symlink()
        assert resolve_inside(out, row.rel_path).is_relative_to(out.resolve())
        samples, repairs = load_audio(path)
        assert samples.dtype == np.float32 and "resampled 8000->16000" in repairs
    assert "CC BY-SA 4.0" in (out / "ATTRIBUTION.txt").read_text()


def test_split_is_stratified_by_cell_and_deterministic(tmp_path):
    recordings = scan_recordings(fake_fsdd(tmp_path / "rec"))
    train, test = split_recordings(recordings, 0.4, seed=0)
    cells = Counter((r.digit, r.speaker) for r in test)
    assert set(cells.values()) == {2} and len(cells) == len(SPEAKERS) * len(DIGITS)
    assert len(train) + len(test) == len(recordings)
    again = split_recordings(list(reversed(recordings)), 0.4, seed=0)
    assert [r.path.name for r in again[1]] == [r.path.name for r in test]
    other = split_recordings(recordings, 0.4, seed=1)
    assert {r.path.name for r in other[1]} != {r.path.name for r in test}
    # A cell never gives away its last training file, even at a large fraction.
    train_hi, _ = split_recordings(recordings, 0.99, seed=0)
    assert len({(r.digit, r.speaker) for r in train_hi}) == len(SPEAKERS) * len(DIGITS)


def test_same_seed_writes_identical_csvs(tmp_path):
    source = fake_fsdd(tmp_path / "rec")
    a = make_fsdd_competition(source, tmp_path / "a", task="speaker", seed=5)
    b = make_fsdd_competition(source, tmp_path / "b", task="speaker", seed=5)
    for name in ("train.csv", "test.csv", "sample_submission.csv", "solution.csv"):
        assert (a / name).read_bytes() == (b / name).read_bytes(), name


def test_replaces_only_its_own_output_and_only_with_overwrite(tmp_path):
    source = fake_fsdd(tmp_path / "rec")
    out = tmp_path / "data"
    out.mkdir()
    (out / "keep.txt").write_text("x")
    with pytest.raises(FileExistsError, match="holds files this project did not write"):
        make_fsdd_competition(source, out, task="digit", overwrite=True)
    assert sorted(p.name for p in out.iterdir()) == ["keep.txt"]
    ours = make_fsdd_competition(source, tmp_path / "ours", task="digit")
    with pytest.raises(FileExistsError, match="already holds a competition folder"):
        make_fsdd_competition(source, ours, task="speaker")
    make_fsdd_competition(source, ours, task="speaker", overwrite=True)
    assert (ours / "train.csv").is_file()


def test_max_per_cell_keeps_a_small_balanced_folder(tmp_path):
    out = make_fsdd_competition(fake_fsdd(tmp_path / "rec"), tmp_path / "d", task="digit", max_per_cell=2)
    assert (
        len(read_train_table(out)[0])
        == len(read_test_items(out, TestLayout()).rows)
        == len(SPEAKERS) * len(DIGITS)
    )


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pipeline", *args], cwd=ROOT, capture_output=True, text=True)


def test_cli_writes_the_folder_and_reports_bad_sources(tmp_path):
    source = fake_fsdd(tmp_path / "rec")
    made = run_cli("data", "fsdd", "--source", str(source), "--out", str(tmp_path / "d"), "--task", "digit",
                   "--seed", "2", "--test-fraction", "0.4")  # fmt: skip
    assert made.returncode == 0, made.stderr
    assert "wrote FSDD digit competition folder" in made.stdout
    assert len(read_test_items(tmp_path / "d", TestLayout()).rows) == 2 * len(SPEAKERS) * len(DIGITS)
    (source / "bad_name.wav").write_bytes(b"RIFF")
    failed = run_cli(
        "data", "fsdd", "--source", str(source), "--out", str(tmp_path / "e"), "--task", "speaker"
    )
    assert failed.returncode == 2 and "bad_name.wav" in failed.stderr
    assert not (tmp_path / "e").exists()


def test_real_fsdd_split(fsdd_recordings, tmp_path):
    out = make_fsdd_competition(fsdd_recordings, tmp_path / "speaker", task="speaker", seed=0)
    train, test = read_train_table(out)[0], read_test_items(out, TestLayout()).rows
    n_files = len(list(fsdd_recordings.glob("*.wav")))
    assert len(train) + len(test) == n_files
    solution = read_rows(out / "solution.csv")
    per_speaker = Counter(row["label"] for row in solution)
    assert len(per_speaker) == 6 and len(set(per_speaker.values())) == 1  # balanced over speakers
    # Digits are spread evenly over the speaker test set too (the digit is the source name's first field).
    digits = Counter(origin_of(out / row.rel_path, fsdd_recordings)[0] for row in test)
    assert len(digits) == 10 and len(set(digits.values())) == 1
    samples, _ = load_audio(out / test[0].rel_path)
    assert samples.size > 1000
