"""A BirdCLEF-layout competition built from FSDD, through both notebooks: chunk rows, macro ROC-AUC, CPU speed.

    python -m benchmarks.soundscape [--quick] [--source RECORDINGS] [--folder DIR]
                                    [--set NAME=VALUE ...] [--infer-set NAME=VALUE ...] [--api]

The folder (pipeline/demo_data/soundscapes.py): FSDD's 6 speakers as species, 75 focal recordings each (3-6 utterances
with pauses, 30% with a quiet second speaker as a secondary label), unlabelled background soundscapes, and 40
hidden 60 s soundscapes with 0-2 speakers per 5 s chunk from takes the focal recordings never use, under a
background of coloured noise, wind and an insect-like tone. The notebooks run with their defaults plus the
layout parameters (LAYOUT, CHUNKS) -- what a user of the README's BirdCLEF example gets:

- the hidden run: every row present, in Kaggle's format (sample_submission's header, `<stem>_<end>` ids, file by
  file, 5 s by 5 s), and its macro ROC-AUC against the hidden chunks (the competition's metric);
- the scores of every chunk pooling (mean, max, mean_max) and window hop, from the same artifact;
- the public copy (an empty test folder, 3 placeholder rows): it must run and write a header-only submission;
- the infer rate in seconds of audio per second on this CPU for the trained default model and the 'voxceleb'
  preset (random weights: speed only), and the time projected for BirdCLEF 2025's hidden set (700 x 60 s) on
  a 4-core CPU, from the rates measured at 1 and 2 threads.

`--api` trains and predicts through the Python functions instead of the notebooks (same code, less start-up),
and `--set` / `--infer-set` change one train / infer parameter against the defaults: for experiments.
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import csv
import json
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_SOURCE = ROOT.parent / "shared" / "fsdd" / "recordings"
LAYOUT = {"train_table": "train.csv", "path_column": "filename", "label_column": "primary_label",
          "secondary_labels_column": "secondary_labels", "audio_dir": "train_audio",
          "noise_dir": "train_soundscapes"}  # fmt: skip
CHUNKS = {"test_audio_dir": "test_soundscapes", "segment_seconds": 5}
HIDDEN_SET = (700, 60.0)  # BirdCLEF 2025: ~700 soundscapes of 1 min
TARGET_AUC = 0.98


def build(source: Path, out: Path, quick: bool, public: bool = False, **options: Any) -> Path:
    from pipeline.demo_data.soundscapes import make_soundscape_competition, species_from_fsdd

    species = species_from_fsdd(source, 6)
    sizes = {"focal_per_class": 20, "test_soundscapes": 8} if quick else {}
    return make_soundscape_competition(out, species, public=public, overwrite=True, **sizes, **options)


def chunk_scores(folder: Path, artifact: Path, hop: float | None = None) -> dict[str, Any]:
    """Macro ROC-AUC of every pooling from one prediction of the hidden chunks (the infer stage's own planning
    and prediction, without writing a submission), and the rate."""
    from pipeline.core import metrics

    predicted = predict_chunks(folder, artifact, hop)
    result = {pooling: round(metrics.score("macro_roc_auc", predicted.truth, scores), 4)
              for pooling, scores in predicted.scores.items()}  # fmt: skip
    result["audio_s_per_s"] = round(predicted.audio_s_per_s, 1)
    return result


@dataclass
class ChunkPrediction:
    """The hidden chunks as the infer stage scores them: rows in submission order, the solution's classes."""

    ids: list[str]
    classes: list[str]
    truth: np.ndarray  # [rows, classes] 0/1
    scores: dict[str, np.ndarray]  # pooling -> [rows, classes]
    audio_s_per_s: float
    post: dict[str, np.ndarray] | None = None  # post-processing variant -> [rows, classes] (max pooling)


