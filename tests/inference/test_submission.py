import csv
import json
import shutil

import numpy as np
import pytest
import soundfile as sf

from pipeline.core.artifact import ArtifactError
from pipeline.core.config import InferConfig
from pipeline.core.staging import OutputRefused
from pipeline.core.tables import DataError
from pipeline.inference.submission import AllFallbacksError, run_inference
from pipeline.tooling.scoring import score_submission


def read_rows(path):
    with open(path, newline="") as handle:
        return list(csv.DictReader(handle))


def test_score_checks_ids(tmp_path):
    (tmp_path / "sol.csv").write_text("id,label\n1,a\n2,b\n")
    (tmp_path / "sub.csv").write_text("id,label\n1,a\n2,a\n")
    assert score_submission(tmp_path / "sub.csv", tmp_path / "sol.csv") == ("accuracy", 0.5)
    (tmp_path / "bad.csv").write_text("id,label\n1,a\n3,b\n")
    with pytest.raises(DataError, match="1 missing"):
        score_submission(tmp_path / "bad.csv", tmp_path / "sol.csv")


def test_inference_stage_on_synthetic_data(tiny_artifact, synthetic_data, tmp_path):
    out = tmp_path / "sub.csv"
    config = InferConfig(data_dir=str(synthetic_data), artifact_dir=str(tiny_artifact), submission_path=str(out),
                         progress=False, write_probabilities=True, write_embeddings=True)  # fmt: skip
    result = run_inference(config)
    ids = [r["id"] for r in read_rows(synthetic_data / "sample_submission.csv")]
    assert [r["id"] for r in read_rows(out)] == ids and result.n_fallbacks == 0
    assert score_submission(out, synthetic_data / "solution.csv")[1] >= 0.5  # 3-epoch tiny model, 4 speakers
    probs = read_rows(tmp_path / "probabilities.csv")
    assert len(probs) == len(ids)
    assert abs(sum(float(v) for k, v in probs[0].items() if k != "id") - 1.0) < 1e-3
    emb = np.load(tmp_path / "embeddings.npz")
    assert emb["embeddings"].shape[0] == len(ids) and emb["ok"].all()


def test_the_report_and_extras_replace_only_files_this_project_wrote(tiny_artifact, synthetic_data, tmp_path):
    """The files named after the submission (its report, probabilities.csv, embeddings.npz) replace a file only
    if this project wrote it: refused before anything is predicted, and a user's file is left as it was."""
    out = tmp_path / "sub.csv"
    config = dict(data_dir=str(synthetic_data), artifact_dir=str(tiny_artifact), submission_path=str(out),
                  progress=False, write_probabilities=True, write_embeddings=True)  # fmt: skip
    users = {"sub_report.json": '{"mine": 1}', "probabilities.csv": "id,score\nmine,1\n"}
    for name, text in users.items():
        (tmp_path / name).write_text(text)
        with pytest.raises(OutputRefused, match=rf"{name} is there and this project did not write it"):
            run_inference(InferConfig(**config))
        assert (
            (tmp_path / name).read_text() == text
            and not out.exists()
            and not (tmp_path / "embeddings.npz").exists()
        )
        (tmp_path / name).unlink()

    run_inference(InferConfig(**config))
    listed = json.loads((tmp_path / "sub_report.json").read_text())["extras"]
    assert sorted(listed) == ["embeddings.npz", "probabilities.csv"]
    run_inference(
        InferConfig(**{**config, "write_embeddings": False})
    )  # ours: replaced; the other stays ours
    assert sorted(json.loads((tmp_path / "sub_report.json").read_text())["extras"]) == sorted(listed)
    with (tmp_path / "embeddings.npz").open("ab") as edited:  # changed since: no longer the file we wrote
        edited.write(b"\0")
    with pytest.raises(OutputRefused, match="embeddings.npz is there"):
        run_inference(InferConfig(**config))


