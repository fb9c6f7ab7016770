"""The training audio on disk: decoded once, by every core, into a cache that is read lazily.

Training revisits every clip every epoch, and a real competition has 100+ hours of it: held in RAM as float32
that is 0.23 GB per hour per process. Instead each file is decoded and resampled once, by a process pool over
all cores, into int16 shards at the model's sample rate (`shard-NNNNN.pcm`, 0.115 GB per hour at 16 kHz) that
every reader memory-maps: a training step reads only its crops, the pages are file-backed (the kernel may drop
them: they are not the process's private memory), and the DDP ranks and DataLoader workers of one machine
share the same pages.

Why numpy memory maps rather than Lhotse, WebDataset or HF datasets: the access pattern is random crops of
known-length clips, which a flat int16 file and an offset table serve with one slice and no decoding; the
format needs nothing beyond numpy to read (the offline infer image installs no extra wheel for it), and
a cache attached as a Kaggle dataset is read in place. Each file is scaled by its own peak before it is
quantised, so quiet recordings keep 16 bits of resolution and float files louder than 1.0 keep their shape.

A cache lives in `<cache_dir>/<fingerprint>/`. The fingerprint covers what decoding depends on: every
file's path (relative to the data folder), size and modification time, the sample rate and this format's
version. So a rerun, a resumed Kaggle version or another task on the same files finds it, and any change to
the files builds a new one. It is written through pipeline.core.staging (never half-written) under a file lock,
so the ranks of a torchrun launch, or two notebooks, build it once and the others wait and reuse it.

    cache.json     version, fingerprint, sample rate, the source files, shards, files that failed and why
    index.npz      per file: shard, offset, length (samples), gain, and its loudness envelope (the RMS of
                   every ENVELOPE_SECONDS), which lets training crops land on the sound (data.crop_span)
    shard-*.pcm    int16 samples, files back to back
"""

from __future__ import annotations

import concurrent.futures
import hashlib
import json
import os
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..core.config import SAMPLE_RATE
from ..core.data import AudioError, load_audio
from ..core.progress import plural, progress_bar
from ..core.staging import MARKER, check_output_dir, mark, marked_as, staged_directory
from ..core.tables import DataError, resolve_inside
from ..devices.launch import helper_spawn_context

CACHE_VERSION = 2  # 2: the sample rate is a parameter; index.npz holds loudness envelopes
CACHE_KIND = "audio cache"
MANIFEST = "cache.json"
INDEX = "index.npz"
SHARD = re.compile(r"shard-\d{5}\.pcm")
FULL_SCALE = 32767.0
ENVELOPE_SECONDS = 0.1  # one loudness value per 100 ms: 10 floats per second of audio, 14 MB for 100 hours
# A decoding task is a run of consecutive files of about this much source data: big enough that a task's
# overhead (a process round trip, one shard file) is negligible, small enough to keep every core busy.
TASK_BYTES = 32 << 20
TASK_FILES = 512


class CacheBuildStopped(RuntimeError):
    """Decoding stopped at the first unusable file (the caller asked to stop there). `index` and `reason`."""

    def __init__(self, index: int, reason: str) -> None:
        super().__init__(reason)
        self.index, self.reason = index, reason


@dataclass(frozen=True)
class SourceFile:
    key: str  # the path as the table writes it, relative to the data folder: what the fingerprint records
    path: Path | None  # resolved inside the data folder; None if the path itself is unusable
    problem: str | None = None  # why `path` is None


def source_files(data_dir: Path, rel_paths: Sequence[str]) -> list[SourceFile]:
    """The files behind `rel_paths`, resolved inside `data_dir` (paths that escape it are problems)."""
    files = []
    for rel in rel_paths:
        try:
            files.append(SourceFile(rel, resolve_inside(data_dir, rel)))
        except DataError as error:
            files.append(SourceFile(rel, None, str(error)))
    return files


def fingerprint(files: Sequence[SourceFile], sample_rate: int = SAMPLE_RATE) -> tuple[str, list[list]]:
    """The cache key of `files` and the per-file records it was computed from (path, size, mtime_ns)."""
    records = []
    for source in files:
        try:
            stat = source.path.stat() if source.path is not None else None
        except OSError:
            stat = None
        records.append([source.key, stat.st_size if stat else -1, stat.st_mtime_ns if stat else -1])
    payload = json.dumps({"version": CACHE_VERSION, "rate": sample_rate, "files": records})
    return hashlib.sha256(payload.encode()).hexdigest()[:20], records


