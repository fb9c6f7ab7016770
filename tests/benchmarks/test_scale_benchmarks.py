"""benchmarks/targets_scale.py, teacher_pass_scale.py and ownership_scale.py at toy sizes: each size is really
written, read, scored or checked by the product's code, and the ratios are those of the two sizes measured."""

from __future__ import annotations

from benchmarks import ownership_scale, targets_scale, teacher_pass_scale


def test_targets_scale_writes_and_reads_both_sizes_with_the_products_code():
    result = targets_scale.run(rows=1200, classes=3)
    one, ten = result["sizes"]
    assert (one["rows"], ten["rows"]) == (1200, 12000)  # read back: every row the writer was given
    assert all(size["write_peak_private_mb"] > 0 and size["peak_private_mb"] > 0 for size in (one, ten))
    assert result["memory_ratio"] == round(ten["peak_private_mb"] / one["peak_private_mb"], 2)
    assert result["write_time_ratio"] == round(ten["write_s"] / one["write_s"], 2)


def test_teacher_pass_scale_scores_every_window_of_both_sizes():
    result = teacher_pass_scale.run(files=2, classes=5)
    per_file = round((teacher_pass_scale.SECONDS - teacher_pass_scale.WINDOW) / teacher_pass_scale.HOP) + 1
    assert [size["windows"] for size in result["sizes"]] == [2 * per_file, 20 * per_file]
    one, ten = result["sizes"]
    assert result["time_ratio"] == round(ten["score_s"] / one["score_s"], 2) and one["peak_private_mb"] > 0


def test_ownership_scale_marks_and_checks_both_sizes_with_the_products_code():
    result = ownership_scale.run(files=20, megabytes=1)
    one, ten = result["folders"]
    assert (one["files"], ten["files"]) == (20, 200) and ten["marker_kb"] > one["marker_kb"] > 0
    assert [a["weights_mb"] for a in result["artifacts"]] == [1, 10]
    assert result["check_ratio"] == round(ten["check_s"] / one["check_s"], 2)
