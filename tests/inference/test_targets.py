"""pipeline/inference/targets.py: a model's probabilities over every window of some files, as a targets file."""

from __future__ import annotations

import csv
import json

import pytest

from pipeline.core.staging import OutputRefused
from pipeline.inference import targets


def test_scoring_in_passes_writes_what_one_pass_writes(tiny_artifact, synthetic_data, tmp_path, monkeypatch):
    """The files are scored FILES_PER_PASS at a time (memory bounded by a pass): passes of 1 and 3 files give
    the rows and lineage one pass over every file gives, named as the caller names the files."""
    files = sorted(
        str(p.relative_to(synthetic_data)) for p in (synthetic_data / "audio" / "test").glob("*.wav")
    )[:7]
    names = [f"renamed_{k}.wav" for k in range(len(files))]
    written = {}
    for per_pass in (len(files), 3, 1):
        monkeypatch.setattr(targets, "FILES_PER_PASS", per_pass)
        out = tmp_path / f"targets_{per_pass}.csv"
        targets.write_window_targets(tiny_artifact, synthetic_data, files, names, out, log=lambda _: None)
        written[per_pass] = (out.read_bytes(), json.loads(out.with_suffix(".json").read_text()))
    rows = list(csv.DictReader(open(tmp_path / f"targets_{len(files)}.csv")))
    assert {row["filename"] for row in rows} == set(names) and len(rows) == written[1][1]["windows"] > len(
        files
    )
    assert written[3] == written[1] == written[len(files)]


def test_a_pass_lets_go_of_the_last_pass_before_it_predicts(
    tiny_artifact, synthetic_data, tmp_path, monkeypatch
):
    """Memory is bounded by one pass: when a pass starts predicting, no probabilities of the pass before it are
    still held (a row of them bound to a loop variable kept the whole array alive into the next pass)."""
    import gc
    import weakref

    files = sorted(
        str(p.relative_to(synthetic_data)) for p in (synthetic_data / "audio" / "test").glob("*.wav")
    )[:3]
    monkeypatch.setattr(targets, "FILES_PER_PASS", 1)
    held, alive_at_predict = [], []
    predict, span_probabilities = targets.predict, targets.span_probabilities

    def watched_predict(*args, **kwargs):
        gc.collect()
        alive_at_predict.append(sum(ref() is not None for ref in held))
        return predict(*args, **kwargs)

    def watched_probabilities(*args, **kwargs):
        probs = span_probabilities(*args, **kwargs)
        held.append(weakref.ref(probs))
        return probs

    monkeypatch.setattr(targets, "predict", watched_predict)
    monkeypatch.setattr(targets, "span_probabilities", watched_probabilities)
    targets.write_window_targets(
        tiny_artifact, synthetic_data, files, files, tmp_path / "t.csv", log=lambda _: None
    )
    assert alive_at_predict == [0, 0, 0]


def test_a_file_that_cannot_be_read_has_no_rows_and_the_others_keep_theirs(
    tiny_artifact, synthetic_data, tmp_path
):
    files = sorted(
        str(p.relative_to(synthetic_data)) for p in (synthetic_data / "audio" / "test").glob("*.wav")
    )[:2]
    (tmp_path / "data").mkdir()
    for rel in files:
        (tmp_path / "data" / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "data" / rel).write_bytes((synthetic_data / rel).read_bytes())
    (tmp_path / "data" / "broken.wav").write_bytes(b"RIFF0000WAVEnot audio")
    out = tmp_path / "t.csv"
    targets.write_window_targets(tiny_artifact, tmp_path / "data", [files[0], "broken.wav", files[1]],
                                 ["a.wav", "b.wav", "c.wav"], out, log=lambda _: None)  # fmt: skip
    assert {row["filename"] for row in csv.DictReader(open(out))} == {"a.wav", "c.wav"}
    with pytest.raises(OutputRefused, match="did not write"):
        out.with_suffix(".json").write_text("{}")
        targets.write_window_targets(tiny_artifact, tmp_path / "data", files, files, out, log=lambda _: None)
