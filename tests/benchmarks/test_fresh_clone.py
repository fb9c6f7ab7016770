"""benchmarks.fresh_clone: what it reads from the logs of make demo and .ci/run."""

from __future__ import annotations

from benchmarks.fresh_clone import pytest_summary


def test_the_pytest_summary_is_the_last_one_in_the_log(tmp_path):
    log = tmp_path / "ci.log"
    log.write_text(
        "== 3 passed in 1.50s ==\n"
        "....\n"
        "================= 847 passed, 2 skipped, 12 deselected in 780.12s (0:13:00) =================\n"
        "[handoff] done\n"
    )
    assert pytest_summary(log) == {"counts": "847 passed, 2 skipped, 12 deselected", "seconds": 780.12}
    log.write_text("no tests ran\n")
    assert pytest_summary(log) == {}
