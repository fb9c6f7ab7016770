"""Inference throughput: the seed's one-file-at-a-time SpeechBrain loop against the project's `run_inference`,
on the same artifact and the same files.

    python -m benchmarks.inference [--quick] [--tune] [--files N] [--preset base] [--join N] [--json out.json]

- naive (the seed's pattern, ../shared/seeds/000_*.txt): `EncoderClassifier.from_hparams(source=<artifact>)`
  offline, then per file: read it, `torch.from_numpy(signal).float()` resampled to 16 kHz by SpeechBrain's
  own audio normaliser, `.unsqueeze(0)`, `classify_batch`. Through the artifact's hyperparams.yaml that
  computes exactly what ours computes (the same 1 s windows, see pipeline.model.WindowedEncoder), one file
  per forward pass.
- ours: `pipeline.submission.run_inference` end to end (manifest check, decoding and resampling, fixed 1 s
  windows of many files batched `batch_windows` at a time, submission + report written).

Files: FSDD recordings (../shared/fsdd/recordings, 8 kHz, ~0.44 s each) copied into a competition folder with
test.csv; synthetic voices when FSDD is absent. The model is ECAPA-TDNN of the `base` preset (C=512, the size
../shared/NOTES.md's baselines were measured with) with untrained weights: throughput does not depend on
what the weights are, only on shapes, so no training is needed. `--quick` uses 40 files and the `small` preset.

Model FLOPs are counted with torch.utils.flop_counter.FlopCounterMode on one batch (convolutions and matmuls;
the Fbank's FFT is not counted). Both sides execute the same FLOPs: whole 1 s windows (a short clip is
zero-padded to one window, exactly as in training). "Useful" FLOP/s counts every clip at its own length
instead: on FSDD (median 0.42 s) windows cost ~2.3x that, the price of matching training (see data.windows).
The peak is the best fp32 torch.matmul rate measured in this process (2048^3, all threads).
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import soundfile as sf
import torch

FSDD = Path(__file__).resolve().parents[2] / "shared" / "fsdd" / "recordings"
WINDOW = 16_000


def run(
    quick: bool = False,
    files: int | None = None,
    preset: str | None = None,
    tune: bool = False,
    join: int = 1,
) -> dict:
    """Run the benchmark and return its numbers (also printed by `main`)."""
    from pipeline.config import InferConfig

    n_files = files or (40 if quick else 300)
    preset = preset or ("small" if quick else "base")
    with tempfile.TemporaryDirectory(prefix="bench-infer-") as tmp:
        tmp = Path(tmp)
        data, source = make_test_folder(tmp / "data", n_files, join)
        labels = ["george", "jackson", "lucas", "nicolas", "theo", "yweweler"]
        artifact = make_artifact(tmp / "model", preset, labels)
        durations = [sf.info(str(data / row["path"])).duration for row in _rows(data / "test.csv")]
        peaks_before = gemm_peaks()

        warm = make_subset(data, tmp / "warm", 8)  # first calls pay one-off costs (oneDNN kernels, imports)
        naive_loop(artifact, warm, tmp / "sb-warm")
        naive = naive_loop(artifact, data, tmp / "sb")
        plain = plain_sorted_batches(artifact, data)
        base = InferConfig(data_dir=str(data), artifact_dir=str(artifact), submission_path="", progress=False)
        ours_runs = {}
        for name, overrides in configurations(tune):
            ours_runs[name] = ours_timed(base, overrides, warm, tmp / name)
        peaks = {k: max(v, peaks_before[k]) for k, v in gemm_peaks().items()}
        peak = peaks["matmul"]

        per_window, per_sample = model_flops(artifact)
        artifact_config = json.loads((artifact / "manifest.json").read_text())["model_config"]
    windows = sum(_windows(d * 16000) for d in durations)
    audio_samples = sum(d * 16000 for d in durations)
    useful_flops = per_sample * audio_samples  # every clip at its own length
    executed_flops = per_window * windows  # what both sides run: whole windows
    result: dict[str, Any] = {
        "files": n_files,
        "source": source,
        "preset": preset,
        "audio_seconds": round(sum(durations), 1),
        "windows": windows,
        "gflop_per_window": per_window / 1e9,
        "matmul_peak_gflops": peak / 1e9,
        "onednn_peak_gflops": peaks["onednn"] / 1e9,
        "torch_threads": torch.get_num_threads(),
        "cpus": os.cpu_count(),
        "naive": _rates(naive, n_files, executed_flops, useful_flops, peaks),
        "plain_sorted_batches": _rates(
            plain, n_files, per_sample * plain["padded_samples"], useful_flops, peaks
        ),
        "ours": {
            name: _rates(r, n_files, executed_flops, useful_flops, peaks) | {"settings": r["settings"]}
            for name, r in ours_runs.items()
        },
    }
    best = max(result["ours"], key=lambda k: result["ours"][k]["files_per_s"])
    result["best"] = best
    result["default_batching"] = default_batching(artifact_config, base)
    result["speedup"] = result["ours"][best]["files_per_s"] / result["naive"]["files_per_s"]
    result["speedup_default"] = result["ours"]["default"]["files_per_s"] / result["naive"]["files_per_s"]
    naive_rate, ours_rate = result["naive"], result["ours"]["default"]
    result["headline"] = (
        f"naive one-file SpeechBrain loop {naive_rate['files_per_s']:.1f} files/s "
        f"({naive_rate['fraction_of_peak']:.0%} of the matmul peak) vs run_inference "
        f"{ours_rate['files_per_s']:.1f} files/s ({ours_rate['fraction_of_peak']:.0%} executed, "
        f"{ours_rate['useful_fraction_of_peak']:.0%} useful): {result['speedup_default']:.2f}x"
    )
    result["table"] = report(result)
    return result


SLOW_PADDING = "slow_padding"  # a benchmark-only switch: time without pipeline.inference's padding rewrite


def configurations(tune: bool) -> list[tuple[str, dict[str, Any]]]:
    """InferConfig settings to time: the defaults, and with --tune the variants that were tried."""
    runs: list[tuple[str, dict[str, Any]]] = [("default", {})]
    if tune:
        runs += [
            ("old: batch 64, 1 worker", {"batch_windows": 64, "num_workers": 1, SLOW_PADDING: True}),
            ("torch reflect padding", {SLOW_PADDING: True}),
            ("batch 8", {"batch_windows": 8}),
            ("batch 32", {"batch_windows": 32}),
            ("batch 64", {"batch_windows": 64}),
            ("1 worker", {"num_workers": 1}),
            ("1 thread", {"num_threads": 1}),
            ("1 thread, 1 worker", {"num_threads": 1, "num_workers": 1}),
            ("2 CPU processes", {"device": "cpu", "devices": 2}),
        ]
    return runs


def make_test_folder(data: Path, n_files: int, join: int = 1) -> tuple[Path, str]:
    """A competition folder (test.csv, sample_submission.csv, audio/) with `n_files` clips; with `join` > 1
    each clip is that many FSDD recordings of one speaker back to back (longer clips, fewer padded windows)."""
    audio = data / "audio"
    audio.mkdir(parents=True)
    if FSDD.is_dir() and any(FSDD.glob("*.wav")):
        recordings = sorted(FSDD.glob("*.wav"))
        order = np.random.default_rng(0).permutation(len(recordings))
        if join == 1:
            chosen = [recordings[i] for i in order[:n_files]]
            for path in chosen:  # copies: symlinks resolve outside DATA and are refused (pipeline.data)
                shutil.copyfile(path, audio / path.name)
            names, source = [p.name for p in chosen], f"FSDD ({FSDD})"
        else:
            by_speaker: dict[str, list[Path]] = {}
            for i in order:
                by_speaker.setdefault(recordings[i].stem.split("_")[1], []).append(recordings[i])
            groups = [
                paths[k : k + join]
                for paths in by_speaker.values()
                for k in range(0, len(paths) - join + 1, join)
            ]
            names = []
            for index, group in enumerate(groups[:n_files]):
                parts = [sf.read(str(path), dtype="float32") for path in group]
                name = f"joined_{index:05d}.wav"
                sf.write(audio / name, np.concatenate([samples for samples, _ in parts]), parts[0][1])
                names.append(name)
            source = f"FSDD ({FSDD}), {join} recordings of one speaker per clip"
    else:
        from pipeline.synthetic import make_synthetic_competition

        synthetic = make_synthetic_competition(data.parent / "synthetic", seed=0, n_speakers=6,
                                               train_per_speaker=1, test_per_speaker=math.ceil(n_files / 6))  # fmt: skip
        found = sorted((synthetic / "audio").rglob("*.wav"))[:n_files]
        for path in found:
            shutil.copyfile(path, audio / path.name)
        names, source = [p.name for p in found], "synthetic voices (FSDD not found)"
    rows = [(f"f{i:05d}", f"audio/{name}") for i, name in enumerate(names)]
    (data / "test.csv").write_text("id,path\n" + "".join(f"{i},{p}\n" for i, p in rows))
    (data / "sample_submission.csv").write_text("id,label\n" + "".join(f"{i},?\n" for i, _ in rows))
    return data, source


def make_subset(data: Path, target: Path, n: int) -> Path:
    rows = _rows(data / "test.csv")[:n]
    (target / "audio").mkdir(parents=True)
    for row in rows:
        shutil.copyfile(data / row["path"], target / row["path"])
    (target / "test.csv").write_text("id,path\n" + "".join(f"{r['id']},{r['path']}\n" for r in rows))
    (target / "sample_submission.csv").write_text("id,label\n" + "".join(f"{r['id']},?\n" for r in rows))
    return target


def make_artifact(target: Path, preset: str, labels: list[str]) -> Path:
    """An artifact with untrained weights of a realistic size (throughput does not depend on the values)."""
    from pipeline.artifact import save_artifact
    from pipeline.model import ModelConfig, SpeakerClassifier

    torch.manual_seed(0)
    model = SpeakerClassifier(ModelConfig.from_preset(preset, n_classes=len(labels), n_mels=80,
                                                      window_samples=WINDOW)).eval()  # fmt: skip
    return save_artifact(target, model, labels, {"benchmark": "untrained weights"})


def naive_loop(artifact: Path, data: Path, savedir: Path) -> dict[str, Any]:
    """The seed's pattern: SpeechBrain's EncoderClassifier, one file at a time."""
    from speechbrain.inference.speaker import EncoderClassifier
    from speechbrain.utils.fetching import LocalStrategy

    started = time.perf_counter()
    classifier = EncoderClassifier.from_hparams(source=str(artifact), savedir=str(savedir),
                                                local_strategy=LocalStrategy.COPY, run_opts={"device": "cpu"})  # fmt: skip
    loaded = time.perf_counter()
    predictions = {}
    for row in _rows(data / "test.csv"):
        signal, rate = sf.read(str(data / row["path"]), dtype="float32")
        wav = classifier.audio_normalizer(torch.from_numpy(signal).float(), rate)  # resample to 16 kHz
        _, _, _, text = classifier.classify_batch(wav.unsqueeze(0))
        predictions[row["id"]] = text[0]
    loop_done = time.perf_counter()
    with open(savedir / "submission.csv", "w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["id", "label"])
        writer.writerows(predictions.items())
    return {"seconds": time.perf_counter() - started, "loop_seconds": loop_done - loaded,
            "load_seconds": loaded - started, "settings": {}}  # fmt: skip


def plain_sorted_batches(artifact: Path, data: Path, batch: int = 32) -> dict[str, Any]:
    """The reference ../shared/NOTES.md calls "length-sorted batches of 32": whole files (no windows), sorted by
    length, padded to the longest of each batch, relative lengths. It computes other (worse, for a
    window-trained model) predictions; it is here as a same-machine yardstick for FLOP/s, not as a rival."""
    from pipeline.artifact import load_artifact
    from pipeline.data import load_audio

    model = load_artifact(artifact).model
    clips = [load_audio(data / row["path"])[0] for row in _rows(data / "test.csv")]
    order = np.argsort([-clip.size for clip in clips])
    padded = 0
    with torch.inference_mode():
        model.scores(
            model.embed(model.features(torch.zeros(2, WINDOW), torch.ones(2)), torch.ones(2))
        )  # warm
        started = time.perf_counter()
        for start in range(0, len(order), batch):
            members = [clips[i] for i in order[start : start + batch]]
            longest = members[0].size
            wavs = torch.zeros(len(members), longest)
            for row, clip in enumerate(members):
                wavs[row, : clip.size] = torch.from_numpy(clip)
            lens = torch.tensor([clip.size / longest for clip in members])
            model.scores(model.embed(model.features(wavs, lens), lens))
            padded += len(members) * longest
        seconds = time.perf_counter() - started
    return {"seconds": seconds, "padded_samples": padded, "settings": {"batch": batch}}


def ours_timed(base, overrides: dict[str, Any], warm: Path, out: Path) -> dict[str, Any]:
    """`run_inference` end to end, after a warm-up run on a few files with the same settings."""
    import dataclasses

    import pipeline.inference
    from pipeline.submission import run_inference

    out.mkdir()
    settings = dict(overrides)
    threads = torch.get_num_threads()
    fast_padding = pipeline.inference.use_fast_reflect_padding
    overrides = dict(overrides)
    if overrides.pop(SLOW_PADDING, False):
        pipeline.inference.use_fast_reflect_padding = lambda model: 0
    try:
        warm_config = dataclasses.replace(base, data_dir=str(warm), submission_path=str(out / "warm.csv"),
                                          **overrides)  # fmt: skip
        run_inference(warm_config)
        config = dataclasses.replace(base, submission_path=str(out / "submission.csv"), **overrides)
        started = time.perf_counter()
        result = run_inference(config)
        seconds = time.perf_counter() - started
    finally:
        torch.set_num_threads(threads)  # num_threads overrides are process-wide
        pipeline.inference.use_fast_reflect_padding = fast_padding
    assert result.n_fallbacks == 0, result.report["fallbacks"][:3]
    return {"seconds": seconds, "settings": settings, "device_counts": result.device_counts}


def default_batching(model_config: dict[str, Any], base) -> tuple[int, int]:
    """What run_inference chooses on this CPU when batch_windows / num_workers are left at None."""
    from pipeline.devices.inference_devices import batching_for
    from pipeline.model import ModelConfig

    return batching_for(
        base.batch_windows, base.num_workers, ModelConfig(**model_config), torch.device("cpu")
    )


def model_flops(artifact: Path) -> tuple[float, float]:
    """(FLOPs per 1 s window in a batch, FLOPs per input sample at batch 1 on a 1 s clip)."""
    from torch.utils.flop_counter import FlopCounterMode

    from pipeline.artifact import load_artifact

    model = load_artifact(artifact).model
    batch = 8
    wavs, lens = 0.1 * torch.randn(batch, WINDOW), torch.ones(batch)
    with FlopCounterMode(display=False) as counter, torch.inference_mode():
        model.scores(model.embed(model.features(wavs, lens), lens))
    per_window = counter.get_total_flops() / batch
    with FlopCounterMode(display=False) as counter, torch.inference_mode():
        model.scores(model.embed(model.features(wavs[:1], lens[:1]), lens[:1]))
    return per_window, counter.get_total_flops() / WINDOW


def gemm_peaks(n: int = 2048, seconds: float = 1.5) -> dict[str, float]:
    """Best fp32 FLOP/s of an n x n x n product, over a few bursts with 1 thread and with all threads (the
    machine is shared: keep the best). `matmul` is torch.matmul (MKL); `onednn` is the same product as a 1x1
    convolution, run by oneDNN like the model's convolutions. On this AMD CPU MKL's sgemm reached ~190 GFLOP/s
    and oneDNN ~360 on 2 cores, so both are reported."""
    threads = torch.get_num_threads()
    a, b = torch.randn(n, n), torch.randn(n, n)
    conv = torch.nn.Conv1d(n, n, 1, bias=False).eval()
    x = torch.randn(1, n, n)
    kernels = {"matmul": lambda: torch.matmul(a, b), "onednn": lambda: conv(x)}
    peaks = {}
    try:
        with torch.inference_mode():
            for name, kernel in kernels.items():
                best = 0.0
                for count_threads in sorted({1, threads}):
                    torch.set_num_threads(count_threads)
                    kernel()
                    for _ in range(3):
                        started, count = time.perf_counter(), 0
                        while time.perf_counter() - started < seconds / 3:
                            kernel()
                            count += 1
                        best = max(best, 2 * n**3 * count / (time.perf_counter() - started))
                peaks[name] = best
    finally:
        torch.set_num_threads(threads)
    return peaks


def _windows(samples: float) -> int:
    return 1 if samples <= WINDOW else min(math.ceil(samples / WINDOW), 64)


def _rates(
    run: dict[str, Any], n_files: int, flops: float, useful: float, peaks: dict[str, float]
) -> dict[str, Any]:
    seconds, peak = run["seconds"], peaks["matmul"]
    out = {
        "seconds": round(seconds, 2),
        "files_per_s": n_files / seconds,
        "gflops": flops / seconds / 1e9,
        "fraction_of_peak": flops / seconds / peak,
        "useful_fraction_of_peak": useful / seconds / peak,
        "fraction_of_onednn_peak": flops / seconds / peaks["onednn"],
    }
    if "loop_seconds" in run:
        out["loop_seconds"] = round(run["loop_seconds"], 2)
        out["loop_fraction_of_peak"] = flops / run["loop_seconds"] / peak
    if "device_counts" in run:
        out["device_counts"] = run["device_counts"]
    return out


def _rows(path: Path) -> list[dict[str, str]]:
    with open(path, newline="") as handle:
        return list(csv.DictReader(handle))


def report(result: dict[str, Any]) -> str:
    """The printed table: throughput and FLOP rates of the naive loop and of each run_inference setting."""
    lines = [
        f"{result['files']} files from {result['source']}, {result['audio_seconds']} s of audio -> "
        f"{result['windows']} windows of 1 s; ECAPA-TDNN '{result['preset']}' (untrained weights), "
        f"{result['gflop_per_window']:.2f} GFLOP per window",
        f"fp32 peaks: torch.matmul {result['matmul_peak_gflops']:.0f} GFLOP/s, oneDNN 1x1 conv "
        f"{result['onednn_peak_gflops']:.0f} GFLOP/s ({result['torch_threads']} torch threads, {result['cpus']} CPUs); "
        f"run_inference defaults here: batch_windows={result['default_batching'][0]}, "
        f"num_workers={result['default_batching'][1]}",
        "",
        f"{'':40s} {'files/s':>8s} {'seconds':>8s} {'GFLOP/s':>8s} {'of peak':>8s} {'useful':>8s} {'oneDNN':>8s}",
    ]

    def row(name: str, r: dict[str, Any]) -> str:
        return (f"{name:40s} {r['files_per_s']:8.1f} {r['seconds']:8.2f} {r['gflops']:8.1f} "
                f"{r['fraction_of_peak']:8.0%} {r['useful_fraction_of_peak']:8.0%} {r['fraction_of_onednn_peak']:8.0%}")  # fmt: skip

    naive = result["naive"]
    lines.append(row("naive: SpeechBrain, one file at a time", naive))
    lines.append(row("reference: sorted whole-file batches of 32", result["plain_sorted_batches"]))
    lines += [row(f"ours: run_inference, {name}", r) for name, r in result["ours"].items()]
    lines += [
        "",
        f"naive loop alone (model already loaded): {naive['loop_seconds']:.2f} s, "
        f"{naive['loop_fraction_of_peak']:.0%} of the matmul peak",
        f"speed-up of run_inference (defaults) over the one-file loop: {result['speedup_default']:.2f}x"
        + (f"; best setting '{result['best']}': {result['speedup']:.2f}x" if len(result["ours"]) > 1 else ""),
        "'of peak': executed FLOP/s / torch.matmul peak; 'useful': every clip counted at its own length (naive",
        "and ours pad short clips to a 1 s window, as in training); 'oneDNN': executed FLOP/s / oneDNN GEMM peak.",
        "The reference row (NOTES.md's 'length-sorted batches', whole files, no windows; timed in-process",
        "without decoding) predicts differently: it is a same-machine yardstick for FLOP/s only.",
    ]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="40 files, small model")
    parser.add_argument("--files", type=int, default=None)
    parser.add_argument("--preset", default=None, help="model size preset (default: base; quick: small)")
    parser.add_argument("--tune", action="store_true", help="also time the variants of InferConfig tried")
    parser.add_argument("--join", type=int, default=1, help="FSDD recordings per test clip (longer clips)")
    parser.add_argument("--json", type=Path, default=None, help="also write the numbers here")
    args = parser.parse_args()
    result = run(quick=args.quick, files=args.files, preset=args.preset, tune=args.tune, join=args.join)
    print(report(result))
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