class AudioStore:
    """Read access to a built cache. Pickles as its folder: each process maps the shards it reads itself."""

    def __init__(self, folder: str | os.PathLike) -> None:
        self.folder = Path(folder)
        self.manifest = json.loads((self.folder / MANIFEST).read_text())
        with np.load(self.folder / INDEX) as index:
            self.shard, self.offset = index["shard"], index["offset"]
            self.lengths, self.gain = index["length"], index["gain"]
            self._envelopes, self._envelope_offset = index["envelope"], index["envelope_offset"]
        self.sample_rate = int(self.manifest["sample_rate"])
        self.envelope_frame = int(round(ENVELOPE_SECONDS * self.sample_rate))  # samples per envelope value
        self.failures: dict[int, str] = {int(i): why for i, why in self.manifest["failures"].items()}
        self._maps: dict[int, np.memmap] = {}

    def __len__(self) -> int:
        return len(self.lengths)

    def __getstate__(self) -> dict:
        return {"folder": self.folder}

    def __setstate__(self, state: dict) -> None:
        self.__init__(state["folder"])

    @property
    def hours(self) -> float:
        return float(self.lengths.sum()) / self.sample_rate / 3600

    def envelope(self, index: int) -> np.ndarray:
        """The RMS loudness of file `index` per `envelope_frame` samples (the last frame may be shorter)."""
        return self._envelopes[self._envelope_offset[index] : self._envelope_offset[index + 1]]

    def read(self, index: int, start: int = 0, stop: int | None = None) -> np.ndarray:
        """Samples [start, stop) of file `index` as float32 (a copy; the cache is never written through)."""
        length = int(self.lengths[index])
        stop = length if stop is None else min(stop, length)
        shard = int(self.shard[index])
        if shard not in self._maps:
            self._maps[shard] = np.memmap(self.folder / f"shard-{shard:05d}.pcm", dtype=np.int16, mode="r")
        base = int(self.offset[index])
        pcm = self._maps[shard][base + start : base + stop]
        return pcm.astype(np.float32) * np.float32(self.gain[index] / FULL_SCALE)


def is_cache(folder: Path) -> bool:
    return marked_as(folder, CACHE_KIND)


def not_cache_files(folder: Path) -> list[str]:
    """What in `folder` a rebuild of this cache would delete and this project did not write: every entry if it
    is not marked as a cache, else every file that is not one a cache holds (cache.json, index.npz, the
    shards). A cache's own files count as ours whatever their times (a cache copied from a dataset has new
    ones) and whatever their content (it is decoded again from the audio)."""
    if not is_cache(folder):
        return sorted(p.name for p in folder.iterdir())
    return [
        p.name
        for p in sorted(folder.iterdir())
        if p.is_dir() or not (p.name in (MARKER, MANIFEST, INDEX) or SHARD.fullmatch(p.name))
    ]


def is_cache_dir(folder: Path) -> bool:
    """A cache_dir this project may write into: new, empty, or holding only caches (and their locks)."""
    return all(is_cache(p) or p.name.startswith(".") for p in folder.iterdir())


