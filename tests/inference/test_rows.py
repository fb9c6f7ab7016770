"""The plan of rows: which ids a submission has, in which order, and the audio span behind each."""

from pathlib import Path

import pytest

from pipeline.core.config import ConfigError, InferConfig, check_template
from pipeline.core.tables import SampleSubmission, TestItems, TestRow
from pipeline.core.windows import Span
from pipeline.inference.rows import chunk_count, plan_chunk_rows, plan_file_rows, recognise_template


def sample(ids, classes=("a", "b")):
    return SampleSubmission(Path("sample_submission.csv"), "row_id", list(classes), list(ids))


def folder(*stems, source="folder"):
    return TestItems([TestRow(0, stem, f"test_soundscapes/{stem}.ogg") for stem in stems], source)


def test_chunk_ids_are_recognised_from_the_sample_ids():
    assert recognise_template(["x_5", "x_10", "x_15"], 5)[0] == "{id}_{end}"
    assert recognise_template(["x_0", "x_5"], 5)[0] == "{id}_{start}"
    template, why = recognise_template(["row1", "row2"], 5)
    assert template == "{id}_{end}" and "form" in why
    template, why = recognise_template(["x_7"], 5)
    assert template == "{id}_{end}" and "multiples" in why


def test_a_trailing_part_is_a_chunk_from_half_a_segment_on():
    assert [chunk_count(s, 5) for s in (60, 59.99, 62.4, 62.5, 63, 1.0, 0.2)] == [12, 12, 12, 13, 13, 1, 1]


def test_placeholder_sample_ids_give_every_chunk_of_every_file_sorted():
    plan = plan_chunk_rows(sample(["s0_5", "s0_10", "s0_15"]), folder("zz", "aa"), [10.0, 15.2], 5, "auto",
                           "the files under test_soundscapes")  # fmt: skip
    assert plan.ids == ["aa_5", "aa_10", "aa_15", "zz_5", "zz_10"]  # 15.2 s: 3 chunks, 10 s: 2
    assert [plan.spans[s] for s in plan.span_of] == [Span(1, 0, 5), Span(1, 5, 10), Span(1, 10, 15), Span(0, 0, 5),
                                                     Span(0, 5, 10)]  # fmt: skip
    assert "one per 5-second chunk (5)" in plan.rule and "placeholders" in plan.rule
    assert plan.chunked and plan.template == "{id}_{end}" and not plan.missing


def test_sample_ids_that_all_exist_keep_their_order_and_extra_chunks_are_said():
    plan = plan_chunk_rows(sample(["b_10", "a_5", "b_5"]), folder("a", "b"), [5.0, 12.6], 5, "auto", "there")
    assert plan.ids == ["b_10", "a_5", "b_5"]
    assert plan.spans[plan.span_of[0]] == Span(1, 5, 10)
    assert any("1 5-second chunk not in sample_submission.csv get no row: 'b_15'" in n for n in plan.notes)


def test_with_a_test_table_missing_sample_ids_get_fallback_rows():
    plan = plan_chunk_rows(
        sample(["a_5", "nope_5"]), folder("a", source="table"), [5.0], 5, "{id}_{end}", "test.csv"
    )
    assert plan.ids == ["a_5", "nope_5"] and plan.span_of[1] is None
    assert plan.missing == {1: "id of sample_submission.csv is not in test.csv"}


def test_a_file_without_a_readable_header_gets_the_usual_number_of_chunks():
    plan = plan_chunk_rows(sample(["p_5"]), folder("a", "b", "c"), [60.0, None, 59.9], 5, "auto", "there")
    assert plan.ids.count("b_60") == 1 and len([i for i in plan.ids if i.startswith("b_")]) == 12
    assert any("no readable header" in n and "'b'" in n for n in plan.notes)
    alone = plan_chunk_rows(sample(["p_5"]), folder("a"), [None], 5, "auto", "there", usual_seconds=20)
    assert alone.ids == ["a_5", "a_10", "a_15", "a_20"]


def test_templates_may_use_the_file_name_and_fractional_seconds():
    plan = plan_chunk_rows(sample(["p"]), folder("a"), [5.0], 2.5, "{name}-{start}-{end}", "there")
    assert plan.ids == ["a.ogg-0-2.5", "a.ogg-2.5-5"]


def test_file_rows_follow_the_sample_order_or_sort_placeholders_away():
    items = folder("b", "a")
    kept = plan_file_rows(sample(["a", "b"]), items, "there")
    assert kept.ids == ["a", "b"] and [kept.spans[s].file for s in kept.span_of] == [1, 0]
    assert all(span.end is None for span in kept.spans)  # a file row is its whole file
    placeholders = plan_file_rows(sample(["x", "y"]), items, "there")
    assert placeholders.ids == ["a", "b"] and "placeholders" in placeholders.rule


@pytest.mark.parametrize("template", ["{id}", "{start}_{end}", "{id}_{end}_{speed}", "{id_{end}"])
def test_bad_templates_are_refused_with_what_to_use(template):
    with pytest.raises(ConfigError, match="row_id_template"):
        check_template(template)
    with pytest.raises(ConfigError, match="row_id_template"):
        InferConfig(row_id_template=template)


