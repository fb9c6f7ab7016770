"""Self-training rounds (pipeline/rounds/self_training.py) on a small field-soundscape folder: the teacher's
targets file, the student's lineage, and the targets' reader and controls."""

from __future__ import annotations

import csv
import dataclasses
import hashlib
import json
from pathlib import Path

import numpy as np
import pytest
from conftest import TINY_TRAIN

from pipeline.core.config import ConfigError, TrainConfig
from pipeline.core.tables import DataError, read_chunk_targets
from pipeline.demo_data.soundscapes import make_soundscape_competition, species_from_synthetic

LAYOUT = {"train_table": "train.csv", "path_column": "filename", "label_column": "primary_label",
          "secondary_labels_column": "secondary_labels", "audio_dir": "train_audio", "noise_dir": "train_soundscapes"}  # fmt: skip


@pytest.fixture(scope="module")
def field(tmp_path_factory) -> Path:
    species = species_from_synthetic(3, train_per=8, test_per=6, seed=2)
    return make_soundscape_competition(tmp_path_factory.mktemp("field") / "data", species, focal_per_class=6,
                                       test_soundscapes=1, train_soundscapes=2, soundscape_seconds=10, field=True)  # fmt: skip


def test_a_field_folder_has_calls_in_its_unlabelled_soundscapes_and_their_hidden_truth(field):
    truth = list(csv.DictReader(open(field / "train_soundscapes_truth.csv")))
    assert truth and {row["filename"] for row in truth} <= {"unlabelled_0000.ogg", "unlabelled_0001.ogg"}
    assert all(row["primary_label"] for row in truth)


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_round_of_self_training_is_taught_by_round_0_and_says_so(field, tmp_path):
    """Round 0 teaches round 1 the soundscapes and (distill_focal) the training recordings themselves."""
    from pipeline.rounds.self_training import _trained_with, train_rounds

    tiny = {**TINY_TRAIN, "epochs": 1, "ensemble_members": 1}
    config = TrainConfig(data_dir=str(field), artifact_dir=str(tmp_path / "model"), cache_dir=str(tmp_path / "cache"),
                         self_training_rounds=1, distill_focal=True, **LAYOUT, **tiny)  # fmt: skip
    result = train_rounds(config, log=lambda _: None)
    assert result.artifact_dir == tmp_path / "model"
    teacher = tmp_path / "model.round_0"
    targets = tmp_path / "model.targets_1.csv"
    rows = list(csv.DictReader(open(targets)))
    labels = json.loads((teacher / "manifest.json").read_text())["labels"]
    assert list(rows[0]) == ["filename", "start", "end", *labels]
    # every 0.5 s window of both 10 s soundscapes, a quarter of a second apart: 39 each
    assert len(rows) == 2 * 39 and all(0.0 <= float(row[c]) <= 1.0 for row in rows for c in labels)
    assert {float(r["end"]) - float(r["start"]) for r in rows} == {0.5}
    student = json.loads((tmp_path / "model" / "manifest.json").read_text())["provenance"]
    record = student["soundscape_targets"]
    assert record["file"] == targets.name and record["stretches"] <= len(rows) == record["of"]
    assert record["sha256"] == hashlib.sha256(targets.read_bytes()).hexdigest()
    assert record["lineage"]["teacher"] == "model.round_0" and record["lineage"]["teacher_provenance"] is None
    assert student["objective"] == "bce" and student["config"]["soundscape_targets"] == targets.name
    # The training recordings' windows, named as the training table resolves them (relative to data_dir).
    focal = tmp_path / "model.focal_targets_1.csv"
    windows = list(csv.DictReader(open(focal)))
    recordings = {row["filename"] for row in csv.DictReader(open(field / "train.csv"))}
    assert {row["filename"] for row in windows} == {f"train_audio/{name}" for name in recordings}
    assert all(0.0 <= float(row[c]) <= 1.0 for row in windows for c in labels)
    assert student["focal_targets"]["rows_covered"] == student["focal_targets"]["rows"] > 0
    assert student["focal_targets"]["lineage"]["teacher"] == "model.round_0"
    assert student["config"]["focal_targets"] == focal.name
    first = json.loads((teacher / "manifest.json").read_text())["provenance"]
    assert first["soundscape_targets"] is None and first["focal_targets"] is None  # round 0: the labels alone
    # A rerun after a lost session keeps round 0, trained with the same parameters; other parameters retrain it.
    round_0 = dataclasses.replace(
        config, artifact_dir=str(teacher), self_training_rounds=0, distill_focal=False
    )
    assert _trained_with(teacher, round_0)
    assert not _trained_with(teacher, dataclasses.replace(round_0, seed=5))


