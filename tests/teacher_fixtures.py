"""A pretrained teacher small enough for the tests, and a competition it knows (imported as `teacher_fixtures`).

The teacher is a real ONNX model behind a teacher.json, the interface a Perch folder uses: 1 s windows at
8 kHz, one logit per tone it knows, from the energy of the window at that tone's frequency (a fixed
projection onto a cosine and a sine). The competition's classes are tones named like species, so the teacher
is matched to them by scientific name.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import soundfile as sf
import torch

from pipeline.core.tables import write_csv

RATE = 8000
# The teacher's labels (BirdNET's form) and the frequency of each; the competition's classes are
# `<genus>_<species>` of the first three, plus one the teacher does not know.
TONES = {"Tonus bassus_Low Tone": 300.0, "Tonus medius_Middle Tone": 700.0, "Tonus altus_High Tone": 1500.0,
         "Tonus ignotus_Other Tone": 2500.0}  # fmt: skip
LACKING = ("tonus_rarus", 1100.0)  # a class no teacher output stands for


class ToneTeacher(torch.nn.Module):
    def __init__(self, freqs: list[float]) -> None:
        super().__init__()
        t = torch.arange(RATE) / RATE
        self.register_buffer("cos", torch.stack([torch.cos(2 * torch.pi * f * t) for f in freqs], dim=1))
        self.register_buffer("sin", torch.stack([torch.sin(2 * torch.pi * f * t) for f in freqs], dim=1))

    def forward(self, windows: torch.Tensor) -> torch.Tensor:
        energy = (windows @ self.cos) ** 2 + (windows @ self.sin) ** 2
        share = energy / (energy.sum(dim=1, keepdim=True) + 1e-6)
        return 8.0 * share - 4.0  # a pure tone: logit 4 for its own, -4 for the others


def make_tone_teacher(folder: Path) -> Path:
    """An ONNX teacher folder (model.onnx, labels.txt, teacher.json)."""
    folder.mkdir(parents=True, exist_ok=True)
    model = ToneTeacher(list(TONES.values())).eval()
    batch = torch.export.Dim("batch", min=1, max=1024)
    torch.onnx.export(model, (torch.zeros(2, RATE),), str(folder / "model.onnx"), dynamo=True,
                      dynamic_shapes=({0: batch},), input_names=["windows"], output_names=["logits"],
                      external_data=False)  # fmt: skip
    (folder / "labels.txt").write_text("\n".join(TONES) + "\n")
    (folder / "teacher.json").write_text(json.dumps({"name": "tone teacher", "model": "model.onnx",
        "labels": "labels.txt", "sample_rate": RATE, "window_seconds": 1.0, "output": "logits",
        "licence": "test fixture"}))  # fmt: skip
    return folder


def tone_clip(freq: float, seconds: float, rng: np.random.Generator, rate: int = 16000) -> np.ndarray:
    t = np.arange(int(seconds * rate)) / rate
    clip = 0.3 * np.sin(2 * np.pi * freq * (1 + rng.uniform(-0.01, 0.01)) * t) + 0.02 * rng.standard_normal(
        t.size
    )
    return clip.astype(np.float32)


def make_tone_competition(
    folder: Path, train_per_class: int = 6, test_per_class: int = 3, seed: int = 0
) -> Path:
    """train.csv (path,label), test.csv, sample_submission.csv, solution.csv and taxonomy.csv over the first
    three tones the teacher knows and LACKING, clips of 3 s."""
    rng = np.random.default_rng(seed)
    classes = {name.split("_")[0].lower().replace(" ", "_"): f for name, f in list(TONES.items())[:3]}
    classes[LACKING[0]] = LACKING[1]
    train, test, solution = [], [], []
    for label, freq in classes.items():
        for k in range(train_per_class):
            rel = f"train_audio/{label}/{k}.wav"
            (folder / rel).parent.mkdir(parents=True, exist_ok=True)
            sf.write(folder / rel, tone_clip(freq, 3.0, rng), 16000)
            train.append([rel, label])
        for k in range(test_per_class):
            test_id = f"{label[6:9]}{k}"
            rel = f"test_audio/{test_id}.wav"
            (folder / rel).parent.mkdir(parents=True, exist_ok=True)
            sf.write(folder / rel, tone_clip(freq, 3.0, rng), 16000)
            test.append([test_id, rel])
            solution.append([test_id, label])
    write_csv(folder / "train.csv", ["path", "label"], train)
    write_csv(folder / "test.csv", ["id", "path"], test)
    write_csv(folder / "sample_submission.csv", ["id", "label"], [[i, train[0][1]] for i, _ in test])
    write_csv(folder / "solution.csv", ["id", "label"], solution)
    write_csv(folder / "taxonomy.csv", ["primary_label", "scientific_name"],
              [[label, label.replace("_", " ").capitalize()] for label in classes])  # fmt: skip
    return folder