def test_broken_test_files_still_get_rows_and_are_reported(tiny_artifact, synthetic_data, tmp_path):
    data = tmp_path / "data"
    shutil.copytree(synthetic_data, data)
    rows = read_rows(data / "test.csv")
    sf.write(data / "audio" / "stereo.wav", np.random.default_rng(0).standard_normal((16000, 2)) * 0.1, 44100)
    (data / "audio" / "empty.wav").write_bytes(b"")
    (data / "audio" / "text.wav").write_text("not audio")
    extra = [("x_stereo", "audio/stereo.wav"), ("x_empty", "audio/empty.wav"), ("x_text", "audio/text.wav"),
             ("x_missing", "audio/nope.wav"), ("x_outside", "../../etc/passwd")]  # fmt: skip
    with open(data / "test.csv", "a") as handle:
        handle.writelines(f"{i},{p}\n" for i, p in extra)
    ids = [r["id"] for r in rows] + [i for i, _ in extra] + ["x_not_in_test"]
    (data / "sample_submission.csv").write_text("id,label\n" + "".join(f"{i},?\n" for i in ids))
    out = tmp_path / "sub.csv"
    config = InferConfig(data_dir=str(data), artifact_dir=str(tiny_artifact), submission_path=str(out),
                         progress=False)  # fmt: skip
    result = run_inference(config)
    written = read_rows(out)
    assert [r["id"] for r in written] == ids
    report = json.loads(result.report_path.read_text())
    fallback_ids = {f["id"] for f in report["fallbacks"]}
    assert fallback_ids == {"x_empty", "x_text", "x_missing", "x_outside", "x_not_in_test"}
    assert any(
        r["id"] == "x_stereo" and any("mixed down" in x for x in r["repairs"]) for r in report["repaired"]
    )
    labels = {r["id"]: r["label"] for r in written}
    assert all(labels[i] == report["fallback_label"] for i in fallback_ids)


def test_invalid_artifact_fails_the_run(artifact_copy, synthetic_data, tmp_path):
    (artifact_copy / "classifier.ckpt").write_bytes(b"tampered")
    config = InferConfig(data_dir=str(synthetic_data), artifact_dir=str(artifact_copy),
                         submission_path=str(tmp_path / "s.csv"), progress=False)  # fmt: skip
    with pytest.raises(ArtifactError, match="classifier.ckpt"):
        run_inference(config)
    assert not (tmp_path / "s.csv").exists()


def test_score_refuses_duplicate_ids(tmp_path):
    (tmp_path / "sol.csv").write_text("id,label\n1,a\n2,b\n")
    (tmp_path / "sub.csv").write_text("id,label\n1,a\n2,b\n1,b\n")
    with pytest.raises(DataError, match=r"sub.csv line 4: duplicate id '1'"):
        score_submission(tmp_path / "sub.csv", tmp_path / "sol.csv")


def test_awkward_ids_and_repeated_test_rows_cost_no_row(tiny_artifact, synthetic_data, tmp_path):
    """Ids with commas and quotes survive in every output; a test.csv id given twice uses its first row."""
    data = tmp_path / "data"
    shutil.copytree(synthetic_data, data)
    first = read_rows(data / "test.csv")[0]
    awkward = ['a,"1"', "b'q"]
    with open(data / "test.csv", "a", newline="") as handle:
        writer = csv.writer(handle, lineterminator="\n")
        writer.writerows([[i, first["path"]] for i in awkward])
        writer.writerow([first["id"], "audio/does-not-exist.wav"])  # repeats an id: ignored, reported
    ids = [r["id"] for r in read_rows(data / "sample_submission.csv")] + awkward
    with open(data / "sample_submission.csv", "w", newline="") as handle:
        csv.writer(handle, lineterminator="\n").writerows([["id", "label"], *[[i, "?"] for i in ids]])
    out = tmp_path / "sub.csv"
    result = run_inference(InferConfig(data_dir=str(data), artifact_dir=str(tiny_artifact),
                                       submission_path=str(out), progress=False, write_probabilities=True))  # fmt: skip
    assert [r["id"] for r in read_rows(out)] == ids and result.n_fallbacks == 0
    assert [r["id"] for r in read_rows(tmp_path / "probabilities.csv")][-2:] == awkward
    assert any(f"repeats id {first['id']!r}" in w for w in result.report["notes"])
    assert out.stat().st_mode & 0o777 == 0o644


def test_score_uses_the_competitions_metric_for_class_column_solutions(tmp_path):
    (tmp_path / "sol.csv").write_text("row_id,a,b\nx_5,1,0\nx_10,0,1\nx_15,1,1\nx_20,0,0\n")
    (tmp_path / "sub.csv").write_text("row_id,b,a\nx_5,0.1,0.9\nx_10,0.8,0.2\nx_15,0.7,0.6\nx_20,0.3,0.4\n")
    metric, value = score_submission(tmp_path / "sub.csv", tmp_path / "sol.csv")
    # a: positives 0.9, 0.6 vs negatives 0.2, 0.4 -> 1.0; b: positives 0.8, 0.7 vs 0.1, 0.3 -> 1.0
    assert metric == "macro_roc_auc" and value == 1.0
    assert score_submission(tmp_path / "sub.csv", tmp_path / "sol.csv", "lwlrap")[0] == "lwlrap"
    (tmp_path / "short.csv").write_text("row_id,a\nx_5,1\nx_10,0\nx_15,1\nx_20,0\n")
    with pytest.raises(DataError, match=r"short.csv: no column for class\(es\) \['b'\]"):
        score_submission(tmp_path / "short.csv", tmp_path / "sol.csv")
    (tmp_path / "text.csv").write_text("row_id,a,b\nx_5,1,high\nx_10,0,0\nx_15,1,1\nx_20,0,0\n")
    with pytest.raises(DataError, match=r"id 'x_5', column 'b': 'high' is not a number"):
        score_submission(tmp_path / "text.csv", tmp_path / "sol.csv")


