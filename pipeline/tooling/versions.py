"""The versions this project is tested on: the version matrix's legs and Kaggle's two images, in one table.

Read by `python -m matrix.run` (what each leg installs and checks), tests/tooling/test_versions.py (pyproject's ranges
are exactly what the legs prove: the floor leg pins every lower bound, the newest leg the newest allowed),
pipeline/tooling/wheelcheck.py (what the images have preinstalled) and `python -m pipeline doctor` (this session's
versions against the legs). Installed versions are read with importlib.metadata: importing this module, or
calling anything in it, never imports torch or torch_xla.

Legs (every torch minor from 2.7 to 2.11 is one of them):
  floor       the lower bound of every range in pyproject.toml, torch_xla 2.7 beside torch 2.7.1
  kaggle-tpu  Kaggle's TPU image: torch/torchaudio/torch_xla 2.8.0; trains the artifact on 8 XLA CPU devices
              and exports its embedding model to ONNX (fp32, int8) with torch 2.8's exporter
  dev         requirements.lock (torch 2.9.1, torch_xla 2.9.0): `make test`, not the matrix, runs it
  kaggle-gpu  Kaggle's GPU image: torch/torchaudio 2.10.0, no torch_xla; predicts offline from kaggle-tpu's
              artifact, SpeechBrain's EncoderClassifier loads that artifact, and ONNX Runtime runs kaggle-tpu's
              export (and one made here by torch 2.10) with torch's labels
  newest      the newest torch/torchaudio/speechbrain the ranges allow, and the newest of everything else
torch_xla X.Y is built against torch X.Y (C++ ABI): it pairs with torch X.Y.* only, so the tpu extra stops at
the newest torch_xla on PyPI (2.9) even though torch's own range goes further.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from importlib import metadata

# The distributions a leg is described by (and doctor reports), in display order.
KEY_PACKAGES = ("torch", "torchaudio", "torch_xla", "speechbrain", "numpy")


@dataclass(frozen=True)
class Leg:
    name: str
    torch: str
    torchaudio: str
    torch_xla: str | None  # None: not installed (it cannot be, or the image has none)
    speechbrain: str
    about: str
    checks: tuple[str, ...]  # what the leg runs, in words (matrix/run.py implements them)
    extra: Mapping[str, str] = field(default_factory=dict)  # further exact pins (the floor pins every bound)
    in_matrix: bool = True  # False: the dev leg, which `make test` runs in .venv
    # The checks `make handoff` (CI, after `make test`) runs: the Kaggle TPU image trains the artifact that the
    # GPU image predicts from offline. `make matrix` runs every check of every leg.
    handoff_checks: tuple[str, ...] = ()

    def pins(self) -> dict[str, str]:
        """Distribution name -> exact version the leg installs (torch_xla only where it has one)."""
        pins = {"torch": self.torch, "torchaudio": self.torchaudio, "speechbrain": self.speechbrain}
        if self.torch_xla:
            pins["torch_xla"] = self.torch_xla
        return {**pins, **self.extra}


@dataclass(frozen=True)
class Image:
    """A Kaggle notebook image, as far as the bundle's install on it is concerned."""

    name: str
    python: str  # major.minor
    glibc: str  # manylinux_X_Y the image satisfies (Ubuntu 22.04: 2.35)
    # Distributions the image has. A version: the one Kaggle ships; None: present, version not published
    # (numpy: the images' requirements leave it unpinned; every cp312 numpy is >= 1.26).
    preinstalled: Mapping[str, str | None]
    # Preinstalled distributions that must never be replaced or upgraded by the bundle's install: torch is
    # built for the image's CUDA / libtpu, and torchaudio and torch_xla are built against that torch.
    protected: tuple[str, ...] = ("torch", "torchaudio", "torch_xla")


# Common to both images per Kaggle's published requirements (and torch's own dependencies).
_IMAGE_COMMON: dict[str, str | None] = dict.fromkeys(
    (
        "numpy",
        "scipy",
        "scikit-learn",
        "threadpoolctl",
        "tqdm",
        "pyyaml",
        "safetensors",
        "huggingface-hub",
        "joblib",
        "packaging",
        "requests",
        "cffi",
        "pycparser",
        "filelock",
        "typing-extensions",
        "sympy",
        "networkx",
        "jinja2",
        "fsspec",
        "setuptools",
    )
)

KAGGLE_TPU = Image(
    name="kaggle-tpu",
    python="3.12",
    glibc="2.35",
    preinstalled={**_IMAGE_COMMON, "torch": "2.8.0", "torchaudio": "2.8.0", "torch_xla": "2.8.0"},
)
KAGGLE_GPU = Image(
    name="kaggle-gpu",
    python="3.12",
    glibc="2.35",
    preinstalled={
        **_IMAGE_COMMON,
        "torch": "2.10.0",
        "torchaudio": "2.10.0",
        "torchcodec": "0.10.0",
        "soundfile": "0.13.1",
    },
)
IMAGES = {image.name: image for image in (KAGGLE_TPU, KAGGLE_GPU)}