def predict_chunks(
    folder: Path, artifact: Path, hop: float | None = None, post: dict[str, tuple] | None = None
) -> ChunkPrediction:
    """Every pooling's scores of the hidden chunks from one prediction (the infer stage's own planning and
    prediction, without writing a submission); with `post` (name -> (chunk_smoothing, file_max_weight)), the
    max pooling's scores after each post-processing variant too."""
    from pipeline.core.artifact import load_artifact
    from pipeline.core.config import InferConfig
    from pipeline.core.windows import POOLINGS
    from pipeline.inference.postprocess import post_process
    from pipeline.inference.predict import predict
    from pipeline.inference.rows import plan_rows
    from pipeline.inference.runtime import resolve_runtime
    from pipeline.inference.submission import read_test_set

    config = InferConfig(data_dir=str(folder), artifact_dir=str(artifact), progress=False, window_hop_seconds=hop,
                         **CHUNKS)  # fmt: skip
    loaded = load_artifact(artifact)
    sample, items = read_test_set(config)
    with contextlib.redirect_stdout(sys.stderr):
        plan = plan_rows(sample, items, config)
        started = time.perf_counter()
        predicted = predict(loaded.model, plan, resolve_runtime(config, loaded)).spans
        seconds = time.perf_counter() - started
    solution, classes = read_solution(folder / "solution.csv")
    columns = [loaded.labels.index(c) for c in classes]
    truth = np.array([solution[row_id] for row_id in plan.ids])
    spans = np.array(plan.span_of)
    scores = {pooling: predicted.pooled[pooling][spans][:, columns] for pooling in POOLINGS}
    variants = {name: post_process(predicted.pooled["max"], plan, kernel, weight)[spans][:, columns]
                for name, (kernel, weight) in (post or {}).items()}  # fmt: skip
    return ChunkPrediction(
        list(plan.ids), classes, truth, scores, predicted.audio_seconds / seconds, variants
    )


def read_solution(path: Path) -> tuple[dict[str, list[float]], list[str]]:
    with open(path, newline="") as handle:
        reader = csv.reader(handle)
        header = next(reader)
        return {row[0]: [float(v) for v in row[1:]] for row in reader}, header[1:]