def open_or_build(
    files: Sequence[SourceFile],
    cache_dir: str | os.PathLike,
    *,
    sample_rate: int = SAMPLE_RATE,
    search: Sequence[Path] = (),
    workers: int | None = None,
    stop_at_first_failure: bool = False,
    log: Callable[[str], object] = print,
    progress: bool = False,
    keep_apart: dict[str, str | os.PathLike | None] | None = None,
) -> AudioStore:
    """The cache of `files` at `sample_rate`: found in `cache_dir`, or among the caches `search` names (read in
    place, e.g. in an attached Kaggle dataset), else built in `cache_dir` by `workers` processes (default: every
    core). With `stop_at_first_failure`, CacheBuildStopped is raised at the first unusable file and nothing is
    kept."""
    from filelock import FileLock

    key, records = fingerprint(files, sample_rate)
    for folder in [Path(cache_dir) / key, *map(Path, search)]:
        if _complete(folder, key):
            return _reuse(folder, log)
    root = check_output_dir(
        cache_dir,
        name="cache_dir",
        is_ours=is_cache_dir,
        what="a folder of audio caches",
        keep_apart=keep_apart,
    )
    root.mkdir(parents=True, exist_ok=True)
    with FileLock(str(root / f".{key}.lock")):  # another process may be building this very cache: wait for it
        if _complete(root / key, key):
            return _reuse(root / key, log)
        _explain_rebuild(root, records, log)
        # Over its own files only, and checked before decoding, not only at the swap: an hour's decoding must
        # not end in a refusal.
        check_output_dir(
            root / key,
            name="cache_dir",
            what="an audio cache as this project left it",
            not_ours=not_cache_files,
        )
        started = time.perf_counter()
        with staged_directory(root / key, lambda folder: not not_cache_files(folder)) as staging:
            _build(files, records, key, sample_rate, staging, workers, stop_at_first_failure, log, progress)
            mark(staging, CACHE_KIND)
        store = AudioStore(root / key)
        size = sum(p.stat().st_size for p in (root / key).iterdir() if p.name != MARKER)
        log(
            f"audio cache: {len(store)} files, {store.hours:.1f} h, {size / 1e9:.2f} GB in "
            f"{root / key}, built in {time.perf_counter() - started:.0f} s"
        )
        return store


def _complete(folder: Path, key: str) -> bool:
    try:
        manifest = json.loads((folder / MANIFEST).read_text())
    except (OSError, ValueError):
        return False
    return (
        manifest.get("version") == CACHE_VERSION
        and manifest.get("fingerprint") == key
        and all((folder / f"shard-{i:05d}.pcm").is_file() for i in range(len(manifest.get("shards", []))))
    )


def _reuse(folder: Path, log: Callable[[str], object]) -> AudioStore:
    store = AudioStore(folder)
    log(
        f"audio cache: reusing {folder} ({len(store)} files, {store.hours:.1f} h, built "
        f"{store.manifest.get('built', '?')})"
    )
    return store


def _explain_rebuild(root: Path, records: list[list], log: Callable[[str], object]) -> None:
    """Say why an existing cache of (mostly) the same files is not used: it is often a surprise."""
    ours = {r[0]: r for r in records}
    for manifest_path in sorted(root.glob(f"*/{MANIFEST}")):
        try:
            theirs = {r[0]: r for r in json.loads(manifest_path.read_text())["files"]}
        except (OSError, ValueError, KeyError, TypeError):
            continue
        shared = ours.keys() & theirs.keys()
        if len(shared) < 0.5 * len(ours):
            continue
        changed = sum(ours[k] != theirs[k] for k in shared)
        log(
            f"audio cache: {manifest_path.parent.name} holds {len(shared)} of these files but differs "
            f"({len(ours.keys() - shared)} added, {len(theirs.keys() - shared)} removed, {changed} with another "
            "size or modification time): building a new one beside it"
        )
        return


def _tasks(files: Sequence[SourceFile], records: list[list]) -> list[list[tuple[int, str]]]:
    """Runs of consecutive decodable files of about TASK_BYTES each (file sizes, from the fingerprint's
    `records`, stand in for durations)."""
    tasks, current, current_bytes = [], [], 0
    for index, source in enumerate(files):
        if source.path is None:
            continue
        current.append((index, str(source.path)))
        current_bytes += max(0, records[index][1])  # -1: the file could not be read
        if current_bytes >= TASK_BYTES or len(current) >= TASK_FILES:
            tasks.append(current)
            current, current_bytes = [], 0
    return tasks + ([current] if current else [])


Decoded = tuple[int, int, float, np.ndarray, "str | None"]


def decode_task(
    task: list[tuple[int, str]], shard_path: str, sample_rate: int = SAMPLE_RATE
) -> list[Decoded]:
    """Decode a run of files into one shard (in a pool process, or this one: `_decoders`). Returns per file:
    index, samples written, gain, loudness envelope, and the reason it could not be used (then nothing is
    written for it)."""
    done: list[Decoded] = []
    frame = int(round(ENVELOPE_SECONDS * sample_rate))  # samples per loudness value
    with open(shard_path, "wb") as shard:
        for index, path in task:
            try:
                samples, _ = load_audio(Path(path), sample_rate=sample_rate)
            except AudioError as error:
                done.append((index, 0, 0.0, np.zeros(0, np.float32), error.detail))
                continue
            peak = float(np.abs(samples).max())
            gain = peak if peak > 0 else 1.0
            pcm = np.round(samples * (FULL_SCALE / gain)).astype(np.int16)
            shard.write(pcm.tobytes())
            done.append((index, len(pcm), gain, loudness(samples, frame), None))
    return done


