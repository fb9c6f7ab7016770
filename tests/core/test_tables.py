"""pipeline.core.tables: the competition's tables in this project's layout or its own, test items, sample submissions."""

import pytest
import soundfile as sf
from helpers import tone

from pipeline.core.config import SAMPLE_RATE
from pipeline.core.tables import (
    DataError,
    TestLayout,
    TrainTable,
    audio_files_under,
    audio_root,
    read_sample_submission,
    read_test_items,
    read_train_table,
    resolve_inside,
)


def touch_audio(root, *names):
    for name in names:
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        sf.write(root / name, tone(0.1), SAMPLE_RATE)


def test_missing_columns_are_named_with_the_parameters_to_set(tmp_path):
    (tmp_path / "train.csv").write_text("file,speaker\na.wav,x\n")
    with pytest.raises(DataError, match=r"train.csv: missing column\(s\) \['path', 'label'\].*path_column"):
        read_train_table(tmp_path)


def test_missing_test_table_says_to_use_test_audio_dir(tmp_path):
    (tmp_path / "test_audio").mkdir()
    with pytest.raises(DataError, match=r"test.csv: file not found.*test_audio_dir.*'test_audio'"):
        read_test_items(tmp_path, TestLayout())


def test_empty_label_or_path_names_the_line_or_is_skipped(tmp_path):
    (tmp_path / "train.csv").write_text("path,label\na.wav,x\nb.wav,\n,y\n")
    with pytest.raises(DataError, match=r"train.csv line 3 \('b.wav'\): empty 'label'.*on_bad_row='skip'"):
        read_train_table(tmp_path)
    rows, skipped = read_train_table(tmp_path, on_bad_row="skip")
    assert [r.rel_path for r in rows] == ["a.wav"]
    assert [(s["line"], s["reason"]) for s in skipped] == [("3", "empty 'label'"), ("4", "empty 'path'")]


def test_a_repeated_test_id_uses_its_first_row_and_is_reported(tmp_path):
    (tmp_path / "test.csv").write_text("id,path\n1,a.wav\n2,c.wav\n1,b.wav\n")
    items = read_test_items(tmp_path, TestLayout())
    assert [(r.id, r.rel_path) for r in items.rows] == [("1", "a.wav"), ("2", "c.wav")]
    assert items.notes == ["test.csv line 4 repeats id '1' of line 2; the first row is used"]


def test_csv_dialects_users_produce_are_read_byte_exact(tmp_path):
    """Excel and pandas write a BOM, CRLF, quoted fields and extra columns in any order. Values stay exactly as
    written (issue 14: ' spaced ' became 'spaced' in the model and in submission.csv)."""
    (tmp_path / "train.csv").write_bytes(
        b'\xef\xbb\xbf"speaker_id","label","path"\r\n"7","a, b","dir with space/x.wav"\r\n"8"," c ","y.wav"\r\n'
    )
    rows, _ = read_train_table(tmp_path)
    assert [(r.line, r.rel_path, r.label) for r in rows] == [
        (2, "dir with space/x.wav", "a, b"),
        (3, "y.wav", " c "),
    ]


def test_the_competitions_own_training_table(tmp_path):
    """Issue 12: train_curated.csv with fname,labels, audio in train_curated/, nested, with or without extension."""
    touch_audio(tmp_path / "train_curated", "a.wav", "deep/b.flac", "c.ogg")
    (tmp_path / "train_curated" / "c.au").write_bytes(b"")  # a later suffix of AUDIO_SUFFIXES: c stays c.ogg
    (tmp_path / "train_curated.csv").write_text("fname,labels\na.wav,dog\ndeep/b,cat\nc,dog,\n")
    layout = TrainTable("train_curated.csv", "fname", "labels", "train_curated")
    rows, _ = read_train_table(tmp_path, layout=layout)
    assert [(r.rel_path, r.label, r.written) for r in rows] == [
        ("train_curated/a.wav", "dog", "a.wav"), ("train_curated/deep/b.flac", "cat", "deep/b"),
        ("train_curated/c.ogg", "dog", "c")]  # fmt: skip
    with pytest.raises(DataError, match=r"train_curated.csv line 2 \('a.wav'\): empty 'labels'"):
        (tmp_path / "train_curated.csv").write_text("fname,labels\na.wav,\n")
        read_train_table(tmp_path, layout=layout)
    with pytest.raises(DataError, match=r"parameter audio_dir='nope': no such folder"):
        read_train_table(tmp_path, layout=TrainTable("train_curated.csv", "fname", "labels", "nope"))
    with pytest.raises(DataError, match=r"parameter audio_dir='../x'.*outside"):
        read_train_table(tmp_path, layout=TrainTable("train_curated.csv", "fname", "labels", "../x"))


