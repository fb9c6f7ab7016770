"""pipeline.training.store: training audio decoded once into a memory-mapped int16 cache, found again by fingerprint."""

import json
import os
import subprocess
import sys
import time

import numpy as np
import pytest
import soundfile as sf
from helpers import venv_env

from pipeline.core.data import load_audio
from pipeline.core.staging import OutputRefused
from pipeline.training.store import (
    AudioStore,
    CacheBuildStopped,
    fingerprint,
    open_or_build,
    source_files,
)


def make_files(root, count=6, rate=8000, fmt="WAV"):
    root.mkdir(parents=True, exist_ok=True)
    names = []
    for k in range(count):
        t = np.arange(int((0.3 + 0.1 * k) * rate)) / rate
        audio = (0.05 * (k + 1) * np.sin(2 * np.pi * (200 + 50 * k) * t)).astype(np.float32)
        name = f"clip{k}.{fmt.lower()}"
        sf.write(root / name, audio, rate, format=fmt)
        names.append(name)
    return names


def build(data, names, cache, **kwargs):
    logged = []
    store = open_or_build(source_files(data, names), cache, log=logged.append, workers=2, **kwargs)
    return store, logged


def test_the_cache_holds_what_decoding_gives_to_16_bit_precision(tmp_path):
    data = tmp_path / "data"
    names = make_files(data, fmt="FLAC") + make_files(data / "wav", count=2, rate=16000)
    names = names[:6] + [f"wav/{n}" for n in names[6:]]
    store, _ = build(data, names, tmp_path / "cache")
    assert len(store) == len(names) and not store.failures
    for index, name in enumerate(names):
        decoded, _ = load_audio(data / name)
        cached = store.read(index)
        assert cached.dtype == np.float32 and cached.shape == decoded.shape
        # Scaled by its own peak before quantising: the error is below one part in 2^15 of the peak.
        assert np.abs(cached - decoded).max() <= np.abs(decoded).max() / 32767 * 0.51 + 1e-7
        assert np.array_equal(store.read(index, 100, 300), cached[100:300])  # a crop reads only its span


def test_a_second_run_reuses_the_cache_and_a_changed_file_builds_a_new_one(tmp_path):
    data = tmp_path / "data"
    names = make_files(data)
    first, log = build(data, names, tmp_path / "cache")
    assert any("decoding 6 files" in line for line in log)
    again, log = build(data, names, tmp_path / "cache")
    assert again.folder == first.folder and any("reusing" in line for line in log)
    assert not any("decoding" in line for line in log)

    time.sleep(0.01)
    os.utime(data / names[2])  # same bytes, new modification time: the fingerprint says "another file"
    changed, log = build(data, names, tmp_path / "cache")
    assert changed.folder != first.folder and first.folder.is_dir()  # built beside, the old one kept
    assert any("1 with another size or modification time" in line for line in log)


def test_the_fingerprint_is_relative_to_the_data_folder(tmp_path):
    """Kaggle mounts a competition at another path in a later session: the same files, the same cache."""
    names = make_files(tmp_path / "a" / "data")
    os.rename(tmp_path / "a", tmp_path / "b")
    here, _ = fingerprint(source_files(tmp_path / "b" / "data", names))
    (tmp_path / "c").mkdir()
    os.rename(tmp_path / "b" / "data", tmp_path / "c" / "data")
    assert fingerprint(source_files(tmp_path / "c" / "data", names))[0] == here


def test_bad_files_are_recorded_or_stop_the_build_leaving_nothing(tmp_path):
    data = tmp_path / "data"
    names = make_files(data) + ["missing.wav", "garbage.wav", "../outside.wav"]
    (data / "garbage.wav").write_bytes(b"not audio" * 20)
    with pytest.raises(CacheBuildStopped) as stopped:
        build(data, names, tmp_path / "cache", stop_at_first_failure=True)
    assert stopped.value.index == 8 and "outside" in stopped.value.reason  # found before any decoding
    assert [p.name for p in (tmp_path / "cache").iterdir() if not p.name.startswith(".")] == []
    store, _ = build(data, names, tmp_path / "cache")
    assert sorted(store.failures) == [6, 7, 8] and "file not found" in store.failures[6]
    assert store.lengths[6] == 0 and store.lengths[0] > 0