def loudness(samples: np.ndarray, frame: int) -> np.ndarray:
    """RMS of every `frame` samples (the last frame may be shorter), float32."""
    starts = np.arange(0, len(samples), frame)
    sums = np.add.reduceat(np.square(samples, dtype=np.float64), starts)
    return np.sqrt(sums / np.diff(starts, append=len(samples))).astype(np.float32)


def _decoders(workers: int) -> concurrent.futures.Executor:
    """Where the tasks are decoded: a pool of `workers` processes, or a thread of this process for one. A pool
    of one decodes in the same order as this process would, after starting Python and importing torch in the
    child first (5 s of a tiny training's 27 s here: every first run on a small table paid it)."""
    if workers == 1:
        return concurrent.futures.ThreadPoolExecutor(1)
    return concurrent.futures.ProcessPoolExecutor(
        workers, mp_context=helper_spawn_context(), initializer=_one_thread
    )


def _one_thread() -> None:
    """A pool process's torch threads: one process per core already, more threads would only contend."""
    import torch

    torch.set_num_threads(1)


def _build(
    files, records, key, sample_rate, staging: Path, workers, stop_at_first_failure, log, progress
) -> None:
    n = len(files)
    shard = np.zeros(n, dtype=np.int32)
    offset = np.zeros(n, dtype=np.int64)
    length = np.zeros(n, dtype=np.int64)
    gain = np.ones(n, dtype=np.float32)
    envelopes: list[np.ndarray] = [np.zeros(0, np.float32)] * n
    failures = {i: source.problem for i, source in enumerate(files) if source.path is None}
    if stop_at_first_failure and failures:
        raise CacheBuildStopped(*min(failures.items()))  # the first unusable file
    tasks = _tasks(files, records)
    workers = max(1, min(workers or len(os.sched_getaffinity(0)), len(tasks) or 1))
    total_gb = sum(r[1] for r in records if r[1] > 0) / 1e9
    log(
        f"audio cache: decoding {plural(n, 'file')} ({total_gb:.2f} GB) to {sample_rate / 1000:g} kHz with "
        f"{plural(workers, 'process', 'processes')} into {staging.parent / key}"
    )
    bar = progress_bar(n, "decode", "file", progress)
    with _decoders(workers) as pool:
        futures = {
            pool.submit(decode_task, task, str(staging / f"shard-{k:05d}.pcm"), sample_rate): k
            for k, task in enumerate(tasks)
        }
        try:
            for future in concurrent.futures.as_completed(futures):
                k = futures[future]
                position = 0
                for index, count, file_gain, envelope, problem in future.result():
                    if problem is not None:
                        failures[index] = problem
                        if stop_at_first_failure:
                            raise CacheBuildStopped(index, problem)
                    shard[index], offset[index], length[index], gain[index] = k, position, count, file_gain
                    envelopes[index] = envelope
                    position += count
                if bar is not None:
                    bar.update(len(tasks[k]))
        except BaseException:
            pool.shutdown(cancel_futures=True)  # the tasks not started yet are dropped
            raise
        finally:
            if bar is not None:
                bar.close()
    envelope_offset = np.concatenate([[0], np.cumsum([len(e) for e in envelopes])]).astype(np.int64)
    np.savez(
        staging / INDEX,
        shard=shard,
        offset=offset,
        length=length,
        gain=gain,
        envelope=np.concatenate(envelopes).astype(np.float32),
        envelope_offset=envelope_offset,
    )
    manifest = {
        "version": CACHE_VERSION,
        "fingerprint": key,
        "sample_rate": sample_rate,
        "dtype": "int16",
        "built": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "shards": [f"shard-{k:05d}.pcm" for k in range(len(tasks))],
        "failures": {str(i): why for i, why in sorted(failures.items())},
        "files": records,
    }
    (staging / MANIFEST).write_text(json.dumps(manifest))


__all__ = ["AudioStore", "CacheBuildStopped", "SourceFile", "fingerprint", "open_or_build", "source_files"]
