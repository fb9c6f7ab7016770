"""The real-birds benchmark's scoring and summary (the notebooks themselves run in make bench)."""

import math

from benchmarks.birds import score, summarise

SPECIES = ("acro_a", "acro_b")


def scored(accuracy: float, hidden: float | None = None) -> dict:
    return {"accuracy": accuracy, "per_species": dict.fromkeys(SPECIES, accuracy),
            **({"hidden": hidden, "known": accuracy} if hidden is not None else {})}  # fmt: skip


def defaults(student: float, blend: float, teacher: float, hidden_blend: float | None) -> dict:
    hidden = {} if hidden_blend is None else {
        s: {"blend": scored(hidden_blend, hidden_blend), "teacher": scored(teacher, teacher)} for s in SPECIES
    }  # fmt: skip
    return {"student": scored(student), "blend": scored(blend), "teacher": scored(teacher), "hidden": hidden,
            "train_min": 5.0, "teacher_pass": {"audio_seconds_per_second": 70.0}}  # fmt: skip


def test_score_counts_a_missing_row_as_wrong_and_splits_the_hidden_species(tmp_path):
    submission = tmp_path / "s.csv"
    submission.write_text("id,label\nr1,acro_a\nr2,acro_a\n")  # r3 has no row
    result = score({"r1": "acro_a", "r2": "acro_b", "r3": "acro_b"}, submission, hidden="acro_b")
    assert result["accuracy"] == round(1 / 3, 4) and result["hidden"] == 0.0 and result["known"] == 1.0
    assert result["confusions"][0] == "acro_b -> acro_a: 1"


def test_the_targets_follow_the_means_and_are_not_judged_without_the_hidden_runs():
    met = summarise([defaults(0.8, 0.95, 0.9, 0.9), defaults(0.8, 0.95, 0.9, 0.9)], {})
    assert met["accuracy"] == {"student": 0.8, "blend": 0.95, "teacher": 0.9}
    assert all(met["targets"].values())
    missed = summarise([defaults(0.8, 0.85, 0.9, 0.7)], {})
    assert missed["targets"] == {"blend >= teacher on the species it knows": False,
                                 "blend on a hidden species >= the student alone on it": False}  # fmt: skip
    without = summarise([defaults(0.8, 0.95, 0.9, None)], {})  # --no-hidden
    assert math.isnan(without["hidden_species"]["blend_on_hidden"])
    assert without["targets"]["blend on a hidden species >= the student alone on it"] is None
    assert "hidden" not in without["headline"] and "a species hidden from the teacher" in met["headline"]


def test_a_run_without_the_defaults_summarises_what_ran():
    fold = {"fold": 1, "today": scored(0.9), "distilled": {"hidden": "acro_a", "student": scored(0.8, 1.0),
                                                            "blend": scored(0.95, 1.0)}}  # fmt: skip
    result = summarise([fold], {})
    assert result["accuracy"] == {"today": 0.9} and result["distilled"]["blend_accuracy"] == 0.95
    assert "today's recipe 0.900" in result["headline"] and "student" not in result["headline"].split(";")[0]
