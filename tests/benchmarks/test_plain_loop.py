"""benchmarks/plain_loop.py: NOTES' plain loop, the fsdd section's same-day reference, learns and is timed."""

from __future__ import annotations

from benchmarks import plain_loop


def test_the_plain_loop_learns_the_synthetic_speakers_and_reports_its_seconds(synthetic_data):
    result = plain_loop.run(synthetic_data, "speaker", seed=0, epochs=3)
    # 4 speakers: chance is 0.25; the loop's 3 epochs reach 0.69 here.
    assert result["accuracy"] >= 0.5
    assert (result["train_files"], result["test_files"], result["steps"]) == (48, 16, 3 * 2)
    assert 0 < result["train_s"] and 0 < result["infer_s"]
    assert result["total_s"] >= result["train_s"]