def test_a_targets_file_is_hashed_as_it_is_read(tmp_path):
    """The student's record of its targets (provenance, checkpoint fingerprint) takes the hash of the bytes
    read_chunk_targets parsed, in the same pass: over a BOM, CRLF lines, and a file of many read blocks."""
    path = tmp_path / "targets.csv"
    rows = "".join(f"s{k % 97}.ogg,{k},{k + 1},0.{k % 10}\r\n" for k in range(150_000))
    for text in ("filename,start,end,a\ns.ogg,0,1,0.5\n", "\ufefffilename,start,end,a\r\n" + rows):
        path.write_bytes(text.encode("utf-8"))
        found = read_chunk_targets(path, ["a"])
        assert found.sha256 == hashlib.sha256(path.read_bytes()).hexdigest() and len(found.files) >= 1
    assert len(found.files) == 150_000 and path.stat().st_size > 2 * (1 << 20)  # more than one 1 MB block


def test_targets_keep_the_models_classes_and_refuse_what_cannot_be_a_probability(tmp_path):
    path = tmp_path / "targets.csv"
    path.write_text("filename,start,end,b,zz\ns.ogg,0,1,0.5,0.9\ns.ogg,1,2,0.25,0\n")
    found = read_chunk_targets(path, ["a", "b"])
    assert found.probs.tolist() == [[0.0, 0.5], [0.0, 0.25]] and found.starts.tolist() == [0.0, 1.0]
    assert found.probs.dtype == np.float32 and found.ends.tolist() == [1.0, 2.0]
    assert any("'zz'" in n for n in found.notes) and any("'a'" in n for n in found.notes)
    path.write_text("filename,start,end,a\ns.ogg,0,1,0.5\ns.ogg,1,2,1.5\n")
    with pytest.raises(DataError, match=r"targets.csv line 3: needs end > start and probabilities in 0..1"):
        read_chunk_targets(path, ["a"])
    path.write_text("filename,start,end,a\ns.ogg,0,1,0.5\n\ns.ogg,0:01,0:02,0.25\ns.ogg,2,3\n")
    with pytest.raises(
        DataError, match=r"targets.csv line 5: start, end and the class columns must be numbers"
    ):
        read_chunk_targets(path, ["a"])  # line 3 is blank (skipped), line 4's times are m:ss
    path.write_text("filename,start,end,a\ns.ogg,0,1,nan\n")
    with pytest.raises(DataError, match=r"line 2: needs end > start and probabilities in 0..1"):
        read_chunk_targets(path, ["a"])


def test_the_self_training_parameters_are_checked():
    with pytest.raises(ConfigError, match="set self_training_rounds >= 1"):
        TrainConfig(teacher="model", noise_dir="x")
    with pytest.raises(ConfigError, match="needs noise_dir"):
        TrainConfig(self_training_rounds=2)
    with pytest.raises(
        ConfigError, match="distill_focal: the teacher of a self-training round, or a pretrained_teacher"
    ):
        TrainConfig(distill_focal=True)
    with pytest.raises(ConfigError, match="focal_target_weight"):
        TrainConfig(focal_target_weight=1.5)
    with pytest.raises(ConfigError, match="target_floor"):
        TrainConfig(target_floor=1.5)


