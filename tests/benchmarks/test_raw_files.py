"""Every benchmark's raw file (`--out`, make bench's benchmarks/raw/) names the commit and machine it came from."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from benchmarks import ISA_FLAGS, ROOT, commit_state, cpu_model, print_result


def test_a_raw_file_names_the_commit_time_and_machine_it_was_measured_on(tmp_path, capsys):
    out = tmp_path / "result.json"
    print_result({"headline": "two of two", "value": 0.5}, out)
    record = json.loads(out.read_text())
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    assert record["value"] == 0.5 and record["headline"] == "two of two"
    assert record["commit"] == head.stdout.strip() and isinstance(record["uncommitted_changes"], bool)
    assert record["machine"]["cpu_count"] == os.cpu_count() and record["finished"][:2] == "20"
    assert json.loads(capsys.readouterr().out) == {
        "headline": "two of two",
        "value": 0.5,
    }  # stdout: the result


def test_uncommitted_changes_means_code_not_the_benchmarks_own_outputs(tmp_path):
    """A section run after another in the same checkout sees that one's results.json and raw file: not code."""

    def git(*args: str) -> None:
        subprocess.run(["git", *args], cwd=tmp_path, check=True, capture_output=True)

    for name in (
        "pipeline/stage.py",
        "benchmarks/run.py",
        "benchmarks/results.json",
        "benchmarks/raw/a.json",
    ):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text("0\n")
    git("init", "-q")
    git("add", ".")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "start")
    (tmp_path / "benchmarks/results.json").write_text("1\n")
    (tmp_path / "benchmarks/raw/b.json").write_text("1\n")
    assert commit_state(tmp_path)["uncommitted_changes"] is False
    (tmp_path / "benchmarks/run.py").write_text("1\n")
    assert commit_state(tmp_path)["uncommitted_changes"] is True


@pytest.mark.skipif(not Path("/proc/cpuinfo").exists(), reason="no /proc/cpuinfo: not Linux")
def test_the_machine_names_the_cpu_and_the_instruction_sets_int8_depends_on():
    """Int8's speed and accuracy depend on VNNI (full-range int8 weights saturated without it)."""
    found = cpu_model()
    flags = set(
        next(
            line for line in Path("/proc/cpuinfo").read_text().splitlines() if line.startswith("flags")
        ).split()
    )
    assert found["cpu_flags"] == [flag for flag in ISA_FLAGS if flag in flags]
    assert found["cpu"] and found["cpu"] in Path("/proc/cpuinfo").read_text()


def test_a_timed_run_in_a_fresh_process_gives_its_stdout_or_its_error(tmp_path):
    import io

    from benchmarks import in_fresh_process

    good = tmp_path / "good.json"
    good.write_text('{"accuracy": 0.5}')
    log = io.StringIO()
    assert json.loads(in_fresh_process("json.tool", [str(good)], log=log)) == {"accuracy": 0.5}
    assert '"accuracy": 0.5' in log.getvalue()  # what the process printed reaches the caller's log
    missing = tmp_path / "missing.json"
    with pytest.raises(
        RuntimeError,
        match=r"(?s)python -m json.tool .*missing.json failed \(\d+\): .*can.t open .*missing.json",
    ):
        in_fresh_process("json.tool", [str(missing)])
