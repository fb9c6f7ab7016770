"""The train stage: competition folder -> artifact, on whatever topology the session has.

    train(config)   the session (plan.open_session: paths and the table, read once; the rounds pass theirs)
                    -> check the outputs -> the plan and the training data (plan.py: every auto decided once,
                    the audio decoded once into the cache, by every core) -> policy.run(hardware, fit, plan, ...)
    fit(strategy, hardware, plan, data, started)
                    run by every process of the topology, with its strategy: prepare -> run_epochs -> finish

Everything hardware-specific is behind the strategy the policy hands to `fit` (devices/strategy.py, ddp.py,
xla.py); this file never imports torch_xla. Batches come from DataLoader worker processes (batches.py);
validation reads the cache one file at a time (validation.py).

Sessions die (Kaggle time limits, preemption). Training checkpoints every `checkpoint_every_minutes` and a
rerun with the same parameters resumes from its checkpoint, exactly; `time_budget_minutes` stops early enough
to save the best model.
"""

from __future__ import annotations

import contextlib
import os
import re
import tempfile
import time
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..core.artifact import check_training_outputs, save_artifact
from ..core.config import ConfigError, TrainConfig
from ..core.model import count_parameters, host_model
from ..core.objectives import make_loss
from ..core.progress import first_line, progress_bar
from ..core.report import save_training_figures
from ..core.scaling import Schedule, plan_schedule
from ..devices import policy
from ..devices.policy import HardwarePlan
from ..devices.strategy import Strategy
from . import checkpoint as ckpt
from . import onnx_artifact
from .augment import Augmentation
from .batches import BatchRecipe, training_loader
from .dataset import TrainingData
from .ema import WeightAverage
from .plan import Session, TrainPlan, open_session, plan_training
from .pretrained import initial_model
from .provenance import build_provenance, run_fingerprint, weights_digest
from .validation import (
    calibration_windows,
    embedding_centre,
    evaluate,
    recalibrates,
    test_time_speeds,
    validation_model,
)

GRAD_CLIP = 5.0
# Under DDP every "stop now?" / "checkpoint now?" decision is rank 0's, broadcast to the others: a collective
# and a device-to-host copy. It is taken at the first step of a session, every this many steps, and at the end
# of every epoch -- not at every step, where it would stall the GPUs twice per step.
DECISION_EVERY_STEPS = 25
SAVE_SECONDS_MIN = 30.0  # kept back from the time budget for the artifact save, at least


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
    schedule: dict[str, Any] = field(default_factory=dict)
    skipped_rows: list[dict[str, str]] = field(default_factory=list)
    data_notes: list[str] = field(default_factory=list)
    label_counts: dict[str, int] = field(default_factory=dict)  # training files per class: the prior
    resumed_from: str | None = None
    stopped_early: str | None = None
    rows_trained: int = 0  # rows of this process's shard
    weights_sha256: str = ""  # of the final weights: equal on every rank under data parallelism
    objective: str = "aam"
    metric: str = "accuracy"  # what validation selected by
    best_val_metric: float | None = None
    train_files: int = 0
    onnx: dict[str, Any] = field(default_factory=dict)  # the artifact's ONNX files: provenance["onnx"]

    def summary(self) -> str:
        value = "n/a" if self.best_val_metric is None else f"{self.best_val_metric:.4f}"
        compiles = "" if self.compile_count is None else f"; XLA compilations {self.compile_count}"
        return (
            f"trained on {self.topology['device_kind']} x{self.topology['num_devices']} in "
            f"{self.seconds:.0f}s; kept val {self.metric} {value} (epoch {self.best_epoch}){compiles}; "
            f"artifact {self.artifact_dir}"
        )


def train(config: TrainConfig | Session) -> TrainResult:
    """Train on every device of this session and save the artifact (the train notebook calls it through
    pipeline.rounds.self_training.train_rounds, which opens the session once for all its rounds)."""
    started = time.monotonic()  # the budget counts from here, decoding included (one clock for all ranks)
    if (config.config if isinstance(config, Session) else config).pretrained_teacher:
        raise ConfigError(
            "pretrained_teacher is run by the train notebook's entry, "
            "pipeline.rounds.self_training.train_rounds(config): call that instead of train()"
        )
    session = open_session(config)
    # Under torchrun every rank runs this: rank 0 says what it does.
    log = print if int(os.environ.get("RANK", "0")) == 0 else lambda *_: None
    check_training_outputs(session.config)  # before anything slow
    plan, data = plan_training(session, log)  # audio decoded once per machine, before any rank starts
    return policy.run(
        plan.hardware,
        fit,
        plan,
        data,
        started,
        collective_timeout_s=plan.config.collective_timeout_minutes * 60,
    )


