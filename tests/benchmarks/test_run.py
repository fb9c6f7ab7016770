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
    """Each split runs in a process of its own (it starts cold, as a notebook does); its failure reaches the
    section with the failed process's own message."""
    empty = tmp_path / "recordings"
    empty.mkdir()
    monkeypatch.setenv("FSDD_RECORDINGS", str(empty))
    entry = bench.run_all(only=["fsdd"], quick=True)["sections"]["fsdd"]
    assert entry["status"] == "error"
    for task in ("speaker", "digit"):
        assert f"{task}: RuntimeError: python -m benchmarks.fsdd_accuracy --task {task}" in entry["error"]
    assert f"FSDDError: {empty}: no .wav files found" in entry["error"]


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


def test_results_are_written_after_every_section_and_a_stopped_run_keeps_what_finished(monkeypatch, tmp_path):
    out = tmp_path / "bench"
    out.mkdir()
    earlier = {"machine": {"cpu_count": 2, "python": "3", "torch": "2", "started": "then"}, "quick": False,
               "sections": {"training": {"status": "ok", "result": {"headline": "kept"}, "seconds": 1.0,
                                      "contention": {"others_cpu_share": 0.0}}}}  # fmt: skip
    (out / "results.json").write_text(json.dumps(earlier))

    def first(quick):
        return {"headline": "first done"}

    def second(quick):  # the session ends here: results.json must already hold the first section
        written = json.loads((out / "results.json").read_text())
        assert written["sections"]["fsdd"]["result"] == {"headline": "first done"}
        raise KeyboardInterrupt

    monkeypatch.setitem(bench.RUNNERS, "fsdd", first)
    monkeypatch.setitem(bench.RUNNERS, "esc10", second)
    try:
        bench.main(["--only", "fsdd", "esc10", "--out", str(out)])
    except KeyboardInterrupt:
        pass
    else:
        raise AssertionError("the second section was meant to stop the run")
    written = json.loads((out / "results.json").read_text())
    assert set(written["sections"]) == {
        "training",
        "fsdd",
    }  # the earlier section kept, the stopped one absent
    assert written["rerun"]["fsdd"] == written["sections"]["fsdd"]["finished"]
    assert "first done" in (out / "results.md").read_text()
    assert not list(out.glob(".*partial"))


def test_from_raw_puts_a_stopped_runs_raw_files_into_the_results(monkeypatch, tmp_path):
    out = tmp_path / "bench"
    monkeypatch.setitem(bench.RUNNERS, "fsdd", lambda quick: {"headline": "from the raw file"})
    bench.run_all(only=["fsdd"], raw_dir=out / "raw")  # the raw file only, as a run stopped later leaves it
    assert not (out / "results.json").exists()
    bench.main(["--from-raw", "fsdd", "--out", str(out)])
    written = json.loads((out / "results.json").read_text())
    raw = json.loads((out / "raw" / "fsdd.json").read_text())
    assert written["sections"]["fsdd"]["result"] == {"headline": "from the raw file"}
    assert written["sections"]["fsdd"]["finished"] == raw["finished"] and written["machine"] == raw["machine"]
    try:
        bench.main(["--from-raw", "esc10", "--out", str(out)])
    except SystemExit as stop:
        assert "esc10.json" in str(stop) and "--only esc10" in str(stop)
    else:
        raise AssertionError("a section without a raw file must be refused")


def test_the_fsdd_time_limit_is_judged_in_loops_run_the_same_day():
    # The fsdd section run at 91f2fa9 (`git show 7cf1ac1:benchmarks/raw/fsdd.json`): the slowest split and the
    # plain loop run beside split 0, in seconds.
    digit = {"total_s": 279.1, "time_limit_s": 180.0, "plain_loop": {"total_s": 257.9}}
    speaker = {"total_s": 541.1, "time_limit_s": 180.0, "plain_loop": {"total_s": 191.9}}
    judged = bench.fsdd_time_verdict(digit, "digit")  # over 180 s, but 1.08 loops against 180/143 = 1.26
    assert (
        judged["time_met"] and judged["slowest_in_loops"] == 1.082 and judged["time_limit_in_loops"] == 1.259
    )
    judged = bench.fsdd_time_verdict(speaker, "speaker")  # 2.82 loops (a contended split) against 1.96
    assert not judged["time_met"] and judged["time_limit_in_loops"] == 1.957
    quick = bench.fsdd_time_verdict({"total_s": 170.0, "time_limit_s": 180.0}, "speaker")  # no loop beside it
    assert quick == {"time_rule": "absolute seconds", "time_met": True}