def infer_rates(artifact: Path, seconds: float = 60.0) -> dict[str, Any]:
    """Seconds of audio per second for 5 s chunks of noise at 1 and 2 threads, for the trained model and the
    'voxceleb' preset (random weights), with torch eager and with ONNX Runtime fp32 (what a CPU submission runs
    when the artifact has the file: training writes it; the voxceleb model is exported here), and BirdCLEF
    2025's hidden set projected onto 4 cores from the faster engine."""
    import tempfile

    import torch

    from pipeline.core.artifact import load_artifact
    from pipeline.core.config import InferConfig
    from pipeline.core.model import ModelConfig, SpeakerClassifier
    from pipeline.core.onnx import ONNX_FP32, ONNX_INT8, OnnxEmbedder, export_embedding_model
    from pipeline.devices.threads import available_cores
    from pipeline.inference.engines import TorchEmbedder, use_fast_reflect_padding
    from pipeline.inference.runtime import batching_for, window_plan

    trained = load_artifact(artifact)
    voxceleb = SpeakerClassifier(ModelConfig.from_preset("voxceleb", n_classes=len(trained.labels))).eval()
    noise = (0.05 * np.random.default_rng(0).standard_normal(int(seconds * 16000))).astype(np.float32)
    spans = [(k, 5.0 * k, 5.0 * (k + 1)) for k in range(int(seconds // 5))]
    out: dict[str, Any] = {}
    threads_before = torch.get_num_threads()
    with tempfile.TemporaryDirectory() as scratch:
        for name, model in (("default", trained.model), ("voxceleb", voxceleb)):
            use_fast_reflect_padding(model)
            batch, _ = batching_for(None, None, model.config, torch.device("cpu"), available_cores())
            plan = window_plan(InferConfig(segment_seconds=5), model.config, batch)
            onnx_path = trained.listed_file(ONNX_FP32) if name == "default" else None
            if onnx_path is None:
                onnx_path = Path(scratch) / f"{name}.onnx"
                export_embedding_model(model, onnx_path)
            int8_path = trained.listed_file(ONNX_INT8) if name == "default" else None
            engines = {"torch": None, "onnx": None, **({"onnx_int8": int8_path} if int8_path else {})}
            row: dict[str, Any] = {}
            for engine, int8 in engines.items():
                rates = {}
                for threads in (1, 2):
                    torch.set_num_threads(threads)
                    embed = (TorchEmbedder(model) if engine == "torch" else
                             OnnxEmbedder(model, int8 or onnx_path, threads, "int8" if int8 else "fp32"))  # fmt: skip
                    args = (model, embed, noise, spans, plan)
                    _timed_pass(*args)  # warm-up
                    rates[threads] = seconds / min(_timed_pass(*args), _timed_pass(*args))
                scaling = rates[2] / rates[1]  # per doubling of cores, measured here
                row[engine] = {"audio_s_per_s_1_thread": round(rates[1], 1),
                               "audio_s_per_s_2_threads": round(rates[2], 1), "scaling_1_to_2": round(scaling, 2),
                               "projected_4_cores_audio_s_per_s": round(rates[2] * scaling, 1)}  # fmt: skip
            onnx_record = trained.manifest.get("provenance", {}).get("onnx") or {}
            int8_passed = bool((onnx_record.get("int8") or {}).get("passed")) and "onnx_int8" in row
            usable = [rates for engine, rates in row.items() if engine != "onnx_int8" or int8_passed]
            best = max(usable, key=lambda r: r["projected_4_cores_audio_s_per_s"])  # what engine auto may run
            hidden = HIDDEN_SET[0] * HIDDEN_SET[1]
            row["onnx_vs_torch_2_threads"] = round(
                row["onnx"]["audio_s_per_s_2_threads"] / row["torch"]["audio_s_per_s_2_threads"], 2
            )
            row["projected_minutes_700x60_4_cores"] = round(
                hidden / best["projected_4_cores_audio_s_per_s"] / 60, 1
            )
            if int8_path:
                row["int8_passed_its_rule_at_training"] = int8_passed
            out[name] = row
    torch.set_num_threads(threads_before)
    return out


def _timed_pass(model, embed, noise, spans, plan) -> float:
    """Seconds to window, embed and pool one soundscape's chunks."""
    import torch

    from pipeline.core.windows import FileWindows, run_windows, span_windows

    started = time.perf_counter()
    item = FileWindows(0, *span_windows(noise, spans, plan))
    run_windows(model, iter([item]), len(spans), plan, torch.device("cpu"), embed=embed)
    return time.perf_counter() - started


def decode_rates(folder: Path) -> dict[str, Any]:
    """Seconds to decode an hour of the hidden soundscapes (32 kHz Ogg/Vorbis) to the model's 16 kHz and to
    32 kHz, one process: what a DataLoader decode worker spends per hour of audio."""
    from pipeline.core.data import load_audio

    files = sorted((folder / "test_soundscapes").iterdir())
    out = {}
    for rate in (16000, 32000):
        started, audio = time.perf_counter(), 0.0
        for path in files:
            samples, _ = load_audio(path, sample_rate=rate)
            audio += len(samples) / rate
        out[f"seconds_per_audio_hour_to_{rate // 1000}khz"] = round(
            (time.perf_counter() - started) / audio * 3600, 1
        )
    return out


def high_band(work: Path, quick: bool) -> dict[str, Any]:
    """pipeline.demo_data.synthetic's classes that differ only above 8 kHz, trained and scored at 16 and 32 kHz with the
    defaults: the sample rate parameter at work."""
    from pipeline.core.config import InferConfig, TrainConfig
    from pipeline.demo_data.synthetic import make_high_band_competition
    from pipeline.inference.submission import run_inference
    from pipeline.tooling.scoring import score_submission
    from pipeline.training.train import train

    data = make_high_band_competition(work / "high_band", train_per_class=8 if quick else 24,
                                      test_per_class=6 if quick else 20)  # fmt: skip
    out = {}
    for rate in (16000, 32000):
        model = work / f"high_band_model_{rate}"
        with contextlib.redirect_stdout(sys.stderr):
            train(TrainConfig(data_dir=str(data), artifact_dir=str(model), sample_rate=rate, progress=False,
                              cache_dir=str(work / "cache"), **({"epochs": 3} if quick else {})))  # fmt: skip
            run_inference(InferConfig(data_dir=str(data), artifact_dir=str(model), progress=False,
                                      submission_path=str(work / f"high_band_{rate}.csv")))  # fmt: skip
        out[f"accuracy_{rate // 1000}khz"] = round(score_submission(work / f"high_band_{rate}.csv",
                                                                    data / "solution.csv")[1], 4)  # fmt: skip
    out["chance"] = round(1 / 3, 4)
    return out


def run(source: Path = DEFAULT_SOURCE, quick: bool = False, folder: Path | None = None, api: bool = False,
        train_set: dict[str, Any] | None = None, infer_set: dict[str, Any] | None = None) -> dict[str, Any]:  # fmt: skip
    from benchmarks.scale import papermill
    from pipeline.tooling.scoring import score_submission

    if not source.is_dir():
        raise FileNotFoundError(f"{source}: FSDD recordings not found (see ../shared/fsdd/README)")
    train_set, infer_set = train_set or {}, infer_set or {}
    with tempfile.TemporaryDirectory(prefix="soundscape-") as tmp:
        work = Path(tmp)
        started = time.perf_counter()
        data = folder if folder is not None else build(source, work / "data", quick)
        results: dict[str, Any] = {"build_s": round(time.perf_counter() - started, 1), "layout": LAYOUT,
                                   "train_set": train_set, "infer_set": infer_set}  # fmt: skip
        artifact = work / "model"
        train_params = {"data_dir": data, "artifact_dir": artifact, "cache_dir": work / "cache", "progress": False,
                        **LAYOUT, **({"epochs": 3} if quick else {}), **train_set}  # fmt: skip
        started = time.perf_counter()
        if api:
            from pipeline.core.config import TrainConfig
            from pipeline.training.train import train

            with contextlib.redirect_stdout(sys.stderr):
                train(
                    TrainConfig(**{k: str(v) if isinstance(v, Path) else v for k, v in train_params.items()})
                )
        else:
            papermill(ROOT, "train.ipynb", work, train_params)
        results["train_s"] = round(time.perf_counter() - started, 1)
        provenance = json.loads((artifact / "manifest.json").read_text())["provenance"]
        results["validation"] = {k: v for k, v in provenance["validation"].items() if k.startswith("val_")}
        results["objective"] = provenance["objective"]
        results["onnx"] = provenance.get("onnx")  # what training exported, and int8's verdict (or its error)

        submission = work / "submission.csv"
        infer_params = {"data_dir": data, "artifact_dir": artifact, "submission_path": submission,
                        "expected_test_files": HIDDEN_SET[0], "expected_file_seconds": HIDDEN_SET[1],
                        **CHUNKS, **infer_set}  # fmt: skip
        if api:
            from pipeline.core.config import InferConfig
            from pipeline.inference.submission import run_inference

            with contextlib.redirect_stdout(sys.stderr):
                report = run_inference(InferConfig(**{k: str(v) if isinstance(v, Path) else v
                                                      for k, v in infer_params.items()})).report  # fmt: skip
            results["infer_s"] = report["seconds"]
        else:
            results["infer_s"] = round(papermill(ROOT, "infer.ipynb", work, infer_params)["seconds"], 1)
            report = json.loads((work / "submission_report.json").read_text())
        results["hidden"] = _check_format(submission, data, report)
        results["hidden"]["macro_roc_auc"] = round(score_submission(submission, data / "solution.csv")[1], 4)
        results["poolings_by_hop"] = {str(hop): chunk_scores(data, artifact, hop) for hop in (0.5, 1.0)}

        if not api:
            public = data.parent / "public" if folder is None else work / "public"
            if folder is None:
                shutil.copytree(data, public)
            else:
                shutil.copytree(folder, public)
            for scape in (public / "test_soundscapes").iterdir():
                scape.unlink()
            out = papermill(ROOT, "infer.ipynb", work, {**infer_params, "data_dir": public,
                                                         "submission_path": work / "public.csv"})  # fmt: skip
            with open(work / "public.csv", newline="") as handle:
                rows = list(csv.reader(handle))
            with open(public / "sample_submission.csv", newline="") as handle:
                sample_header = next(csv.reader(handle))
            results["public_copy"] = {"ran": True, "rows": len(rows) - 1, "same_header": rows[0] == sample_header,
                                      "projection_printed": "projected for 700 files" in out["output"]}  # fmt: skip
        results["speed"] = infer_rates(artifact)
        results["decode"] = decode_rates(data)
        results["sample_rate"] = high_band(work, quick)
    hidden = results["hidden"]
    best = max(((p, s) for hop in results["poolings_by_hop"].values() for p, s in hop.items() if p != "audio_s_per_s"),
               key=lambda item: item[1])  # fmt: skip
    speed = results["speed"]
    results["headline"] = (
        f"BirdCLEF layout from FSDD: {hidden['rows']} rows ({'all present, Kaggle format' if hidden['format_ok'] else 'FORMAT WRONG'}), "
        f"macro ROC-AUC {hidden['macro_roc_auc']:.4f} with the defaults, one seed (target {TARGET_AUC} "
        "judged on soundscape_snr's 3-seed mean, a single run varies with its seed; "
        f"best pooling here {best[0]} {best[1]:.4f}); "
        f"CPU rate on 2 threads, ONNX Runtime / torch: {speed['default']['onnx']['audio_s_per_s_2_threads']:.0f} / "
        f"{speed['default']['torch']['audio_s_per_s_2_threads']:.0f} s/s (default model), "
        f"{speed['voxceleb']['onnx']['audio_s_per_s_2_threads']:.0f} / "
        f"{speed['voxceleb']['torch']['audio_s_per_s_2_threads']:.0f} s/s (voxceleb); 700 x 60 s on 4 cores: "
        f"{speed['default']['projected_minutes_700x60_4_cores']:.1f} / {speed['voxceleb']['projected_minutes_700x60_4_cores']:.1f} min; "
        f"decoding 32 kHz Ogg: {results['decode']['seconds_per_audio_hour_to_16khz']:.0f} s per audio hour; classes above "
        f"8 kHz: accuracy {results['sample_rate']['accuracy_32khz']:.2f} at 32 kHz, "
        f"{results['sample_rate']['accuracy_16khz']:.2f} at 16 kHz (chance 0.33)"
    )
    return results


def _check_format(submission: Path, data: Path, report: dict[str, Any]) -> dict[str, Any]:
    with open(submission, newline="") as handle:
        rows = list(csv.reader(handle))
    with open(data / "sample_submission.csv", newline="") as handle:
        sample_header = next(csv.reader(handle))
    solution, _ = read_solution(data / "solution.csv")
    stems = sorted(p.stem for p in (data / "test_soundscapes").iterdir())
    expected = [f"{stem}_{end}" for stem in stems for end in range(5, 61, 5)]
    ids = [row[0] for row in rows[1:]]
    values = np.array([[float(v) for v in row[1:]] for row in rows[1:]])
    ok = (
        rows[0] == sample_header
        and ids == expected
        and set(ids) == set(solution)
        and bool(((values >= 0) & (values <= 1)).all())
    )
    return {
        "rows": len(ids),
        "format_ok": ok,
        "fallbacks": len(report["fallbacks"]),
        "rule": report["row_rule"],
    }


def _parse_sets(items: list[str]) -> dict[str, Any]:
    values = {}
    for item in items:
        name, _, text = item.partition("=")
        try:
            values[name] = ast.literal_eval(text)
        except (ValueError, SyntaxError):
            values[name] = text
    return values


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--source", type=Path, default=DEFAULT_SOURCE)
    parser.add_argument("--folder", type=Path, help="an existing folder built by `pipeline data soundscapes`")
    parser.add_argument("--api", action="store_true", help="Python functions instead of the notebooks")
    parser.add_argument("--set", action="append", default=[], help="NAME=VALUE for the train notebook")
    parser.add_argument("--infer-set", action="append", default=[], help="NAME=VALUE for the infer notebook")
    args = parser.parse_args(argv)
    result = run(
        args.source, args.quick, args.folder, args.api, _parse_sets(args.set), _parse_sets(args.infer_set)
    )
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