def _image_extra(image: Image) -> dict[str, str]:
    """Besides torch/torchaudio/torch_xla, what a leg copies from its image."""
    return {n: v for n, v in image.preinstalled.items() if n in ("torchcodec", "soundfile") and v is not None}


# The ONNX engine's stack (pipeline/inference/engines.py: the runtime, and torch's exporter): one tested version of
# each, pinned alike by every leg but the newest (which takes the newest releases) and bundled by `kaggle
# package` for both images, whose published requirements have none of them.
ONNX_STACK = {"onnxruntime": "1.32.0", "onnxscript": "0.7.2", "onnx": "1.23.2"}
# The Kaggle legs' handoff checks (Leg.handoff_checks).
# Training writes the ONNX files into the artifact (fp32 checked against torch as it exports): the GPU leg checks
# those files, the ones a submission runs, so the TPU leg does not export a second copy.
_TPU_HANDOFF = ("train notebook on 8 XLA CPU devices -> artifact",)
_GPU_HANDOFF = (
    "no torch_xla in the kernel",
    "infer notebook offline on the kaggle-tpu artifact",
    "SpeechBrain client agrees with the torch engine",
    "ONNX Runtime on the artifact's ONNX files agrees with torch",
)

LEGS: tuple[Leg, ...] = (
    Leg(
        "floor",
        "2.7.1",
        "2.7.1",
        "2.7.0",
        "1.1.0",
        about="lower bound of every range in pyproject.toml",
        checks=(
            "pytest -m 'not slow'",
            "pytest -m xla",
            "train -> infer notebooks (cpu)",
            "SpeechBrain client",
        ),
        extra={
            "numpy": "1.26.0",
            "scipy": "1.11.2",
            "safetensors": "0.4.0",
            "soundfile": "0.12.1",
            "pyyaml": "6.0.1",
            "tqdm": "4.64.0",
            "packaging": "22.0",
            "scikit-learn": "1.3.1",
            **ONNX_STACK,
        },
    ),
    Leg(
        "kaggle-tpu",
        KAGGLE_TPU.preinstalled["torch"],
        KAGGLE_TPU.preinstalled["torchaudio"],
        KAGGLE_TPU.preinstalled["torch_xla"],
        "1.1.2",
        about="Kaggle TPU image: trains the handoff artifact",
        checks=("pytest -m xla, less the notebook test the handoff repeats", *_TPU_HANDOFF),
        extra={**_image_extra(KAGGLE_TPU), **ONNX_STACK},
        handoff_checks=_TPU_HANDOFF,
    ),
    Leg(
        "dev",
        "2.9.1",
        "2.9.1",
        "2.9.0",
        "1.1.2",
        about="requirements.lock, run by `make test`",
        checks=("ruff; the whole pytest suite (XLA, DDP, notebooks, offline guard)",),
        extra={"numpy": "2.4.6", **ONNX_STACK},
        in_matrix=False,
    ),
    Leg(
        "kaggle-gpu",
        KAGGLE_GPU.preinstalled["torch"],
        KAGGLE_GPU.preinstalled["torchaudio"],
        None,
        "1.1.2",
        about="Kaggle GPU image: predicts from kaggle-tpu's artifact, offline",
        checks=_GPU_HANDOFF,
        extra={**_image_extra(KAGGLE_GPU), **ONNX_STACK},
        handoff_checks=_GPU_HANDOFF,
    ),
    Leg(
        "newest",
        "2.11.0",
        "2.11.0",
        None,
        "1.1.2",
        about="newest releases pyproject.toml allows; no torch_xla exists for 2.11",
        checks=("pytest -m 'not slow'", "train -> infer notebooks (cpu)", "SpeechBrain client"),
    ),
)
BY_NAME = {leg.name: leg for leg in LEGS}
MATRIX_LEGS = tuple(leg for leg in LEGS if leg.in_matrix)
HANDOFF_LEGS = tuple(leg for leg in MATRIX_LEGS if leg.handoff_checks)
FLOOR, NEWEST = BY_NAME["floor"], BY_NAME["newest"]


def _release(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in version.split("+")[0].split(".")[:3] if part.isdigit())


# The distributions whose ranges have an upper bound: the newest leg pins the newest release allowed (for
# torch_xla, which has none beside torch 2.11, the dev leg's 2.9 is the newest). Every other range is
# open-ended, and the newest leg installs the newest release there is.
CAPPED = ("torch", "torchaudio", "torch_xla", "speechbrain")


