"""pipeline.training.dataset: the table's rows, their audio in the cache, bad rows and the train/validation split."""

import shutil
from collections import Counter

import pytest
import soundfile as sf
from helpers import tone, write_folder

from pipeline.core.config import SAMPLE_RATE, TrainConfig
from pipeline.core.tables import DataError, TrainTable, read_train_table
from pipeline.training.dataset import (
    Sources,
    drop_repeated_rows,
    load_training_data,
    split_files,
    stratified_split,
)
from pipeline.training.plan import choose_objective


def load(root, on_bad_row="error", **overrides):
    config = TrainConfig(data_dir=str(root), cache_dir=str(root.parent / "cache"), on_bad_row=on_bad_row,
                         progress=False, sample_rate=SAMPLE_RATE, **overrides)  # fmt: skip
    logged = []
    rows, skipped = read_train_table(root, on_bad_row, TrainTable.of(config))
    sources = Sources(tuple(rows), tuple(skipped))
    data = load_training_data(config, logged.append, sources, objective=choose_objective(config, rows)[0])
    data.log = logged
    return data


def test_bad_training_audio_names_line_and_file(tmp_path):
    root = write_folder(tmp_path / "d", [("a.wav", "x"), ("missing.wav", "y")], {"a.wav": tone()})
    with pytest.raises(
        DataError, match=r"train.csv line 3 \('missing.wav'\).*file not found.*on_bad_row='skip'"
    ):
        load(root)


@pytest.mark.parametrize("kind", ["empty", "garbage", "outside"])
def test_each_kind_of_bad_row_is_an_error_or_a_reported_skip(tmp_path, kind):
    rows = [("good.wav", "x"), ("bad.wav", "y")]
    root = write_folder(tmp_path / "d", rows if kind != "outside" else [rows[0], ("../bad.wav", "y")],
                        {"good.wav": tone()})  # fmt: skip
    if kind == "empty":
        (root / "bad.wav").write_bytes(b"")
    elif kind == "garbage":
        (root / "bad.wav").write_bytes(b"this is not a wav file at all" * 10)
    else:
        sf.write(tmp_path / "bad.wav", tone(), SAMPLE_RATE)
    with pytest.raises(DataError, match="line 3"):
        load(root)
    result = load(root, on_bad_row="skip")
    assert [r.rel_path for r in result.rows] == ["good.wav"]
    assert len(result.skipped) == 1 and result.skipped[0]["line"] == "3"
    assert str(tmp_path) not in result.skipped[0]["reason"]  # reports carry CSV paths, not absolute ones


@pytest.mark.parametrize("make_path", [
    lambda root: "bad\x00name.wav",  # a NUL byte: the OS refuses the name
    lambda root: "x" * 300 + ".wav",  # longer than a file name may be
    lambda root: (root / "loop.wav").symlink_to(root / "loop.wav") or "loop.wav",  # symlink loop
])  # fmt: skip
def test_paths_the_os_refuses_are_row_errors_not_crashes(tmp_path, make_path):
    root = write_folder(tmp_path / "d", [("good.wav", "x")], {"good.wav": tone()})
    with open(root / "train.csv", "a") as handle:
        handle.write(f"{make_path(root)},y\n")
    with pytest.raises(DataError, match=r"train.csv line 3 .*on_bad_row='skip'"):
        load(root)
    result = load(root, on_bad_row="skip")
    assert [r.rel_path for r in result.rows] == ["good.wav"] and result.skipped[0]["line"] == "3"


