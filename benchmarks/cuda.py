"""The CUDA paths on a GPU, through the production code: what a "GPU T4 x2" session trains and predicts with.

    python -m benchmarks.cuda [--quick] [--out FILE]

Run where a GPU is lent (CI and the development machines have none: without CUDA the section says so and
measures nothing). It records, on the voxceleb preset (what `model_size auto` picks on a GPU) and the default
CPU preset:

- the GPU itself: name, capability, and the measured fp16 / bf16 matrix-product peak (8192^3), the yardstick
  for every "fraction of peak" below;
- training: optimizer steps per second through `train.train_step` and `SingleDevice` at each precision the
  policy can pick on a GPU (fp16 with a gradient scaler: a T4's; bf16: an Ampere-or-later's; fp32), with the
  model FLOPs of forward + backward counted by torch's FlopCounterMode, as a fraction of the measured peak;
- inference: windows per second through `windows.embed_windows` (fp16 autocast, as the infer stage runs a
  GPU) at several batch sizes, the stage's default batch marked, against the naive loop (one file, one
  forward, as SpeechBrain's `classify_file` does), as seconds of audio per second and a fraction of peak.

The end-to-end runs (both notebooks on a GPU) are `benchmarks.soundscape --set accelerator=cuda` and
`benchmarks.fsdd_accuracy --set accelerator=cuda --set precision=fp16`; README "Measured on a GPU" has both.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import torch

WINDOW_S = 1.0


def _sync() -> None:
    torch.cuda.synchronize()


def _timed(fn, min_seconds: float, min_reps: int = 3) -> float:
    """Seconds per call of `fn` (GPU-synchronised), after one warm-up call, over at least `min_seconds`."""
    fn()
    _sync()
    started, reps = time.perf_counter(), 0
    while reps < min_reps or time.perf_counter() - started < min_seconds:
        fn()
        reps += 1
    _sync()
    return (time.perf_counter() - started) / reps


def gpu_facts(quick: bool) -> dict[str, Any]:
    props = torch.cuda.get_device_properties(0)
    n = 4096 if quick else 8192
    peaks = {}
    for name, dtype in (("fp16", torch.float16), ("bf16", torch.bfloat16), ("fp32_tf32_off", torch.float32)):
        a, b = torch.randn(n, n, device="cuda", dtype=dtype), torch.randn(n, n, device="cuda", dtype=dtype)
        seconds = _timed(lambda a=a, b=b: a @ b, 0.5 if quick else 2.0)
        peaks[name] = round(2 * n**3 / seconds / 1e12, 1)
    return {"name": props.name, "capability": f"{props.major}.{props.minor}", "torch": torch.__version__,
            "cuda": torch.version.cuda, "memory_gib": round(props.total_memory / 2**30, 1),
            "matmul_peak_tflops": peaks}  # fmt: skip


def _model(preset: str, n_classes: int = 50):
    from pipeline.core.model import ModelConfig, SpeakerClassifier

    torch.manual_seed(0)
    return SpeakerClassifier(ModelConfig.from_preset(preset, n_classes=n_classes))


def _flops(fn) -> float:
    from torch.utils.flop_counter import FlopCounterMode

    with FlopCounterMode(display=False) as counter:
        fn()
    return float(counter.get_total_flops())


def training_steps(preset: str, batch: int, quick: bool) -> dict[str, Any]:
    """Steps per second of the production step (`train_step` on `SingleDevice(cuda, precision)`: autocast,
    gradient scaler for fp16, clipping, Adam) at each GPU precision, with achieved model TFLOP/s."""
    from pipeline.core.objectives import make_loss
    from pipeline.devices.strategy import SingleDevice
    from pipeline.training.train import train_step

    out: dict[str, Any] = {"preset": preset, "batch": batch}
    torch.backends.cuda.matmul.allow_tf32 = False  # fp32 means fp32 here: the policy's fp32 on a GPU
    torch.backends.cudnn.allow_tf32 = False
    for precision in ("fp16", "bf16", "fp32"):
        strategy = SingleDevice(torch.device("cuda"), precision)
        model = strategy.setup_model(_model(preset))
        optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
        loss_fn = make_loss("aam", 0.2, 30.0)
        window = model.config.window_samples
        generator = torch.Generator().manual_seed(0)
        batch_on_gpu = {"inputs": (0.1 * torch.randn(batch, window, generator=generator)).cuda(),
                        "lens": torch.ones(batch, device="cuda"),
                        "labels": torch.randint(0, 50, (batch,), generator=generator).cuda()}  # fmt: skip

        def step(model=model, strategy=strategy, optimizer=optimizer, loss_fn=loss_fn, batch=batch_on_gpu):
            train_step(model, strategy, loss_fn, optimizer, [batch])

        seconds = _timed(step, 1.0 if quick else 4.0)

        def forward_backward(model=model, strategy=strategy, loss_fn=loss_fn, batch=batch_on_gpu):
            with strategy.autocast():
                scores = model(batch["inputs"], batch["lens"])
            loss_fn(scores, batch["labels"]).backward()

        flops = _flops(forward_backward)
        optimizer.zero_grad(set_to_none=True)
        out[precision] = {"steps_per_s": round(1 / seconds, 1), "windows_per_s": round(batch / seconds),
                          "model_tflops": round(flops / seconds / 1e12, 2)}  # fmt: skip
        del model, optimizer
        torch.cuda.empty_cache()
    out["fp16_vs_fp32"] = round(out["fp16"]["steps_per_s"] / out["fp32"]["steps_per_s"], 2)
    out["bf16_vs_fp16"] = round(out["bf16"]["steps_per_s"] / out["fp16"]["steps_per_s"], 2)
    return out


def inference_throughput(preset: str, batches: tuple[int, ...], quick: bool) -> dict[str, Any]:
    """Windows per second through the infer stage's `embed_windows` (fp16 autocast, copy to and from the GPU)
    at each batch size, and the naive loop: one 1 s clip per forward pass."""
    from pipeline.core.windows import embed_windows
    from pipeline.devices.threads import available_cores
    from pipeline.inference.engines import use_fast_reflect_padding
    from pipeline.inference.runtime import batching_for

    model = _model(preset).cuda().eval()
    use_fast_reflect_padding(model)
    window = model.config.window_samples
    device = torch.device("cuda")
    default_batch, _ = batching_for(None, None, model.config, device, available_cores())
    out: dict[str, Any] = {"preset": preset, "default_batch": default_batch, "by_batch": {}}
    with torch.inference_mode():
        per_window = (
            _flops(lambda: embed_windows(model, 0.1 * torch.randn(8, window), torch.ones(8), device)) / 8
        )
        for batch in sorted({*batches, default_batch}):
            wavs, lens = (0.1 * torch.randn(batch, window)).pin_memory(), torch.ones(batch)
            seconds = _timed(lambda w=wavs, n=lens: embed_windows(model, w, n, device), 0.5 if quick else 2.0)
            out["by_batch"][batch] = {"windows_per_s": round(batch / seconds),
                                      "audio_s_per_s": round(batch * WINDOW_S / seconds),
                                      "model_tflops": round(per_window * batch / seconds / 1e12, 2)}  # fmt: skip
        one = 0.1 * torch.randn(1, window)
        seconds = _timed(lambda: embed_windows(model, one, torch.ones(1), device), 0.5 if quick else 2.0)
        out["naive_one_clip_per_forward"] = {"windows_per_s": round(1 / seconds)}
    out["gflop_per_window"] = round(per_window / 1e9, 2)
    best = max(out["by_batch"].values(), key=lambda r: r["windows_per_s"])
    out["default_vs_naive"] = round(
        out["by_batch"][default_batch]["windows_per_s"] / out["naive_one_clip_per_forward"]["windows_per_s"],
        1,
    )
    out["default_vs_best_batch"] = round(
        out["by_batch"][default_batch]["windows_per_s"] / best["windows_per_s"], 2
    )
    return out


def run(quick: bool = False) -> dict[str, Any]:
    if not torch.cuda.is_available():
        return {"status": "not measured: no CUDA device here", "headline": "no CUDA device: not measured"}
    facts = gpu_facts(quick)
    train = {preset: training_steps(preset, 32, quick) for preset in ("voxceleb", "small")}
    train["voxceleb_128"] = training_steps("voxceleb", 128, quick)
    infer = {
        preset: inference_throughput(preset, (16, 64, 256, 1024), quick) for preset in ("voxceleb", "small")
    }
    peak16 = facts["matmul_peak_tflops"]["fp16"]
    vox_train, vox_infer = train["voxceleb"], infer["voxceleb"]
    default = vox_infer["by_batch"][vox_infer["default_batch"]]
    best_batch, best = max(vox_infer["by_batch"].items(), key=lambda kv: kv[1]["windows_per_s"])
    headline = (
        f"{facts['name']} (fp16 matmul peak {peak16} TFLOP/s, torch {facts['torch']}); voxceleb training at 32 "
        f"windows/GPU: fp16 {vox_train['fp16']['steps_per_s']} steps/s ({vox_train['fp16']['model_tflops'] / peak16:.1%} "
        f"of peak), bf16 {vox_train['bf16_vs_fp16']}x fp16, fp16 {vox_train['fp16_vs_fp32']}x fp32; at 128: fp16 "
        f"{train['voxceleb_128']['fp16']['steps_per_s']} steps/s; inference (fp16): {default['audio_s_per_s']} audio "
        f"s/s at the default batch {vox_infer['default_batch']} ({vox_infer['default_vs_naive']}x the one-clip loop, "
        f"{default['model_tflops'] / peak16:.1%} of peak), best {best['audio_s_per_s']} at batch {best_batch}"
    )  # fmt: skip
    return {"gpu": facts, "training": train, "inference": infer, "headline": headline}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--out", type=Path, help="also write the result here as JSON")
    args = parser.parse_args(argv)
    result = run(quick=args.quick)
    text = json.dumps(result, indent=2)
    if args.out:
        args.out.write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