def test_a_cache_pickles_as_its_folder(tmp_path):
    import pickle

    store, _ = build(tmp_path / "data", make_files(tmp_path / "data"), tmp_path / "cache")
    store.read(0)  # maps a shard
    blob = pickle.dumps(store)
    assert len(blob) < 1000  # a path, not the audio or the maps
    assert np.array_equal(pickle.loads(blob).read(3), store.read(3))


def test_a_read_only_copy_elsewhere_is_used_in_place(tmp_path):
    """An attached Kaggle dataset holding the cache: found by fingerprint, read where it is."""
    import shutil

    data = tmp_path / "data"
    names = make_files(data)
    store, _ = build(data, names, tmp_path / "session1")
    attached = tmp_path / "input" / "my-cache" / store.folder.name
    shutil.copytree(store.folder, attached)
    for path in [*attached.iterdir(), attached]:
        path.chmod(0o555 if path.is_dir() else 0o444)
    found, log = build(data, names, tmp_path / "session2", search=[attached])
    assert found.folder == attached and any("reusing" in line for line in log)
    assert not (tmp_path / "session2").exists()  # nothing decoded, nothing written


def test_a_cache_dir_holding_someone_elses_files_is_refused(tmp_path):
    data = tmp_path / "data"
    names = make_files(data)
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("precious")
    with pytest.raises(OutputRefused, match="cache_dir="):
        build(data, names, mine)
    with pytest.raises(OutputRefused, match="data_dir"):
        build(data, names, data / "cache", keep_apart={"data_dir": data})
    assert sorted(p.name for p in mine.iterdir()) == ["notes.txt"]


def test_a_cache_is_rebuilt_over_its_own_files_only_never_over_a_file_put_there(tmp_path):
    """An incomplete cache (a shard lost) is rebuilt in place; with a user's file inside it, it is refused before
    decoding anything, naming the file, and nothing there is deleted."""
    data = tmp_path / "data"
    names = make_files(data)
    store, _ = build(data, names, tmp_path / "cache")
    folder = store.folder
    (folder / "shard-00000.pcm").unlink()  # incomplete: the next run rebuilds it
    rebuilt, log = build(data, names, tmp_path / "cache")
    assert rebuilt.folder == folder and (folder / "shard-00000.pcm").is_file()
    assert not any("reusing" in line for line in log)

    (folder / "shard-00000.pcm").unlink()
    (folder / "notes.txt").write_text("precious")
    (folder / "plots").mkdir()
    before = sorted(p.name for p in folder.iterdir())
    with pytest.raises(OutputRefused, match=r"notes\.txt, plots.*cache_dir"):
        build(data, names, tmp_path / "cache")
    assert sorted(p.name for p in folder.iterdir()) == before
    assert (folder / "notes.txt").read_text() == "precious"


CONCURRENT = """
import sys
from pathlib import Path
from pipeline.training.store import open_or_build, source_files
data, cache = Path(sys.argv[1]), sys.argv[2]
names = sorted(p.name for p in data.iterdir())
store = open_or_build(source_files(data, names), cache, workers=1)
print("FOLDER", store.folder)
"""


def test_processes_started_together_build_the_cache_once(tmp_path):
    """Ranks of a torchrun launch each call open_or_build: one decodes, the others wait and reuse."""
    data = tmp_path / "data"
    make_files(data, count=12)
    runs = [subprocess.Popen([sys.executable, "-c", CONCURRENT, str(data), str(tmp_path / "cache")], env=venv_env(),
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for _ in range(3)]  # fmt: skip
    outputs = [run.communicate(timeout=300)[0] for run in runs]
    assert all(run.returncode == 0 for run in runs), outputs
    assert sum("decoding" in out for out in outputs) == 1, outputs
    assert sum("reusing" in out for out in outputs) == 2
    folders = {line for out in outputs for line in out.splitlines() if line.startswith("FOLDER")}
    assert len(folders) == 1


def test_the_manifest_records_the_sources_for_explanations(tmp_path):
    store, _ = build(tmp_path / "data", make_files(tmp_path / "data"), tmp_path / "cache")
    manifest = json.loads((store.folder / "cache.json").read_text())
    assert [record[0] for record in manifest["files"]] == [f"clip{k}.wav" for k in range(6)]
    assert manifest["sample_rate"] == 16000 and manifest["dtype"] == "int16"
    assert isinstance(AudioStore(store.folder).hours, float)
