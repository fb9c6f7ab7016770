"""The ESC-10 benchmark's summary and its rescoring of kept folds (the notebooks themselves run in make bench)."""

import pytest

from benchmarks.esc10 import rescore, summarise


def fold(number: int, accuracy: float, minutes: float = 7.5) -> dict:
    hits = round(accuracy * 80)
    return {"seed": 0, "fold": number, "accuracy": accuracy, "minutes": minutes, "variants": {},
            "per_class_hits": {"a": hits}, "per_class_total": {"a": 80}}  # fmt: skip


def test_a_mean_of_exactly_the_target_meets_it_and_a_slow_fold_does_not():
    accuracies = (0.9375, 0.9125, 0.95, 0.9125, 0.8875)  # 0.92, which a float sum puts a bit below
    assert sum(accuracies) / 5 < 0.92
    result = summarise([fold(k + 1, a) for k, a in enumerate(accuracies)], {})
    assert result["meets_target"] and "target 0.92 met" in result["headline"]
    slow = summarise([fold(k + 1, a, minutes=16.0) for k, a in enumerate(accuracies)], {})
    assert not slow["meets_target"] and "MISSED (a fold took 16.0 min > 15)" in slow["headline"]
    short = summarise([fold(k + 1, a) for k, a in enumerate((0.9, 0.9, 0.9, 0.9, 0.9))], {})
    assert not short["meets_target"] and "MISSED (mean 0.9000 < 0.92)" in short["headline"]


def test_a_variant_is_reported_on_the_folds_it_is_chosen_on_and_apart_on_the_held_out_ones():
    runs = [fold(k, 0.9) for k in (1, 2, 3, 4, 5)]
    for run, variant in zip(runs, (0.95, 0.9125, 0.8875, 0.8, 0.9), strict=True):
        run["variants"] = {"max": variant}
    paired = summarise(runs, {})["variants_paired"]["max"]
    assert paired["choice"] == {"folds": [1, 2, 3], "runs": 3, "difference": 0.0167, "up": 2, "down": 1}
    assert paired["confirm"] == {"folds": [4, 5], "runs": 2, "difference": -0.05, "up": 0, "down": 1}


def test_a_rescore_of_kept_folds_passes_no_verdict_on_the_target():
    accuracies = (0.95, 0.95, 0.95, 0.95, 0.95)
    result = summarise([fold(k + 1, a, minutes=0.2) for k, a in enumerate(accuracies)], {"rescored": "kept"})
    assert not result["meets_target"] and "the infer notebook alone on kept models" in result["headline"]


def test_rescore_names_a_folder_without_kept_folds(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"--rescore .*no run<seed>-<fold> folders"):
        rescore(tmp_path)