@dataclass
class Run:
    """The live state of one process's training run, shared by prepare / run_epochs / finish."""

    strategy: Strategy
    config: TrainConfig  # plan.config: every auto decided
    plan: TrainPlan
    data: TrainingData
    schedule: Schedule
    model: torch.nn.Module
    average: WeightAverage | None
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler
    state: ckpt.TrainingState
    fingerprint: str
    checkpoint_dir: Path
    calibration: tuple[torch.Tensor, torch.Tensor] | None
    batches: Iterator[dict[str, torch.Tensor]]
    log: Callable[[str], Any]
    started: float
    metric: str = "accuracy"
    resumed_from: str | None = None
    stopped_early: str | None = None
    last_checkpoint: float = 0.0
    first_step_of_session: bool = True
    export_reserve_s: float = 0.0  # kept back from the time budget for the ONNX files (rank 0 writes them)

    def save_checkpoint(self) -> None:
        ckpt.save(self)
        self.last_checkpoint = time.monotonic()


def fit(
    strategy: Strategy, hardware: HardwarePlan, plan: TrainPlan, data: TrainingData, started: float
) -> TrainResult:
    """The training run of one process of the topology (policy.run calls it with the process's strategy and
    the hardware plan it was built from, plan.hardware)."""
    run = prepare(strategy, plan, data, started)
    run_epochs(run)
    return finish(run)


def prepare(strategy: Strategy, train_plan: TrainPlan, data: TrainingData, started: float) -> Run:
    """Model, optimizer, schedule, weight average, resumed state and the batch pipeline of this process."""
    config, hardware = train_plan.config, train_plan.hardware
    torch.manual_seed(config.seed)
    if config.num_threads:
        torch.set_num_threads(config.num_threads)
    log = print if strategy.is_main else lambda *_: None
    epoch_rows = data.epoch_rows(config.window_samples, config.crops_per_file)
    schedule = plan_schedule(hardware.batch, len(epoch_rows), config.epochs, config.warmup_epochs)
    model = initial_model(  # fresh or fine-tuned
        config,
        train_plan.model_size,
        data.labels,
        log,
        train_plan.objective,
        frontend=train_plan.frontend,
        members=train_plan.members,
    )
    # Rank 0 decides when to stop, and it writes the ONNX files after the last step: their time is kept back.
    timed = strategy.is_main and config.time_budget_minutes
    export_reserve = onnx_artifact.reserve_seconds(model.config, data, config) if timed else 0.0
    members = f" x {model.config.members} members" if model.config.members > 1 else ""
    log(
        f"{data.describe()}; model: ECAPA-TDNN '{train_plan.model_size}'{members}, {count_parameters(model) / 1e6:.2f}M "
        f"parameters, {model.config.frontend} features; {schedule.describe()}; {strategy.describe()}"
    )
    # The average is built before the model is wrapped (DDP) and moved with it: it is never all-reduced.
    # Its BatchNorm statistics are averaged only when validation does not recompute them.
    horizon = config.ema_epochs * schedule.steps_per_epoch
    average = (
        WeightAverage(model, horizon, average_buffers=not recalibrates(config)) if config.ema_epochs else None
    )
    model = strategy.setup_model(model)
    if average is not None:
        average.module.to(strategy.device)
    trainable = [p for p in model.parameters() if p.requires_grad]  # freeze_encoder: the classifier only
    # foreach: one call for all parameters. On XLA the step is traced in Python every time; per-parameter Adam
    # took ~100 ms of host time per step there, foreach ~45 ms (benchmarks/xla_step.py). CUDA picks it anyway.
    optimizer = torch.optim.Adam(
        trainable, lr=hardware.batch.lr, weight_decay=config.weight_decay, foreach=True
    )
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, schedule.factor)

    state = ckpt.TrainingState()
    checkpoint_dir = config.checkpoint_folder
    fingerprint = run_fingerprint(config, data, hardware.topology)
    # Only rank 0's filesystem is sure to hold the checkpoint: it reads it, every rank gets what it read.
    payload = ckpt.read(checkpoint_dir, fingerprint, log) if strategy.is_main else None
    payload = strategy.broadcast_object(payload)
    resumed = (
        ckpt.restore(payload, model, optimizer, scheduler, strategy, state, average, log) if payload else None
    )

    augmentation = Augmentation(
        noise=data.noise,
        noise_probability=config.noise_probability,
        noise_snr_db=(config.noise_snr_db_low, config.noise_snr_db_high),
        mix_probability=config.mix_probability if data.multi_hot is not None else 0.0,
        background_probability=config.background_probability if data.multi_hot is not None else 0.0,
        speed_probability=config.speed_probability,
        time_mask_probability=config.time_mask_probability,
        freq_mask_probability=config.freq_mask_probability,
        targets=data.soundscape_targets,
        target_probability=config.target_probability,
        blend_probability=config.blend_probability if data.multi_hot is None else 0.0,
        classes=len(data.labels),
        multi_label=data.multi_hot is not None,
    )
    log(
        augmentation.describe()
        + (
            " (no crop mixing: the aam objective learns one class per clip)"
            if config.mix_probability and data.multi_hot is None
            else ""
        )
    )
    recipe = BatchRecipe(
        store=data.store,
        items=data.items,
        rows=strategy.shard(epoch_rows),
        targets=data.multi_hot if data.multi_hot is not None else data.targets,
        rows_per_batch=hardware.batch.per_device_batch * strategy.devices_per_process,
        batches_per_epoch=schedule.steps_per_epoch * hardware.batch.grad_accum,
        window=config.window_samples,
        seed=config.seed,
        rank=strategy.rank,
        min_short_fraction=config.min_short_fraction,
        host_features_mels=config.n_mels if strategy.features_on_host else None,
        host_features_frontend=strategy.unwrap(model).config.frontend,
        crop_on_sound=config.crop_on_sound,
        augmentation=augmentation,
        focal_targets=data.focal_targets,
    )
    loader = training_loader(
        recipe,
        state.epoch,
        state.step_in_epoch * hardware.batch.grad_accum,
        config.epochs,
        hardware.loader_workers,
        pin_memory=strategy.device.type == "cuda",
    )
    return Run(
        strategy,
        config,
        train_plan,
        data,
        schedule,
        model,
        average,
        optimizer,
        scheduler,
        state,
        fingerprint,
        checkpoint_dir,
        calibration_windows(data.store, data.items, data.train_idx, config),
        strategy.device_batches(iter(loader)),
        log,
        started,
        train_plan.metric,
        resumed,
        last_checkpoint=time.monotonic(),
        export_reserve_s=export_reserve,
    )