def test_a_truncated_file_keeps_the_rows_of_the_sets_usual_length():
    plan = plan_chunk_rows(sample(["p_5"]), folder("a", "b", "c"), [60.0, 31.0, 60.2], 5, "auto", "there")
    assert [i for i in plan.ids if i.startswith("b_")] == [f"b_{e}" for e in range(5, 61, 5)]
    assert any("shorter than the set's 12 chunks" in n and "'b'" in n for n in plan.notes)
    # A set of many lengths has no usual length: every file keeps its own.
    mixed = plan_chunk_rows(sample(["p_5"]), folder("a", "b", "c"), [10.0, 20.0, 30.0], 5, "auto", "there")
    assert len(mixed.ids) == 2 + 4 + 6 and not any("shorter" in n for n in mixed.notes)


# ------------------------------------------------------------------------- segment_seconds auto


def test_chunk_ids_and_their_length_are_read_from_the_sample_ids():
    from pipeline.inference.rows import read_chunk_ids

    birdclef = read_chunk_ids(
        ["soundscape_292520_5", "soundscape_292520_10", "soundscape_292520_15"], ["a", "b"]
    )
    assert (birdclef.segment, birdclef.of_test_files) == (5.0, False) and "placeholder" in birdclef.why
    ours = read_chunk_ids(["a_10", "a_20", "b_10"], ["a", "b"])
    assert (ours.segment, ours.of_test_files) == (10.0, True)
    assert read_chunk_ids(["a_0", "a_2.5", "a_5"], ["a"]).segment == 2.5  # chunk starts
    assert read_chunk_ids(["a_5"], ["a"]).segment == 5.0  # a file's only chunk
    # Ids that name the test items are file rows, whatever they look like (FSDD's files end in a number).
    assert read_chunk_ids(["3_theo_12", "3_theo_13"], ["3_theo_12", "3_theo_13", "4_ann_0"]).segment is None
    for ids, why in ((["audio_001", "audio_002"], "form"), (["x_5", "x_10", "x_20"], "evenly spaced"),
                     (["p_5", "q_7"], "single"), (["row1", "row2"], "form")):  # fmt: skip
        found = read_chunk_ids(ids, ["a"])
        assert found.segment is None and why in found.why, (ids, found)


def test_segment_seconds_auto_and_the_contradictions_it_stops_on():
    from pipeline.inference.rows import choose_segment

    soundscapes = folder("s1", "s2")
    chunk_ids = ["s1_5", "s1_10", "s2_5"]
    assert choose_segment("auto", chunk_ids, soundscapes)[0] == 5.0
    assert choose_segment(5, chunk_ids, soundscapes) == (5.0, "segment_seconds=5")
    with pytest.raises(
        ConfigError, match=r"segment_seconds=10, but .* 5-second chunks .* use segment_seconds='auto' or 5"
    ):
        choose_segment(10, chunk_ids, soundscapes)
    with pytest.raises(ConfigError, match=r"segment_seconds=None asks for a row per test file, but"):
        choose_segment(None, chunk_ids, soundscapes)
    # Placeholder chunk ids (a public copy): None is the user's call; a different length is still refused.
    assert choose_segment(None, ["p_5", "p_10"], soundscapes)[0] is None
    with pytest.raises(ConfigError, match="segment_seconds=4"):
        choose_segment(4, ["p_5", "p_10"], soundscapes)
    clips = folder("a", "b", source="table")
    assert choose_segment("auto", ["a", "b"], clips)[0] is None
    with pytest.raises(ConfigError, match=r"segment_seconds=5 asks for chunk rows, but .* a row per file"):
        choose_segment(5, ["a", "b"], clips)
    with pytest.raises(ConfigError, match="segment_seconds='five'"):
        InferConfig(segment_seconds="five")


def test_a_birdclef_folder_gets_chunk_rows_without_segment_seconds(tmp_path):
    """The trap a new user fell into: test_soundscapes with the default parameters wrote a row per file."""
    import numpy as np
    import soundfile as sf

    from pipeline.inference.rows import plan_rows

    (tmp_path / "test_soundscapes").mkdir()
    for stem in ("soundscape_1", "soundscape_2"):
        sf.write(tmp_path / "test_soundscapes" / f"{stem}.ogg", np.zeros(15 * 16000, np.float32), 16000)
    placeholders = ["soundscape_292520_5", "soundscape_292520_10", "soundscape_292520_15"]
    config = InferConfig(data_dir=str(tmp_path), test_audio_dir="test_soundscapes")
    items = TestItems([TestRow(0, s, f"test_soundscapes/{s}.ogg") for s in ("soundscape_1", "soundscape_2")],
                      "folder")  # fmt: skip
    plan = plan_rows(sample(placeholders), items, config)
    assert plan.segment == 5.0 and len(plan.ids) == 6 and plan.ids[:3] == ["soundscape_1_5", "soundscape_1_10",
                                                                            "soundscape_1_15"]  # fmt: skip
    assert "5-second placeholder chunk ids" in plan.segment_rule and plan.seconds == [15.0, 15.0]