def test_multi_label_rows_can_be_split(tmp_path):
    touch_audio(tmp_path, "a.wav")
    (tmp_path / "train.csv").write_text('path,label\na.wav,"Bark,Walk"\n')
    rows, _ = read_train_table(tmp_path, layout=TrainTable(label_separator=","))
    assert [(r.rel_path, r.label) for r in rows] == [("a.wav", "Bark"), ("a.wav", "Walk")]


@pytest.mark.parametrize(
    ("sample_ids", "form"),
    [(["x1.ogg", "x2.ogg"], "name"), (["x1", "x2"], "stem"), (["row_0", "row_1"], "stem"),
     (["clip.ogg", "other.ogg"], "name")],
)  # fmt: skip
def test_a_hidden_test_folder_is_discovered_and_named_like_the_sample(tmp_path, sample_ids, form):
    touch_audio(tmp_path / "test", "x1.ogg", "sub/x2.ogg", ".hidden.ogg")
    (tmp_path / "test" / "notes.txt").write_text("not audio")
    items = read_test_items(tmp_path, TestLayout(test_audio_dir="test"), sample_ids)
    expected = ["x1.ogg", "x2.ogg"] if form == "name" else ["x1", "x2"]
    assert [r.id for r in items.rows] == expected and items.source == "folder"
    assert sorted(r.rel_path for r in items.rows) == ["test/sub/x2.ogg", "test/x1.ogg"]
    assert any(f"each file's {form}" in note for note in items.notes)
    named = read_test_items(tmp_path, TestLayout(test_audio_dir="test", test_id="name"), sample_ids)
    assert [r.id for r in named.rows] == ["x1.ogg", "x2.ogg"]


def test_an_empty_hidden_test_folder_gives_no_items(tmp_path):
    (tmp_path / "test").mkdir()
    items = read_test_items(tmp_path, TestLayout(test_audio_dir="test"), ["placeholder"])
    assert items.rows == [] and "0 audio file(s)" in items.notes[0]


def test_sample_submissions_of_both_kinds(tmp_path):
    (tmp_path / "labels.csv").write_text("fname,speaker\na,x\nb,x\n")
    (tmp_path / "probs.csv").write_text("row_id,dog,cat, bird\nr1,0,0,0\n")
    labels, probs = (
        read_sample_submission(tmp_path / "labels.csv"),
        read_sample_submission(tmp_path / "probs.csv"),
    )
    assert (labels.id_column, labels.value_columns, labels.ids, labels.probabilities) == ("fname", ["speaker"],
                                                                                           ["a", "b"], False)  # fmt: skip
    assert (probs.id_column, probs.value_columns, probs.probabilities) == (
        "row_id",
        ["dog", "cat", "bird"],
        True,
    )
    (tmp_path / "one.csv").write_text("id\n1\n")
    with pytest.raises(DataError, match="fewer than two columns"):
        read_sample_submission(tmp_path / "one.csv")


@pytest.mark.parametrize("rel", ["../outside.wav", "/etc/passwd", "a/../../x.wav"])
def test_paths_outside_the_folder_are_refused(tmp_path, rel):
    with pytest.raises(DataError, match="outside the data folder"):
        resolve_inside(tmp_path, rel)


def test_an_empty_path_is_called_empty(tmp_path):
    """Issue 14: it was reported as 'resolves outside the data folder'."""
    with pytest.raises(DataError, match="empty path"):
        resolve_inside(tmp_path, "")


