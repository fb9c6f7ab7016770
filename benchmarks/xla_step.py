"""How big a TPU batch must be to keep the chips busy: host trace time per step vs the device work it launches.

    python -m benchmarks.xla_step [--quick]

torch_xla re-traces the training step in Python on every step (lazy tensors), and the devices wait for the next
graph while the host builds it. The trace costs the same whatever the batch (the graph has the same operations;
only shapes differ), while the device work grows with it: the per-device batch decides whether a step is
host-bound. Measured here on torch_xla's CPU backend with 8 devices (the stand-in for a v5e-8), through the
production train_step and XLASpmdStrategy:

- host time to trace one step (forward + backward + Adam + weight average, up to the sync) per batch size;
- torch_xla's TensorsGraphSize (IR nodes per step) and the compile count;
- the 'voxceleb' preset's FLOPs per training window (torch's FLOP counter on the CPU), hence the device time of
  a step on a v5e-8 at an assumed 40 % of its 197 bf16 TFLOP/s per chip, and the smallest per-device batch whose
  device time covers the trace.

The op count of ECAPA-TDNN does not depend on its width, so the trace is timed on the 'tiny' preset (whose
steps the CPU backend can also execute quickly); FLOPs are counted on 'voxceleb'.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import time
from typing import Any

V5E_CHIP_BF16_FLOPS = 197e12
ASSUMED_UTILISATION = 0.4
CHIPS = 8


def train_flops_per_window(preset: str = "voxceleb", window: int = 16000, n_mels: int = 80) -> float:
    """Forward + backward FLOPs of one 1 s window (torch's FLOP counter; backward counted as 2x forward)."""
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    from pipeline.model import ModelConfig, SpeakerClassifier

    model = SpeakerClassifier(
        ModelConfig.from_preset(preset, n_classes=1000, n_mels=n_mels, window_samples=window)
    )
    wavs, lens = 0.1 * torch.randn(2, window), torch.ones(2)
    with FlopCounterMode(display=False) as counter, torch.no_grad():
        model(wavs, lens)
    return 3.0 * counter.get_total_flops() / 2


def measure_in_this_process(batches: list[int], steps: int) -> dict[str, Any]:
    import torch
    import torch_xla
    import torch_xla.core.xla_model as xm
    import torch_xla.debug.metrics as met

    from pipeline.devices.probe import detect_topology
    from pipeline.devices.xla import XLASpmdStrategy
    from pipeline.ema import WeightAverage
    from pipeline.model import Frontend, ModelConfig, SpeakerClassifier, aam_loss
    from pipeline.train import train_step

    strategy = XLASpmdStrategy(detect_topology("tpu"), "bf16")
    results = {}
    for per_device in batches:
        torch.manual_seed(0)
        config = ModelConfig.from_preset("tiny", n_classes=100, n_mels=80, window_samples=16000)
        model = SpeakerClassifier(config)
        average = WeightAverage(model, 100)
        model = strategy.setup_model(model)
        average.module.to(strategy.device)
        optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
        loss_fn = aam_loss(0.2, 30.0)
        rows = per_device * strategy.num_devices
        wavs, lens = 0.1 * torch.randn(rows, 16000), torch.ones(rows)
        host = {"inputs": Frontend(80)(wavs, lens), "lens": lens, "labels": torch.randint(0, 100, (rows,))}
        batches_iter = strategy.device_batches(iter([host] * (steps + 2)))
        traces, compiles_before = [], met.metric_data("CompileTime")
        for _ in range(steps + 2):
            batch = next(batches_iter)
            xm.wait_device_ops()  # the previous step has run: what is timed next is the host's trace alone
            started = time.perf_counter()
            # train_step ends in the sync that hands the graph to the runtime: its host time is the trace.
            loss = train_step(model, strategy, loss_fn, optimizer, [batch], average)
            traces.append(time.perf_counter() - started)
        float(loss)
        sizes = met.metric_data("TensorsGraphSize")
        results[per_device] = {
            "trace_ms_median": 1000 * sorted(traces[2:])[len(traces[2:]) // 2],
            "graph_nodes_last": int(sizes[2][-1][1]) if sizes else None,
            "compiles": int(met.metric_data("CompileTime")[0])
            - int(compiles_before[0] if compiles_before else 0),
        }
        del batches_iter
        torch_xla.sync()
    return results


def run(quick: bool = False) -> dict[str, Any]:
    batches = [8, 32] if quick else [8, 32, 128]
    steps = 3 if quick else 5
    env = {**os.environ, "PJRT_DEVICE": "CPU", "CPU_NUM_DEVICES": "8", "TF_CPP_MIN_LOG_LEVEL": "2"}
    child = subprocess.run([sys.executable, "-m", "benchmarks.xla_step", "--child", json.dumps([batches, steps])],
                           env=env, capture_output=True, text=True, timeout=3000)  # fmt: skip
    if child.returncode != 0:
        raise RuntimeError(f"XLA step benchmark failed: {child.stderr[-2000:]}")
    per_batch = {int(k): v for k, v in json.loads(child.stdout.strip().splitlines()[-1]).items()}
    flops = train_flops_per_window()
    per_chip_flops = V5E_CHIP_BF16_FLOPS * ASSUMED_UTILISATION
    traces_ms = [r["trace_ms_median"] for r in per_batch.values()]
    trace_s = max(traces_ms) / 1000
    per_window_s = flops / per_chip_flops
    covering = math.ceil(trace_s / per_window_s)  # windows per device whose device time hides the trace
    for batch, row in per_batch.items():
        row["v5e8_device_ms_voxceleb"] = round(1000 * batch * per_window_s, 1)
    largest = max(per_batch)
    nodes = sorted({r["graph_nodes_last"] for r in per_batch.values()})
    return {
        "per_device_batch": per_batch,
        "voxceleb_train_gflop_per_window": round(flops / 1e9, 2),
        "assumed_v5e_chip_tflops": per_chip_flops / 1e12,
        "per_device_batch_whose_device_time_covers_the_trace": covering,
        "headline": (
            f"trace {min(traces_ms):.0f}-{max(traces_ms):.0f} ms/step, graph {'/'.join(map(str, nodes))} nodes "
            f"at batches {'/'.join(map(str, per_batch))}; a v5e-8 voxceleb step at {largest}/device is "
            f"{per_batch[largest]['v5e8_device_ms_voxceleb']} ms of device time: trace-bound (device time covers "
            f"the trace only from ~{covering} windows/device)"
        ),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        batches, steps = json.loads(args.child)
        print(json.dumps(measure_in_this_process(batches, steps)))
        return 0
    print(json.dumps(run(quick=args.quick), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