def run_epochs(run: Run) -> None:
    """Epochs of steps, each followed by validation, until the last epoch or the time budget."""
    config, state = run.config, run.state
    bar = progress_bar(
        run.schedule.total_steps,
        "train",
        "step",
        run.strategy.is_main and config.progress,
        state.global_step,
        False,
    )
    try:
        for epoch in range(state.epoch, config.epochs):
            timing = run_steps(run, epoch, bar)
            state.step_in_epoch = 0
            validate(run, epoch, timing)
            state.epoch = epoch + 1
            if run.stopped_early:
                break
            (due,) = run.strategy.broadcast_flags(_checkpoint_due(run))
            if due and epoch + 1 < config.epochs:
                run.save_checkpoint()
    finally:
        if bar is not None:
            bar.close()
        if (close := getattr(run.batches, "close", None)) is not None:
            close()  # stops the loader: its worker processes (and XLA's transfer threads) end here


def run_steps(run: Run, epoch: int, bar) -> dict[str, float]:
    """The optimizer steps of one epoch (from where a resumed run stopped); returns their timing."""
    config, state, strategy = run.config, run.state, run.strategy
    run.model.train()
    loss_fn = make_loss(run.data.objective, config.aam_margin, config.aam_scale)
    losses: list[torch.Tensor] = []
    wait = busy = startup = 0.0
    first_step_at = None
    first = state.step_in_epoch
    for step in range(first, run.schedule.steps_per_epoch):
        started = time.perf_counter()
        micro_batches = [next(run.batches) for _ in range(run.plan.hardware.batch.grad_accum)]
        ready = time.perf_counter()
        loss = train_step(run.model, strategy, loss_fn, run.optimizer, micro_batches, run.average)
        advance_schedule(run.scheduler)
        if run.first_step_of_session:  # the loader's workers were starting: not a steady-state wait
            startup, busy = ready - started, busy + time.perf_counter() - ready
            first_step_at = time.time()  # wall clock: benchmarks time a whole process up to here
        else:
            wait, busy = wait + ready - started, busy + time.perf_counter() - ready
        losses.append(loss)  # stays on the device: reading it every step would stall XLA and the GPU
        state.global_step += 1
        state.step_in_epoch = step + 1
        last = step + 1 == run.schedule.steps_per_epoch
        if bar is not None:
            bar.update(1)
            if step % DECISION_EVERY_STEPS == 0 or last:
                bar.set_postfix(loss=f"{float(loss):.3f}", epoch=epoch + 1, refresh=False)
        if run.first_step_of_session or (step + 1) % DECISION_EVERY_STEPS == 0 or last:
            run.first_step_of_session = False
            checkpoint, stop = strategy.broadcast_flags(_checkpoint_due(run), _out_of_time(run))
            if stop:
                run.stopped_early = (
                    f"time budget of {config.time_budget_minutes} min reached in epoch {epoch + 1}"
                )
                run.save_checkpoint()  # the exact position: a rerun (next Save Version) continues from here
                break
            if checkpoint and not last:  # at the end of the epoch it is saved after validation
                run.save_checkpoint()
    # Read each loss back on its own: stacking them would be one more XLA graph to compile.
    return {
        "train_loss": float(np.mean([float(loss) for loss in losses])) if losses else float("nan"),
        "steps": state.step_in_epoch - first,
        "data_wait_s": wait,
        "step_s": busy,
        "loader_start_s": round(startup, 2),
        "first_step_at": first_step_at,
    }