def test_links_inside_the_folder_are_followed(tmp_path):
    """Issue 51: Kagglers build data folders out of links to /kaggle/input; the table's paths are judged as
    written, and a link the folder holds is followed wherever it points."""
    (tmp_path / "elsewhere" / "audio").mkdir(parents=True)
    (tmp_path / "elsewhere" / "audio" / "a.wav").write_bytes(b"x")
    (tmp_path / "secret.wav").write_bytes(b"y")
    data = tmp_path / "data"
    data.mkdir()
    (data / "audio").symlink_to(tmp_path / "elsewhere" / "audio", target_is_directory=True)
    (data / "link.wav").symlink_to(tmp_path / "secret.wav")
    assert resolve_inside(data, "audio/a.wav") == data / "audio" / "a.wav"
    assert resolve_inside(data, "audio/a.wav").read_bytes() == b"x"
    assert resolve_inside(data, "link.wav").read_bytes() == b"y"
    assert resolve_inside(data, "audio/../link.wav") == data / "link.wav"  # judged as written, not as linked
    assert audio_root(data, "audio", "audio_dir") == (data / "audio", "audio")
    assert audio_root(data, "./audio/", "audio_dir") == (data / "audio", "audio")
    with pytest.raises(DataError, match="outside the data folder.*'..' climbs out"):
        resolve_inside(data, "audio/../../secret.wav")


def test_audio_files_under_follows_linked_folders_and_walks_a_loop_once(tmp_path):
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "elsewhere" / "b.ogg").write_bytes(b"x")
    root = tmp_path / "root"
    (root / ".hidden").mkdir(parents=True)
    (root / ".hidden" / "h.wav").write_bytes(b"x")
    (root / "a.wav").write_bytes(b"x")
    (root / "notes.txt").write_text("x")
    (root / "linked").symlink_to(tmp_path / "elsewhere", target_is_directory=True)
    (root / "loop").symlink_to(root, target_is_directory=True)  # a link back to the folder itself
    found = [p.relative_to(root).as_posix() for p in audio_files_under(root)]
    assert found == ["a.wav", "linked/b.ogg"]


def test_a_taxonomy_table_maps_labels_to_scientific_names_and_no_table_is_no_mapping(tmp_path):
    from pipeline.core.tables import read_taxonomy

    (tmp_path / "taxonomy.csv").write_text("primary_label,scientific_name\nblabir1,Turdus merula\n,Nobody\n")
    assert read_taxonomy(tmp_path) == {"blabir1": "Turdus merula"}  # a row without a label is no entry
    (tmp_path / "taxonomy.csv").unlink()
    assert read_taxonomy(tmp_path) == {}
    (tmp_path / "taxonomy.csv").write_text("code,name\nx,y\n")  # not BirdCLEF's columns
    assert read_taxonomy(tmp_path) == {}


def test_a_targets_file_is_written_with_its_lineage_and_replaces_only_its_own(tmp_path):
    import hashlib
    import json

    from pipeline.core.staging import OutputRefused
    from pipeline.core.tables import write_targets_file

    out = tmp_path / "m.targets_1.csv"
    lineage = lambda: {"teacher": "m.round_0", "windows": 1, "files": 1}  # noqa: E731
    record = write_targets_file(
        out, ["filename", "start", "end", "a"], [["s.ogg", 0, 1, 0.5]], lineage, why="test"
    )
    assert out.read_text() == "filename,start,end,a\ns.ogg,0,1,0.5\n"
    assert json.loads(out.with_suffix(".json").read_text()) == record
    assert record["sha256"] == hashlib.sha256(out.read_bytes()).hexdigest()
    # Its own file is replaced (a rerun), also when a killed run left the new record beside the old file.
    out.write_text("filename,start,end,a\nold.ogg,0,1,0.1\n")
    write_targets_file(out, ["filename", "start", "end", "a"], [["s.ogg", 1, 2, 0.25]], lineage, why="test")
    assert "s.ogg,1,2,0.25" in out.read_text()
    # Someone else's: a file without a lineage record of this project beside it, or a record that is not one.
    for theirs, text in ((tmp_path / "x.csv", "filename,start,end\n"), (tmp_path / "y.json", "[1, 2]")):
        theirs.write_text(text)
        with pytest.raises(OutputRefused, match=rf"{theirs.name} is there and this project did not write it"):
            write_targets_file(theirs.with_suffix(".csv"), ["filename"], [], lineage, why="test")
        assert theirs.read_text() == text
        assert not theirs.with_suffix(".json" if theirs.suffix == ".csv" else ".csv").exists()