def test_a_data_folder_built_from_links_trains_and_refuses_paths_that_leave_it(tmp_path):
    """Issue 51: the audio folder is a link to a folder elsewhere (as /kaggle/input is linked into a folder of
    /kaggle/working); its files train. A `..` path or an absolute one is still refused, with its line."""
    elsewhere = write_folder(tmp_path / "elsewhere", [], {"a.wav": tone(), "b.wav": tone(freq=440.0)})
    root = write_folder(tmp_path / "d", [("audio/a.wav", "x"), ("audio/b.wav", "y")], {})
    (root / "audio").symlink_to(elsewhere, target_is_directory=True)
    data = load(root)
    assert [r.rel_path for r in data.rows] == ["audio/a.wav", "audio/b.wav"] and not data.skipped
    assert len(data.store) == 2 and not data.store.failures
    for path in ("audio/../../elsewhere/a.wav", str(elsewhere / "b.wav")):
        with open(root / "train.csv", "a") as handle:
            handle.write(f"{path},y\n")
        with pytest.raises(DataError, match=r"train.csv line 4 .*outside the data folder"):
            load(root)
        (root / "train.csv").write_text("".join((root / "train.csv").read_text().splitlines(True)[:-1]))


def test_all_rows_bad_is_an_error_even_when_skipping(tmp_path):
    root = write_folder(tmp_path / "d", [("nope.wav", "x")], {})
    with pytest.raises(DataError, match="no usable training audio"):
        load(root, on_bad_row="skip")


def test_synthetic_folder_satisfies_the_contract(synthetic_data, tmp_path):
    rows = read_train_table(synthetic_data)[0]
    assert len({r.label for r in rows}) == 4
    copy = tmp_path / "copy"
    shutil.copytree(synthetic_data, copy)
    data = load(copy)
    assert len(data.rows) == len(rows) and not data.skipped and len(data.store) == len(rows)
    assert sorted(data.train_idx + data.val_idx) == list(range(len(rows)))


def test_repeated_rows_are_dropped_and_said(tmp_path, capsys):
    """Issue 14: the same clip twice was accepted silently (and could land in training and validation)."""
    rows = [("a.wav", "x"), ("b.wav", "y"), ("a.wav", "x"), ("c.wav", "x"), ("c.wav", "z")]
    root = write_folder(tmp_path / "d", rows, {f"{n}.wav": tone() for n in "abc"})
    data = load(root, objective="aam")  # one class per clip: c.wav is trained on as x and as z
    assert [(r.rel_path, r.label) for r in data.rows] == [("a.wav", "x"), ("b.wav", "y"), ("c.wav", "x"),
                                                           ("c.wav", "z")]  # fmt: skip
    said = "\n".join(data.log)
    assert "1 repeated row(s) dropped" in said and "line 4 (= line 2)" in said
    assert "1 file(s) carry more than one label" in said and "'c.wav'" in said
    assert any("repeated row" in note for note in data.notes)  # and into the artifact's provenance


def test_a_file_with_several_labels_is_never_on_both_sides_of_the_split(tmp_path):
    """A multi-label cell (`label_separator`) makes one row per label; split by label alone, a file's rows could
    land in training and validation, and validation would score audio the model trained on."""
    names = [f"f{k:02d}.wav" for k in range(20)]
    root = write_folder(tmp_path / "d", [(n, "x;y;z") for n in names], {n: tone(freq=200 + 10 * k) for k, n in
                                                                       enumerate(names)})  # fmt: skip
    data = load(root, label_separator=";", val_fraction=0.2, objective="aam")
    paths = [row.rel_path for row in data.rows]
    assert len(paths) == 60
    by_label_alone = stratified_split([row.label for row in data.rows], 0.2, 0)
    assert {paths[i] for i in by_label_alone[0]} & {paths[i] for i in by_label_alone[1]}  # the leak it fixes
    trained, validated = {paths[i] for i in data.train_idx}, {paths[i] for i in data.val_idx}
    assert len(validated) == 4 and not trained & validated  # 0.2 of the 20 files, each wholly held out
    assert sorted(data.train_idx + data.val_idx) == list(range(60))  # every row still used


