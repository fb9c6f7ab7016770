"""Every benchmark's raw file (`--out`, make bench's benchmarks/raw/) names the commit and machine it came from."""

from __future__ import annotations

import json
import os
import subprocess

from benchmarks import ROOT, print_result


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
