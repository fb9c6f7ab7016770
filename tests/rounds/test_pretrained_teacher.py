"""pipeline.rounds.pretrained: a pretrained model teaches a run and is sealed in its artifact; the infer stage
blends it in (inference/runtime.py, submission.py). On the tone teacher of teacher_fixtures: a real ONNX model
behind a teacher.json, knowing three of the competition's four classes."""

import csv
import json

import numpy as np
import pytest
from teacher_fixtures import make_tone_competition, make_tone_teacher

from pipeline.core.artifact import load_artifact
from pipeline.core.config import ConfigError, InferConfig, TrainConfig
from pipeline.inference.submission import run_inference
from pipeline.rounds.self_training import train_rounds
from pipeline.teachers import model as teacher_model
from pipeline.tooling.scoring import score_submission
from pipeline.training.train import train

TINY = dict(model_size="tiny", epochs=2, per_device_batch_size=8, base_batch_size=8, n_mels=40, window_seconds=0.5,
            accelerator="cpu", progress=False, num_threads=2, export_onnx=False, sample_rate=16000)  # fmt: skip


@pytest.fixture(scope="module")
def taught(tmp_path_factory):
    """(data folder, teacher folder, artifact trained with the teacher sealed, the training log)."""
    root = tmp_path_factory.mktemp("taught")
    data = make_tone_competition(root / "data")
    teacher = make_tone_teacher(root / "teacher")
    lines = []
    config = TrainConfig(data_dir=str(data), artifact_dir=str(root / "model"), cache_dir=str(root / "cache"),
                         pretrained_teacher=str(teacher), distill_focal=True, **TINY)  # fmt: skip
    train_rounds(config, log=lines.append)
    return data, teacher, root / "model", lines


def read_rows(path):
    with open(path, newline="") as handle:
        return list(csv.DictReader(handle))


def test_the_teacher_scores_the_recordings_and_is_sealed_in_the_artifact(taught):
    data, _, artifact, lines = taught
    assert any("teacher knows 3 of 4 classes; it lacks 1" in line and "tonus_rarus" in line for line in lines)
    recordings = artifact.with_name("model.teacher_recordings.csv")
    assert read_rows(recordings)[0].keys() == {
        "filename",
        "start",
        "end",
        "tonus_altus",
        "tonus_bassus",
        "tonus_medius",
    }
    loaded = load_artifact(artifact)
    record = loaded.teacher
    assert record["blend_weight"] == 0.5 and record["lacking"] == {
        "tonus_rarus": record["lacking"]["tonus_rarus"]
    }
    # The tones it knows score ~4 on their own recordings and ~-4 on the rare tone's: a logit in between.
    assert -4 < record["unknown_logit"] < 4 and record["unknown_logit_fitted_on"]
    assert {"teacher_model.onnx", "teacher_labels.txt", "teacher.json"} <= set(loaded.manifest["files"])
    assert loaded.manifest["provenance"]["pretrained_teacher"]["name"] == "tone teacher"
    assert loaded.manifest["provenance"]["focal_targets"]["file"] == recordings.name  # distill_focal


def test_the_infer_stage_blends_the_teacher_and_names_the_class_it_lacks(taught, tmp_path):
    data, _, artifact, _ = taught
    runs = {}
    for name, weight in (("alone", 0), ("sealed", "auto"), ("teacher", 1.0)):
        runs[name] = run_inference(InferConfig(data_dir=str(data), artifact_dir=str(artifact), teacher_blend=weight,
                                               submission_path=str(tmp_path / f"{name}.csv"), progress=False))  # fmt: skip
    assert runs["alone"].report["teacher"] == {"blended": False, "why": "teacher_blend=0: the model alone"}
    assert runs["sealed"].report["teacher"]["blended"] and runs["sealed"].report["teacher"]["files"] == 12
    assert runs["sealed"].report["teacher"]["weight"] == 0.5
    assert "teacher: tone teacher blended at 0.5 on 3 of 4 classes" in runs["sealed"].report["runtime"]
    truth = {r["id"]: r["label"] for r in read_rows(data / "solution.csv")}
    # The teacher alone where it knows the class: every tone right -- the rare one, which it cannot name,
    # through its "none of mine" share (the one class it lacks takes all of it).
    got = {r["id"]: r["label"] for r in read_rows(tmp_path / "teacher.csv")}
    assert got == truth
    accuracy = {name: score_submission(tmp_path / f"{name}.csv", data / "solution.csv")[1] for name in runs}
    assert accuracy["sealed"] >= accuracy["alone"]  # the plain average with a teacher that knows its tones
    # Blending changed the probabilities (not only, perhaps, the labels): the embeddings say the same.
    alone, sealed = (
        json.loads((tmp_path / f"{n}_report.json").read_text())["speed"] for n in ("alone", "sealed")
    )
    assert "teacher_audio_seconds_per_second" in sealed and "teacher_audio_seconds_per_second" not in alone


