"""Training throughput per strategy on the same model and global batch: CPU eager, DDP (gloo, 2 ranks) and
torch_xla SPMD over 8 CPU devices, through the production `train_step` and strategies.

    python -m benchmarks.training [--quick]

On this 2-core machine the numbers compare the code paths' overheads, not hardware: DDP splits 2 cores over
2 processes, and XLA's CPU backend stands in for a TPU (~50x slower than eager, ../shared/NOTES.md). What
matters for the TPU path is the compile count: one input shape must compile at most twice.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from typing import Any

import torch

GLOBAL_BATCH = 16


def _settings(quick: bool) -> dict[str, Any]:
    return {"preset": "tiny" if quick else "small", "window": 8000 if quick else 16000, "warmup": 3,
            "steps": 3 if quick else 24, "n_mels": 40 if quick else 80}  # fmt: skip


def _make_model(settings: dict[str, Any]):
    from pipeline.core.model import ModelConfig, SpeakerClassifier

    torch.manual_seed(0)
    config = ModelConfig.from_preset(settings["preset"], n_classes=10, n_mels=settings["n_mels"],
                                     window_samples=settings["window"])  # fmt: skip
    return SpeakerClassifier(config)


def _host_batch(rows: int, settings: dict[str, Any], seed: int) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return {
        "inputs": 0.1 * torch.randn(rows, settings["window"], generator=generator),
        "lens": torch.ones(rows),
        "labels": torch.randint(0, 10, (rows,), generator=generator),
    }


def _time_steps(strategy, settings: dict[str, Any], rows: int) -> dict[str, Any]:
    """Warm up (compiles on XLA), then time steady-state optimizer steps."""
    from pipeline.core.model import Frontend
    from pipeline.core.objectives import make_loss
    from pipeline.training.train import train_step

    model = strategy.setup_model(_make_model(settings))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    loss_fn = make_loss("aam", 0.2, 30.0)
    total = settings["warmup"] + settings["steps"]

    frontend = Frontend(settings["n_mels"], 16000) if strategy.features_on_host else None

    def host_batches():  # on XLA the Fbank features are made on the host, as the training workers do
        for i in range(total):
            batch = _host_batch(rows, settings, seed=1000 * strategy.rank + i)
            if frontend is not None:
                with torch.no_grad():
                    batch["inputs"] = frontend(batch["inputs"], batch["lens"])
            yield batch

    batches = strategy.device_batches(host_batches())
    for _ in range(settings["warmup"]):
        float(train_step(model, strategy, loss_fn, optimizer, [next(batches)]))
    strategy.barrier()
    started = time.perf_counter()
    for _ in range(settings["steps"]):
        loss = train_step(model, strategy, loss_fn, optimizer, [next(batches)])
    float(loss)  # wait for the last step (XLA executes asynchronously)
    strategy.barrier()
    seconds = time.perf_counter() - started
    return {"steps_per_s": settings["steps"] / seconds, "samples_per_s": settings["steps"] * GLOBAL_BATCH / seconds,
            "compile_count": strategy.compile_count()}  # fmt: skip


def bench_eager(settings: dict[str, Any]) -> dict[str, Any]:
    from pipeline.devices.strategy import SingleDevice

    return _time_steps(SingleDevice(torch.device("cpu")), settings, GLOBAL_BATCH)


def ddp_bench_worker(strategy, settings: dict[str, Any]) -> dict[str, Any]:
    return _time_steps(strategy, settings, GLOBAL_BATCH // strategy.world_size)


def bench_ddp(settings: dict[str, Any]) -> dict[str, Any]:
    """Two gloo ranks through the production launcher (spawn, thread split, process group)."""
    from pipeline.devices.ddp import launch_ddp
    from pipeline.devices.probe import detect_topology

    return launch_ddp(
        ddp_bench_worker, (settings,), detect_topology("cpu", 2), "fp32", collective_timeout_s=900
    )


def bench_xla_in_this_process(settings: dict[str, Any]) -> dict[str, Any]:
    from pipeline.devices.probe import detect_topology
    from pipeline.devices.xla import XLASpmdStrategy

    strategy = XLASpmdStrategy(detect_topology("tpu"), "bf16")
    return _time_steps(strategy, settings, GLOBAL_BATCH)


def bench_xla(settings: dict[str, Any]) -> dict[str, Any]:
    """XLA must be configured before torch_xla is imported: run it in a fresh process."""
    env = {**os.environ, "PJRT_DEVICE": "CPU", "CPU_NUM_DEVICES": "8", "TF_CPP_MIN_LOG_LEVEL": "2"}
    run = subprocess.run([sys.executable, "-m", "benchmarks.training", "--xla-child", json.dumps(settings)],
                         env=env, capture_output=True, text=True, timeout=1800)  # fmt: skip
    if run.returncode != 0:
        raise RuntimeError(f"XLA benchmark failed: {run.stderr[-2000:]}")
    return json.loads(run.stdout.strip().splitlines()[-1])


def run(quick: bool = False) -> dict[str, Any]:
    settings = _settings(quick)
    results: dict[str, Any] = {"settings": {**settings, "global_batch": GLOBAL_BATCH}}
    for name, bench in (("cpu_eager", bench_eager), ("ddp_gloo_2", bench_ddp), ("xla_spmd_8", bench_xla)):
        try:
            results[name] = bench(settings)
        except Exception as error:  # noqa: BLE001 - one broken strategy must not lose the others' numbers
            results[name] = {"error": f"{type(error).__name__}: {error}"}
    eager = results["cpu_eager"].get("samples_per_s")
    for name in ("ddp_gloo_2", "xla_spmd_8"):
        if eager and "samples_per_s" in results[name]:
            results[name]["vs_eager"] = results[name]["samples_per_s"] / eager
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--xla-child", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.xla_child:
        print(json.dumps(bench_xla_in_this_process(json.loads(args.xla_child))))
        return 0
    results = run(quick=args.quick)
    for name, value in results.items():
        print(f"{name}: {value}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
