"""Tests for the synthetic competition generator (pipeline/demo_data/synthetic.py)."""

from __future__ import annotations

import csv
import math
import re
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
from scipy import signal

from pipeline.core.staging import MARKER
from pipeline.demo_data import synthetic
from pipeline.demo_data.synthetic import make_synthetic_competition

RATES = {8000, 16000, 22050, 44100}
SMALL = {"n_speakers": 3, "train_per_speaker": 3, "test_per_speaker": 2}


def _read_csv(path: Path) -> tuple[list[str], list[list[str]]]:
    with open(path, newline="", encoding="utf-8") as f:
        rows = list(csv.reader(f))
    return rows[0], rows[1:]


def _tree_bytes(root: Path) -> dict[str, bytes]:
    """Every file's bytes but the marker's, which records when each file was written (core/staging.mark)."""
    assert (root / MARKER).is_file()
    return {
        p.relative_to(root).as_posix(): p.read_bytes()
        for p in sorted(root.rglob("*"))
        if p.is_file() and p.name != MARKER
    }


@pytest.fixture(scope="module")
def comp(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One competition at the default sizes (6 speakers x (40 train + 15 test)), shared by the slow tests."""
    return make_synthetic_competition(tmp_path_factory.mktemp("synth") / "data", seed=0)


@pytest.fixture(scope="module")
def table(comp: Path) -> dict[str, list]:
    """Per-file labels, splits and loaded audio resampled to 16 kHz."""
    _, train = _read_csv(comp / "train.csv")
    _, test = _read_csv(comp / "test.csv")
    _, solution = _read_csv(comp / "solution.csv")
    truth = dict(solution)
    rows = [(path, label, True) for path, label in train] + [(path, truth[i], False) for i, path in test]
    out: dict[str, list] = {"label": [], "is_train": [], "audio16k": []}
    for path, label, is_train in rows:
        x, sr = sf.read(comp / path, dtype="float64")
        g = math.gcd(sr, 16000)
        out["label"].append(label)
        out["is_train"].append(is_train)
        out["audio16k"].append(signal.resample_poly(x, 16000 // g, sr // g))
    return out


def test_folder_contract(comp: Path) -> None:
    header, train = _read_csv(comp / "train.csv")
    assert header == ["path", "label"]
    header, test = _read_csv(comp / "test.csv")
    assert header == ["id", "path"]
    header, sample = _read_csv(comp / "sample_submission.csv")
    assert header == ["id", "label"]
    header, solution = _read_csv(comp / "solution.csv")
    assert header == ["id", "label"]

    train_labels = {label for _, label in train}
    assert train_labels == {f"spk{i:02d}" for i in range(6)}
    for label in train_labels:
        assert sum(lab == label for _, lab in train) == 40

    test_ids = [i for i, _ in test]
    assert len(test_ids) == 6 * 15 == len(set(test_ids))
    assert [i for i, _ in sample] == test_ids
    assert [i for i, _ in solution] == test_ids
    assert {label for _, label in sample} <= train_labels
    assert {label for _, label in solution} == train_labels
    # Test ids and paths must not give the speaker away, and the order must not be grouped by speaker.
    for test_id, path in test:
        assert re.fullmatch(r"t\d{5}", test_id)
        assert "spk" not in path
    solution_labels = [label for _, label in solution]
    assert solution_labels != sorted(solution_labels)

    rates = set()
    for path in [p for p, _ in train] + [p for _, p in test]:
        assert not Path(path).is_absolute() and "\\" not in path
        assert (comp / path).is_file()
        info = sf.info(str(comp / path))
        assert info.channels == 1
        assert info.subtype == "PCM_16" and info.format == "WAV"
        rates.add(info.samplerate)
    assert rates == RATES


def test_levels_and_durations_are_in_range(comp: Path, table: dict[str, list]) -> None:
    peaks = np.array([20 * np.log10(np.max(np.abs(sf.read(p)[0]))) for p in sorted(comp.rglob("*.wav"))])
    assert peaks.min() > -20.5 and peaks.max() < -2.5
    durations = np.array([len(x) / 16000 for x in table["audio16k"]])
    assert durations.min() >= 0.599 and durations.max() <= 2.501


def _nearest_centroid_accuracy(features: np.ndarray, labels: np.ndarray, is_train: np.ndarray) -> float:
    classes = np.unique(labels[is_train])
    centroids = np.stack([features[is_train & (labels == c)].mean(axis=0) for c in classes])
    dist = ((features[~is_train][:, None, :] - centroids[None]) ** 2).sum(axis=-1)
    return float(np.mean(classes[dist.argmin(axis=1)] == labels[~is_train]))


def _mel_edges(fmax: float, n: int) -> np.ndarray:
    mel = np.linspace(0.0, 2595.0 * np.log10(1.0 + fmax / 700.0), n + 1)
    return 700.0 * (10.0 ** (mel / 2595.0) - 1.0)


def _voice_features(x: np.ndarray) -> np.ndarray:
    """Long-term average log-mel spectrum of the louder half of the frames, level removed.

    Only 0-4 kHz, the band every sample rate shares: above it an 8 kHz file is empty, so those bands would
    measure the file's rate rather than the voice.
    """
    freqs, _, spec = signal.stft(x, fs=16000, nperseg=512, noverlap=256)
    power = np.abs(spec) ** 2
    energy = power.sum(axis=0)
    power = power[:, energy >= np.median(energy)]
    edges = _mel_edges(4000.0, 40)
    bands = np.array(
        [power[(freqs >= lo) & (freqs < hi)].mean() for lo, hi in zip(edges[:-1], edges[1:], strict=True)]
    )
    log_bands = np.log(bands + 1e-12)
    return log_bands - log_bands.mean()


def _trivial_features(x: np.ndarray) -> np.ndarray:
    return np.array([20 * np.log10(np.max(np.abs(x))), 10 * np.log10(np.mean(x**2)), len(x) / 16000])


def test_speakers_are_separable_by_voice(table: dict[str, list]) -> None:
    # Measured at seed 0: 1.000 (0.92-1.00 over seeds 0-7); chance is 1/6. Making all six speakers the
    # same voice drops it to 0.167.
    feats = np.stack([_voice_features(x) for x in table["audio16k"]])
    acc = _nearest_centroid_accuracy(feats, np.array(table["label"]), np.array(table["is_train"]))
    assert acc >= 0.9, acc


def test_speakers_are_not_separable_by_level_or_length(table: dict[str, list]) -> None:
    # Measured at seed 0: 0.256 (0.13-0.26 over seeds 0-7); chance is 1/6. A deliberate leak (gain tied
    # to the speaker's F0, up to 18 dB) lifts it to 0.400, which this threshold catches.
    feats = np.stack([_trivial_features(x) for x in table["audio16k"]])
    is_train = np.array(table["is_train"])
    feats = (feats - feats[is_train].mean(axis=0)) / feats[is_train].std(axis=0)
    acc = _nearest_centroid_accuracy(feats, np.array(table["label"]), is_train)
    assert acc <= 0.35, acc


def test_deterministic_given_seed(tmp_path: Path) -> None:
    a = _tree_bytes(make_synthetic_competition(tmp_path / "a", seed=1, **SMALL))
    b = _tree_bytes(make_synthetic_competition(tmp_path / "b", seed=1, **SMALL))
    c = _tree_bytes(make_synthetic_competition(tmp_path / "c", seed=2, **SMALL))
    assert len(a) == 4 + 3 * (3 + 2)  # 4 CSVs, the WAVs
    assert a == b
    assert a.keys() == c.keys()
    wavs = [k for k in a if k.endswith(".wav")]
    assert all(a[k] != c[k] for k in wavs)


def test_never_replaces_a_folder_it_did_not_write(tmp_path: Path) -> None:
    out = tmp_path / "data"
    out.mkdir()
    (out / "keep.txt").write_text("precious")
    for overwrite in (False, True):
        with pytest.raises(
            FileExistsError, match=re.escape(str(out)) + ".*holds files this project did not write"
        ):
            make_synthetic_competition(out, overwrite=overwrite, **SMALL)
    assert (
        sorted(p.name for p in out.iterdir()) == ["keep.txt"] and (out / "keep.txt").read_text() == "precious"
    )


def test_a_users_folder_in_this_projects_layout_or_with_a_file_added_is_never_replaced(
    tmp_path: Path,
) -> None:
    mine = tmp_path / "mine"  # a competition folder of the user's own, laid out as this project's
    (mine / "audio").mkdir(parents=True)
    for name in ("train.csv", "test.csv", "sample_submission.csv", "solution.csv", "audio/rec1.wav"):
        (mine / name).write_text("mine")
    with pytest.raises(FileExistsError, match="holds files this project did not write"):
        make_synthetic_competition(mine, overwrite=True, **SMALL)
    assert (mine / "audio" / "rec1.wav").read_text() == "mine"
    ours = make_synthetic_competition(tmp_path / "ours", **SMALL)
    (ours / "audio" / "notes.txt").write_text("precious")  # put into a folder this project wrote
    with pytest.raises(FileExistsError, match=r"did not write \(audio/notes.txt\)"):
        make_synthetic_competition(ours, seed=1, overwrite=True, **SMALL)
    assert (ours / "audio" / "notes.txt").read_text() == "precious"


def test_replaces_its_own_folder_only_when_asked(tmp_path: Path) -> None:
    out = make_synthetic_competition(tmp_path / "data", **SMALL)
    with pytest.raises(FileExistsError, match="already holds a competition folder .*--overwrite"):
        make_synthetic_competition(out, seed=1, **SMALL)
    assert make_synthetic_competition(out, seed=1, overwrite=True, **SMALL) == out
    assert (out / "train.csv").is_file()
    assert [p.name for p in tmp_path.iterdir()] == ["data"]  # no temp or backup siblings left behind


def test_accepts_empty_out_dir_and_rejects_a_file(tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    assert (make_synthetic_competition(empty, **SMALL) / "test.csv").is_file()
    not_a_dir = tmp_path / "file"
    not_a_dir.write_text("x")
    with pytest.raises(FileExistsError, match=re.escape(str(not_a_dir))):
        make_synthetic_competition(not_a_dir, overwrite=True, **SMALL)


def test_failed_build_leaves_existing_folder_untouched(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = make_synthetic_competition(tmp_path / "data", **SMALL)
    before = _tree_bytes(out)

    def boom(root: Path, *args: object) -> None:
        (root / "partial.wav").write_bytes(b"half")
        raise RuntimeError("disk full")

    monkeypatch.setattr(synthetic, "_build", boom)
    with pytest.raises(RuntimeError, match="disk full"):
        make_synthetic_competition(out, overwrite=True)
    assert _tree_bytes(out) == before
    assert [p.name for p in tmp_path.iterdir()] == ["data"]


@pytest.mark.parametrize("kwargs", [{"n_speakers": 0}, {"train_per_speaker": 0}, {"seed": -1}])
def test_rejects_bad_sizes(tmp_path: Path, kwargs: dict[str, int]) -> None:
    with pytest.raises(ValueError):
        make_synthetic_competition(tmp_path / "data", **kwargs)
    assert not (tmp_path / "data").exists()


def test_folders_of_real_size_have_clips_of_the_asked_length_rate_and_formats(tmp_path: Path) -> None:
    """What the scale benchmark trains on: `python -m pipeline data synthetic --hours H`."""
    import soundfile as sf

    from pipeline.demo_data.synthetic import folder_of_hours

    out = folder_of_hours(tmp_path / "d", hours=0.05, clip_seconds=3.0, n_speakers=4, workers=2)
    train = (out / "train.csv").read_text().splitlines()[1:]
    assert len(train) == 60  # 0.05 h = 180 s = 60 clips of 3 s
    suffixes = {line.split(",")[0].rsplit(".", 1)[1] for line in train}
    assert suffixes == {"wav", "flac"}
    for line in train[:4]:
        info = sf.info(str(out / line.split(",")[0]))
        assert (info.samplerate, info.frames) == (8000, 24000)
    again = folder_of_hours(tmp_path / "e", hours=0.05, clip_seconds=3.0, n_speakers=4, workers=1)
    assert _tree_bytes(out) == _tree_bytes(again)  # the same files whatever the number of processes
