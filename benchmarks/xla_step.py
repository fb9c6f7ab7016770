"""How big a TPU batch must be to keep the chips busy: host trace time per step vs the device work it launches,
for the production step and for the step without each of its trace remedies.

    python -m benchmarks.xla_step [--quick] [--paired-today ROUNDS] [--paired CONFIGURATION ROUNDS]

torch_xla re-traces the training step in Python on every step (lazy tensors), and the devices wait for the next
graph while the host builds it. The trace costs the same whatever the batch (the graph has the same operations;
only shapes differ), while the device work grows with it: the per-device batch decides whether a step is
host-bound. Measured here on torch_xla's CPU backend with 8 devices (the stand-in for a v5e-8), through the
production train_step and XLASpmdStrategy, once per configuration of the remedies (each in a fresh process:
functionalization is chosen before the first XLA tensor):

- `today`: the step as it was (functionalization on, torch's foreach Adam, a per-tensor weight average);
- each remedy added in turn (XLA_DISABLE_FUNCTIONALIZATION, devices/flat_adam.py, ema.py's flat average, and
  the flat Adam's parameter vector reused by its next step and by the average, whose BatchNorm statistics are
  then copied, not averaged: validation recomputes them, and the forward, loss and backward traced once per
  input shape into one XLA computation, devices/xla_traced.py), and the production step without
  functionalization off; then the production step against functionalization on, against the same step
  traced in full at every step, and against the same step without its flat vectors reused, in alternating
  processes, 3 rounds (paired ratios: a single run of either configuration varies by +-15 %);

per configuration: the host time to trace one step (forward + backward + clip + Adam + weight average, up to
the sync; the next batch already on the devices and the previous step finished, so only the trace is timed),
wall-clock (median, min) and the process's CPU time (robust to a shared machine's load), the host time of
each phase of the step (forward, loss, backward, clip + optimizer, weight average, sync), torch_xla's
TensorsGraphSize (IR nodes per step), the compile count, and the losses of the steps (the same seed and batches
in every configuration: the remedies must not change them). Then the 'voxceleb' preset's FLOPs per training
window (torch's FLOP counter on the CPU), hence the device time of a step on a v5e-8 at an assumed 40 % of its
197 bf16 TFLOP/s per chip, and the smallest per-device batch whose device time covers the trace.

The op count of ECAPA-TDNN does not depend on its width, so the trace is timed on the 'tiny' preset (whose
steps the CPU backend can also execute quickly); FLOPs are counted on 'voxceleb'. `today` and the production
step are timed at every batch size; the other configurations at the smallest (the trace does not depend on it).
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
# name: (functionalization off, flat Adam, flat weight average, flat vectors reused, forward + backward traced
# once); the first is today's step, the last-but-one the production step.
CONFIGURATIONS: dict[str, tuple[bool, bool, bool, bool, bool]] = {
    "today": (False, False, False, False, False),
    "+ functionalization off": (True, False, False, False, False),
    "+ flat Adam": (True, True, False, False, False),
    "+ flat average": (True, True, True, False, False),
    "+ flat vectors reused": (True, True, True, True, False),
    "production (+ forward and backward traced once)": (True, True, True, True, True),
    "production, functionalization on": (False, True, True, True, True),
}
TODAY, PRODUCTION = "today", "production (+ forward and backward traced once)"
REUSED, FUNCTIONALIZATION_ON = "+ flat vectors reused", "production, functionalization on"
# Timed only against the production step, in paired rounds (a single run's +-15 % hides what it buys).
NOT_REUSED = "production, flat vectors not reused"
PAIRED_ONLY = {NOT_REUSED: (True, True, True, False, True)}


def train_flops_per_window(preset: str = "voxceleb", window: int = 16000, n_mels: int = 80) -> float:
    """Forward + backward FLOPs of one 1 s window (torch's FLOP counter; backward counted as 2x forward)."""
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    from pipeline.core.model import ModelConfig, SpeakerClassifier

    model = SpeakerClassifier(
        ModelConfig.from_preset(preset, n_classes=1000, n_mels=n_mels, window_samples=window)
    )
    wavs, lens = 0.1 * torch.randn(2, window), torch.ones(2)
    with FlopCounterMode(display=False) as counter, torch.no_grad():
        model(wavs, lens)
    return 3.0 * counter.get_total_flops() / 2


def measure_in_this_process(
    batches: list[int], steps: int, flat_adam: bool, flat_average: bool, reuse: bool, trace_once: bool
) -> dict:
    import torch
    import torch_xla
    import torch_xla.core.xla_model as xm
    import torch_xla.debug.metrics as met

    from pipeline.core.model import ModelConfig, SpeakerClassifier
    from pipeline.core.objectives import make_loss
    from pipeline.devices.probe import detect_topology
    from pipeline.devices.xla import XLASpmdStrategy
    from pipeline.training.ema import WeightAverage
    from pipeline.training.train import train_step

    strategy = XLASpmdStrategy(detect_topology("tpu"), "bf16")
    # The remedies under comparison, switched on the instance before its first step (XLASpmdStrategy's defaults
    # are the production ones).
    strategy.flat_adam, strategy.reuse_flat_vectors, strategy.trace_once = flat_adam, reuse, trace_once
    results: dict[str, Any] = {"strategy": strategy.describe()}
    for per_device in batches:
        torch.manual_seed(0)
        config = ModelConfig.from_preset("tiny", n_classes=100, n_mels=80, window_samples=16000)
        model = SpeakerClassifier(config)
        average = WeightAverage(
            model, 100, flat=flat_average, average_buffers=not reuse
        )  # reuse: as train.py
        model = strategy.setup_model(model)
        average.module.to(strategy.device)
        optimizer = torch.optim.Adam(
            model.parameters(), lr=1e-3, weight_decay=2e-5, foreach=True
        )  # as train.py
        loss_fn = make_loss("aam", 0.2, 30.0)
        rows = per_device * strategy.num_devices
        generator = torch.Generator().manual_seed(1)
        host = [{"inputs": torch.randn(rows, 101, 80, generator=generator), "lens": torch.ones(rows),
                 "labels": torch.randint(0, 100, (rows,), generator=generator)} for _ in range(steps + 2)]  # fmt: skip
        batches_on_device = list(strategy.device_batches(iter(host)))  # sent before timing: the trace alone
        compiles_before = met.metric_data("CompileTime")
        wall, cpu, losses = [], [], []
        for batch in batches_on_device:
            xm.wait_device_ops()  # the previous step has run: what is timed next is the host's trace alone
            started, started_cpu = time.perf_counter(), time.process_time()
            # train_step ends in the sync that hands the graph to the runtime: its host time is the trace.
            losses.append(train_step(model, strategy, loss_fn, optimizer, [batch], average))
            wall.append(1000 * (time.perf_counter() - started))
            cpu.append(1000 * (time.process_time() - started_cpu))
        sizes = met.metric_data("TensorsGraphSize")
        timed = slice(2, None)  # the first two steps compile
        results[str(per_device)] = {
            "trace_ms_median": round(_median(wall[timed]), 1),
            "trace_ms_min": round(min(wall[timed]), 1),
            "trace_cpu_ms_median": round(_median(cpu[timed]), 1),
            "graph_nodes_last": int(sizes[2][-1][1]) if sizes else None,
            "compiles": int(met.metric_data("CompileTime")[0])
            - int(compiles_before[0] if compiles_before else 0),
            "losses": [round(float(loss), 6) for loss in losses],
        }
        if per_device == batches[0]:  # where the trace goes: the same step, phase by phase
            parts = [_step_in_parts(model, strategy, loss_fn, optimizer, average, batch)
                     for batch in strategy.device_batches(iter(host[:steps]))]  # fmt: skip
            results[str(per_device)]["trace_ms_by_part"] = {
                name: round(_median([part[name] for part in parts[2:]]), 1) for name in parts[0]
            }
        del batches_on_device
        torch_xla.sync()
    return results


def _step_in_parts(model, strategy, loss_fn, optimizer, average, batch) -> dict[str, float]:
    """pipeline.training.train.train_step's body for one micro-batch, with the host time of each phase (ms)."""
    import torch_xla.core.xla_model as xm

    from pipeline.training.train import GRAD_CLIP

    xm.wait_device_ops()
    times, last = {}, time.perf_counter()

    def lap(name: str) -> None:
        nonlocal last
        now = time.perf_counter()
        times[name], last = 1000 * (now - last), now

    if strategy.trace_once:  # one call: the traced computation
        strategy.forward_backward(model, loss_fn, batch)
        lap("forward + loss + backward")
    else:
        with strategy.autocast():
            scores = model(batch["inputs"], batch["lens"], features_ready=strategy.features_on_host)
        lap("forward")
        loss = loss_fn(scores, batch["labels"])
        lap("loss")
        strategy.backward(loss)
        lap("backward")
    strategy.optimizer_step(optimizer, model, GRAD_CLIP)
    lap("clip + optimizer")
    if average is not None:
        average.update(strategy.unwrap(model))
    lap("weight average")
    strategy.mark_step()
    lap("sync (graph hashing, hand-off)")
    return times


def _median(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[len(ordered) // 2]


def _child(name: str, batches: list[int], steps: int) -> dict[str, Any]:
    functionalization_off, *remedies = {**CONFIGURATIONS, **PAIRED_ONLY}[name]
    env = {**os.environ, "PJRT_DEVICE": "CPU", "CPU_NUM_DEVICES": "8", "TF_CPP_MIN_LOG_LEVEL": "2",
           "XLA_DISABLE_FUNCTIONALIZATION": "1" if functionalization_off else "0"}  # fmt: skip
    spec = json.dumps([batches, steps, *remedies])
    child = subprocess.run([sys.executable, "-m", "benchmarks.xla_step", "--child", spec], env=env,
                           capture_output=True, text=True, timeout=3000)  # fmt: skip
    if child.returncode != 0:
        raise RuntimeError(f"XLA step benchmark ({name}) failed: {child.stderr[-2000:]}")
    return json.loads(child.stdout.strip().splitlines()[-1])


def v5e_seconds_per_window(flops: float) -> float:
    """Device seconds of one training window of `flops` on a v5e chip at ASSUMED_UTILISATION."""
    return flops / (V5E_CHIP_BF16_FLOPS * ASSUMED_UTILISATION)


def covering_batch(trace_ms: float, per_window_s: float) -> int:
    """Windows per device whose v5e device time hides a trace of `trace_ms`."""
    return math.ceil(trace_ms / 1000 / per_window_s)


def paired(other: str, rounds: int, steps: int) -> dict[str, Any]:
    """The production step and configuration `other`, in alternating child processes at 8 windows per device,
    `rounds` times: the production step's trace as a ratio to `other`'s, round by round. (For
    XLA_DISABLE_FUNCTIONALIZATION a single run of each differed in sign between two sessions.)"""
    times: dict[str, list[float]] = {PRODUCTION: [], other: []}
    for index in range(rounds):
        for name in (PRODUCTION, other)[:: 1 if index % 2 == 0 else -1]:
            times[name].append(_child(name, [8], steps)["8"]["trace_ms_median"])
    ratios = [ours / theirs for ours, theirs in zip(times[PRODUCTION], times[other], strict=True)]
    return {
        "trace_ms_production_by_round": times[PRODUCTION],
        "trace_ms_other_by_round": times[other],
        "production_over_other_by_round": [round(r, 3) for r in ratios],
        "production_over_other_median": round(_median(ratios), 3),
    }


def run(quick: bool = False) -> dict[str, Any]:
    batches = [8, 32] if quick else [8, 32, 128]
    steps = 4 if quick else 8
    flops = train_flops_per_window()
    per_window_s = v5e_seconds_per_window(flops)
    configurations: dict[str, Any] = {}
    for name in CONFIGURATIONS:
        sizes = batches if name in (TODAY, PRODUCTION) else batches[:1]
        measured = _child(name, sizes, steps)
        rows = {int(k): v for k, v in measured.items() if k != "strategy"}
        for batch, row in rows.items():
            row["v5e8_device_ms_voxceleb"] = round(1000 * batch * per_window_s, 1)
        # The trace is the host's work and the same at every batch; on this CPU backend, though, the devices
        # are the same 2 cores, and the graph handed over at the sync starts executing while the host is still
        # in it: at larger batches the timed step also holds the CPU backend's execution (its CPU time grows
        # with the batch, the graph does not). The smallest batch measures the trace; the worst is kept too.
        smallest = rows[batches[0]]
        configurations[name] = {
            "strategy": measured["strategy"],
            "per_device_batch": rows,
            "trace_ms": smallest["trace_ms_median"],
            "trace_cpu_ms": smallest["trace_cpu_ms_median"],
            "trace_ms_by_part": smallest.get("trace_ms_by_part"),
            "trace_ms_worst_median": max(row["trace_ms_median"] for row in rows.values()),
            "graph_nodes": smallest["graph_nodes_last"],
            "per_device_batch_whose_device_time_covers_the_trace": covering_batch(
                smallest["trace_ms_median"], per_window_s
            ),
        }
    today, production = configurations[TODAY], configurations[PRODUCTION]
    reference = today["per_device_batch"][batches[0]]["losses"]
    for row in configurations.values():
        losses = row["per_device_batch"][batches[0]]["losses"]
        row["max_relative_loss_difference_vs_today"] = max(
            abs(a - b) / max(abs(b), 1e-12) for a, b in zip(losses, reference, strict=True)
        )
    largest = max(batches)
    device_ms = production["per_device_batch"][largest]["v5e8_device_ms_voxceleb"]
    rounds = 1 if quick else 3
    functionalization, traced, reuse = (
        paired(FUNCTIONALIZATION_ON, rounds, steps),
        paired(REUSED, rounds, steps),
        paired(NOT_REUSED, rounds, steps),
    )
    return {
        "configurations": configurations,
        "functionalization_off_vs_on_paired": functionalization,
        "traced_once_vs_every_step_paired": traced,
        "flat_vectors_reused_vs_not_paired": reuse,
        "voxceleb_train_gflop_per_window": round(flops / 1e9, 2),
        "assumed_v5e_chip_tflops": V5E_CHIP_BF16_FLOPS * ASSUMED_UTILISATION / 1e12,
        "trace_speedup_vs_today": round(
            today["trace_ms_worst_median"] / production["trace_ms_worst_median"], 2
        ),
        "per_device_batch_whose_device_time_covers_the_trace": production[
            "per_device_batch_whose_device_time_covers_the_trace"
        ],
        "headline": (
            f"trace {production['trace_ms']:.0f} ms/step (today {today['trace_ms']:.0f}; "
            f"CPU {production['trace_cpu_ms']:.0f} vs {today['trace_cpu_ms']:.0f} ms), "
            f"graph {production['graph_nodes']} nodes (today {today['graph_nodes']}), at {batches[0]} windows/device "
            f"(the trace does not depend on the batch); a v5e-8 voxceleb step at {largest}/device is {device_ms} ms of device "
            f"time, which covers the trace from "
            f"~{production['per_device_batch_whose_device_time_covers_the_trace']} windows/device (today "
            f"~{today['per_device_batch_whose_device_time_covers_the_trace']}); losses within "
            f"{production['max_relative_loss_difference_vs_today']:.1e} of today's (bf16); paired rounds, the "
            f"production trace as a ratio to functionalization on: {functionalization['production_over_other_median']:.2f}x "
            f"({functionalization['production_over_other_by_round']}), to forward and backward traced at every "
            f"step: {traced['production_over_other_median']:.2f}x ({traced['production_over_other_by_round']}), to the flat "
            f"vectors not reused: {reuse['production_over_other_median']:.2f}x ({reuse['production_over_other_by_round']})"
        ),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--paired", nargs=2, metavar=("CONFIGURATION", "ROUNDS"),
                        help="only the production step against one configuration (a name of CONFIGURATIONS or "
                        "PAIRED_ONLY), in alternating processes")  # fmt: skip
    parser.add_argument("--paired-today", type=int, metavar="ROUNDS",
                        help="only the production step against today's, in alternating processes (~3 min a round): "
                        "the quick check on another torch_xla (e.g. the matrix's kaggle-tpu venv)")  # fmt: skip
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(measure_in_this_process(*json.loads(args.child))))
        return 0
    if args.paired:
        print(json.dumps(paired(args.paired[0], int(args.paired[1]), 8), indent=2))
        return 0
    if args.paired_today:
        import torch_xla

        result = paired(TODAY, args.paired_today, 8)
        per_window_s = v5e_seconds_per_window(train_flops_per_window())
        production_ms = _median(result["trace_ms_production_by_round"])
        result.update(torch_xla=torch_xla.__version__, trace_ms_production_median=production_ms,
                      per_device_batch_whose_device_time_covers_the_trace=covering_batch(production_ms, per_window_s))  # fmt: skip
        print(json.dumps(result, indent=2))
        return 0
    print(json.dumps(run(quick=args.quick), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