def test_split_files_keeps_every_label_trained_and_single_label_tables_as_they_were():
    from pipeline.core.tables import TrainRow

    # "b" is only ever a second label, of the file a stratified split by first label holds out.
    rows = [TrainRow(2, "p", "a"), TrainRow(2, "p", "b"), TrainRow(3, "q", "a"), TrainRow(4, "r", "c"),
            TrainRow(5, "s", "c")]  # fmt: skip
    for seed in range(6):
        train, val, note = split_files(rows, 0.5, seed)
        assert {rows[i].label for i in train} == {"a", "b", "c"}
        assert not {rows[i].rel_path for i in train} & {rows[i].rel_path for i in val}
        if 0 in stratified_split(["a", "a", "c", "c"], 0.5, seed)[1]:  # files p, q, r, s by first label
            assert "went back to training" in note  # p was held out by the file split, and came back
    single = [TrainRow(k + 2, f"f{k}", label) for k, label in enumerate("aabbbcccc")]
    for seed in range(3):
        assert split_files(single, 0.3, seed) == stratified_split(list("aabbbcccc"), 0.3, seed)


def test_drop_repeated_rows_keeps_the_first_of_each():
    from pathlib import Path

    from pipeline.core.tables import TrainRow

    rows = [TrainRow(2, "a", "x"), TrainRow(3, "a", "x"), TrainRow(4, "a", "x")]
    kept, notes = drop_repeated_rows(rows, Path("train.csv"))
    assert kept == rows[:1] and "2 repeated row(s)" in notes[0]


def test_stratified_split_holds_out_each_label_and_keeps_one_for_training():
    labels = ["a"] * 10 + ["b"] * 10 + ["c"]
    train, val, note = stratified_split(labels, 0.2, seed=1)
    assert sorted(train + val) == list(range(len(labels))) and not set(train) & set(val)
    assert [labels[i] for i in val].count("a") == 2 and [labels[i] for i in val].count("b") == 2
    assert 20 in train  # the single "c" stays in training
    assert stratified_split(labels, 0.2, seed=1) == (train, val, note) and note is None


@pytest.mark.parametrize("clips_per_class", [2, 5])
def test_classes_with_few_clips_still_get_a_validation_split(clips_per_class):
    """Issue 14: 120 classes x 2 clips gave "240 train / 0 validation" (and at 5 clips, round(0.5) == 0)."""
    labels = [f"c{k:03d}" for k in range(120) for _ in range(clips_per_class)]
    train, val, note = stratified_split(labels, 0.1, seed=0)
    assert len(val) == round(0.1 * len(labels)) and not set(train) & set(val)
    assert set(Counter(labels[i] for i in train)) == set(labels)  # every class keeps a training clip
    assert max(Counter(labels[i] for i in val).values()) == 1
    assert "classes that could spare a clip" in note


def test_no_validation_is_said_with_the_reason():
    single = [f"c{k}" for k in range(30)]
    train, val, note = stratified_split(single, 0.1, seed=0)
    assert val == [] and "every class has a single clip" in note and "model selection is off" in note
    assert "val_fraction=0" in stratified_split(["a", "a", "b", "b"], 0.0, seed=0)[2]


def test_fsdd_like_splits_are_unchanged_by_the_guarantee():
    # Enough clips per class: exactly the per-class rounding of before, no note.
    labels = [f"s{k}" for k in range(6) for _ in range(360)]
    _, val, note = stratified_split(labels, 0.1, seed=0)
    assert len(val) == 216 and note is None