def test_a_label_outside_the_solutions_classes_is_simply_wrong(tmp_path):
    (tmp_path / "sol.csv").write_text("id,label\n1,a\n2,b\n")
    (tmp_path / "sub.csv").write_text("id,label\n1,zz\n2,b\n")  # 'zz' must not count as class 'a'
    assert score_submission(tmp_path / "sub.csv", tmp_path / "sol.csv") == ("accuracy", 0.5)


def test_clip_pooling_max_scores_a_file_by_its_best_windows(tiny_artifact, synthetic_data, tmp_path):
    """A row per file: clip_pooling picks how the file's windows become its scores, and the report says which."""
    written = {}
    for pooling in ("mean", "max"):
        out = tmp_path / pooling / "sub.csv"
        result = run_inference(InferConfig(data_dir=str(synthetic_data), artifact_dir=str(tiny_artifact),
                                           submission_path=str(out), progress=False, write_probabilities=True,
                                           clip_pooling=pooling))  # fmt: skip
        assert result.report["clip_pooling"] == pooling and result.n_fallbacks == 0
        written[pooling] = np.array([[float(v) for k, v in row.items() if k != "id"]
                                     for row in read_rows(out.parent / "probabilities.csv")])  # fmt: skip
    assert written["mean"].shape == written["max"].shape
    assert not np.allclose(
        written["mean"], written["max"], atol=1e-4
    )  # the synthetic clips span several windows


def test_a_run_where_every_row_falls_back_is_loud_and_stops_outside_the_scoring_rerun(
    tiny_artifact, synthetic_data, tmp_path, monkeypatch, capsys
):
    """Issue 51: with every test file unreachable (a broken link), a submission of priors is a failure of the
    input: the run stops with the cause and its count, and writes no submission; in Kaggle's scoring rerun it
    writes one (a submission must exist) and the alarm is its last line; a threshold below 1 is the user's."""
    data = tmp_path / "data"
    shutil.copytree(synthetic_data, data, ignore=shutil.ignore_patterns("audio"))
    (data / "audio").symlink_to(tmp_path / "nowhere", target_is_directory=True)  # a link left dangling
    n_rows = len(read_rows(data / "sample_submission.csv"))
    out = tmp_path / "sub.csv"
    config = dict(
        data_dir=str(data), artifact_dir=str(tiny_artifact), submission_path=str(out), progress=False
    )
    monkeypatch.delenv("KAGGLE_IS_COMPETITION_RERUN", raising=False)
    with pytest.raises(
        AllFallbacksError, match=rf"every row of sub.csv fell back.*{n_rows} rows: <file>: file not found"
    ):
        run_inference(InferConfig(**config))
    assert not out.exists()
    summary = json.loads((tmp_path / "sub_report.json").read_text())["fallback_summary"]
    assert summary["causes"] == [{"cause": "<file>: file not found", "rows": n_rows}] and summary["stops_run"]

    monkeypatch.setenv("KAGGLE_IS_COMPETITION_RERUN", "1")
    result = run_inference(InferConfig(**config))
    assert len(read_rows(out)) == n_rows and result.n_fallbacks == n_rows
    assert result.summary().splitlines()[-1].startswith("ALARM: every row of sub.csv fell back")

    # Half the files back: below the default threshold no alarm; at a threshold of 0.4 an alarm that stops.
    monkeypatch.delenv("KAGGLE_IS_COMPETITION_RERUN")
    (data / "audio").unlink()
    shutil.copytree(synthetic_data / "audio", data / "audio")
    tests = read_rows(data / "test.csv")
    for row in tests[: len(tests) // 2]:
        (data / row["path"]).unlink()
    result = run_inference(InferConfig(**config))
    assert result.n_fallbacks == len(tests) // 2 and result.report["fallback_summary"]["alarm"] is None
    with pytest.raises(AllFallbacksError, match=rf"{len(tests) // 2} of {n_rows} rows \(50%\)"):
        run_inference(InferConfig(**config, fallback_alarm_share=0.4))
    result = run_inference(InferConfig(**config, fallback_alarm_share=0.4, fail_on_all_fallbacks=False))
    assert "ALARM" in result.summary() and len(read_rows(out)) == n_rows