def validate(run: Run, epoch: int, timing: dict[str, float]) -> None:
    """Validate the kept weights, record the epoch in the history, keep them if they are the best so far."""
    strategy, state, config = run.strategy, run.state, run.config
    started = time.perf_counter()
    compiles_before = strategy.compile_count()
    kept = validation_model(run.model, run.average, strategy, run.calibration)
    result = evaluate(kept, strategy, run.data, config, run.metric)
    steps = max(1, timing["steps"])
    loop = timing["data_wait_s"] + timing["step_s"]
    record = {
        "epoch": epoch + 1,
        "train_loss": timing["train_loss"],
        **(result.metrics if result else {}),
        "lr": run.scheduler.get_last_lr()[0],
        "seconds": round(time.monotonic() - run.started, 1),
        "samples_per_s": round(timing["steps"] * run.plan.hardware.batch.global_batch / loop, 1)
        if loop
        else 0.0,
        "step_ms": round(1000 * timing["step_s"] / steps, 2),
        "data_wait_ms": round(1000 * timing["data_wait_s"] / steps, 2),
        "data_wait_share": round(timing["data_wait_s"] / loop, 4) if loop else 0.0,
        "validation_s": round(time.perf_counter() - started, 2),
    }
    if timing["first_step_at"] is not None:  # the first step of this session
        record.update(loader_start_s=timing["loader_start_s"], first_step_at=timing["first_step_at"])
    if compiles_before is not None:  # XLA, so far in the run: neither may grow after the first epoch
        record.update(xla_compiles_before_validation=compiles_before, xla_compiles=strategy.compile_count())
    state.history.append(record)
    if state.is_better(record, selection_key(run)):
        state.best_state = {k: v.detach().to("cpu").clone() for k, v in kept.state_dict().items()}
        state.best_epoch = epoch + 1
        state.best_predictions = None if result is None else result.predictions
    run.log(format_epoch(record, config.epochs, run.metric))


