"""pipeline.teachers.scoring: a teacher's windows, its targets files and the infer stage's span scores."""

import json

import numpy as np
import pytest
import soundfile as sf
from teacher_fixtures import RATE, TONES, make_tone_teacher, tone_clip

from pipeline.core.tables import read_chunk_targets
from pipeline.teachers.model import find_teacher
from pipeline.teachers.scoring import span_logits, teacher_windows, write_targets
from pipeline.teachers.species import match_classes


@pytest.fixture(scope="module")
def tones(tmp_path_factory):
    return find_teacher(make_tone_teacher(tmp_path_factory.mktemp("teacher") / "tones"))


def test_windows_tile_the_audio_and_keep_a_last_part_of_half_a_window():
    samples = np.arange(25, dtype=np.float32)
    windows, starts = teacher_windows(samples, 10, 10)
    assert list(starts) == [0, 10, 20] and windows[2, :5].tolist() == [20, 21, 22, 23, 24]
    assert not windows[2, 5:].any()  # zero-padded
    _, starts = teacher_windows(samples[:24], 10, 10)
    assert list(starts) == [0, 10]  # 4 samples left: under half a window, no window of their own
    windows, starts = teacher_windows(samples[:3], 10, 10)
    assert list(starts) == [0] and windows.shape == (1, 10)  # shorter than a window: one padded window
    _, starts = teacher_windows(samples, 10, 5)
    assert list(starts) == [0, 5, 10, 15]


def test_a_targets_file_has_a_column_per_known_class_and_its_lineage(tones, tmp_path):
    rng = np.random.default_rng(1)
    data = tmp_path / "data"
    data.mkdir()
    sf.write(data / "low.wav", np.concatenate([tone_clip(300, 2.0, rng), np.zeros(32000, np.float32)]), 16000)
    sf.write(data / "high.wav", tone_clip(1500, 3.0, rng), 16000)
    (data / "broken.wav").write_bytes(b"not audio")
    classes = ["tonus_altus", "tonus_bassus", "tonus_rarus"]
    class_map = match_classes(classes, tones.labels)
    lines = []
    lineage = write_targets(tones.runtime(1), class_map, data, ["low.wav", "high.wav", "broken.wav"],
                            ["low.wav", "high.wav", "broken.wav"], tmp_path / "t.csv", log=lines.append)  # fmt: skip
    header = (tmp_path / "t.csv").read_text().splitlines()[0]
    assert header == "filename,start,end,tonus_altus,tonus_bassus"  # tonus_rarus: no column, no opinion
    found = read_chunk_targets(tmp_path / "t.csv", classes)
    assert found.known.tolist() == [True, True, False]
    assert found.files == ["low.wav"] * 4 + ["high.wav"] * 3 and found.starts.tolist() == [
        0,
        1,
        2,
        3,
        0,
        1,
        2,
    ]
    assert found.probs[0, 1] > 0.9 and found.probs[0, 0] < 0.1  # the low tone's first second
    assert found.probs[2:4, 1].max() < 0.9  # its silence: no tone, no confidence
    assert (found.probs[4:, 0] > 0.9).all()
    assert (
        lineage["unreadable"] == {"broken.wav": lineage["unreadable"]["broken.wav"]}
        and lineage["windows"] == 7
    )
    assert json.loads((tmp_path / "t.json").read_text())["classes"] == {"tonus_altus": "Tonus altus_High Tone",
                                                                       "tonus_bassus": "Tonus bassus_Low Tone"}  # fmt: skip
    assert "7 windows of 2 files" in lines[0] and "1 unreadable" in lines[0]


def test_a_span_scores_the_highest_of_its_windows(tones):
    rng = np.random.default_rng(2)
    audio = np.concatenate(
        [tone_clip(f, 1.0, rng, rate=RATE) for f in TONES.values()]
    )  # 4 s, a tone a second
    scores = span_logits(tones.runtime(1), audio, [(0.0, None), (0.0, 2.0), (2.0, 4.0), (1.2, 1.4)])
    assert (scores[0] > 3).all()  # the whole file: every tone somewhere
    assert list(scores[1].argsort()[-2:]) in ([0, 1], [1, 0]) and scores[1, 2:].max() < 0
    assert scores[2, 2:].min() > 3
    assert scores[3].argmax() == 1  # shorter than a window: the window that covers it
