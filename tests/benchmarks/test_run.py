"""benchmarks/run.py's section runner: a section that cannot run here is recorded as such, never as "ok"."""

from __future__ import annotations

import json

from benchmarks import run as bench


def test_fsdd_without_its_recordings_is_not_available(monkeypatch, tmp_path):
    missing = tmp_path / "no-recordings"
    monkeypatch.setenv("FSDD_RECORDINGS", str(missing))
    entry = bench.run_all(only=["fsdd"])["sections"]["fsdd"]
    assert entry["status"] == "not available"
    assert str(missing) in entry["error"] and "FSDD_RECORDINGS" in entry["error"]


def test_fsdd_with_both_tasks_failing_is_an_error(monkeypatch, tmp_path):
    def fails(task, source, quick, seed=0):
        raise ValueError(f"{task} broke")

    monkeypatch.setenv("FSDD_RECORDINGS", str(tmp_path))
    monkeypatch.setattr("benchmarks.fsdd_accuracy.run", fails)
    entry = bench.run_all(only=["fsdd"])["sections"]["fsdd"]
    assert entry["status"] == "error"
    assert "speaker: ValueError: speaker broke" in entry["error"] and "digit broke" in entry["error"]


def test_each_section_writes_its_raw_file_only_where_asked(monkeypatch, tmp_path):
    monkeypatch.setenv("FSDD_RECORDINGS", str(tmp_path / "no-recordings"))
    repo = tmp_path / "repo"
    repo.mkdir()
    monkeypatch.setattr(bench, "ROOT", repo)
    bench.run_all(only=["fsdd"])  # no raw_dir: a test's run never touches the repository's benchmarks/raw/
    bench.run_all(only=["fsdd"], raw_dir=tmp_path / "raw")
    assert list(repo.iterdir()) == []
    record = json.loads((tmp_path / "raw" / "fsdd.json").read_text())
    assert record["section"] == "fsdd" and record["status"] == "not available"
    assert record["machine"]["python"] and "commit" in record
