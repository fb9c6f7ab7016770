"""Int8 weight range on this CPU: full-range int8 weights against the 7-bit ones quantize_embedding_model writes,
for closeness to fp32 and for speed, per model preset.

    python -m benchmarks.int8_range [--quick] [--presets small base voxceleb] [--rounds 9] [--out FILE]

Why: x86 CPUs without VNNI (AVX2, or AVX-512 without VNNI) multiply ONNX Runtime's uint8 activations by int8
weights with VPMADDUBSW, whose 16-bit pair sums saturate when weights use the full int8 range. Four ONNX Runtime
sessions of one export, each on the same windows:
  int8 full range               what artifacts carried before 7-bit weights
  int8 full range, exact        the same file with session.x64quantprecision (load_session sets it: older artifacts)
  int8 7-bit                    quantize_embedding_model's file today, without that option
  int8 7-bit, as loaded         the same through load_session (the option on), what inference runs
Closeness: cosine of each one's embeddings to fp32 ONNX Runtime's, on FSDD windows that calibration did not see.
Speed: the encoder alone (features computed once, outside the timing), batches of 16 windows of 1 s, 2 threads;
the sessions run in turn round after round, and `vs_fp32` is the median of the per-round ratios. Weights are
untrained (seed 0): speed does not depend on them, and saturation shows on them as it does on trained ones
(tests/inference/test_onnx_engine.py measures a trained model). The CPU's name and flags are in the raw file's
`machine`: on a CPU with VNNI the four int8 rows are expected to agree.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from benchmarks import cpu_model, print_result
from benchmarks.fsdd_accuracy import DEFAULT_SOURCE as FSDD

WINDOW, BATCH, THREADS = 16000, 16, 2


def fsdd_windows(paths: list[Path]) -> tuple[torch.Tensor, torch.Tensor]:
    from pipeline.core.data import load_audio, windows

    cut = [windows(load_audio(path)[0], WINDOW, 1) for path in paths]
    return torch.from_numpy(np.concatenate([w for w, _ in cut])), torch.from_numpy(
        np.concatenate([r for _, r in cut])
    )


def plain_session(path: Path, exact: bool) -> Any:
    """load_session's options with session.x64quantprecision on or off."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    options.add_session_config_entry("session.x64quantprecision", "1" if exact else "0")
    options.intra_op_num_threads, options.inter_op_num_threads = THREADS, 1
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def measure_preset(preset: str, recordings: list[Path], rounds: int) -> dict[str, Any]:
    from pipeline.core.model import ModelConfig, SpeakerClassifier
    from pipeline.core.onnx import export_embedding_model, load_session, quantize_embedding_model, run_session

    torch.manual_seed(0)
    config = ModelConfig.from_preset(preset, n_classes=10, n_mels=80, window_samples=WINDOW)
    model = SpeakerClassifier(config).eval()
    calibration = fsdd_windows(recordings[::40][:64])
    wavs, lens = fsdd_windows(recordings[7::50][:32])  # other recordings than calibration's
    with torch.inference_mode():
        feats = model.features(wavs, lens)
    with tempfile.TemporaryDirectory(prefix="bench-int8-") as folder:
        fp32 = export_embedding_model(model, Path(folder) / "fp32.onnx").path
        full = quantize_embedding_model(
            model, fp32, Path(folder) / "full.onnx", *calibration, reduce_range=False
        )
        seven = quantize_embedding_model(model, fp32, Path(folder) / "seven.onnx", *calibration)
        sessions = {
            "fp32": load_session(fp32, THREADS),
            "int8 full range": plain_session(full, exact=False),
            "int8 full range, exact": plain_session(full, exact=True),
            "int8 7-bit": plain_session(seven, exact=False),
            "int8 7-bit, as loaded": load_session(seven, THREADS),
        }
        reference = torch.from_numpy(run_session(sessions["fp32"], feats, lens))
        seconds: dict[str, list[float]] = {name: [] for name in sessions}
        for session in sessions.values():
            run_session(session, feats[:BATCH], lens[:BATCH])  # first call allocates
        for _ in range(rounds):
            for name, session in sessions.items():
                started = time.perf_counter()
                for i in range(0, len(feats), BATCH):
                    run_session(session, feats[i : i + BATCH], lens[i : i + BATCH])
                seconds[name].append(time.perf_counter() - started)
        rows = {}
        for name, session in sessions.items():
            found = torch.from_numpy(run_session(session, feats, lens))
            cosine = torch.nn.functional.cosine_similarity(found, reference, dim=1)
            ratios = [f / s for f, s in zip(seconds["fp32"], seconds[name], strict=True)]
            rows[name] = {"cosine_mean": round(float(cosine.mean()), 4), "cosine_min": round(float(cosine.min()), 4),
                          "median_s": round(statistics.median(seconds[name]), 4),
                          "vs_fp32": round(statistics.median(ratios), 2),
                          "vs_fp32_range": [round(min(ratios), 2), round(max(ratios), 2)]}  # fmt: skip
    return {"windows": len(feats), "audio_seconds": round(len(feats) * WINDOW / 16000, 1), "rows": rows}


def run(quick: bool = False, presets: list[str] | None = None, rounds: int | None = None) -> dict[str, Any]:
    recordings = sorted(FSDD.glob("*.wav"))
    if not recordings:
        raise FileNotFoundError(
            f"FSDD recordings not found at {FSDD} (they live in ../shared beside the repo)"
        )
    torch.set_num_threads(THREADS)
    presets = presets or (["small"] if quick else ["small", "base", "voxceleb"])
    rounds = rounds or (3 if quick else 9)
    result = {preset: measure_preset(preset, recordings, rounds) for preset in presets}
    cpu = cpu_model()
    headline = "; ".join(
        f"{preset}: full range cosine {r['rows']['int8 full range']['cosine_mean']:.4f} "
        f"({r['rows']['int8 full range']['vs_fp32']:.2f}x fp32), 7-bit "
        f"{r['rows']['int8 7-bit, as loaded']['cosine_mean']:.4f} ({r['rows']['int8 7-bit, as loaded']['vs_fp32']:.2f}x)"
        for preset, r in result.items()
    )
    return {"headline": f"{cpu.get('cpu')} {cpu.get('cpu_flags')}: {headline}", "rounds": rounds,
            "threads": THREADS, "batch": BATCH, "presets": result}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="the small preset, 3 rounds")
    parser.add_argument("--presets", nargs="+", default=None, help="model presets (small base voxceleb)")
    parser.add_argument("--rounds", type=int, default=None, help="rounds of every session (9)")
    parser.add_argument("--out", type=Path, default=None, help="also write the result here (a raw file)")
    args = parser.parse_args()
    print_result(run(args.quick, args.presets, args.rounds), args.out)


if __name__ == "__main__":
    main()
