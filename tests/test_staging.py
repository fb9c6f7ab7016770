"""pipeline.staging: a directory appears complete or not at all, and a replaced one survives a failed build."""

import stat

import numpy as np
import pytest

from pipeline.staging import refuse_to_replace, staged_directory, staged_file, write_text_atomically


def test_a_finished_build_appears_under_the_target_name_and_nothing_else_is_left(tmp_path):
    target = tmp_path / "out"
    with staged_directory(target) as staging:
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
    with staged_directory(target) as staging:
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
        with staged_directory(target) as staging:
            (staging / "half.txt").write_text("half")
            raise error
    assert sorted(p.name for p in target.iterdir()) == ["old.txt"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


def test_a_failed_first_build_leaves_nothing(tmp_path):
    with pytest.raises(RuntimeError):
        with staged_directory(tmp_path / "deeper" / "out"):
            raise RuntimeError("interrupted")
    assert list((tmp_path / "deeper").iterdir()) == []


def test_refuse_to_replace_names_the_path_and_the_way_out(tmp_path):
    refuse_to_replace(tmp_path / "missing", overwrite=False, how_to_overwrite="pass --overwrite")
    empty = tmp_path / "empty"
    empty.mkdir()
    refuse_to_replace(empty, overwrite=False, how_to_overwrite="pass --overwrite")
    full = tmp_path / "full"
    full.mkdir()
    (full / "x").write_text("x")
    with pytest.raises(FileExistsError, match=r"not empty: .*full \(pass --overwrite to replace it\)"):
        refuse_to_replace(full, overwrite=False, how_to_overwrite="pass --overwrite")
    refuse_to_replace(full, overwrite=True, how_to_overwrite="pass --overwrite")
    a_file = tmp_path / "file"
    a_file.write_text("x")
    with pytest.raises(FileExistsError, match="not a directory"):
        refuse_to_replace(a_file, overwrite=True, how_to_overwrite="pass --overwrite")


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
