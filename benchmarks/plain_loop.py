"""The plain loop `../shared/NOTES.md` measured FSDD with, run here on the same folder as the pipeline.

    python -m benchmarks.plain_loop --data DIR --task speaker|digit [--seed S]

NOTES' baseline (2 cores): ECAPA-TDNN with C=128, 1 s windows zero-padded around short clips, Adam with a
one-cycle schedule, batch 32, fp32; speaker ID 0.997 after 8 epochs (92 s train + infer), digits 0.987 after
12 (143 s). Those seconds were measured on another day, and this machine's speed moves up to 3x between days:
the fsdd section runs this loop beside the pipeline, on the same competition folder, so its time is reported
as a ratio to a loop that ran minutes apart on the same machine.

Nothing of pipeline/ is used: the loop is what a Kaggler writes in one cell (SpeechBrain's Fbank and
ECAPA-TDNN, a linear head, cross-entropy), and what the pipeline's time is held against.
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

SAMPLE_RATE = 16_000
WINDOW = SAMPLE_RATE  # 1 s
EPOCHS = {"speaker": 8, "digit": 12}  # NOTES' counts
BATCH = 32


def _read(path: Path) -> np.ndarray:
    """Mono float32 at 16 kHz."""
    import soundfile
    import torch
    import torchaudio

    audio, rate = soundfile.read(path, dtype="float32", always_2d=True)
    wav = torch.from_numpy(audio.mean(axis=1))
    if rate != SAMPLE_RATE:
        wav = torchaudio.functional.resample(wav, rate, SAMPLE_RATE)
    return wav.numpy()


def _windows(wav: np.ndarray, rng: np.random.Generator | None) -> list[np.ndarray]:
    """A clip's 1 s windows: one random window of a longer clip (training, `rng`) or all of them (inference),
    a short clip zero-padded around its centre."""
    if len(wav) <= WINDOW:
        left = (WINDOW - len(wav)) // 2
        return [np.pad(wav, (left, WINDOW - len(wav) - left))]
    if rng is not None:
        start = int(rng.integers(0, len(wav) - WINDOW + 1))
        return [wav[start : start + WINDOW]]
    starts = list(range(0, len(wav) - WINDOW + 1, WINDOW)) + [len(wav) - WINDOW]
    return [wav[s : s + WINDOW] for s in sorted(set(starts))]


def run(data: str | Path, task: str, seed: int = 0, epochs: int | None = None) -> dict[str, Any]:
    """Train on `data`/train.csv and predict `data`/test.csv; accuracy against solution.csv and the seconds of
    train (reading the audio included) and inference. `epochs` replaces NOTES' count (tests)."""
    import torch
    from speechbrain.lobes.features import Fbank
    from speechbrain.lobes.models.ECAPA_TDNN import ECAPA_TDNN

    data = Path(data)
    torch.manual_seed(seed)
    rng = np.random.default_rng(seed)
    t0 = time.perf_counter()
    with open(data / "train.csv", newline="") as f:
        train_rows = [(row["path"], row["label"]) for row in csv.DictReader(f)]
    labels = sorted({label for _, label in train_rows})
    index = {label: i for i, label in enumerate(labels)}
    train_audio = [_read(data / path) for path, _ in train_rows]
    targets = torch.tensor([index[label] for _, label in train_rows])

    fbank = Fbank(n_mels=80)
    encoder = ECAPA_TDNN(80, channels=[128, 128, 128, 128, 384], lin_neurons=192)
    head = torch.nn.Linear(192, len(labels))
    model = torch.nn.ModuleList([encoder, head])

    def logits(wavs: torch.Tensor) -> torch.Tensor:
        feats = fbank(wavs)
        feats = feats - feats.mean(dim=1, keepdim=True)  # sentence mean normalisation over the window
        return head(encoder(feats).squeeze(1))

    epochs = epochs or EPOCHS[task]
    steps_per_epoch = -(-len(train_rows) // BATCH)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    schedule = torch.optim.lr_scheduler.OneCycleLR(
        optimizer, max_lr=5e-3, total_steps=epochs * steps_per_epoch
    )
    model.train()
    for _ in range(epochs):
        order = rng.permutation(len(train_rows))
        for start in range(0, len(order), BATCH):
            rows = order[start : start + BATCH]
            wavs = torch.from_numpy(np.stack([_windows(train_audio[i], rng)[0] for i in rows]))
            loss = torch.nn.functional.cross_entropy(logits(wavs), targets[rows])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            schedule.step()
    t1 = time.perf_counter()

    model.eval()
    with open(data / "test.csv", newline="") as f:
        test_rows = [(row["id"], row["path"]) for row in csv.DictReader(f)]
    with torch.inference_mode():
        windows, owners = [], []
        for row_id, path in test_rows:
            for window in _windows(_read(data / path), None):
                windows.append(window)
                owners.append(row_id)
        scores: dict[str, torch.Tensor] = {}
        for start in range(0, len(windows), BATCH):
            out = logits(torch.from_numpy(np.stack(windows[start : start + BATCH])))
            for row_id, score in zip(owners[start : start + BATCH], out, strict=True):
                scores[row_id] = scores[row_id] + score if row_id in scores else score
        predicted = {row_id: labels[int(score.argmax())] for row_id, score in scores.items()}
    t2 = time.perf_counter()

    with open(data / "solution.csv", newline="") as f:
        truth = {row["id"]: row["label"] for row in csv.DictReader(f)}
    accuracy = sum(predicted.get(row_id) == label for row_id, label in truth.items()) / len(truth)
    return {
        "task": task,
        "seed": seed,
        "epochs": epochs,
        "steps": epochs * steps_per_epoch,
        "train_files": len(train_rows),
        "test_files": len(truth),
        "accuracy": round(accuracy, 4),
        "train_s": round(t1 - t0, 1),
        "infer_s": round(t2 - t1, 1),
        "total_s": round(t2 - t0, 1),
        "torch_threads": torch.get_num_threads(),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.plain_loop", description=__doc__.splitlines()[0]
    )
    parser.add_argument(
        "--data", required=True, help="an FSDD competition folder (python -m pipeline data fsdd)"
    )
    parser.add_argument("--task", choices=sorted(EPOCHS), required=True)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    print(json.dumps(run(args.data, args.task, args.seed), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