def finish(run: Run) -> TrainResult:
    """The best weights as the artifact (rank 0), the checkpoint kept or dropped; every rank returns."""
    strategy, state, config, data = run.strategy, run.state, run.config, run.data
    if run.stopped_early:
        run.log(f"stopping early: {run.stopped_early}; saving the best epoch so far")
    if state.best_state is None:  # no epoch finished (budget hit in epoch 1): the current weights
        kept = validation_model(run.model, run.average, strategy, run.calibration)
        state.best_state = {k: v.detach().to("cpu") for k, v in kept.state_dict().items()}
    # The final model is built on the host from CPU tensors: loading them back into the device model
    # would compile one more XLA graph per tensor shape just to read them out again.
    final = host_model(strategy.unwrap(run.model), state.best_state)
    best = state.history[state.best_epoch - 1] if state.best_epoch else {}
    result = TrainResult(
        artifact_dir=Path(config.artifact_dir),
        history=state.history,
        best_val_accuracy=best.get("val_accuracy"),
        objective=data.objective,
        metric=run.metric,
        best_val_metric=best.get(selection_key(run), best.get(f"val_{run.metric}")),
        train_files=len({data.rows[i].rel_path for i in data.train_idx}),
        best_epoch=state.best_epoch,
        seconds=time.monotonic() - run.started,
        plan=run.plan.hardware.batch.to_dict(),
        topology=run.plan.hardware.topology.to_dict(),
        compile_count=strategy.compile_count(),  # every device computation of the run is behind us
        schedule=run.schedule.to_dict(),
        skipped_rows=data.skipped,
        data_notes=data.notes,
        label_counts=data.label_counts(),
        resumed_from=run.resumed_from,
        stopped_early=run.stopped_early,
        rows_trained=len(strategy.shard(data.train_idx)),
        weights_sha256=weights_digest(final),
    )
    if not strategy.is_main:
        return result  # no collective follows: the other ranks leave while rank 0 saves
    centre = _embedding_centre(run, final)
    if (speeds := test_time_speeds(config)) != (1.0,):
        run.log(
            f"test-time speeds: the infer stage reads each file at {', '.join(f'{v:g}' for v in speeds)}x "
            "(the model trained with speed perturbation; infer parameter test_time_speeds)"
        )
    provenance = build_provenance(config, run.plan, strategy, result)
    # Self-training and distillation: the teachers' scores, and their lineage.
    provenance["soundscape_targets"], provenance["focal_targets"] = data.targets_record, data.focal_record
    truth = data.targets[np.asarray(data.val_idx, dtype=np.int64)]  # the first label of each validation file
    if (predictions := state.best_predictions) is None:  # no epoch validated (or no split): curves only
        truth = predictions = np.zeros(0, dtype=np.int64)
    with tempfile.TemporaryDirectory() as folder:
        figures = save_training_figures(
            state.history, truth, predictions, data.labels, Path(folder), state.best_epoch, run.metric
        )
        with _onnx_files(run, final) as onnx:
            provenance["onnx"] = result.onnx = onnx.record
            result.artifact_dir = save_artifact(
                config.artifact_dir,
                final,
                data.labels,
                provenance,
                extra_files={**figures, **onnx.files},
                fallback_label=data.labels[int(np.bincount(data.targets).argmax())],
                embedding_centre=centre,
                test_time_speeds=list(speeds) if speeds != (1.0,) else None,
            )
    if run.stopped_early:
        run.log(
            f"checkpoint kept in {ckpt.run_dir(run.checkpoint_dir, run.fingerprint)}: rerun with the same "
            "parameters to continue training"
        )
    else:
        ckpt.remove(run.checkpoint_dir, run.fingerprint)
    run.log(result.summary())
    return result


def _embedding_centre(run: Run, final: torch.nn.Module) -> list[float] | None:
    """The training files' mean embedding that inference subtracts before scoring (aam only), on the host copy."""
    started = time.monotonic()
    centre = embedding_centre(final, run.data, run.config)
    if centre is not None:
        run.log(
            f"embedding centre: the training files' mean unit embedding (length {np.linalg.norm(centre):.3f}, "
            f"{time.monotonic() - started:.0f} s); inference scores embeddings minus it"
        )
    return centre


@contextlib.contextmanager
def _onnx_files(run: Run, final: torch.nn.Module):
    """The ONNX Runtime files of the kept weights (on the host CPU copy, so never on the training device) in a
    temporary folder, with their provenance record; none with export_onnx=False."""
    if not run.config.export_onnx:
        yield onnx_artifact.OnnxFiles(record={"skipped": "export_onnx=False"})
        return
    with tempfile.TemporaryDirectory(prefix="onnx-export-") as folder:
        started, compiles = time.monotonic(), run.strategy.compile_count()
        try:
            onnx = onnx_artifact.export_for_artifact(
                final, run.data, run.config, run.metric, Path(folder), run.log
            )
        except Exception as error:  # noqa: BLE001 - hours of training must not be lost to an optional file
            # export_for_artifact turns the failures it knows into a line of its own; this is for the rest
            # (seen on a GPU machine: an int8 failure whose message was empty broke the error report itself).
            run.log(
                f"ONNX files: none in the artifact ({type(error).__name__}: {first_line(error)}); "
                "inference runs torch"
            )
            onnx = onnx_artifact.OnnxFiles(record={"error": f"{type(error).__name__}: {error}"[:500]})
        onnx.record["seconds"] = round(time.monotonic() - started, 1)
        if compiles is not None:  # XLA: the export must not have touched the device (0 new graphs)
            onnx.record["xla_compiles_during_export"] = run.strategy.compile_count() - compiles
        yield onnx