def test_the_controls_shape_the_targets(field, tmp_path):
    from pipeline.training.dataset import load_soundscape_targets

    path = tmp_path / "t.csv"
    path.write_text(
        "filename,start,end,a,b\nunlabelled_0000.ogg,0,1,0.9,0.2\nunlabelled_0001.ogg,1,2,0.3,0.05\n"
    )
    config = TrainConfig(data_dir=str(field), noise_dir="train_soundscapes", soundscape_targets=str(path),
                         cache_dir=str(tmp_path / "cache"), target_power=2.0, target_floor=0.1, target_threshold=0.5, sample_rate=16000)  # fmt: skip
    stretches, record = load_soundscape_targets(
        config, ["a", "b"], "train_soundscapes", set(), log=lambda _: None
    )
    np.testing.assert_allclose(
        stretches.probs, [[0.81, 0.0]], rtol=1e-6
    )  # 0.2^2 < floor; row 2 under threshold
    assert record["stretches"] == 1 and record["of"] == 2 and record["lineage"] is None
    assert stretches.starts.tolist() == [0] and stretches.ends.tolist() == [config.sample_rate]


def test_focal_targets_cover_the_training_rows_by_their_recording(field, tmp_path):
    from pipeline.core.tables import TrainTable, read_train_table
    from pipeline.training.dataset import load_focal_targets

    config = TrainConfig(data_dir=str(field), cache_dir=str(tmp_path / "cache"), sample_rate=16000, **LAYOUT)
    rows, _ = read_train_table(field, "error", TrainTable.of(config))
    first, second = rows[0].rel_path, rows[1].rel_path
    path = tmp_path / "focal.csv"
    path.write_text(
        f"filename,start,end,a,b\n{first},1,2,0.2,0.8\n{first},0,1,0.9,0.1\n{second},0,1,0.5,0.5\n"
    )
    config = dataclasses.replace(config, focal_targets=str(path), focal_target_weight=0.25)
    focal, record = load_focal_targets(config, rows, ["a", "b"], log=lambda _: None)
    rate = config.sample_rate
    assert focal.first[:3].tolist() == [0, 2, 3] and (focal.first[3:] == 3).all()  # the rest: no windows
    assert focal.centres[:2].tolist() == [rate // 2, 3 * rate // 2]  # sorted by time within a recording
    assert record["rows_covered"] == 2 and record["rows"] == len(rows) and record["weight"] == 0.25
    path.write_text("filename,start,end,a,b\nelsewhere/x.ogg,0,1,0.2,0.8\n")
    with pytest.raises(DataError, match="none of its 1 files is a recording of the training table"):
        load_focal_targets(config, rows, ["a", "b"], log=lambda _: None)


def test_the_rounds_check_every_file_and_folder_they_write_before_anything_runs(field, tmp_path):
    """A round's targets file or folder that this project did not write is refused before round 0 trains, and
    left as it was: never train for an hour, then replace or refuse a user's file."""
    from pipeline.core.staging import OutputRefused
    from pipeline.rounds.self_training import train_rounds

    config = TrainConfig(data_dir=str(field), artifact_dir=str(tmp_path / "model"), cache_dir=str(tmp_path / "cache"),
                         self_training_rounds=2, distill_focal=True, **LAYOUT, **TINY_TRAIN)  # fmt: skip
    theirs = tmp_path / "model.focal_targets_2.csv"
    theirs.write_text("my own notes\n")
    with pytest.raises(OutputRefused, match=r"model\.focal_targets_2\.csv.*did not write"):
        train_rounds(config, log=lambda _: None)
    assert theirs.read_text() == "my own notes\n"
    theirs.unlink()
    lineage = tmp_path / "model.targets_1.json"  # a lineage record's name, holding something else
    lineage.write_text('{"mine": true}\n')
    with pytest.raises(OutputRefused, match=r"model\.targets_1\.json"):
        train_rounds(config, log=lambda _: None)
    assert lineage.read_text() == '{"mine": true}\n'
    lineage.unlink()
    folder = tmp_path / "model.round_1"
    folder.mkdir()
    (folder / "notes.txt").write_text("mine")
    with pytest.raises(OutputRefused, match=r"model\.round_1.*notes\.txt"):
        train_rounds(config, log=lambda _: None)
    assert (folder / "notes.txt").read_text() == "mine"
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "model.round_1"
    ]  # nothing trained, scored or cached