def test_probability_rows_are_blended_distributions(taught, tmp_path):
    data, _, artifact, _ = taught
    labels = ["tonus_altus", "tonus_bassus", "tonus_medius", "tonus_rarus"]
    (tmp_path / "data").mkdir()
    for name in ("test.csv", "taxonomy.csv"):
        (tmp_path / "data" / name).write_text((data / name).read_text())
    (tmp_path / "data" / "test_audio").symlink_to(data / "test_audio", target_is_directory=True)
    ids = [r["id"] for r in read_rows(data / "test.csv")]
    (tmp_path / "data" / "sample_submission.csv").write_text(
        "id," + ",".join(labels) + "\n" + "".join(f"{i}" + ",0.25" * 4 + "\n" for i in ids)
    )
    run_inference(InferConfig(data_dir=str(tmp_path / "data"), artifact_dir=str(artifact),
                              submission_path=str(tmp_path / "p.csv"), progress=False))  # fmt: skip
    rows = read_rows(tmp_path / "p.csv")
    values = np.array([[float(r[c]) for c in labels] for r in rows])
    np.testing.assert_allclose(values.sum(axis=1), 1.0, atol=1e-4)
    truth = {r["id"]: r["label"] for r in read_rows(data / "solution.csv")}
    assert [labels[k] for k in values.argmax(axis=1)] == [truth[r["id"]] for r in rows]


def test_a_teacher_that_cannot_run_is_left_out_under_auto_and_stops_an_explicit_weight(
    taught, tmp_path, monkeypatch
):
    data, _, artifact, _ = taught
    monkeypatch.setattr(teacher_model, "runtime_missing", lambda teacher: "onnxruntime is not installed")
    from pipeline.inference import runtime

    monkeypatch.setattr(runtime, "runtime_missing", lambda teacher: "onnxruntime is not installed")
    result = run_inference(InferConfig(data_dir=str(data), artifact_dir=str(artifact),
                                       submission_path=str(tmp_path / "s.csv"), progress=False))  # fmt: skip
    assert not result.report["teacher"]["blended"]
    assert (
        "cannot run here (onnxruntime is not installed); the model alone" in result.report["teacher"]["why"]
    )
    with pytest.raises(Exception, match="onnxruntime is not installed"):
        run_inference(InferConfig(data_dir=str(data), artifact_dir=str(artifact), teacher_blend=0.7,
                                  submission_path=str(tmp_path / "s.csv"), progress=False))  # fmt: skip


def test_a_rerun_keeps_the_teachers_targets_and_blend_0_seals_nothing(taught, tmp_path):
    data, teacher, artifact, _ = taught
    recordings = artifact.with_name("model.teacher_recordings.csv")
    target = tmp_path / "model"
    (tmp_path / "model.teacher_recordings.csv").write_bytes(recordings.read_bytes())
    (tmp_path / "model.teacher_recordings.json").write_bytes(recordings.with_suffix(".json").read_bytes())
    lines = []
    config = TrainConfig(data_dir=str(data), artifact_dir=str(target), cache_dir=str(artifact.parent / "cache"),
                         pretrained_teacher=str(teacher), teacher_blend=0.0, **{**TINY, "epochs": 1})  # fmt: skip
    train_rounds(config, log=lines.append)
    assert any("is there, scored by the same teacher from the same files: kept" in line for line in lines)
    assert load_artifact(target).teacher is None
    with pytest.raises(ConfigError, match="carries no teacher"):
        run_inference(InferConfig(data_dir=str(data), artifact_dir=str(target), teacher_blend=0.5,
                                  submission_path=str(tmp_path / "s.csv"), progress=False))  # fmt: skip


def test_the_teacher_parameters_are_checked_and_train_points_to_the_rounds():
    with pytest.raises(ConfigError, match="not both"):
        TrainConfig(pretrained_teacher="birdnet", teacher="x.csv", self_training_rounds=1, noise_dir="n")
    with pytest.raises(ConfigError, match="teacher_blend"):
        TrainConfig(teacher_blend=1.5)
    assert TrainConfig(teacher_exclude="a, b").teacher_exclude == ["a", "b"]
    with pytest.raises(ConfigError, match="train_rounds"):
        train(TrainConfig(pretrained_teacher="birdnet", data_dir="x", artifact_dir="y"))
    assert json.dumps(TrainConfig(distill_focal=True, pretrained_teacher="birdnet").distill_focal)


def test_the_teachers_pass_refuses_outputs_it_did_not_write_before_it_scores(taught, tmp_path):
    """The teacher's targets files, and the artifact folder, are checked before the teacher scores anything."""
    from pipeline.core.staging import OutputRefused

    data, teacher, artifact, _ = taught
    config = TrainConfig(data_dir=str(data), artifact_dir=str(tmp_path / "model"), cache_dir=str(tmp_path / "cache"),
                         pretrained_teacher=str(teacher), **TINY)  # fmt: skip
    theirs = tmp_path / "model.teacher_recordings.csv"
    theirs.write_text("filename,start,end\nmine.ogg,0,1\n")  # no lineage beside it: not this project's
    with pytest.raises(OutputRefused, match=r"model\.teacher_recordings\.csv"):
        train_rounds(config, log=lambda _: None)
    assert theirs.read_text() == "filename,start,end\nmine.ogg,0,1\n"
    theirs.unlink()
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "notes.txt").write_text("mine")
    with pytest.raises(OutputRefused, match=r"artifact_dir.*notes\.txt"):
        train_rounds(config, log=lambda _: None)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model"]  # the teacher scored nothing