def advance_schedule(scheduler: torch.optim.lr_scheduler.LRScheduler) -> None:
    """One learning-rate step per training step, on purpose also for the ``optimizer.step()`` calls that fp16's
    GradScaler skips while it calibrates its scale (the first steps overflow at 65536): torch's warning about
    the call order, in every T4 run's log, is silenced."""
    with warnings.catch_warnings():
        warnings.filterwarnings(
            "ignore", re.escape("Detected call of `lr_scheduler.step()` before"), UserWarning
        )
        scheduler.step()


def train_step(
    model, strategy: Strategy, loss_fn, optimizer, micro_batches: list[dict[str, torch.Tensor]], average=None
) -> torch.Tensor:
    """One optimizer step over `grad_accum` micro-batches already on the device; returns the loss (on device)."""
    total = None
    for index, batch in enumerate(micro_batches):
        with strategy.no_sync(model) if index < len(micro_batches) - 1 else contextlib.nullcontext():
            loss = strategy.forward_backward(model, loss_fn, batch, len(micro_batches))
        total = loss if total is None else total + loss
    # An ensemble's members have independent gradients whose norms add in quadrature: each keeps one model's clip.
    members = getattr(getattr(strategy.unwrap(model), "config", None), "members", 1)
    strategy.optimizer_step(optimizer, model, GRAD_CLIP * members**0.5)
    if average is not None:
        unwrapped = strategy.unwrap(model)  # the average joins the step's XLA graph: no extra compile
        average.update(unwrapped, strategy.flat_parameters(unwrapped))
    strategy.mark_step()
    return total


def selection_key(run: Run) -> str:
    """The history entry that picks the kept epoch: the metric on labelled soundscapes (the test's domain)
    when there are any, else on the held-out files."""
    return f"val_soundscape_{run.metric}" if run.data.soundscapes is not None else f"val_{run.metric}"


def _checkpoint_due(run: Run) -> bool:
    return time.monotonic() - run.last_checkpoint > run.config.checkpoint_every_minutes * 60


def _out_of_time(run: Run) -> bool:
    if run.config.time_budget_minutes is None:
        return False
    reserve = reserve_seconds(run.state) + run.export_reserve_s
    return time.monotonic() - run.started > run.config.time_budget_minutes * 60 - reserve


def reserve_seconds(state: ckpt.TrainingState) -> float:
    """Time kept back from the budget for what follows the last step: the epoch's validation (as long as the
    longest so far, with its BatchNorm recalibration), a checkpoint and the artifact save."""
    validation = max((r.get("validation_s", 0.0) for r in state.history), default=0.0)
    epoch_times = np.diff([0.0, *(r["seconds"] for r in state.history)])
    longest_epoch = float(max(epoch_times, default=60.0))
    return max(SAVE_SECONDS_MIN, 0.25 * longest_epoch) + 1.5 * validation


def format_epoch(record: dict[str, float], epochs: int, metric: str = "accuracy") -> str:
    parts = [f"epoch {int(record['epoch'])}/{epochs}", f"loss {record['train_loss']:.3f}"]
    if "val_accuracy" in record:
        parts += [_value("val_acc", record, "val_accuracy"), f"val_loss {record['val_loss']:.3f}"]
    if f"val_{metric}" in record and metric != "accuracy":
        parts.append(_value(f"val_{metric}", record, f"val_{metric}"))
    if f"val_soundscape_{metric}" in record:
        parts.append(_value(f"soundscapes {metric}", record, f"val_soundscape_{metric}"))
    parts += [
        f"lr {record['lr']:.2e}",
        f"{record.get('samples_per_s', 0):.0f} samples/s",
        f"data wait {record.get('data_wait_share', 0):.1%}",
        f"{record['seconds']:.0f}s",
    ]
    return " | ".join(parts)


def _value(name: str, record: dict[str, float], key: str) -> str:
    """`name value`, with the value's standard error where validation computed one (checkpoint.is_better)."""
    error = f" +-{record[f'{key}_se']:.4f}" if f"{key}_se" in record else ""
    return f"{name} {record[key]:.4f}{error}"


__all__ = ["TrainResult", "fit", "train", "train_step"]