def write_birdclef_table(root, rows):
    """train.csv with BirdCLEF's primary_label / secondary_labels / filename columns."""
    import csv

    root.mkdir(parents=True)
    with open(root / "train.csv", "w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["primary_label", "secondary_labels", "filename", "rating"])
        for k, (label, secondary) in enumerate(rows):
            sf.write(root / f"f{k}.wav", tone(freq=200 + 50 * k), SAMPLE_RATE)
            writer.writerow([label, secondary, f"f{k}.wav", "4.0"])
    return root


def test_secondary_labels_make_multi_hot_targets_and_a_multi_label_objective(tmp_path):
    root = write_birdclef_table(tmp_path / "d", [("a", "['b']"), ("a", "[]"), ("b", "['a', 'zz']"), ("c", "[]"),
                                                 ("c", "['a']"), ("b", "[]")])  # fmt: skip
    data = load(root, path_column="filename", label_column="primary_label", secondary_labels_column="secondary_labels",
                secondary_label_weight=0.5, val_fraction=0)  # fmt: skip
    assert data.objective == "bce" and data.labels == ["a", "b", "c"]
    assert data.multi_hot.tolist() == [[1, 0.5, 0], [1, 0, 0], [0.5, 1, 0], [0, 0, 1], [0.5, 0, 1], [0, 1, 0]]
    assert data.targets.tolist() == [0, 0, 1, 2, 2, 1]  # the primary label: what the split stratifies by
    assert data.label_counts() == {"a": 4, "b": 3, "c": 2}  # files that have the class (the prior)
    said = "\n".join(data.log)
    assert "'zz'" in said
    config = TrainConfig(data_dir=str(root), path_column="filename", label_column="primary_label",
                         secondary_labels_column="secondary_labels")  # fmt: skip
    table = read_train_table(root, "error", TrainTable.of(config))[0]
    assert choose_objective(config, table) == ("bce", "auto: 3 of 6 files have several labels")
    aam = load(root, path_column="filename", label_column="primary_label", secondary_labels_column="secondary_labels",
               objective="aam", val_fraction=0)  # fmt: skip
    assert aam.multi_hot is None and "4 secondary labels left out" in "\n".join(aam.log)


def test_a_few_double_labelled_files_keep_one_class_per_clip(tmp_path):
    rows = [(f"f{k:02d}.wav", "x" if k % 2 else "y") for k in range(30)] + [("f00.wav", "x")]
    root = write_folder(tmp_path / "d", rows, {f"f{k:02d}.wav": tone(freq=100 + 20 * k) for k in range(30)})
    data = load(root)
    assert data.objective == "aam" and len(data.rows) == 31  # f00.wav trained on as x and as y
    table = read_train_table(root, "error", TrainTable.of(TrainConfig(data_dir=str(root))))[0]
    assert "only 1 of 30 files have several labels" in choose_objective(TrainConfig(), table)[1]


@pytest.mark.parametrize("cell", ["['a'", "[1, 2]", "__import__('os')"])
def test_a_secondary_label_cell_that_is_no_list_names_its_line(tmp_path, cell):
    root = write_birdclef_table(
        tmp_path / "d", [("a", "[]"), ("b", cell if cell.startswith("[") else f"[{cell}]")]
    )
    with pytest.raises(DataError, match=r"train.csv line 3, column 'secondary_labels'.*not a list of labels"):
        load(
            root,
            path_column="filename",
            label_column="primary_label",
            secondary_labels_column="secondary_labels",
        )


def test_an_epoch_crops_long_files_once_per_window_of_their_audio(tmp_path):
    lengths = {"short.wav": 0.4, "one.wav": 1.2, "six.wav": 6.1, "long.wav": 30.0}  # seconds
    root = write_folder(tmp_path / "d", [(name, "x") for name in lengths],
                        {name: tone(seconds=s) for name, s in lengths.items()})  # fmt: skip
    data = load(root, val_fraction=0)
    counts = Counter(data.rows[i].rel_path for i in data.epoch_rows(SAMPLE_RATE))
    assert counts == {
        "short.wav": 1,
        "one.wav": 1,
        "six.wav": 6,
        "long.wav": 8,
    }  # capped at MAX_CROPS_PER_FILE
    fixed = Counter(data.rows[i].rel_path for i in data.epoch_rows(SAMPLE_RATE, crops_per_file=2))
    assert set(fixed.values()) == {2}