def tested_range(name: str) -> str | None:
    """The range the legs prove for `name`, as pyproject.toml states it: from the floor leg's pin (else the
    lowest pin) to below the next minor release of the highest pin for CAPPED names (torch 2.7.1 .. 2.11.0
    -> '>=2.7.1,<2.12'), open-ended for the others ('>=1.26.0'). None if no leg pins it."""
    pinned = [leg.pins()[name] for leg in LEGS if name in leg.pins()]
    if not pinned:
        return None
    low = FLOOR.pins().get(name) or min(pinned, key=_release)
    if name not in CAPPED:
        return f">={low}"
    major, minor = _release(max(pinned, key=_release))[:2]
    return f">={low},<{major}.{minor + 1}"


def _in_range(version: str, spec: str) -> bool:
    """'2.9.1' in '>=2.7.1,<2.12', by release numbers (a local label such as +cu128 is ignored)."""
    have = _release(version)
    clauses = [(clause[:2], _release(clause.lstrip("<>="))) for clause in spec.split(",")]
    return all(have >= bound if op == ">=" else have < bound for op, bound in clauses)


def installed_version(name: str) -> str | None:
    """The installed distribution's version (importlib.metadata; nothing is imported), or None."""
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


@dataclass
class Comparison:
    session: dict[str, str | None]  # KEY_PACKAGES -> installed version or None
    matches: list[str]  # legs whose torch/torchaudio/torch_xla/speechbrain equal this session's
    nearest: str | None  # a leg with the same torch minor, if none matches exactly
    out_of_range: list[str]  # 'torch 2.12.0 is outside the tested >=2.7.1,<2.12'
    notes: list[str] = field(default_factory=list)

    def lines(self) -> list[str]:
        """What doctor prints under '== versions'."""
        found = ", ".join(f"{n} {v or 'not installed'}" for n, v in self.session.items())
        lines = [f"this session: {found}"]
        if self.matches:
            lines.append(f"tested: the same versions as matrix leg(s) {', '.join(self.matches)}")
        elif self.nearest:
            lines.append(f"near leg {self.nearest} (same torch minor); not tested as a whole")
        else:
            lines.append("no leg has this torch: an untested combination")
        lines += [f"OUTSIDE the tested range: {text}" for text in self.out_of_range]
        lines += self.notes
        lines.append("legs (README 'Tested versions'; run them with `make matrix`):")
        for leg in LEGS:
            pins = leg.pins()
            text = ", ".join(f"{n} {pins.get(n, '-')}" for n in KEY_PACKAGES if n in pins or n == "torch_xla")
            lines.append(f"  {leg.name:<11} {text}  ({leg.about})")
        return lines


_DEFINING = ("torch", "torchaudio", "torch_xla", "speechbrain")


def compare(version_of: Callable[[str], str | None] = installed_version) -> Comparison:
    """This session's KEY_PACKAGES against the legs. `version_of` (name -> version or None) is for tests."""
    session = {name: version_of(name) for name in KEY_PACKAGES}

    def same(a: str | None, b: str | None) -> bool:
        return (a is None and b is None) or (a is not None and b is not None and _release(a) == _release(b))

    matches = [leg.name for leg in LEGS if all(same(session[n], leg.pins().get(n)) for n in _DEFINING)]
    nearest = None
    torch, xla = session["torch"], session["torch_xla"]
    if not matches and torch:
        nearest = next((leg.name for leg in LEGS if _release(leg.torch)[:2] == _release(torch)[:2]), None)
    out_of_range = []
    for name, version in session.items():
        if version and (spec := tested_range(name)) and not _in_range(version, spec):
            out_of_range.append(f"{name} {version} is outside the tested {spec}")
    notes = []
    if xla and torch and _release(xla)[:2] != _release(torch)[:2]:
        notes.append(
            f"torch_xla {xla} is built for torch {'.'.join(map(str, _release(xla)[:2]))}, "
            f"not torch {torch}: importing it will fail (C++ ABI)"
        )
    return Comparison(session, matches, nearest, out_of_range, notes)


def markdown_table() -> str:
    """The legs as README.md's "Tested versions" table shows them (tests/tooling/test_versions.py keeps it equal)."""
    rows = [
        "| leg | torch | torchaudio | torch_xla | speechbrain | numpy | what | checks |",
        "|---" * 8 + "|",
    ]
    for leg in LEGS:
        pins = leg.pins()
        cells = [pins.get(name, "-" if name == "torch_xla" else "newest") for name in KEY_PACKAGES]
        rows.append(f"| {leg.name} | " + " | ".join([*cells, leg.about, "; ".join(leg.checks)]) + " |")
    return "\n".join(rows)
