"""The train stage: competition folder -> artifact, on whatever topology the session has.

`train(config)` reads as the data flow: topology -> batch/lr plan -> (launch processes) -> data -> model ->
epochs of steps -> best weights -> artifact. Everything hardware-specific is behind a strategy
(devices/strategy.py, ddp.py, xla.py); this file never imports torch_xla.

Sessions die (Kaggle time limits, preemption). Training checkpoints every `checkpoint_every_minutes` and a
rerun with the same parameters resumes from the latest checkpoint; `time_budget_minutes` stops early enough
to save the best model.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import os
import re
import tempfile
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from . import checkpoint as ckpt
from .artifact import check_artifact_dir, save_artifact
from .config import ConfigError, TrainConfig
from .data import load_training_set, random_crop, stratified_split
from .devices.launch import running_under_torchrun
from .devices.probe import Topology, detect_topology
from .devices.strategy import SingleDevice
from .ema import WeightAverage, recompute_batchnorm
from .inference import classify_clips, progress_bar
from .model import aam_loss, compute_loss, count_parameters, host_model
from .pretrained import initial_model
from .provenance import build_provenance, run_fingerprint, weights_digest
from .report import save_training_figures
from .scaling import BatchPlan, plan_batch, warmup_lr_factor
from .staging import check_output_dir

GRAD_CLIP = 5.0


@dataclass
class TrainResult:
    artifact_dir: Path
    history: list[dict[str, float]]
    best_val_accuracy: float | None
    best_epoch: int
    seconds: float
    plan: dict[str, Any]
    topology: dict[str, Any]
    compile_count: int | None
    skipped_rows: list[dict[str, str]] = field(default_factory=list)
    resumed_from: str | None = None
    stopped_early: str | None = None
    rows_trained: int = 0  # rows of this process's shard
    weights_sha256: str = ""  # of the final weights: equal on every rank under data parallelism

    def summary(self) -> str:
        acc = "n/a" if self.best_val_accuracy is None else f"{self.best_val_accuracy:.4f}"
        compiles = "" if self.compile_count is None else f"; XLA compilations {self.compile_count}"
        return (f"trained on {self.topology['device_kind']} x{self.topology['num_devices']} in "
                f"{self.seconds:.0f}s; best val accuracy {acc} (epoch {self.best_epoch}){compiles}; "
                f"artifact {self.artifact_dir}")  # fmt: skip


def train(config: TrainConfig) -> TrainResult:
    """Train on every device of this session and save the artifact. Called by notebooks/train.ipynb."""
    check_output_dirs(config)  # before anything slow: never train for hours, then refuse to save
    topology = session_topology(config)
    plan = plan_for(config, topology)
    precision = resolve_precision(config.precision, topology)
    # What was found and what will be done, before anything slow happens (data loading, compiling).
    if int(os.environ.get("RANK", "0")) == 0:  # under torchrun every rank runs this
        print(f"{describe_topology(topology)}. {plan.describe(with_warmup=False)}; {precision}")
    if topology.num_devices > 1 and topology.accelerator in ("cuda", "cpu"):
        from .devices.ddp import train_ddp  # DDP: one spawned process per device, rank 0's result returned

        return train_ddp(config, topology, plan, precision)
    if topology.accelerator == "tpu":
        from .devices.xla import XLASpmdStrategy  # the only import path that reaches torch_xla

        strategy = XLASpmdStrategy(topology, precision)
    else:
        device = torch.device("cuda" if topology.accelerator == "cuda" else "cpu")
        strategy = SingleDevice(device, precision)
    return fit(config, strategy, plan, topology)


def checkpoint_dir_of(config: TrainConfig) -> Path:
    return Path(config.checkpoint_dir or f"{config.artifact_dir}.checkpoints")


def check_output_dirs(config: TrainConfig) -> None:
    """The artifact may replace only an earlier artifact or an empty folder; checkpoints are written beside
    it; neither may overlap the data or each other (pipeline.staging's rule for every output folder)."""
    check_artifact_dir(
        config.artifact_dir, data_dir=config.data_dir, checkpoint_dir=checkpoint_dir_of(config)
    )
    check_output_dir(checkpoint_dir_of(config), name="checkpoint_dir", is_ours=lambda _: True,
                     what="a checkpoint folder", keep_apart={"data_dir": config.data_dir})  # fmt: skip


def session_topology(config: TrainConfig) -> Topology:
    """The topology to train on. Under torchrun the processes already exist: their number is the device
    count (WORLD_SIZE), whatever the probe would find, and `devices` must agree with it."""
    if running_under_torchrun():
        world_size = int(os.environ["WORLD_SIZE"])
        if config.devices not in (None, world_size):
            raise ConfigError(f"parameter devices={config.devices} but torchrun started WORLD_SIZE={world_size} "
                              "processes; leave devices unset under torchrun")  # fmt: skip
        return detect_topology(config.accelerator, world_size)
    return detect_topology(config.accelerator, config.devices)


def describe_topology(topology: Topology) -> str:
    how = {"tpu": "XLA SPMD" if topology.num_devices > 1 else "XLA", "cuda": "DDP" if topology.num_devices > 1
           else "single GPU", "cpu": "gloo DDP" if topology.num_devices > 1 else "eager"}[topology.accelerator]  # fmt: skip
    unit = {"tpu": "XLA devices", "cuda": "GPUs", "cpu": "CPU processes"}[topology.accelerator]
    return f"{topology.accelerator.upper()}: {topology.num_devices} {unit} ({how}, {topology.device_kind})"


def plan_for(config: TrainConfig, topology: Topology, total_steps: int | None = None) -> BatchPlan:
    return plan_batch(
        per_device_batch=config.per_device_batch_size,
        num_devices=topology.num_devices,
        grad_accum=config.grad_accum,
        base_lr=config.base_lr,
        base_batch=config.base_batch_size,
        rule=config.lr_scaling,
        accelerator=topology.accelerator,
        total_steps=total_steps,
    )


def resolve_precision(requested: str, topology: Topology) -> str:
    """bf16 on TPU and on GPUs with native bf16; fp16 + loss scaling on T4 (no native bf16); fp32 on CPU."""
    if requested == "fp16" and topology.accelerator == "tpu":
        raise ConfigError("parameter precision='fp16' is not available on TPU (its matrix units take bf16); "
                          "use 'bf16' (the default there) or 'fp32'")  # fmt: skip
    if requested != "auto":
        return requested
    if topology.accelerator == "tpu":
        return "bf16"
    if topology.accelerator == "cuda":
        return "bf16" if topology.bf16_native else "fp16"
    return "fp32"


def resolve_model_size(config: TrainConfig, topology: Topology) -> str:
    """`auto`: the VoxCeleb-size model on real accelerators, the small one on CPUs, and the tiny one on
    torch_xla's CPU stand-in for a TPU, which exists to exercise the TPU code path (it runs ~50x slower
    than eager CPU, ../shared/NOTES.md)."""
    if config.model_size != "auto":
        return config.model_size
    if topology.accelerator == "cuda":
        return "voxceleb"
    if topology.accelerator == "tpu":
        return "tiny" if os.environ.get("PJRT_DEVICE", "TPU").upper() == "CPU" else "voxceleb"
    return "small"


def fit(config: TrainConfig, strategy: SingleDevice, plan: BatchPlan, topology: Topology) -> TrainResult:
    """The training loop proper, run by every process of the topology."""
    started = time.perf_counter()
    torch.manual_seed(config.seed)
    if config.num_threads:
        torch.set_num_threads(config.num_threads)
    log = print if strategy.is_main else (lambda *_: None)

    dataset = load_training_set(config.data_dir, config.on_bad_row)
    if dataset.skipped:
        log(f"skipped {len(dataset.skipped)} bad training rows (on_bad_row='skip'): "
            + "; ".join(f"line {s['line']} {s['path']}: {s['reason']}" for s in dataset.skipped[:5]))  # fmt: skip
    labels = sorted({row.label for row in dataset.rows})
    targets = np.array([labels.index(row.label) for row in dataset.rows])
    train_idx, val_idx = stratified_split(
        [row.label for row in dataset.rows], config.val_fraction, config.seed
    )
    my_rows = strategy.shard(train_idx)
    calibration = calibration_windows(dataset.clips, train_idx, config)

    model_size = resolve_model_size(config, topology)
    model = initial_model(config, model_size, labels, log)  # fresh, or fine-tuned from config.init_from
    log(f"data: {len(dataset.rows)} files, {len(labels)} classes, {len(train_idx)} train / {len(val_idx)} "
        f"validation; model: ECAPA-TDNN '{model_size}', {count_parameters(model) / 1e6:.2f}M parameters")  # fmt: skip
    steps_per_epoch = max(1, len(train_idx) // plan.global_batch)
    total_steps = steps_per_epoch * config.epochs
    # The average is built before the model is wrapped (DDP) and moved with it: it is never all-reduced.
    average = WeightAverage(model, config.ema_epochs * steps_per_epoch) if config.ema_epochs else None
    model = strategy.setup_model(model)
    if average is not None:
        average.module.to(strategy.device)
    loss_fn = aam_loss(config.aam_margin, config.aam_scale)
    trainable = [p for p in model.parameters() if p.requires_grad]  # freeze_encoder: the classifier only
    optimizer = torch.optim.Adam(trainable, lr=plan.lr, weight_decay=config.weight_decay)
    if config.warmup_epochs > 0:  # warmup in epochs, the user's choice; else the scaling rule's default
        plan = dataclasses.replace(plan, warmup_steps=max(1, round(config.warmup_epochs * steps_per_epoch)),
                                   warmup_source=f"{config.warmup_epochs:g} epochs")  # fmt: skip
    else:
        plan = plan_for(config, topology, total_steps)
    warmup_steps = plan.warmup_steps
    log(f"{steps_per_epoch} steps per epoch x {config.epochs} epochs = {total_steps} steps; "
        f"warmup {warmup_steps} steps ({plan.warmup_source}); {strategy.describe()}")  # fmt: skip
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: lr_factor(step, warmup_steps, total_steps)
    )

    state = ckpt.TrainingState()
    checkpoint_dir = checkpoint_dir_of(config)
    fingerprint = run_fingerprint(config, dataset, topology)
    resumed = ckpt.try_resume(
        checkpoint_dir, fingerprint, model, optimizer, scheduler, strategy, state, log, average
    )

    budget_s = None if config.time_budget_minutes is None else config.time_budget_minutes * 60
    last_checkpoint = time.perf_counter()
    stopped_early = None
    bar = progress_bar(
        total_steps, "train", "step", strategy.is_main and config.progress, state.global_step, False
    )
    rows_per_batch = plan.per_device_batch * strategy.devices_per_process  # SPMD feeds the global batch

    def save_checkpoint() -> None:
        ckpt.save(checkpoint_dir, fingerprint, model, optimizer, scheduler, strategy, state, average)

    for epoch in range(state.epoch, config.epochs):
        model.train()
        order = epoch_order(my_rows, steps_per_epoch * plan.grad_accum * rows_per_batch, config.seed, epoch)
        first_batch = state.step_in_epoch * plan.grad_accum
        batches = strategy.device_batches(
            host_batches(dataset.clips, targets, order, rows_per_batch, first_batch, config, epoch, strategy)
        )
        losses = []
        for step in range(state.step_in_epoch, steps_per_epoch):
            micro_batches = [next(batches) for _ in range(plan.grad_accum)]
            loss = train_step(model, strategy, loss_fn, optimizer, micro_batches, average)
            advance_schedule(scheduler)
            losses.append(loss)  # stays on the device: reading it every step would stall XLA
            state.global_step += 1
            state.step_in_epoch = step + 1
            if bar is not None:
                bar.update(1)
                if step % 10 == 0 or step + 1 == steps_per_epoch:
                    bar.set_postfix(loss=f"{float(loss):.3f}", epoch=epoch + 1, refresh=False)
            now = time.perf_counter()
            if strategy.broadcast_flag(now - last_checkpoint > config.checkpoint_every_minutes * 60):
                state.epoch = epoch
                save_checkpoint()
                last_checkpoint = now
            out_of_time = budget_s is not None and (now - started) > budget_s - reserve_seconds(state)
            if strategy.broadcast_flag(out_of_time):
                stopped_early = (
                    f"time budget of {config.time_budget_minutes} min reached in epoch {epoch + 1}"
                )
                # Keep the exact position: a rerun (next Save Version, same command) continues from here.
                state.epoch = epoch
                save_checkpoint()
                break
        state.step_in_epoch = 0
        kept, eval_device = validation_model(model, average, strategy, calibration)
        record = evaluate(kept, eval_device, dataset.clips, targets, val_idx, config)
        # Read each loss back on its own: stacking them would be one more XLA graph to compile.
        train_loss = float(np.mean([float(loss) for loss in losses])) if losses else float("nan")
        record.update(epoch=epoch + 1, train_loss=train_loss,
                      lr=scheduler.get_last_lr()[0], seconds=round(time.perf_counter() - started, 1))  # fmt: skip
        state.history.append(record)
        if state.is_better(record):
            state.best_state = {k: v.detach().to("cpu").clone() for k, v in kept.state_dict().items()}
            state.best_epoch = epoch + 1
        log(format_epoch(record, config.epochs))
        state.epoch = epoch + 1
        if stopped_early:
            break
        if epoch + 1 < config.epochs and strategy.broadcast_flag(
            time.perf_counter() - last_checkpoint > config.checkpoint_every_minutes * 60
        ):
            save_checkpoint()
            last_checkpoint = time.perf_counter()
    if bar is not None:
        bar.close()
    if stopped_early:
        log(f"stopping early: {stopped_early}; saving the best epoch so far")

    # The final model is built on the host from CPU tensors: loading them back into the device model
    # would compile one more XLA graph per tensor shape just to read them out again.
    if state.best_state is None:  # no epoch finished (budget hit in epoch 1): the current weights
        kept, _ = validation_model(model, average, strategy, calibration)
        state.best_state = {k: v.detach().to("cpu") for k, v in kept.state_dict().items()}
    final = host_model(strategy.unwrap(model), state.best_state)
    compile_count = strategy.compile_count()  # every device computation of the run is behind us
    result = TrainResult(
        artifact_dir=Path(config.artifact_dir),
        history=state.history,
        best_val_accuracy=state.history[state.best_epoch - 1].get("val_accuracy")
        if state.best_epoch
        else None,
        best_epoch=state.best_epoch,
        seconds=time.perf_counter() - started,
        plan=plan.to_dict(),
        topology=topology.to_dict(),
        compile_count=compile_count,
        skipped_rows=dataset.skipped,
        resumed_from=resumed,
        stopped_early=stopped_early,
        rows_trained=len(my_rows),
        weights_sha256=weights_digest(final),
    )
    if strategy.is_main:
        provenance = build_provenance(config, topology, plan, strategy, result, model_size)
        with tempfile.TemporaryDirectory() as figures_dir:
            val_pred = evaluate(final, torch.device("cpu"), dataset.clips, targets, val_idx,
                                config, return_predictions=True)  # fmt: skip
            figures = save_training_figures(
                state.history, targets[val_idx], val_pred, labels, Path(figures_dir), state.best_epoch
            )
            result.artifact_dir = save_artifact(
                config.artifact_dir, final, labels, provenance, extra_files=figures,
                fallback_label=labels[int(np.bincount(targets).argmax())],
            )  # fmt: skip
        if stopped_early:
            log(f"checkpoint kept in {checkpoint_dir}: rerun with the same parameters to continue training")
        else:
            ckpt.remove(checkpoint_dir, fingerprint)
        log(result.summary())
    strategy.barrier()
    return result


def advance_schedule(scheduler: torch.optim.lr_scheduler.LRScheduler) -> None:
    """One learning-rate step per training step, skipped optimizer steps included.

    Under fp16 the GradScaler skips ``optimizer.step()`` while it calibrates its scale (the first few
    steps overflow at 65536). The schedule still counts those steps, on purpose, and torch would warn
    about the call order in every T4 run's log; that one warning is silenced here.
    """
    with warnings.catch_warnings():
        warnings.filterwarnings(
            "ignore", re.escape("Detected call of `lr_scheduler.step()` before"), UserWarning
        )
        scheduler.step()


def train_step(
    model, strategy, loss_fn, optimizer, micro_batches: list[dict[str, torch.Tensor]], average=None
) -> torch.Tensor:
    """One optimizer step over `grad_accum` micro-batches already on the device; returns the loss (on device)."""
    total = None
    for index, batch in enumerate(micro_batches):
        last = index == len(micro_batches) - 1
        with strategy.no_sync(model) if not last else contextlib.nullcontext():
            with strategy.autocast():
                scores = model(batch["inputs"], batch["lens"], features_ready=strategy.features_on_host)
            loss = compute_loss(loss_fn, scores, batch["labels"]) / len(micro_batches)
            strategy.backward(loss)
        total = loss.detach() if total is None else total + loss.detach()
    strategy.optimizer_step(optimizer, model, GRAD_CLIP)
    if average is not None:
        average.update(strategy.unwrap(model))  # in the same XLA graph as the step: no extra compile
    strategy.mark_step()
    return total


def host_batches(clips, targets, order, batch_rows, first_batch, config, epoch, strategy):
    """Micro-batches of random crops, as dicts of CPU tensors, from position `first_batch` of this epoch.
    On XLA the Fbank features are computed here on the host (the compiler crashed on them under SPMD)."""
    for batch_index in range(first_batch, len(order) // batch_rows):
        start = batch_index * batch_rows
        rows = order[start : start + batch_rows]
        wavs, lens, labels = make_batch(clips, targets, rows, config.window_samples, config.seed, epoch, start,
                                        strategy.rank, config.min_short_fraction)  # fmt: skip
        inputs = strategy.host_features(wavs, lens) if strategy.features_on_host else wavs
        yield {"inputs": inputs, "lens": lens, "labels": labels}


def make_batch(
    clips, targets, rows, window, seed, epoch, offset, rank=0, min_short_fraction=1.0
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Random crops for `rows`; the RNG is derived from (seed, epoch, rank, position) so a resumed run sees
    the same crops as an uninterrupted one, and ranks crop independently."""
    rng = np.random.default_rng([seed, epoch, rank, offset])
    crops, lens = zip(*(random_crop(clips[i], window, rng, min_short_fraction) for i in rows), strict=True)
    return (torch.from_numpy(np.stack(crops)), torch.tensor(lens, dtype=torch.float32),
            torch.from_numpy(targets[list(rows)]).long())  # fmt: skip


def epoch_order(rows: list[int], needed: int, seed: int, epoch: int) -> list[int]:
    """This epoch's shuffled row order, repeated if the shard is smaller than one epoch of batches."""
    rng = np.random.default_rng([seed, epoch, 7919])
    order: list[int] = []
    while len(order) < needed:
        order += [rows[i] for i in rng.permutation(len(rows))]
    return order[:needed]


def calibration_windows(clips, train_idx, config) -> tuple[torch.Tensor, torch.Tensor] | None:
    """A fixed sample of training crops for recompute_batchnorm: the same every epoch and on every rank.
    None with freeze_encoder: the pretrained encoder's weights and statistics are kept exactly as they are."""
    count = min(config.bn_calibration_windows, len(train_idx))
    if count == 0 or config.freeze_encoder:
        return None
    rng = np.random.default_rng([config.seed, 104729])
    rows = rng.choice(np.asarray(train_idx), size=count, replace=False)
    crops, lens = zip(*(random_crop(clips[i], config.window_samples, rng) for i in rows), strict=True)
    return torch.from_numpy(np.stack(crops)), torch.tensor(lens, dtype=torch.float32)


def validation_model(model, average, strategy, calibration) -> tuple[torch.nn.Module, torch.device]:
    """The weights an epoch validates and may keep (the average, else the model itself) as the module that
    validation runs on (a host copy on XLA), in eval mode, with BatchNorm statistics of their own."""
    kept = average.module if average is not None else strategy.unwrap(model)
    module, device = strategy.eval_model(kept)
    if calibration is not None:
        recompute_batchnorm(module, *calibration, device)
    strategy.sync_buffers(module)  # DDP: every rank validates (and may keep) exactly rank 0's statistics
    return module.eval(), device


def evaluate(model, device, clips, targets, val_idx, config, return_predictions=False):
    """Validation exactly as at inference (windowed, length-weighted), on the held-out files, of `model` (an
    unwrapped module on `device`). Returns the metrics, or the predicted class per file with
    `return_predictions`."""
    if not val_idx:
        return np.zeros(0, dtype=np.int64) if return_predictions else {}
    model.eval()
    predictions = classify_clips(model, [clips[i] for i in val_idx], config.window_samples, device=device)
    truth = targets[val_idx]
    scores = torch.from_numpy(predictions.scores) * config.aam_scale
    loss = torch.nn.functional.cross_entropy(scores, torch.from_numpy(truth)).item()
    if return_predictions:
        return predictions.scores.argmax(1)
    accuracy = float((predictions.scores.argmax(1) == truth).mean())
    return {"val_accuracy": accuracy, "val_loss": loss}


def lr_factor(step: int, warmup_steps: int, total_steps: int) -> float:
    """Linear warmup (large scaled learning rates need it, Goyal et al. 2017), then cosine decay to 2%."""
    if step < warmup_steps:
        return warmup_lr_factor(step, warmup_steps)
    progress = min(1.0, (step - warmup_steps) / max(1, total_steps - warmup_steps))
    return 0.02 + 0.98 * 0.5 * (1 + math.cos(math.pi * progress))


def reserve_seconds(state: ckpt.TrainingState) -> float:
    """Time kept back from the budget for the last validation and the artifact save."""
    epoch_times = [r["seconds"] for r in state.history]
    longest_epoch = max(np.diff([0.0, *epoch_times]), default=60.0)
    return max(30.0, 0.25 * float(longest_epoch))


def format_epoch(record: dict[str, float], epochs: int) -> str:
    parts = [f"epoch {int(record['epoch'])}/{epochs}", f"loss {record['train_loss']:.3f}"]
    if "val_accuracy" in record:
        parts += [f"val_acc {record['val_accuracy']:.4f}", f"val_loss {record['val_loss']:.3f}"]
    parts += [f"lr {record['lr']:.2e}", f"{record['seconds']:.0f}s"]
    return " | ".join(parts)
