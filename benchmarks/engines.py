"""CPU inference engines: PyTorch eager against ONNX Runtime fp32 and static int8 (issue 19, phase 1).

    python -m benchmarks.engines [--quick] [--preset NAME ...] [--threads N ...] [--batch N ...]
                                 [--task speaker|digit ...] [--epochs N] [--no-speed] [--no-accuracy] [--json PATH]

Speed: seconds of audio per second through `embed(wavs, lens)` (Fbank + normalisation in torch, the encoder
in the engine), on full 1 s windows of real speech (FSDD recordings resampled to 16 kHz and laid end to end),
in batches of the size inference uses on this CPU (inference/runtime.batching_for; voxceleb: 4,
small: 32) and of 16. Weights are random (speed does not depend on them; the int8 file is calibrated on FSDD
windows all the same). At each thread count the engines run in turn, round after round, each round over the
same windows; a figure is the median over rounds, and `vs_torch` the median of the per-round ratios (a
neighbour's burst of load hits the engines of a round alike). Torch runs with the project's fast reflect
padding (pipeline.inference.engines.use_fast_reflect_padding), as inference runs it today.

Accuracy: a 'small' model trained with default settings but 4 epochs (a CPU session's size) on FSDD recordings with
index < 40, then scored on everything it never saw -- the competition folder's test split and every
recording with index >= 40 -- by torch, ONNX Runtime fp32 and int8 (calibrated on 256 training windows; the
default keeps the squeeze-excitation and final layers fp32, `onnx-int8-every-conv` quantises those too), each
through windows.run_windows. The int8 rule (core.onnx.int8_acceptable): within 0.5 points of fp32.

The `engines` section of benchmarks/run.py (`make bench`); `run(quick)` returns its dict with a headline.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from benchmarks import commit_state, machine
from benchmarks.fsdd_accuracy import DEFAULT_SOURCE, CpuMeter, split_by_index

ENGINES = ("torch", "onnx-fp32", "onnx-int8")
HOLDOUT_INDEX = 40  # FSDD's development copy has indices 0-44: 40-44 are never trained on


# ------------------------------------------------------------------------------------------ speech


def speech_windows(count: int, window: int = 16000, source: Path = DEFAULT_SOURCE) -> torch.Tensor:
    """`count` full windows of real speech: FSDD recordings (16 kHz) end to end, cut into windows."""
    from pipeline.core.data import load_audio

    recordings = sorted(Path(source).glob("*.wav"))
    if not recordings:
        raise FileNotFoundError(f"no FSDD recordings in {source} (set --source)")
    order = np.random.default_rng(0).permutation(len(recordings))
    parts, total = [], 0
    for index in order:
        samples = load_audio(recordings[index])[0]
        parts.append(samples)
        total += samples.size
        if total >= count * window:
            break
    audio = np.concatenate(parts)[: count * window]
    if audio.size < count * window:
        raise ValueError(f"{source} holds {audio.size / window:.0f} windows of audio, {count} were asked for")
    return torch.from_numpy(audio.reshape(count, window).copy())


# ------------------------------------------------------------------------------------------ speed


def speed(
    preset: str, threads: list[int], batches: list[int], rounds: int, windows: int, work: Path
) -> dict[str, Any]:
    """Audio s/s of every engine at every thread count and batch size, plus export and quantisation times."""
    from pipeline.core.model import ModelConfig, SpeakerClassifier
    from pipeline.core.onnx import OnnxEmbedder, export_embedding_model, quantize_embedding_model
    from pipeline.devices.threads import available_cores
    from pipeline.inference.engines import TorchEmbedder, use_fast_reflect_padding
    from pipeline.inference.runtime import batching_for

    torch.manual_seed(0)
    model = SpeakerClassifier(ModelConfig.from_preset(preset, n_classes=10)).eval()
    use_fast_reflect_padding(model)
    window = model.config.window_samples
    audio, lens = speech_windows(windows, window), torch.ones(windows)
    exported = export_embedding_model(model, work / f"{preset}.onnx")
    started = time.perf_counter()
    int8_path = quantize_embedding_model(
        model, exported.path, work / f"{preset}.int8.onnx", audio[:64], lens[:64]
    )
    quantize_s = time.perf_counter() - started
    default_batch = batching_for(None, None, model.config, torch.device("cpu"), available_cores())[0]
    result: dict[str, Any] = {
        "preset": preset,
        "windows": windows,
        "rounds": rounds,
        "default_batch": default_batch,
        "export_s": round(exported.seconds, 1),
        "quantize_s": round(quantize_s, 1),
        "export_max_abs_diff": exported.max_abs_diff,
        "onnx_mb": round(exported.path.stat().st_size / 2**20, 1),
        "int8_mb": round(int8_path.stat().st_size / 2**20, 1),
        "runs": {},
    }
    torch_threads = torch.get_num_threads()
    try:
        for count in threads:
            torch.set_num_threads(count)
            engines = {
                "torch": TorchEmbedder(model),
                "onnx-fp32": OnnxEmbedder(model, exported.path, count, "fp32"),
                "onnx-int8": OnnxEmbedder(model, int8_path, count, "int8"),
            }
            for batch in sorted({default_batch, *batches}):
                result["runs"][f"{count} thread(s), batch {batch}"] = _timed(
                    engines, audio, lens, batch, rounds
                )
    finally:
        torch.set_num_threads(torch_threads)
    return result


def _timed(engines: dict, audio: torch.Tensor, lens: torch.Tensor, batch: int, rounds: int) -> dict[str, Any]:
    for embed in engines.values():  # warm-up: oneDNN primitives, ONNX Runtime's arena, at this batch shape
        for _ in range(2):
            embed(audio[:batch], lens[:batch])
    seconds: dict[str, list[float]] = {name: [] for name in engines}
    names = list(engines)
    for round_index in range(rounds):
        for name in names[round_index % len(names) :] + names[: round_index % len(names)]:  # rotate the order
            started = time.perf_counter()
            for start in range(0, len(audio), batch):
                engines[name](audio[start : start + batch], lens[start : start + batch])
            seconds[name].append(time.perf_counter() - started)
    audio_s = len(audio) * 1.0  # full 1 s windows
    out = {}
    for name, times in seconds.items():
        rates = [audio_s / t for t in times]
        out[name] = {"audio_s_per_s": round(statistics.median(rates), 2), "min": round(min(rates), 2),
                     "max": round(max(rates), 2)}  # fmt: skip
        if name != "torch":
            ratios = [a / b for a, b in zip(seconds["torch"], times, strict=True)]
            out[name]["vs_torch"] = round(statistics.median(ratios), 2)
    return out


# ------------------------------------------------------------------------------------------ accuracy


def accuracy(
    task: str, work: Path, quick: bool = False, epochs: int | None = None, source: Path = DEFAULT_SOURCE
) -> dict[str, Any]:
    """Torch, ONNX Runtime fp32 and int8 labels on FSDD recordings a trained 'small' model never saw
    (`epochs`: None trains the default 12; quick: 2)."""
    from pipeline.core.artifact import load_artifact
    from pipeline.core.config import TrainConfig
    from pipeline.core.data import load_audio, windows
    from pipeline.core.onnx import (
        OnnxEmbedder,
        export_embedding_model,
        int8_acceptable,
        quantize_embedding_model,
    )
    from pipeline.core.windows import FileWindows, WindowPlan, run_windows, span_windows
    from pipeline.demo_data.fsdd import make_fsdd_competition
    from pipeline.inference.engines import TorchEmbedder, use_fast_reflect_padding
    from pipeline.training.train import train

    development, heldout = split_by_index(Path(source), work, HOLDOUT_INDEX, task)
    data = make_fsdd_competition(development, work / "data", task=task, max_per_cell=6 if quick else None)
    artifact = work / "model"
    started = time.perf_counter()
    with contextlib.redirect_stdout(sys.stderr):
        epochs = 2 if quick else epochs  # None: the data decides (FSDD: 12)
        settings = dict(progress=False, epochs=epochs, export_onnx=False)  # exported below, with variants
        train(TrainConfig(data_dir=str(data), artifact_dir=str(artifact), **settings))
    train_s = time.perf_counter() - started
    loaded = load_artifact(artifact)
    model, labels = loaded.model, loaded.labels
    use_fast_reflect_padding(model)
    window = model.config.window_samples

    def rows(folder: Path) -> list[tuple[Path, str]]:
        with open(folder / "test.csv", newline="") as handle:
            paths = {row["id"]: folder / row["path"] for row in csv.DictReader(handle)}
        with open(folder / "solution.csv", newline="") as handle:
            return [(paths[row["id"]], row["label"]) for row in csv.DictReader(handle)]

    sets = {"test_split": rows(data), "unseen_indices": rows(heldout)}
    clips = {name: [load_audio(path)[0] for path, _ in found] for name, found in sets.items()}
    with open(data / "train.csv", newline="") as handle:
        train_paths = [data / row["path"] for row in csv.DictReader(handle)]
    picked = np.random.default_rng(0).permutation(len(train_paths))[:256]
    cut = [windows(load_audio(train_paths[i])[0], window, 1) for i in picked]  # one window per file
    calibration = (
        torch.from_numpy(np.concatenate([w for w, _ in cut])),
        torch.from_numpy(np.concatenate([r for _, r in cut])),
    )
    exported = export_embedding_model(model, work / "embedding_model.onnx")
    int8_path = quantize_embedding_model(
        model, exported.path, work / "embedding_model.int8.onnx", *calibration
    )
    # For comparison: every convolution in int8, squeeze-excitation and final layer included.
    int8_all = quantize_embedding_model(
        model, exported.path, work / "all.int8.onnx", *calibration, keep_fp32=()
    )
    threads = torch.get_num_threads()
    engines = {
        "torch": TorchEmbedder(model),
        "onnx-fp32": OnnxEmbedder(model, exported.path, threads, "fp32"),
        "onnx-int8": OnnxEmbedder(model, int8_path, threads, "int8"),
        "onnx-int8-every-conv": OnnxEmbedder(model, int8_all, threads, "int8"),
    }
    scores: dict[str, dict[str, np.ndarray]] = {}
    for engine, embed in engines.items():
        for name, found in clips.items():
            plan = WindowPlan(window, model.config.sample_rate, 32)
            items = (
                FileWindows(i, *span_windows(clip, [(i, 0.0, None)], plan)) for i, clip in enumerate(found)
            )
            found_scores = run_windows(
                model, items, len(found), plan, torch.device("cpu"), embed=embed
            ).scores
            scores.setdefault(engine, {})[name] = found_scores
    truth = {name: np.array([label for _, label in found]) for name, found in sets.items()}
    result: dict[str, Any] = {"task": task, "epochs": epochs, "train_s": round(train_s, 1),
                              "files": {n: len(f) for n, f in sets.items()},
                              "export_s": round(exported.seconds, 1), "engines": {}}  # fmt: skip
    for engine in engines:
        predicted = {name: np.array(labels)[scores[engine][name].argmax(1)] for name in sets}
        correct = {name: int((predicted[name] == truth[name]).sum()) for name in sets}
        total = sum(len(f) for f in sets.values())
        torch_labels = {name: np.array(labels)[scores["torch"][name].argmax(1)] for name in sets}
        result["engines"][engine] = {
            **{f"accuracy_{name}": round(correct[name] / len(sets[name]), 4) for name in sets},
            "accuracy": round(sum(correct.values()) / total, 4),
            "labels_differing_from_torch": int(sum((predicted[n] != torch_labels[n]).sum() for n in sets)),
            "max_abs_score_diff_vs_torch": float(max(np.abs(scores[engine][n] - scores["torch"][n]).max() for n in sets)),
        }  # fmt: skip
    fp32, int8 = result["engines"]["onnx-fp32"]["accuracy"], result["engines"]["onnx-int8"]["accuracy"]
    result["int8_drop_points"] = round(100 * (fp32 - int8), 2)
    result["int8_passes"] = int8_acceptable(fp32, int8)
    return result


# ------------------------------------------------------------------------------------------ section


def run(
    quick: bool = False,
    presets: list[str] | None = None,
    threads: list[int] | None = None,
    batches: list[int] | None = None,
    tasks: list[str] | None = None,
    epochs: int | None = 4,
) -> dict[str, Any]:
    """The benchmark section: speed per preset and accuracy per task, with a headline. Accuracy trains 4
    epochs by default (FSDD's unseen-recording accuracy is 0.99 on both tasks by then; the default 12 would take
    about 50 minutes a task on this shared 2-core machine, at 240 s an epoch): `epochs=None` trains 12."""
    import onnxruntime

    presets = presets if presets is not None else ["small"] if quick else ["voxceleb", "small"]
    threads = threads or ([1] if quick else [1, 2])
    batches = batches if batches is not None else ([] if quick else [16])
    tasks = tasks if tasks is not None else ["speaker"] if quick else ["speaker", "digit"]
    result: dict[str, Any] = {"onnxruntime": onnxruntime.__version__, "torch": torch.__version__,
                              "cpus": len(os.sched_getaffinity(0)), "speed": {}, "accuracy": {}}  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="bench-engines-") as tmp, CpuMeter() as meter:
        for preset in presets:
            work = Path(tmp) / preset
            work.mkdir()
            result["speed"][preset] = speed(preset, threads, batches, rounds=1 if quick else 3,
                                            windows=16 if quick else (48 if preset == "voxceleb" else 256), work=work)  # fmt: skip
        for task in tasks:
            work = Path(tmp) / f"accuracy-{task}"
            work.mkdir()
            result["accuracy"][task] = accuracy(task, work, quick=quick, epochs=epochs)
    result["contention"] = meter.result
    result["headline"] = headline(result)
    return result


def headline(result: dict[str, Any]) -> str:
    parts = []
    for preset, found in result["speed"].items():
        most = max(int(key.split()[0]) for key in found["runs"])
        key = f"{most} thread(s), batch {found['default_batch']}"
        run = found["runs"][key]
        parts.append(f"{preset} ({key}): torch {run['torch']['audio_s_per_s']} audio s/s, ONNX fp32 "
                     f"{run['onnx-fp32']['vs_torch']}x, int8 {run['onnx-int8']['vs_torch']}x")  # fmt: skip
    for task, found in result["accuracy"].items():
        engines = found["engines"]
        parts.append(f"FSDD {task} unseen accuracy torch {engines['torch']['accuracy']}, fp32 "
                     f"{engines['onnx-fp32']['accuracy']}, int8 {engines['onnx-int8']['accuracy']} "
                     f"({'passes' if found['int8_passes'] else 'fails'} the 0.5-point rule)")  # fmt: skip
    return "; ".join(parts)


def report(result: dict[str, Any]) -> str:
    lines = [f"onnxruntime {result['onnxruntime']}, torch {result['torch']}, {result['cpus']} CPUs; other processes "
             f"took {result['contention']['others_cpu_share']} of the CPU", ""]  # fmt: skip
    for preset, found in result["speed"].items():
        lines.append(f"{preset}: export {found['export_s']} s ({found['onnx_mb']} MB, max |ONNX - torch| "
                     f"{found['export_max_abs_diff']:.1e}), int8 quantisation {found['quantize_s']} s "
                     f"({found['int8_mb']} MB); audio s/s, median [min-max] of {found['rounds']} rounds")  # fmt: skip
        for key, run in found["runs"].items():
            cells = [f"{name} {r['audio_s_per_s']:7.2f} [{r['min']:.2f}-{r['max']:.2f}]"
                     + (f" {r['vs_torch']:.2f}x" if "vs_torch" in r else "") for name, r in run.items()]  # fmt: skip
            lines.append(f"  {key:24s} " + " | ".join(cells))
    for task, found in result["accuracy"].items():
        lines.append(f"FSDD {task}: {found['files']} unseen files, int8 drop {found['int8_drop_points']} points "
                     f"({'passes' if found['int8_passes'] else 'FAILS'})")  # fmt: skip
        for engine, r in found["engines"].items():
            lines.append(f"  {engine:10s} {json.dumps(r)}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.engines", description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--preset", action="append", default=None, help="model preset (repeatable)")
    parser.add_argument(
        "--threads", action="append", type=int, default=None, help="thread count (repeatable)"
    )
    parser.add_argument(
        "--batch", action="append", type=int, default=None, help="extra batch size (repeatable)"
    )
    parser.add_argument("--task", action="append", choices=["speaker", "digit"], default=None)
    parser.add_argument(
        "--epochs", type=int, default=4, help="training epochs for accuracy (0: the default 12)"
    )
    parser.add_argument("--no-accuracy", action="store_true", help="speed only")
    parser.add_argument("--no-speed", action="store_true", help="accuracy only")
    parser.add_argument("--json", type=Path, default=None, help="also write the numbers here")
    args = parser.parse_args(argv)
    result = run(quick=args.quick, presets=[] if args.no_speed else args.preset, threads=args.threads,
                 batches=args.batch, tasks=[] if args.no_accuracy else args.task, epochs=args.epochs or None)  # fmt: skip
    print(report(result))
    print(result["headline"])
    if args.json:  # a raw file: stamped with the commit, the time and the machine (CPU flags included)
        args.json.write_text(json.dumps({**commit_state(), "machine": machine(), **result}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
