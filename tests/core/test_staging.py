"""pipeline.core.staging: a directory appears complete or not at all, a replaced one survives a failed build, and
no output ever replaces or overlaps a folder this project did not write."""

import os
import stat

import numpy as np
import pytest

from pipeline.core.staging import (
    MARKER,
    OutputRefused,
    changes_since_marked,
    check_output_dir,
    mark,
    marked_as,
    staged_directory,
    staged_file,
    write_text_atomically,
)


def anything(_folder):
    return True


def nothing(_folder):
    return False


def test_a_finished_build_appears_under_the_target_name_and_nothing_else_is_left(tmp_path):
    target = tmp_path / "out"
    with staged_directory(target, anything) as staging:
        assert staging.parent == tmp_path and staging.name.startswith(".out.partial-")
        assert not target.exists()  # nothing visible while it is being built
        (staging / "a.txt").write_text("new")
    assert (target / "a.txt").read_text() == "new"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]
    assert stat.S_IMODE(target.stat().st_mode) == 0o755  # shared, not mkdtemp's private 0700


def test_a_finished_build_replaces_the_old_directory(tmp_path):
    target = tmp_path / "out"
    target.mkdir()
    (target / "old.txt").write_text("old")
    with staged_directory(target, anything) as staging:
        (staging / "new.txt").write_text("new")
        assert (target / "old.txt").exists()  # the old one stays until the swap
    assert sorted(p.name for p in target.iterdir()) == ["new.txt"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


@pytest.mark.parametrize("error", [RuntimeError("disk full"), KeyboardInterrupt()])
def test_a_failed_build_leaves_the_old_directory_as_it_was(tmp_path, error):
    target = tmp_path / "out"
    target.mkdir()
    (target / "old.txt").write_text("old")
    with pytest.raises(type(error)):
        with staged_directory(target, anything) as staging:
            (staging / "half.txt").write_text("half")
            raise error
    assert sorted(p.name for p in target.iterdir()) == ["old.txt"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


def test_a_failed_first_build_leaves_nothing(tmp_path):
    with pytest.raises(RuntimeError):
        with staged_directory(tmp_path / "deeper" / "out", anything):
            raise RuntimeError("interrupted")
    assert list((tmp_path / "deeper").iterdir()) == []


def test_a_folder_holding_someone_elses_files_is_never_replaced_at_the_swap(tmp_path):
    target = tmp_path / "out"
    with pytest.raises(OutputRefused, match="did not write"):
        with staged_directory(target, nothing) as staging:
            (staging / "new.txt").write_text("new")
            target.mkdir()  # while the build ran, a user put a file there
            (target / "notes.txt").write_text("mine")
    assert sorted(p.name for p in target.iterdir()) == ["notes.txt"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


def test_new_empty_and_own_folders_may_be_written(tmp_path):
    assert check_output_dir(tmp_path / "new", name="out", is_ours=nothing, what="x") == tmp_path / "new"
    (tmp_path / "empty").mkdir()
    check_output_dir(tmp_path / "empty", name="out", is_ours=nothing, what="x")
    ours = tmp_path / "ours"
    ours.mkdir()
    mark(ours, "competition folder")
    assert marked_as(ours, "competition folder") and not marked_as(ours, "artifact")
    check_output_dir(ours, name="out", is_ours=lambda p: marked_as(p, "competition folder"), what="x")


def test_a_marked_folder_is_ours_only_while_nobody_put_or_changed_a_file_there(tmp_path):
    ours = tmp_path / "ours"
    (ours / "audio").mkdir(parents=True)
    (ours / "audio" / "a.wav").write_bytes(b"RIFF")
    (ours / "train.csv").write_text("path,label\n")
    mark(ours, "competition folder")
    assert changes_since_marked(ours, "competition folder") == []
    assert changes_since_marked(ours, "kaggle package") == [MARKER, "audio", "train.csv"]
    (ours / "train.csv").unlink()  # a file of ours gone is nobody's loss
    assert changes_since_marked(ours, "competition folder") == []
    (ours / "audio" / "mine.wav").write_bytes(b"RIFF")  # put there
    (ours / "audio" / "a.wav").write_bytes(b"RIFX")  # the same size, written again a second later
    later = (ours / MARKER).stat().st_mtime_ns + 1_000_000_000
    os.utime(ours / "audio" / "a.wav", ns=(later, later))
    assert changes_since_marked(ours, "competition folder") == [
        "audio/a.wav (changed since)",
        "audio/mine.wav",
    ]
    with pytest.raises(
        OutputRefused, match=r"holds files this project did not write \(audio/a.wav \(changed"
    ):
        check_output_dir(
            ours,
            name="out",
            is_ours=lambda p: not changes_since_marked(p, "competition folder"),
            what="x",
            not_ours=lambda p: changes_since_marked(p, "competition folder"),
        )
    assert (ours / "audio" / "mine.wav").exists()


def test_a_marker_from_before_markers_listed_files_holds_the_folder_to_its_time(tmp_path):
    ours = tmp_path / "ours"
    ours.mkdir()
    (ours / "train.csv").write_text("path,label\n")
    (ours / MARKER).write_text('{"kind": "competition folder"}\n')
    assert changes_since_marked(ours, "competition folder") == []
    later = (ours / MARKER).stat().st_mtime_ns + 1_000_000_000
    (ours / "notes.txt").write_text("mine")
    os.utime(ours / "notes.txt", ns=(later, later))
    assert changes_since_marked(ours, "competition folder") == ["notes.txt (changed since)"]


def test_a_folder_with_a_users_files_is_refused_naming_them(tmp_path):
    full = tmp_path / "full"
    full.mkdir()
    (full / "notes.txt").write_text("mine")
    with pytest.raises(
        OutputRefused, match=r"out='.*full' holds files this project did not write \(notes.txt\)"
    ):
        check_output_dir(full, name="out", is_ours=nothing, what="a competition folder")
    assert (full / "notes.txt").read_text() == "mine"


def test_replacing_our_own_folder_can_require_asking(tmp_path):
    ours = tmp_path / "ours"
    ours.mkdir()
    (ours / "train.csv").write_text("path,label\n")
    with pytest.raises(
        OutputRefused, match=r"already holds a competition folder .* pass --overwrite to replace"
    ):
        check_output_dir(ours, name="out", is_ours=anything, what="a competition folder", replace_ours=False,
                         how_to_replace="pass --overwrite")  # fmt: skip


def test_a_file_is_not_an_output_folder(tmp_path):
    a_file = tmp_path / "file"
    a_file.write_text("x")
    with pytest.raises(OutputRefused, match="not a folder"):
        check_output_dir(a_file, name="out", is_ours=anything, what="x")


def test_the_working_directory_its_parents_home_and_root_are_refused(tmp_path, monkeypatch):
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    for target, where in ((".", "working directory"), (str(tmp_path), "working directory"), ("/", "root")):
        with pytest.raises(OutputRefused, match=where):
            check_output_dir(target, name="artifact_dir", is_ours=anything, what="x")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    (tmp_path / "home").mkdir()
    with pytest.raises(OutputRefused, match="home folder"):
        check_output_dir(tmp_path / "home", name="artifact_dir", is_ours=anything, what="x")


@pytest.mark.parametrize(
    ("target", "relation"), [("data", "is"), ("data/model", "lies inside"), (".", "contains")]
)
def test_an_output_may_not_overlap_the_data(tmp_path, monkeypatch, target, relation):
    monkeypatch.chdir(tmp_path)
    root = tmp_path / "root"
    (root / "data").mkdir(parents=True)
    with pytest.raises(OutputRefused, match=f"artifact_dir='.*' {relation} data_dir="):
        check_output_dir(root / target, name="artifact_dir", is_ours=anything, what="x",
                         keep_apart={"data_dir": root / "data"})  # fmt: skip


def test_a_written_file_replaces_the_target_readable_by_others(tmp_path):
    target = tmp_path / "sub" / "submission.csv"
    write_text_atomically(target, "id,label\n")
    write_text_atomically(target, "id,label\na,b\n")
    assert target.read_text() == "id,label\na,b\n"
    assert stat.S_IMODE(target.stat().st_mode) == 0o644  # not mkstemp's private 0600
    assert sorted(p.name for p in target.parent.iterdir()) == ["submission.csv"]


def test_a_staged_file_keeps_the_suffix_so_numpy_writes_exactly_there(tmp_path):
    target = tmp_path / "embeddings.npz"
    with staged_file(target) as staging:
        assert staging.suffix == ".npz" and staging.name.startswith(".embeddings.partial-")
        np.savez(staging, x=np.arange(3))  # savez appends ".npz" to a name without it
    assert np.load(target)["x"].tolist() == [0, 1, 2]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["embeddings.npz"]


def test_a_failed_file_write_leaves_the_old_file(tmp_path):
    target = tmp_path / "latest.pt"
    target.write_text("old")
    with pytest.raises(OSError):
        with staged_file(target) as staging:
            staging.write_text("half")
            raise OSError("disk full")
    assert target.read_text() == "old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["latest.pt"]
