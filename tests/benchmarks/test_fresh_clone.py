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


def test_the_workers_are_compared_with_the_serial_suite_of_the_same_clone(tmp_path):
    from benchmarks.fresh_clone import _workers_against_serial

    log = tmp_path / "ci.log"
    log.write_text("bringing up nodes...\n........\n852 passed in 540.00s (0:09:00)\n")  # pytest-xdist's -q
    steps = {"ci": {"pytest": pytest_summary(log)}, "serial_test": {"pytest": {"seconds": 810.0}}}
    assert _workers_against_serial(steps) == "; pytest 9.0 min on make test's workers, 13.5 serial (x0.67)"
    steps["serial_test"]["pytest"] = {}  # the serial run printed no summary: nothing is compared
    assert _workers_against_serial(steps) == ""
